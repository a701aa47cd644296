// Package console serves runledger's web console (runledger console): the
// runs of a namespace, live; a run's shards, conditions, Events and items
// from the ledger database; a key's history; and actions on runs, each
// through the API server as the user whose kubeconfig the console was
// given (it has no privileges of its own) and each behind a confirmation
// and a check against cross-site requests.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/redact"
)

//go:embed assets
var assets embed.FS

//go:embed templates/*.html
var templates embed.FS

// Options configure a Server. Kube or Store may be nil (a console on the
// ledger alone, or on the cluster alone), not both.
type Options struct {
	// Kube acts as the user (their kubeconfig's identity).
	Kube client.WithWatch
	// Namespace the console lists and watches the runs of ("" for all).
	Namespace string
	// Store reads the ledger database with the user's connection string.
	Store *ledger.Store
	// Secrets masks the connection string in whatever reaches a page or
	// the log.
	Secrets *redact.Redactor
	Log     *slog.Logger
	// Since: how far back the runs of a console on the ledger alone go.
	Since time.Duration
}

// Server is the console's HTTP handler.
type Server struct {
	o     Options
	token string
	watch *runWatch
	// schedules is the schedules' informer, started by the first stream
	// that follows them (wantSchedules closed): a console whose user looks
	// at runs alone watches no schedules.
	schedules     *watched
	schedulesOnce sync.Once
	wantSchedules chan struct{}
	tmpl          map[string]*template.Template
	mux           *http.ServeMux
	// hosts are the Host headers accepted (the loopback address served,
	// by IP and as localhost): any other is a DNS rebinding's.
	hosts map[string]bool
}

// New builds the console's handler for the listener at addr (its actual
// address, port included). Start it with Run.
func New(o Options, addr net.Addr) (*Server, error) {
	if o.Kube == nil && o.Store == nil {
		return nil, errors.New("the console needs a cluster (a kubeconfig) or a ledger database (a connection string), or both")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Secrets == nil {
		o.Secrets = redact.New("")
	}
	if o.Since <= 0 {
		o.Since = 7 * 24 * time.Hour
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("the console's token: %w", err)
	}
	s := &Server{o: o, token: base64.RawURLEncoding.EncodeToString(b), hosts: allowedHosts(addr), wantSchedules: make(chan struct{})}
	if err := s.parseTemplates(); err != nil {
		return nil, err
	}
	if o.Kube != nil {
		s.watch = newRunWatch(o.Kube, o.Namespace)
		s.schedules = newScheduleWatch(o.Kube, o.Namespace)
	}
	s.routes()
	return s, nil
}

// allowedHosts are the Host headers of addr: its IP and port, and
// localhost with its port.
func allowedHosts(addr net.Addr) map[string]bool {
	hosts := map[string]bool{}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return hosts
	}
	hosts[net.JoinHostPort(host, port)] = true
	hosts["localhost:"+port] = true
	return hosts
}

// Run runs the runs' informer, and the schedules' once a page follows
// them, until ctx ends.
func (s *Server) Run(ctx context.Context) {
	if s.watch == nil {
		return
	}
	go func() {
		select {
		case <-s.wantSchedules:
			s.schedules.informer.RunWithContext(ctx)
		case <-ctx.Done():
		}
	}()
	s.watch.informer.RunWithContext(ctx)
}

func (s *Server) routes() {
	static, _ := fs.Sub(assets, "assets")
	m := http.NewServeMux()
	m.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(static)))
	m.HandleFunc("GET /{$}", s.runsPage)
	m.HandleFunc("GET /events", s.events)
	m.HandleFunc("GET /runs/{namespace}/{name}", s.runPage)
	m.HandleFunc("GET /runs/{namespace}/{name}/live", s.runLive)
	m.HandleFunc("GET /runs/{namespace}/{name}/confirm/{action}", s.confirmPage)
	m.HandleFunc("POST /runs/{namespace}/{name}/{action}", s.act)
	m.HandleFunc("GET /key", s.keyPage)
	m.HandleFunc("GET /schedules", s.schedulesPage)
	m.HandleFunc("GET /schedules/live", s.schedulesLive)
	m.HandleFunc("GET /schedules/{namespace}/{name}", s.schedulePage)
	m.HandleFunc("GET /schedules/{namespace}/{name}/live", s.scheduleLive)
	m.HandleFunc("GET /schedules/{namespace}/{name}/confirm/{action}", s.scheduleConfirmPage)
	m.HandleFunc("POST /schedules/{namespace}/{name}/{action}", s.scheduleAct)
	s.mux = m
}

// ServeHTTP refuses a request whose Host is not the console's own (DNS
// rebinding: another site's name resolving to 127.0.0.1), and a
// state-changing one that is not from the console's own pages (its token,
// its Origin), then serves it with headers that keep the pages to
// themselves.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: under no-referrer a form's POST says
	// Origin: null, which sameOrigin refuses.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if !s.hosts[r.Host] {
		http.Error(w, "refused: the console answers only at its own loopback address, not at host "+r.Host, http.StatusMisdirectedRequest)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := s.sameOrigin(r); err != nil {
			s.o.Log.Warn("refused a request", "method", r.Method, "path", r.URL.Path, "reason", err.Error())
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, "refused: %v\n", err)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// sameOrigin checks a state-changing request came from one of the
// console's pages: an Origin (or, without one, a Referer) of the console's
// own address, no cross-site Sec-Fetch-Site, and the process's token.
func (s *Server) sameOrigin(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return fmt.Errorf("a %s request", site)
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		origin = r.Header.Get("Referer")
	}
	if origin == "" {
		return errors.New("no Origin or Referer")
	}
	u, err := url.Parse(origin)
	if err != nil || u.Scheme != "http" || !s.hosts[u.Host] {
		return fmt.Errorf("from origin %q, not the console's", origin)
	}
	if err := r.ParseForm(); err != nil {
		return fmt.Errorf("the form: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(s.token)) != 1 {
		return errors.New("no valid token (reload the console's page)")
	}
	return nil
}

// events streams the runs of namespace (the query's, else all the console
// watches) as Server-Sent Events: the list now, then again at every
// change the watch sees.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	if s.watch == nil {
		http.Error(w, "no cluster: the console reads the ledger alone, which it does not watch", http.StatusNotFound)
		return
	}
	flusher, ok := startStream(w)
	if !ok {
		return
	}
	ns := r.URL.Query().Get("namespace")
	heartbeat := time.NewTicker(20 * time.Second)
	defer heartbeat.Stop()
	for {
		runs, changed, err := s.watch.state()
		msg := struct {
			Runs  []runRow `json:"runs"`
			Error string   `json:"error,omitempty"`
		}{Runs: rows(runs, ns, time.Now())}
		if err != nil {
			msg.Error = s.shown(err)
		}
		if !send(w, flusher, "runs", msg) || !s.await(r.Context(), w, flusher, changed, heartbeat.C) {
			return
		}
	}
}

// coalesce is how long a stream waits after a change for more, so that a
// burst of status updates (many shards reporting) is sent once.
const coalesce = 200 * time.Millisecond

// await waits for changed (and coalesce more), sending a comment at each
// heartbeat to keep the stream open; false when the request ended or its
// writer failed.
func (s *Server) await(ctx context.Context, w http.ResponseWriter, flusher http.Flusher, changed <-chan struct{}, heartbeat <-chan time.Time) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-changed:
			select {
			case <-ctx.Done():
				return false
			case <-time.After(coalesce):
				return true
			}
		case <-heartbeat:
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return false
			}
			flusher.Flush()
		}
	}
}

// shown is err's text as a page may show it: the connection string
// masked.
func (s *Server) shown(err error) string {
	return s.o.Secrets.String(strings.TrimSpace(err.Error()))
}

package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// pageSize is how many items a page of a run's items table shows.
const pageSize = 50

func (s *Server) parseTemplates() error {
	funcs := template.FuncMap{
		"time": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"mtime": func(t metav1.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format(time.RFC3339)
		},
		"keyURL": func(k ledger.Key) string {
			return "/key?entity=" + url.QueryEscape(k.Entity) + "&occurrence=" + url.QueryEscape(k.Occurrence)
		},
		"pct":        percent,
		"eventAt":    func(e corev1.Event) string { return eventTime(e).UTC().Format(time.RFC3339) },
		"eventCount": eventCount,
	}
	s.tmpl = map[string]*template.Template{}
	for _, page := range []string{"runs", "run", "key", "confirm", "error", "schedules", "schedule", "sconfirm"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templates, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return fmt.Errorf("the console's template %s: %w", page, err)
		}
		s.tmpl[page] = t
	}
	return nil
}

// page is what every page's layout reads.
type page struct {
	Title     string
	Namespace string
	Cluster   bool
	Ledger    bool
	Token     string
	Data      any
}

func (s *Server) render(w http.ResponseWriter, status int, name, title string, data any) {
	var b bytes.Buffer
	p := page{Title: title, Namespace: s.o.Namespace, Cluster: s.o.Kube != nil, Ledger: s.o.Store != nil, Token: s.token, Data: data}
	if err := s.tmpl[name].Execute(&b, p); err != nil {
		s.o.Log.Error("rendering a page", "page", name, "error", s.shown(err))
		http.Error(w, "rendering the page: "+s.shown(err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail shows err (the API server's message for a refusal of RBAC, with its
// status code) on a page of its own.
func (s *Server) fail(w http.ResponseWriter, what string, err error) {
	status := http.StatusInternalServerError
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Code >= 400 {
		status = int(st.Status().Code)
	}
	if errors.Is(err, errNotFound) {
		status = http.StatusNotFound
	}
	s.o.Log.Info("a request failed", "what", what, "status", status, "error", s.shown(err))
	s.render(w, status, "error", what, struct {
		What, Message string
		Status        int
	}{what, s.shown(err), status})
}

var errNotFound = errors.New("not found")

// runsData is the runs page's.
type runsData struct {
	Filter string
	Rows   []runRow
	Error  string
	Live   bool
}

func (s *Server) runsPage(w http.ResponseWriter, r *http.Request) {
	ns := r.URL.Query().Get("namespace")
	d := runsData{Filter: ns, Rows: []runRow{}}
	if s.watch != nil {
		runs, _, err := s.watch.state()
		d.Rows, d.Live = rows(runs, ns, time.Now()), true
		if err != nil {
			d.Error = s.shown(err)
		}
	} else {
		var err error
		if d.Rows, err = s.ledgerRows(r.Context(), ns); err != nil {
			d.Error = s.shown(err)
		}
	}
	s.render(w, http.StatusOK, "runs", "Runs", d)
}

// ledgerRows are the runs the ledger database knows of namespace ns (all
// for ""), since Options.Since, with what the ledger counts of each
// (completed, failed; not already handled, which needs the batch): a
// console without a cluster (runs of runledger run).
func (s *Server) ledgerRows(ctx context.Context, ns string) ([]runRow, error) {
	if ns == "" {
		ns = s.o.Namespace
	}
	recs, err := s.o.Store.RecentRuns(ctx, ns, time.Now().Add(-s.o.Since))
	if err != nil {
		return nil, err
	}
	out := []runRow{}
	for _, rec := range recs {
		c, err := s.o.Store.RunCounts(ctx, rec.UID)
		if err != nil {
			return nil, err
		}
		out = append(out, runRow{Namespace: rec.Namespace, Name: rec.Name, Total: rec.Items, Completed: c.Completed, Failed: c.Failed,
			Percent: percent(c.Completed+c.Failed, rec.Items), Age: age(time.Since(rec.Created)), Ledger: true})
	}
	return out, nil
}

// The notes a run's page shows after an action sent the browser there
// (a code in the URL, never text from it).
const (
	noteTriggerFound = "trigger-found"
	noteRetryFound   = "retry-found"
)

var notes = map[string]string{
	noteTriggerFound: "The occurrence's run existed already (the schedule, or an earlier trigger, made it): nothing was created; here it is.",
	noteRetryFound:   "This run retries those failed items already (an earlier retry, or a second click): nothing was created; here it is.",
}

// runData is a run's page's.
type runData struct {
	Namespace, Name string
	Note            string
	// LiveURL: the stream of the page's live part ("" for none); Live
	// that part, rendered, and LiveVersion its digest.
	LiveURL     string
	Live        template.HTML
	LiveVersion string
	// Chart: items/s from the samples the console kept of the run.
	Chart       template.HTML
	Run         *v1alpha1.ProcessingRun
	Events      []corev1.Event
	EventsError string
	Finished    bool
	Record      *ledger.RunRecord
	LedgerError string
	Items       itemsPage
	Handled     itemsPage
	// Changed: the items whose payload changed; Classes the failures by
	// class; Proof the run's, when asked.
	Changed      itemsPage
	Classes      []classRow
	ClassesError string
	Proof        proofData
}

// itemsPage is one page of a run's items of one verdict, filtered.
type itemsPage struct {
	Items      []ledger.ItemVerdict
	Query      string
	Offset     int
	Next, Prev int
	More       bool
	Note       string
}

func (s *Server) runPage(w http.ResponseWriter, r *http.Request) {
	d := runData{Namespace: r.PathValue("namespace"), Name: r.PathValue("name"), Note: notes[r.URL.Query().Get("note")]}
	ctx := r.Context()
	uid := ""
	if s.o.Kube != nil {
		run := &v1alpha1.ProcessingRun{}
		err := s.o.Kube.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: d.Name}, run)
		switch {
		case apierrors.IsNotFound(err) && s.o.Store != nil:
		case err != nil:
			s.fail(w, "run "+d.Namespace+"/"+d.Name, err)
			return
		default:
			d.Run, uid, d.Finished, d.LiveURL = run, string(run.UID), finished(run), s.liveURL(d.Namespace, d.Name)
			d.Events, d.EventsError = s.runEvents(ctx, run)
		}
	}
	if s.o.Store != nil {
		d.Record, d.LedgerError = s.record(ctx, d.Namespace, d.Name, uid)
		if d.Record != nil {
			s.ledgerPart(ctx, &d, r.URL.Query())
		}
	}
	if d.Run != nil {
		if s.watch != nil {
			d.Chart = rateChart(s.watch.samplesOf(d.Namespace, d.Name))
		}
		d.Live, d.LiveVersion = s.liveHTML("run", d)
	}
	if d.Run == nil && d.Record == nil {
		s.fail(w, "run "+d.Namespace+"/"+d.Name, fmt.Errorf("run %s/%s: %w in the cluster nor in the ledger database%s", d.Namespace, d.Name, errNotFound, suffix(d.LedgerError)))
		return
	}
	s.render(w, http.StatusOK, "run", d.Namespace+"/"+d.Name, d)
}

func suffix(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func offset(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// finished: the run succeeded or failed (its pods are gone or going).
func finished(run *v1alpha1.ProcessingRun) bool {
	return run.Status.Phase == v1alpha1.RunSucceeded || run.Status.Phase == v1alpha1.RunFailed
}

// runEvents are run's Events, oldest first, or why they could not be read.
func (s *Server) runEvents(ctx context.Context, run *v1alpha1.ProcessingRun) ([]corev1.Event, string) {
	list := &corev1.EventList{}
	if err := s.o.Kube.List(ctx, list, client.InNamespace(run.Namespace), eventSelector(run)); err != nil {
		return nil, s.shown(err)
	}
	sort.SliceStable(list.Items, func(i, j int) bool { return eventTime(list.Items[i]).Before(eventTime(list.Items[j])) })
	return list.Items, ""
}

// record is the ledger's run namespace/name: the one of uid if the ledger
// has it, else the latest of that name.
func (s *Server) record(ctx context.Context, ns, name, uid string) (*ledger.RunRecord, string) {
	recs, err := s.o.Store.FindRuns(ctx, ns, name)
	if err != nil {
		return nil, s.shown(err)
	}
	if len(recs) == 0 {
		return nil, "the ledger database has no run " + ns + "/" + name + " (its first shard has not started)"
	}
	for i := range recs {
		if recs[i].UID == uid {
			return &recs[i], ""
		}
	}
	return &recs[0], ""
}

// ledgerPart reads what a run's page shows of the ledger: its failed,
// already handled and payload-changed items (a page of each), its
// failures by class, and its proof when asked (?proof=1: it reads every
// key of the batch).
func (s *Server) ledgerPart(ctx context.Context, d *runData, q url.Values) {
	rec := *d.Record
	d.Items = s.items(ctx, rec, []ledger.Outcome{ledger.Failed}, matching(q.Get("q")), offset(q.Get("offset")))
	d.Handled = s.items(ctx, rec, []ledger.Outcome{ledger.AlreadyHandled}, matching(q.Get("hq")), offset(q.Get("hoffset")))
	d.Handled.Query = q.Get("hq")
	d.Items.Query = q.Get("q")
	d.Changed = s.items(ctx, rec, []ledger.Outcome{ledger.AlreadyHandled, ledger.Failed}, payloadChanged, offset(q.Get("coffset")))
	classes, err := s.o.Store.FailureClasses(ctx, rec.UID)
	if err != nil {
		d.ClassesError = s.shown(err)
	}
	d.Classes = classesOf(classes)
	if q.Get("proof") != "" {
		d.Proof = s.prove(ctx, rec, d.Run)
	}
}

// classRow is a class of a run's failures, with its share of the most
// frequent one's items (the bar's length).
type classRow struct {
	ledger.ClassCount
	Share int
}

func classesOf(cs []ledger.ClassCount) []classRow {
	out := make([]classRow, 0, len(cs))
	for _, c := range cs {
		out = append(out, classRow{ClassCount: c, Share: percent(c.Items, cs[0].Items)})
	}
	return out
}

// matching keeps the items whose key, class or error holds q
// (case-insensitively).
func matching(q string) func(ledger.ItemVerdict) bool {
	needle := strings.ToLower(q)
	return func(it ledger.ItemVerdict) bool {
		return needle == "" || strings.Contains(strings.ToLower(it.Entity+"\x00"+it.Occurrence+"\x00"+it.Class+"\x00"+it.Error), needle)
	}
}

// payloadChanged keeps the items whose payload changed: already handled
// by a row of another payload, or failed for it (onPayloadChange: Fail).
func payloadChanged(it ledger.ItemVerdict) bool {
	return it.PayloadChanged || it.Outcome == ledger.Failed && it.Class == ledger.ClassPayloadChanged
}

// errEnough stops reading items once a page is full.
var errEnough = errors.New("page full")

// items reads one page of run's items of the outcomes asked that keep
// keeps, from offset on.
func (s *Server) items(ctx context.Context, run ledger.RunRecord, outcomes []ledger.Outcome, keep func(ledger.ItemVerdict) bool, from int) itemsPage {
	p := itemsPage{Offset: from, Items: []ledger.ItemVerdict{}, Prev: max(0, from-pageSize), Next: from + pageSize}
	seen := 0
	err := s.o.Store.RunItems(ctx, run, outcomes, func(it ledger.ItemVerdict) error {
		if !keep(it) {
			return nil
		}
		seen++
		switch {
		case seen <= from:
		case len(p.Items) < pageSize:
			p.Items = append(p.Items, it)
		default:
			p.More = true
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		p.Note = s.shown(err)
	}
	return p
}

func (s *Server) keyPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key := ledger.Key{Entity: q.Get("entity"), Occurrence: q.Get("occurrence")}
	d := struct {
		Key     ledger.Key
		Asked   bool
		History ledger.KeyHistory
		Error   string
	}{Key: key, Asked: key.Entity != "" || key.Occurrence != ""}
	switch {
	case !d.Asked:
	case s.o.Store == nil:
		d.Error = "no ledger database: start the console with $RUNLEDGER_DATABASE_URL or --dsn-file"
	default:
		h, err := s.o.Store.Key(r.Context(), key)
		if err != nil {
			d.Error = s.shown(err)
		}
		d.History = h
	}
	s.render(w, http.StatusOK, "key", "Key", d)
}

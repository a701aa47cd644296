package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// watches: the console's watch covers namespace ns (its live parts
// follow the objects there).
func (s *Server) watches(ns string) bool {
	return s.watch != nil && (s.o.Namespace == "" || s.o.Namespace == ns)
}

// liveURL is the event stream of run ns/name's page, "" when the console
// does not watch its namespace.
func (s *Server) liveURL(ns, name string) string {
	if !s.watches(ns) {
		return ""
	}
	return "/runs/" + ns + "/" + name + "/live"
}

// liveMessage is what a page's event stream sends: the page's live part,
// rendered by the server, and its version; or that its object is gone.
type liveMessage struct {
	HTML    template.HTML `json:"html"`
	Version string        `json:"version"`
	Gone    string        `json:"gone,omitempty"`
}

// startStream sets the headers of an event stream; false (once it
// answered) when w cannot stream.
func startStream(w http.ResponseWriter) (http.Flusher, bool) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return nil, false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	return flusher, true
}

// send sends msg as an event of type event; false when the request ended.
func send(w http.ResponseWriter, flusher http.Flusher, event string, msg any) bool {
	b, _ := json.Marshal(msg)
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return false
	}
	flusher.Flush()
	return true
}

// runLive streams a run's page's live part (status, actions, shards,
// conditions, Events), rendered by the server, as Server-Sent Events: now,
// then at every change of the run (the runs' informer) or of its Events
// (one watch of them for the stream, as kubectl get events --watch would;
// a list at each change of the run when the user may not watch Events).
func (s *Server) runLive(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	if s.liveURL(ns, name) == "" {
		http.Error(w, "the console does not watch namespace "+ns, http.StatusNotFound)
		return
	}
	ctx := r.Context()
	run := awaitObject[v1alpha1.ProcessingRun](ctx, &s.watch.watched, ns, name)
	if run == nil {
		http.Error(w, "no run "+ns+"/"+name+" in the console's watch", http.StatusNotFound)
		return
	}
	flusher, ok := startStream(w)
	if !ok {
		return
	}
	feed := s.watchEvents(ctx, run)
	heartbeat := time.NewTicker(20 * time.Second)
	defer heartbeat.Stop()
	for {
		changed, _ := s.watch.next()
		run := s.watch.run(ns, name)
		msg := liveMessage{Gone: "The run was deleted."}
		if run != nil {
			d := runData{Namespace: run.Namespace, Name: run.Name, Run: run, Finished: finished(run), Chart: rateChart(s.watch.samplesOf(ns, name))}
			d.Events, d.EventsError = feed.list(ctx, s)
			msg = liveMessage{}
			msg.HTML, msg.Version = s.liveHTML("run", d)
		}
		if !send(w, flusher, "live", msg) || run == nil || !s.await(ctx, w, flusher, either(ctx, changed, feed.next()), heartbeat.C) {
			return
		}
	}
}

// liveHTML renders the live part of page's template (its "live"), and its
// version (a digest: the page replaces its live part only when it
// changed, not under the user's pointer for nothing).
func (s *Server) liveHTML(page string, d any) (template.HTML, string) {
	var b bytes.Buffer
	if err := s.tmpl[page].ExecuteTemplate(&b, "live", d); err != nil {
		b.Reset()
		b.WriteString(`<p class="error" role="alert">rendering the page: ` + template.HTMLEscapeString(s.shown(err)) + `</p>`)
	}
	sum := sha256.Sum256(b.Bytes())
	return template.HTML(b.String()), hex.EncodeToString(sum[:8]) //nolint:gosec // html/template's own output
}

// either is a channel closed when a or b is (or ctx ends).
func either(ctx context.Context, a, b <-chan struct{}) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		defer close(out)
		select {
		case <-a:
		case <-b:
		case <-ctx.Done():
		}
	}()
	return out
}

// at is a channel closed at t (never for a zero t), or when ctx ends.
func at(ctx context.Context, t time.Time) <-chan struct{} {
	if t.IsZero() {
		return nil
	}
	out := make(chan struct{})
	go func() {
		defer close(out)
		timer := time.NewTimer(time.Until(t))
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
	}()
	return out
}

// eventFeed holds a run's Events as one watch of them sends them (its
// first events are the Events there are: a watch from no resourceVersion).
// When the watch cannot be opened (RBAC grants list, not watch), list
// reads them at each change instead.
type eventFeed struct {
	mu      sync.Mutex
	events  map[string]corev1.Event
	changed chan struct{}
	err     error // the watch's: nil while it holds the events
	run     *v1alpha1.ProcessingRun
	c       client.WithWatch
}

func (s *Server) watchEvents(ctx context.Context, run *v1alpha1.ProcessingRun) *eventFeed {
	f := &eventFeed{events: map[string]corev1.Event{}, changed: make(chan struct{}), run: run, c: s.o.Kube}
	if rv, err := f.relist(ctx); err == nil {
		go f.loop(ctx, rv)
	}
	return f
}

// eventSelector selects run's Events.
func eventSelector(run *v1alpha1.ProcessingRun) client.MatchingFieldsSelector {
	return client.MatchingFieldsSelector{Selector: fields.SelectorFromSet(fields.Set{"involvedObject.name": run.Name, "involvedObject.uid": string(run.UID)})}
}

// relist reads the run's Events into the feed and returns the list's
// resourceVersion, which the watch starts from (as a reflector does).
func (f *eventFeed) relist(ctx context.Context) (string, error) {
	list := &corev1.EventList{}
	err := f.c.List(ctx, list, client.InNamespace(f.run.Namespace), eventSelector(f.run))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
	if err != nil {
		return "", err
	}
	f.events = map[string]corev1.Event{}
	for _, e := range list.Items {
		f.events[e.Name] = e
	}
	close(f.changed)
	f.changed = make(chan struct{})
	return list.ResourceVersion, nil
}

// loop watches the run's Events from resourceVersion rv, lists them again
// when the API server ends a watch and watches on, until ctx ends or the
// watch is refused (then list reads them at each change of the run).
func (f *eventFeed) loop(ctx context.Context, rv string) {
	for ctx.Err() == nil {
		wi, err := f.c.Watch(ctx, &corev1.EventList{}, client.InNamespace(f.run.Namespace), eventSelector(f.run),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			f.mu.Lock()
			f.err = err
			f.mu.Unlock()
			return
		}
		f.consume(ctx, wi)
		wi.Stop()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second): // no harder than a reflector watches again
		}
		if rv, err = f.relist(ctx); err != nil {
			return
		}
	}
}

func (f *eventFeed) consume(ctx context.Context, wi watch.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return
			}
			e, isEvent := ev.Object.(*corev1.Event)
			if !isEvent {
				continue
			}
			f.mu.Lock()
			if ev.Type == watch.Deleted {
				delete(f.events, e.Name)
			} else {
				f.events[e.Name] = *e
			}
			close(f.changed)
			f.changed = make(chan struct{})
			f.mu.Unlock()
		}
	}
}

// next is closed at the Events' next change.
func (f *eventFeed) next() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// list is the run's Events, oldest first: the watch's, else a list's.
func (f *eventFeed) list(ctx context.Context, s *Server) ([]corev1.Event, string) {
	f.mu.Lock()
	err := f.err
	out := make([]corev1.Event, 0, len(f.events))
	for _, e := range f.events {
		out = append(out, e)
	}
	f.mu.Unlock()
	if err != nil {
		return s.runEvents(ctx, f.run)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	sort.SliceStable(out, func(i, j int) bool { return eventTime(out[i]).Before(eventTime(out[j])) })
	return out, ""
}

// eventTime is when e was last seen: an Event of events.k8s.io/v1 (the
// controller's recorder) has only its eventTime and series set.
func eventTime(e corev1.Event) time.Time {
	if e.Series != nil && !e.Series.LastObservedTime.IsZero() {
		return e.Series.LastObservedTime.Time
	}
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	if !e.FirstTimestamp.IsZero() {
		return e.FirstTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// eventCount is how many times e occurred, as kubectl get events counts
// an Event of events.k8s.io/v1 (its series', else once).
func eventCount(e corev1.Event) int32 {
	if e.Series != nil {
		return e.Series.Count
	}
	return max(e.Count, 1)
}

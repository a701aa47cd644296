package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/schedule"
	"github.com/runledger/runledger/internal/schedule/manualrun"
)

// nextTicks is how many of a schedule's next ticks its page lists.
const nextTicks = 5

// maxBackfill bounds the runs one backfill creates (runledger schedule
// backfill's bound).
const maxBackfill = 1000

// scheduleRow is one line of the schedules page.
type scheduleRow struct {
	Namespace, Name, Schedule, Zone string
	Suspended                       bool
	Active                          int32
	Missed                          int64
	Next, NextOccurrence            string
	LastRun                         string
}

// schedulesData is the schedules page's; its live part the table.
type schedulesData struct {
	Filter      string
	Rows        []scheduleRow
	Error       string
	LiveURL     string
	Live        template.HTML
	LiveVersion string
}

// newScheduleWatch holds the schedules of namespace ("" for all) as runWatch
// holds the runs.
func newScheduleWatch(c client.WithWatch, namespace string) *watched {
	w := &watched{}
	w.init(c, namespace, func() client.ObjectList { return &v1alpha1.ProcessingScheduleList{} }, &v1alpha1.ProcessingSchedule{}, nil)
	return w
}

// scheduleWatch is the schedules' informer, started now if it was not.
func (s *Server) scheduleWatch() *watched {
	s.schedulesOnce.Do(func() { close(s.wantSchedules) })
	return s.schedules
}

// schedulesNamespace is the namespace the schedules page of r lists: its
// filter's, else the console's ("" for all).
func (s *Server) schedulesNamespace(r *http.Request) string {
	if ns := r.URL.Query().Get("namespace"); ns != "" {
		return ns
	}
	return s.o.Namespace
}

// scheduleRows are the schedules' lines, by namespace and name.
func scheduleRows(scs []*v1alpha1.ProcessingSchedule) []scheduleRow {
	out := []scheduleRow{}
	for _, sc := range scs {
		st := sc.Status
		row := scheduleRow{Namespace: sc.Namespace, Name: sc.Name, Schedule: sc.Spec.Schedule, Zone: sc.Spec.TimeZoneName(),
			Suspended: sc.Spec.Suspend, Active: st.ActiveCount, Missed: st.MissedTicks, NextOccurrence: st.NextOccurrence}
		if st.NextScheduleTime != nil {
			row.Next = st.NextScheduleTime.UTC().Format(time.RFC3339)
		}
		if st.LastRun != nil {
			row.LastRun = st.LastRun.Name
		}
		out = append(out, row)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// schedulesPage lists the schedules as the API server lists them now; its
// table then follows the schedules' watch (schedulesLive) when the console
// watches their namespace.
func (s *Server) schedulesPage(w http.ResponseWriter, r *http.Request) {
	if s.o.Kube == nil {
		s.fail(w, "schedules", fmt.Errorf("schedules: %w (they need a cluster)", errNotFound))
		return
	}
	ns := s.schedulesNamespace(r)
	d := schedulesData{Filter: r.URL.Query().Get("namespace"), Rows: []scheduleRow{}}
	list := &v1alpha1.ProcessingScheduleList{}
	if err := s.o.Kube.List(r.Context(), list, client.InNamespace(ns)); err != nil {
		d.Error = s.shown(err)
	}
	scs := make([]*v1alpha1.ProcessingSchedule, 0, len(list.Items))
	for i := range list.Items {
		scs = append(scs, &list.Items[i])
	}
	d.Rows = scheduleRows(scs)
	if s.watches(ns) {
		d.LiveURL = "/schedules/live?namespace=" + url.QueryEscape(d.Filter)
	}
	d.Live, d.LiveVersion = s.liveHTML("schedules", d)
	s.render(w, http.StatusOK, "schedules", "Schedules", d)
}

// schedulesLive streams the schedules page's table as Server-Sent Events:
// now, then at every change the schedules' watch sees.
func (s *Server) schedulesLive(w http.ResponseWriter, r *http.Request) {
	ns := s.schedulesNamespace(r)
	if !s.watches(ns) {
		http.Error(w, "the console does not watch namespace "+ns, http.StatusNotFound)
		return
	}
	flusher, ok := startStream(w)
	if !ok {
		return
	}
	ctx := r.Context()
	sw := s.scheduleWatch()
	if sw.ready(ctx) != nil && ctx.Err() != nil {
		return // a refusal is shown with the table
	}
	heartbeat := time.NewTicker(20 * time.Second)
	defer heartbeat.Stop()
	for {
		changed, err := sw.next()
		var scs []*v1alpha1.ProcessingSchedule
		for _, sc := range objects[v1alpha1.ProcessingSchedule](sw) {
			if ns == "" || sc.Namespace == ns {
				scs = append(scs, sc)
			}
		}
		d := schedulesData{Rows: scheduleRows(scs)}
		if err != nil {
			d.Error = s.shown(err)
		}
		var msg liveMessage
		msg.HTML, msg.Version = s.liveHTML("schedules", d)
		if !send(w, flusher, "live", msg) || !s.await(ctx, w, flusher, changed, heartbeat.C) {
			return
		}
	}
}

// occurrenceRun is one run of a schedule, by its occurrence.
type occurrenceRun struct {
	Occurrence, Name, Phase, CreatedBy, Created string
	Counts                                      v1alpha1.ItemCounts
	Percent                                     int
}

// scheduleData is a schedule's page's; all but Note and the forms its live
// part.
type scheduleData struct {
	Sched     *v1alpha1.ProcessingSchedule
	Zone      string
	Problem   string // the spec cannot be read (the Stalled condition's reason)
	Next      []schedule.Tick
	Trigger   schedule.Tick // the occurrence a trigger now starts
	Runs      []occurrenceRun
	RunsError string
	Note      string
	// LiveURL: the stream of the page's live part ("" for none); Live
	// that part, rendered, and LiveVersion its digest.
	LiveURL     string
	Live        template.HTML
	LiveVersion string
}

// getSchedule reads the request's schedule.
func (s *Server) getSchedule(ctx context.Context, r *http.Request) (*v1alpha1.ProcessingSchedule, error) {
	if s.o.Kube == nil {
		return nil, fmt.Errorf("schedules: %w (they need a cluster)", errNotFound)
	}
	sc := &v1alpha1.ProcessingSchedule{}
	err := s.o.Kube.Get(ctx, types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}, sc)
	return sc, err
}

// scheduleView is what a schedule's page shows of sc and its runs (those
// labelled with it) at now.
func (s *Server) scheduleView(sc *v1alpha1.ProcessingSchedule, runs []*v1alpha1.ProcessingRun, runsErr error, now time.Time) scheduleData {
	d := scheduleData{Sched: sc, Zone: sc.Spec.TimeZoneName(), Runs: occurrenceRuns(runs)}
	if runsErr != nil {
		d.RunsError = s.shown(runsErr)
	}
	if p, err := schedule.Parse(sc.Name, &sc.Spec); err != nil {
		d.Problem = s.shown(err)
	} else {
		w := p.WallOf(now)
		for len(d.Next) < nextTicks {
			t, ok := p.NextAfter(w)
			if !ok {
				break
			}
			d.Next, w = append(d.Next, t), t.Wall
		}
		d.Trigger = p.TriggerTick(now)
	}
	return d
}

// schedulePage shows a schedule and its runs as the API server has them
// now; its live part then follows the schedules' and the runs' watches
// (scheduleLive) when the console watches its namespace.
func (s *Server) schedulePage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sc, err := s.getSchedule(ctx, r)
	if err != nil {
		s.fail(w, "schedule "+r.PathValue("namespace")+"/"+r.PathValue("name"), err)
		return
	}
	runs, err := s.scheduleRuns(ctx, sc)
	d := s.scheduleView(sc, runs, err, time.Now())
	if q := r.URL.Query(); q.Has("created") {
		d.Note = fmt.Sprintf("Backfill: %d runs created, %d found (they existed).", offset(q.Get("created")), offset(q.Get("found")))
	}
	if s.watches(sc.Namespace) {
		d.LiveURL = "/schedules/" + sc.Namespace + "/" + sc.Name + "/live"
	}
	d.Live, d.LiveVersion = s.liveHTML("schedule", d)
	s.render(w, http.StatusOK, "schedule", "Schedule "+sc.Namespace+"/"+sc.Name, d)
}

// scheduleLive streams a schedule's page's live part (status, suspend or
// resume, next and missed ticks, the run of each occurrence), rendered by
// the server, as Server-Sent Events: now, then at every change of the
// schedule (the schedules' watch) or of the runs (the runs' watch), and
// when its next tick falls due.
func (s *Server) scheduleLive(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	if !s.watches(ns) {
		http.Error(w, "the console does not watch namespace "+ns, http.StatusNotFound)
		return
	}
	ctx := r.Context()
	sw := s.scheduleWatch()
	for _, wt := range []*watched{sw, &s.watch.watched} {
		if err := wt.ready(ctx); err != nil {
			http.Error(w, "the console's watch: "+s.shown(err), http.StatusServiceUnavailable)
			return
		}
	}
	if awaitObject[v1alpha1.ProcessingSchedule](ctx, sw, ns, name) == nil {
		http.Error(w, "no schedule "+ns+"/"+name+" in the console's watch", http.StatusNotFound)
		return
	}
	flusher, ok := startStream(w)
	if !ok {
		return
	}
	heartbeat := time.NewTicker(20 * time.Second)
	defer heartbeat.Stop()
	for {
		// wait ends with the iteration: its goroutines and timer with it.
		wait, done := context.WithCancel(ctx)
		scChanged, _ := sw.next()
		runsChanged, runsErr := s.watch.next()
		sc := object[v1alpha1.ProcessingSchedule](sw, ns, name)
		msg := liveMessage{Gone: "The schedule was deleted."}
		var due <-chan struct{}
		if sc != nil {
			d := s.scheduleView(sc, s.watch.ofSchedule(sc), runsErr, time.Now())
			msg = liveMessage{}
			msg.HTML, msg.Version = s.liveHTML("schedule", d)
			if len(d.Next) > 0 {
				due = at(wait, d.Next[0].Time)
			}
		}
		ok := send(w, flusher, "live", msg) && sc != nil &&
			s.await(ctx, w, flusher, either(wait, either(wait, scChanged, runsChanged), due), heartbeat.C)
		done()
		if !ok {
			return
		}
	}
}

// scheduleRuns are the runs labelled with schedule sc, as the API server
// lists them.
func (s *Server) scheduleRuns(ctx context.Context, sc *v1alpha1.ProcessingSchedule) ([]*v1alpha1.ProcessingRun, error) {
	list := &v1alpha1.ProcessingRunList{}
	if err := s.o.Kube.List(ctx, list, client.InNamespace(sc.Namespace), client.MatchingLabels{v1alpha1.LabelSchedule: sc.Name}); err != nil {
		return nil, err
	}
	runs := make([]*v1alpha1.ProcessingRun, 0, len(list.Items))
	for i := range list.Items {
		runs = append(runs, &list.Items[i])
	}
	return runs, nil
}

// ofSchedule are the runs the watch holds labelled with schedule sc.
func (w *runWatch) ofSchedule(sc *v1alpha1.ProcessingSchedule) []*v1alpha1.ProcessingRun {
	var out []*v1alpha1.ProcessingRun
	for _, run := range objects[v1alpha1.ProcessingRun](&w.watched) {
		if run.Namespace == sc.Namespace && run.Labels[v1alpha1.LabelSchedule] == sc.Name {
			out = append(out, run)
		}
	}
	return out
}

// occurrenceRuns are a schedule's runs by occurrence, the latest first.
func occurrenceRuns(runs []*v1alpha1.ProcessingRun) []occurrenceRun {
	out := []occurrenceRun{}
	for _, run := range runs {
		phase := string(run.Status.Phase)
		if phase == "" {
			phase = "Pending"
		}
		out = append(out, occurrenceRun{Occurrence: run.Spec.Occurrence, Name: run.Name, Phase: phase,
			CreatedBy: run.Annotations[v1alpha1.AnnotationCreatedBy], Created: run.CreationTimestamp.UTC().Format(time.RFC3339),
			Counts: run.Status.ItemCounts, Percent: percent(run.Status.Processed(), run.Status.Total)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Occurrence != out[j].Occurrence {
			return out[i].Occurrence > out[j].Occurrence
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// scheduleAction is what the console may do to a schedule, as the user.
type scheduleAction struct {
	Name, Verb string
}

var scheduleActions = map[string]scheduleAction{
	"trigger":  {Name: "trigger", Verb: "Trigger"},
	"backfill": {Name: "backfill", Verb: "Backfill"},
	"suspend":  {Name: "suspend", Verb: "Suspend"},
	"resume":   {Name: "resume", Verb: "Resume"},
}

// planned is the runs a trigger or backfill creates: the ticks, or why
// it cannot (bad input, shown as a 400).
func planned(sc *v1alpha1.ProcessingSchedule, a string, form url.Values) ([]schedule.Tick, error) {
	p, err := schedule.Parse(sc.Name, &sc.Spec)
	if err != nil {
		return nil, err
	}
	switch a {
	case "trigger":
		occ := form.Get("occurrence")
		if occ == "" {
			return []schedule.Tick{p.TriggerTick(time.Now())}, nil
		}
		if msg := v1alpha1.KeyPartProblem(occ); msg != "" {
			return nil, fmt.Errorf("occurrence %s", msg)
		}
		// The current minute's tick, confirmed: its scheduled time too (as
		// runledger schedule trigger records it), if it is that occurrence's.
		if at, err := time.Parse(time.RFC3339, form.Get("at")); err == nil {
			if t := p.TickAt(p.WallOf(at)); t.Occurrence == occ && t.Time.Equal(at) {
				return []schedule.Tick{t}, nil
			}
		}
		return []schedule.Tick{{Occurrence: occ, RunName: schedule.RunName(sc.Name, occ)}}, nil
	case "backfill":
		from, err := p.ParseWall(form.Get("from"))
		if err != nil {
			return nil, fmt.Errorf("from: %w", err)
		}
		to, err := p.ParseWall(form.Get("to"))
		if err != nil {
			return nil, fmt.Errorf("to: %w", err)
		}
		return p.Backfill(sc.Spec.Schedule, from, to, maxBackfill)
	}
	return nil, nil
}

// scheduleConfirm is a schedule action's confirmation page's.
type scheduleConfirm struct {
	Sched    *v1alpha1.ProcessingSchedule
	Action   scheduleAction
	Ticks    []schedule.Tick
	Question string
	// Form: the values the confirmation posts again (the occurrence, the
	// range), so that what is done is what was confirmed.
	Form map[string]string
}

// scheduleActionOf is the request's schedule action and schedule, or false
// once it answered.
func (s *Server) scheduleActionOf(w http.ResponseWriter, r *http.Request) (scheduleAction, *v1alpha1.ProcessingSchedule, bool) {
	what := "schedule " + r.PathValue("namespace") + "/" + r.PathValue("name")
	a, ok := scheduleActions[r.PathValue("action")]
	if !ok {
		s.fail(w, what, fmt.Errorf("action %q: %w", r.PathValue("action"), errNotFound))
		return a, nil, false
	}
	sc, err := s.getSchedule(r.Context(), r)
	if err != nil {
		s.fail(w, a.Verb+" "+what, err)
		return a, nil, false
	}
	return a, sc, true
}

func (s *Server) scheduleConfirmPage(w http.ResponseWriter, r *http.Request) {
	a, sc, ok := s.scheduleActionOf(w, r)
	if !ok {
		return
	}
	d := scheduleConfirm{Sched: sc, Action: a, Form: map[string]string{}}
	id := sc.Namespace + "/" + sc.Name
	switch a.Name {
	case "trigger", "backfill":
		ticks, err := planned(sc, a.Name, r.URL.Query())
		if err != nil {
			s.fail(w, a.Verb+" "+id, apierrors.NewBadRequest(err.Error()))
			return
		}
		d.Ticks = ticks
		if a.Name == "trigger" {
			d.Form["occurrence"] = ticks[0].Occurrence
			if !ticks[0].Time.IsZero() {
				d.Form["at"] = ticks[0].Time.UTC().Format(time.RFC3339)
			}
			d.Question = fmt.Sprintf("Create the run of occurrence %s of %s now, as the schedule would (found, not duplicated, if it exists)?", ticks[0].Occurrence, id)
		} else {
			d.Form["from"], d.Form["to"] = r.URL.Query().Get("from"), r.URL.Query().Get("to")
			d.Question = fmt.Sprintf("Create the runs of these %d occurrences of %s (those that exist are found, not duplicated), whatever catchUp, concurrencyPolicy and suspend say?", len(ticks), id)
		}
	case "suspend":
		d.Question = fmt.Sprintf("Suspend %s (spec.suspend: true)? Its ticks start no run while it is suspended: they are counted missed and never run later.", id)
	case "resume":
		d.Question = fmt.Sprintf("Resume %s (spec.suspend: false)?", id)
	}
	s.render(w, http.StatusOK, "sconfirm", a.Verb+" "+id, d)
}

// scheduleAct does a confirmed schedule action (ServeHTTP checked its
// origin and token), as runledger schedule trigger and backfill do, and
// sends the browser on: to the run a trigger created or found, else to the
// schedule's page with a note.
func (s *Server) scheduleAct(w http.ResponseWriter, r *http.Request) {
	a, sc, ok := s.scheduleActionOf(w, r)
	if !ok {
		return
	}
	what := a.Verb + " " + sc.Namespace + "/" + sc.Name
	back := "/schedules/" + sc.Namespace + "/" + sc.Name
	switch a.Name {
	case "suspend", "resume":
		patch := fmt.Appendf(nil, `{"metadata":{"uid":%q},"spec":{"suspend":%t}}`, sc.UID, a.Name == "suspend")
		if err := s.o.Kube.Patch(r.Context(), sc, client.RawPatch(types.MergePatchType, patch)); err != nil {
			s.fail(w, what, fmt.Errorf("setting spec.suspend of %s/%s: %w", sc.Namespace, sc.Name, err))
			return
		}
		http.Redirect(w, r, back, http.StatusSeeOther)
		return
	}
	ticks, err := planned(sc, a.Name, r.PostForm)
	if err != nil {
		s.fail(w, what, apierrors.NewBadRequest(err.Error()))
		return
	}
	by := schedule.CreatedByTrigger
	if a.Name == "backfill" {
		by = schedule.CreatedByBackfill
	}
	created, found := 0, 0
	name := ""
	for _, t := range ticks {
		n, made, err := manualrun.Create(r.Context(), s.o.Kube, sc, t.Occurrence, t.Time, by)
		if err != nil {
			if errors.Is(err, manualrun.ErrNameTaken) {
				err = apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("processingruns").GroupResource(), n, err)
			}
			s.fail(w, what, fmt.Errorf("%d created, %d found before: %w", created, found, err))
			return
		}
		if made {
			created++
		} else {
			found++
		}
		name = n
	}
	s.o.Log.Info("action done", "action", a.Name, "schedule", sc.Namespace+"/"+sc.Name, "created", created, "found", found)
	if a.Name == "trigger" {
		target := "/runs/" + sc.Namespace + "/" + name
		if found > 0 {
			target += "?note=" + noteTriggerFound
		}
		http.Redirect(w, r, target, http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, fmt.Sprintf("%s?created=%d&found=%d", back, created, found), http.StatusSeeOther)
}

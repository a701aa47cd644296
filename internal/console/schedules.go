package console

import (
	"context"
	"errors"
	"fmt"
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

func (s *Server) schedulesPage(w http.ResponseWriter, r *http.Request) {
	if s.o.Kube == nil {
		s.fail(w, "schedules", fmt.Errorf("schedules: %w (they need a cluster)", errNotFound))
		return
	}
	ns := r.URL.Query().Get("namespace")
	if ns == "" {
		ns = s.o.Namespace
	}
	d := struct {
		Filter string
		Rows   []scheduleRow
		Error  string
	}{Filter: r.URL.Query().Get("namespace"), Rows: []scheduleRow{}}
	list := &v1alpha1.ProcessingScheduleList{}
	if err := s.o.Kube.List(r.Context(), list, client.InNamespace(ns)); err != nil {
		d.Error = s.shown(err)
	}
	for _, sc := range list.Items {
		st := sc.Status
		row := scheduleRow{Namespace: sc.Namespace, Name: sc.Name, Schedule: sc.Spec.Schedule, Zone: sc.Spec.TimeZoneName(),
			Suspended: sc.Spec.Suspend, Active: st.ActiveCount, Missed: st.MissedTicks, NextOccurrence: st.NextOccurrence}
		if st.NextScheduleTime != nil {
			row.Next = st.NextScheduleTime.UTC().Format(time.RFC3339)
		}
		if st.LastRun != nil {
			row.LastRun = st.LastRun.Name
		}
		d.Rows = append(d.Rows, row)
	}
	s.render(w, http.StatusOK, "schedules", "Schedules", d)
}

// occurrenceRun is one run of a schedule, by its occurrence.
type occurrenceRun struct {
	Occurrence, Name, Phase, CreatedBy, Created string
	Counts                                      v1alpha1.ItemCounts
	Percent                                     int
}

// scheduleData is a schedule's page's.
type scheduleData struct {
	Sched     *v1alpha1.ProcessingSchedule
	Zone      string
	Problem   string // the spec cannot be read (the Stalled condition's reason)
	Next      []schedule.Tick
	Trigger   schedule.Tick // the occurrence a trigger now starts
	Runs      []occurrenceRun
	RunsError string
	Note      string
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

func (s *Server) schedulePage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sc, err := s.getSchedule(ctx, r)
	if err != nil {
		s.fail(w, "schedule "+r.PathValue("namespace")+"/"+r.PathValue("name"), err)
		return
	}
	d := scheduleData{Sched: sc, Zone: sc.Spec.TimeZoneName(), Runs: []occurrenceRun{}}
	if q := r.URL.Query(); q.Has("created") {
		d.Note = fmt.Sprintf("Backfill: %d runs created, %d found (they existed).", offset(q.Get("created")), offset(q.Get("found")))
	}
	if p, err := schedule.Parse(sc.Name, &sc.Spec); err != nil {
		d.Problem = s.shown(err)
	} else {
		now := time.Now()
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
	d.Runs, d.RunsError = s.scheduleRuns(ctx, sc)
	s.render(w, http.StatusOK, "schedule", "Schedule "+sc.Namespace+"/"+sc.Name, d)
}

// scheduleRuns are the runs labelled with schedule sc, the latest
// occurrence first.
func (s *Server) scheduleRuns(ctx context.Context, sc *v1alpha1.ProcessingSchedule) ([]occurrenceRun, string) {
	list := &v1alpha1.ProcessingRunList{}
	if err := s.o.Kube.List(ctx, list, client.InNamespace(sc.Namespace), client.MatchingLabels{v1alpha1.LabelSchedule: sc.Name}); err != nil {
		return []occurrenceRun{}, s.shown(err)
	}
	out := []occurrenceRun{}
	for _, run := range list.Items {
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
	return out, ""
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

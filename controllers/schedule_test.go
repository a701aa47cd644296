package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/schedule"
)

// startScheduleManager runs a manager with only the schedule reconciler on
// the fake clock (runs' statuses are the test's to write).
func startScheduleManager(t *testing.T, env *envtestutil.Env, ns, name string, clk *clocktesting.FakeClock) func() {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.UserAgent = name
	cacheOpts := CacheOptions()
	cacheOpts.DefaultNamespaces = map[string]cache.Config{ns: {}}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: env.Scheme, Cache: cacheOpts,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
		Logger:     testLogger().WithName(name),
	})
	require.NoError(t, err)
	r := &ScheduleReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("runledger-controller"), Clock: clk, MaxRunsPerPass: 5}
	require.NoError(t, r.SetupWithManager(mgr, controller.Options{}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager %s: %v", name, err)
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// newSchedule is an hourly schedule of a two-item inline batch whose
// occurrence is the tick's.
func newSchedule(ns, name string, mutate func(*v1alpha1.ProcessingScheduleSpec)) *v1alpha1.ProcessingSchedule {
	s := &v1alpha1.ProcessingSchedule{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProcessingScheduleSpec{
			Schedule: "0 * * * *",
			RunTemplate: v1alpha1.RunTemplate{
				Metadata: &v1alpha1.RunTemplateMetadata{Labels: map[string]string{"team": "billing"}},
				Spec: v1alpha1.ProcessingRunSpec{
					Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: testSecret, Key: "dsn"}},
					Batch: v1alpha1.BatchSpec{Items: []v1alpha1.Item{
						{Entity: "acct-1", Occurrence: v1alpha1.OccurrencePlaceholder},
						{Entity: "acct-2", Occurrence: v1alpha1.OccurrencePlaceholder},
					}},
				},
			},
		},
	}
	if mutate != nil {
		mutate(&s.Spec)
	}
	return s
}

// scheduleFixture: a schedule created now and a fake clock at its creation.
type scheduleFixture struct {
	env   *envtestutil.Env
	ns    string
	name  string
	clock *clocktesting.FakeClock
	// hour is the first top of the hour after the schedule's creation.
	hour time.Time
}

func newScheduleFixture(t *testing.T, name string, mutate func(*v1alpha1.ProcessingScheduleSpec)) *scheduleFixture {
	t.Helper()
	env, ns := setup(t)
	s := newSchedule(ns, name, mutate)
	require.NoError(t, env.Client.Create(context.Background(), s))
	created := s.CreationTimestamp.Time
	return &scheduleFixture{env: env, ns: ns, name: name, clock: clocktesting.NewFakeClock(created),
		hour: created.Truncate(time.Hour).Add(time.Hour)}
}

// at sets the fake clock and pokes the schedule so that a pass runs.
func (f *scheduleFixture) at(t *testing.T, now time.Time) {
	t.Helper()
	f.clock.SetTime(now)
	f.poke(t)
}

func (f *scheduleFixture) poke(t *testing.T) {
	t.Helper()
	s := f.get(t)
	patch := client.MergeFrom(s.DeepCopy())
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations["test/poke"] = fmt.Sprint(time.Now().UnixNano())
	require.NoError(t, f.env.Client.Patch(context.Background(), s, patch))
}

func (f *scheduleFixture) get(t *testing.T) *v1alpha1.ProcessingSchedule {
	t.Helper()
	s := &v1alpha1.ProcessingSchedule{}
	require.NoError(t, f.env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: f.name}, s))
	return s
}

// runs are the schedule's runs, by name.
func (f *scheduleFixture) runs(t *testing.T) []v1alpha1.ProcessingRun {
	t.Helper()
	var list v1alpha1.ProcessingRunList
	require.NoError(t, f.env.Client.List(context.Background(), &list, client.InNamespace(f.ns),
		client.MatchingLabels{v1alpha1.LabelSchedule: f.name}))
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

func (f *scheduleFixture) runNames(t *testing.T) []string {
	var out []string
	for _, r := range f.runs(t) {
		if r.DeletionTimestamp == nil {
			out = append(out, r.Name)
		}
	}
	return out
}

// waitStatus waits until the schedule's status passes check.
func (f *scheduleFixture) waitStatus(t *testing.T, what string, check func(*v1alpha1.ProcessingScheduleStatus) error) *v1alpha1.ProcessingSchedule {
	t.Helper()
	var s *v1alpha1.ProcessingSchedule
	waitFor(t, what, func() error {
		s = f.get(t)
		return check(&s.Status)
	})
	return s
}

func lastScheduled(want time.Time) func(*v1alpha1.ProcessingScheduleStatus) error {
	return func(st *v1alpha1.ProcessingScheduleStatus) error {
		if st.LastScheduleTime == nil || !st.LastScheduleTime.Time.Equal(want) {
			return fmt.Errorf("lastScheduleTime %v, want %v", st.LastScheduleTime, want)
		}
		return nil
	}
}

// occ is the default occurrence of wall-clock time t (UTC).
func occ(t time.Time) string { return t.UTC().Format(v1alpha1.DefaultOccurrenceFormat) }

func (f *scheduleFixture) runName(t time.Time) string { return schedule.RunName(f.name, occ(t)) }

// finish marks a run Succeeded or Failed, as the run controller would.
func (f *scheduleFixture) finish(t *testing.T, name string, ok bool, at time.Time) {
	t.Helper()
	run := getRun(t, f.env, f.ns, name)
	typ, phase := v1alpha1.ConditionComplete, v1alpha1.RunSucceeded
	if !ok {
		typ, phase = v1alpha1.ConditionFailed, v1alpha1.RunFailed
	}
	run.Status.Phase = phase
	run.Status.CompletionTime = &metav1.Time{Time: at}
	meta.SetStatusCondition(&run.Status.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: string(phase), Message: "test"})
	require.NoError(t, f.env.Client.Status().Update(context.Background(), run))
}

func scheduleEvents(t *testing.T, env *envtestutil.Env, ns, name, reason string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(ns)))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "ProcessingSchedule" && e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

func waitScheduleEvent(t *testing.T, f *scheduleFixture, reason, substr string) {
	t.Helper()
	waitFor(t, "event "+reason+" "+substr, func() error {
		for _, e := range scheduleEvents(t, f.env, f.ns, f.name, reason) {
			if strings.Contains(e.Note, substr) {
				return nil
			}
		}
		return fmt.Errorf("no %s event with %q", reason, substr)
	})
}

// TestScheduleOneRunPerTick: each tick creates its occurrence's run (owned,
// labelled, spec.occurrence set, the template's labels); passes at the same
// time create nothing more; the status says what happened and what is next.
func TestScheduleOneRunPerTick(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "hourly", nil)
	startScheduleManager(t, f.env, f.ns, "sched-a", f.clock)
	st := f.waitStatus(t, "first status", func(st *v1alpha1.ProcessingScheduleStatus) error {
		if st.NextScheduleTime == nil || !st.NextScheduleTime.Time.Equal(f.hour) {
			return fmt.Errorf("next %v, want %v", st.NextScheduleTime, f.hour)
		}
		return nil
	})
	require.Equal(t, "UTC", st.Status.TimeZone, "UTC by default, and said so")
	require.Equal(t, occ(f.hour), st.Status.NextOccurrence)
	require.Empty(t, f.runNames(t), "nothing before the first tick")

	f.at(t, f.hour.Add(time.Second))
	f.waitStatus(t, "first tick", lastScheduled(f.hour))
	runs := f.runs(t)
	require.Len(t, runs, 1)
	run := runs[0]
	require.Equal(t, f.runName(f.hour), run.Name)
	require.Equal(t, occ(f.hour), run.Spec.Occurrence)
	require.Equal(t, "billing", run.Labels["team"])
	require.Equal(t, occ(f.hour), run.Annotations[v1alpha1.AnnotationOccurrence])
	owner := metav1.GetControllerOf(&run)
	require.NotNil(t, owner)
	require.Equal(t, f.get(t).UID, owner.UID)
	waitScheduleEvent(t, f, "RunCreated", run.Name)

	for range 3 {
		f.poke(t)
	}
	f.at(t, f.hour.Add(30*time.Minute))
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, []string{run.Name}, f.runNames(t), "one run per tick")

	f.at(t, f.hour.Add(time.Hour))
	s := f.waitStatus(t, "second tick", lastScheduled(f.hour.Add(time.Hour)))
	require.Equal(t, []string{f.runName(f.hour), f.runName(f.hour.Add(time.Hour))}, f.runNames(t))
	// The pass the new run's watch event starts may read the schedule from
	// before the status write: it finds the run, and says nothing.
	time.Sleep(500 * time.Millisecond)
	for _, e := range scheduleEvents(t, f.env, f.ns, f.name, "RunExists") {
		t.Errorf("one manager, each tick once: no RunExists event, got %q", e.Note)
	}
	require.Equal(t, int32(2), s.Status.ActiveCount)
	require.Zero(t, s.Status.MissedTicks)
	ready := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady)
	require.NotNil(t, ready)
	require.Equal(t, metav1.ConditionTrue, ready.Status)
	require.Equal(t, ReasonScheduled, ready.Reason)
}

// TestScheduleTwoManagersOneRun: two managers (a partition: both think they
// lead) and a restarted one, all at the tick, create one run.
func TestScheduleTwoManagersOneRun(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "twice", nil)
	f.clock.SetTime(f.hour.Add(time.Second))
	startScheduleManager(t, f.env, f.ns, "sched-one", f.clock)
	startScheduleManager(t, f.env, f.ns, "sched-two", f.clock)
	f.poke(t)
	f.waitStatus(t, "the tick", lastScheduled(f.hour))
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, []string{f.runName(f.hour)}, f.runNames(t))

	// A restart at the tick, its status not yet written: set it back.
	stop := startScheduleManager(t, f.env, f.ns, "sched-three", f.clock)
	s := f.get(t)
	s.Status.LastScheduleTime, s.Status.LastScheduleLocalTime = nil, ""
	require.NoError(t, f.env.Client.Status().Update(context.Background(), s))
	f.waitStatus(t, "the tick again", lastScheduled(f.hour))
	stop()
	require.Equal(t, []string{f.runName(f.hour)}, f.runNames(t), "AlreadyExists is this occurrence's run: never a second run")
	waitScheduleEvent(t, f, "RunExists", "already exists")
}

// TestScheduleForbidSkips: under Forbid, a tick while a run is unfinished
// is skipped, recorded as missed and announced; once the run finished, the
// next tick runs.
func TestScheduleForbidSkips(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "forbid", func(s *v1alpha1.ProcessingScheduleSpec) { s.ConcurrencyPolicy = v1alpha1.ConcurrencyForbid })
	startScheduleManager(t, f.env, f.ns, "sched", f.clock)
	f.at(t, f.hour.Add(time.Second))
	f.waitStatus(t, "first tick", lastScheduled(f.hour))
	second := f.hour.Add(time.Hour)
	f.at(t, second.Add(time.Second))
	s := f.waitStatus(t, "second tick skipped", lastScheduled(second))
	require.Equal(t, []string{f.runName(f.hour)}, f.runNames(t))
	require.EqualValues(t, 1, s.Status.MissedTicks)
	require.Equal(t, []v1alpha1.MissedTick{{ScheduledTime: metav1.Time{Time: second}, Occurrence: occ(second), Reason: v1alpha1.MissedConcurrencyForbidden}}, s.Status.Missed)
	waitScheduleEvent(t, f, "Skipped", "concurrencyPolicy is Forbid")

	f.finish(t, f.runName(f.hour), true, second.Add(time.Minute))
	third := second.Add(time.Hour)
	f.at(t, third.Add(time.Second))
	f.waitStatus(t, "third tick", lastScheduled(third))
	require.Equal(t, []string{f.runName(f.hour), f.runName(third)}, f.runNames(t))
}

// TestScheduleReplace: under Replace, the unfinished run is deleted and the
// tick's run created.
func TestScheduleReplace(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "replace", func(s *v1alpha1.ProcessingScheduleSpec) { s.ConcurrencyPolicy = v1alpha1.ConcurrencyReplace })
	startScheduleManager(t, f.env, f.ns, "sched", f.clock)
	f.at(t, f.hour.Add(time.Second))
	f.waitStatus(t, "first tick", lastScheduled(f.hour))
	second := f.hour.Add(time.Hour)
	f.at(t, second.Add(time.Second))
	f.waitStatus(t, "second tick", lastScheduled(second))
	waitFor(t, "first run deleted", func() error {
		if names := f.runNames(t); len(names) != 1 || names[0] != f.runName(second) {
			return fmt.Errorf("runs %v", names)
		}
		return nil
	})
	waitScheduleEvent(t, f, "Replaced", f.runName(f.hour))
}

// TestScheduleCatchUp: a controller away for three ticks comes back: All
// starts each, Latest the last, None none; the others are missed, counted.
func TestScheduleCatchUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy v1alpha1.CatchUpPolicy
		runs   []int // hours after the first tick
		missed int64
	}{
		{v1alpha1.CatchUpAll, []int{0, 1, 2}, 0},
		{v1alpha1.CatchUpLatest, []int{2}, 2},
		{v1alpha1.CatchUpNone, nil, 3},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			t.Parallel()
			f := newScheduleFixture(t, "catchup-"+strings.ToLower(string(tc.policy)), func(s *v1alpha1.ProcessingScheduleSpec) { s.CatchUp = tc.policy })
			f.clock.SetTime(f.hour.Add(2*time.Hour + time.Minute))
			startScheduleManager(t, f.env, f.ns, "sched", f.clock)
			s := f.waitStatus(t, "caught up", lastScheduled(f.hour.Add(2*time.Hour)))
			var want []string
			for _, h := range tc.runs {
				want = append(want, f.runName(f.hour.Add(time.Duration(h)*time.Hour)))
			}
			require.Equal(t, want, f.runNames(t))
			require.Equal(t, tc.missed, s.Status.MissedTicks)
			require.Len(t, s.Status.Missed, int(tc.missed))
			for _, m := range s.Status.Missed {
				require.Equal(t, v1alpha1.MissedNotCaughtUp, m.Reason)
			}
		})
	}
}

// TestScheduleHistoryLimits: the oldest finished runs beyond the limits are
// deleted; an unfinished run never is.
func TestScheduleHistoryLimits(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "history", func(s *v1alpha1.ProcessingScheduleSpec) {
		s.SuccessfulRunsHistoryLimit = ptr.To[int32](1)
		s.FailedRunsHistoryLimit = ptr.To[int32](1)
		s.CatchUp = v1alpha1.CatchUpAll
	})
	f.clock.SetTime(f.hour.Add(4*time.Hour + time.Minute))
	startScheduleManager(t, f.env, f.ns, "sched", f.clock)
	f.waitStatus(t, "five ticks", lastScheduled(f.hour.Add(4*time.Hour)))
	name := func(h int) string { return f.runName(f.hour.Add(time.Duration(h) * time.Hour)) }
	require.Len(t, f.runNames(t), 5)
	// Finished out of creation order: 1 then 0 succeed, 2 and 3 fail, 4 runs.
	base := f.hour.Add(4*time.Hour + 2*time.Minute) // before the next tick
	f.finish(t, name(1), true, base)
	f.finish(t, name(0), true, base.Add(time.Minute))
	f.finish(t, name(2), false, base.Add(2*time.Minute))
	f.finish(t, name(3), false, base.Add(3*time.Minute))
	f.at(t, base.Add(4*time.Minute))
	waitFor(t, "history pruned", func() error {
		got := f.runNames(t)
		want := []string{name(0), name(3), name(4)}
		sort.Strings(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("runs %v, want %v", got, want)
		}
		return nil
	})
	// The pass that deletes writes its status after the deletions: the
	// status to check is that pass's, not the one before it (run 3 active).
	s := f.waitStatus(t, "last success, one active", func(st *v1alpha1.ProcessingScheduleStatus) error {
		if st.LastSuccessfulRun == nil || st.LastSuccessfulRun.Name != name(0) {
			return fmt.Errorf("lastSuccessfulRun %v", st.LastSuccessfulRun)
		}
		if st.ActiveCount != 1 {
			return fmt.Errorf("activeCount %d", st.ActiveCount)
		}
		return nil
	})
	require.Equal(t, int32(1), s.Status.ActiveCount)
	require.Len(t, s.Status.Active, 1)
	require.Equal(t, name(4), s.Status.Active[0].Name, "the unfinished run is never deleted and is the one active")
}

// TestScheduleSuspend: ticks while suspended start nothing, are missed
// (Suspended), and are not run after the resume.
func TestScheduleSuspend(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "suspend", func(s *v1alpha1.ProcessingScheduleSpec) {
		s.Suspend = true
		s.CatchUp = v1alpha1.CatchUpAll
	})
	startScheduleManager(t, f.env, f.ns, "sched", f.clock)
	f.at(t, f.hour.Add(time.Second))
	s := f.waitStatus(t, "tick while suspended", lastScheduled(f.hour))
	require.Empty(t, f.runNames(t))
	require.Equal(t, v1alpha1.MissedSuspended, s.Status.Missed[0].Reason)
	require.Nil(t, s.Status.NextScheduleTime)
	c := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionSuspended)
	require.NotNil(t, c)
	require.Equal(t, metav1.ConditionTrue, c.Status)

	s.Spec.Suspend = false
	require.NoError(t, f.env.Client.Update(context.Background(), s))
	f.at(t, f.hour.Add(30*time.Minute))
	f.waitStatus(t, "resumed", func(st *v1alpha1.ProcessingScheduleStatus) error {
		if st.NextScheduleTime == nil {
			return fmt.Errorf("no next tick")
		}
		return nil
	})
	require.Empty(t, f.runNames(t), "the suspended tick is not caught up")
	f.at(t, f.hour.Add(time.Hour+time.Second))
	f.waitStatus(t, "next tick", lastScheduled(f.hour.Add(time.Hour)))
	require.Equal(t, []string{f.runName(f.hour.Add(time.Hour))}, f.runNames(t))
}

// TestScheduleInvalid: the CRD refuses what it can tell (bad cron shape,
// Local, a template setting spec.occurrence); an unknown zone stalls.
func TestScheduleInvalid(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		mutate func(*v1alpha1.ProcessingScheduleSpec)
		want   string
	}{
		{func(s *v1alpha1.ProcessingScheduleSpec) { s.Schedule = "* * * *" }, "must be five cron fields"},
		{func(s *v1alpha1.ProcessingScheduleSpec) { s.Schedule = "@every 1h" }, "must be five cron fields"},
		{func(s *v1alpha1.ProcessingScheduleSpec) { s.Schedule = "TZ=UTC 0 * * * *" }, "set spec.timeZone"},
		{func(s *v1alpha1.ProcessingScheduleSpec) { s.TimeZone = "Local" }, "controller's own zone"},
		{func(s *v1alpha1.ProcessingScheduleSpec) { s.RunTemplate.Spec.Occurrence = "x" }, "set by the schedule"},
		{func(s *v1alpha1.ProcessingScheduleSpec) { s.ConcurrencyPolicy = "Skip" }, "Unsupported value"},
	} {
		err := env.Client.Create(ctx, newSchedule(ns, "bad", tc.mutate))
		require.Error(t, err)
		require.Contains(t, err.Error(), tc.want)
	}
	long := newSchedule(ns, strings.Repeat("x", v1alpha1.MaxScheduleNameLength+1), nil)
	require.ErrorContains(t, env.Client.Create(ctx, long), "at most 52 characters")

	f := &scheduleFixture{env: env, ns: ns, name: "nozone", clock: clocktesting.NewFakeClock(time.Now())}
	require.NoError(t, env.Client.Create(ctx, newSchedule(ns, "nozone", func(s *v1alpha1.ProcessingScheduleSpec) { s.TimeZone = "Mars/Olympus" })))
	startScheduleManager(t, env, ns, "sched", f.clock)
	s := f.waitStatus(t, "stalled", func(st *v1alpha1.ProcessingScheduleStatus) error {
		if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStalled); c == nil || c.Reason != ReasonInvalidTimeZone {
			return fmt.Errorf("conditions %v", st.Conditions)
		}
		return nil
	})
	require.Contains(t, meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionStalled).Message, "Mars/Olympus")
}

// TestScheduleTemplateStaysEditable: the run's immutability rules are the
// run's, not its template's: a schedule's batch, database and effect can
// change (later runs use the new template), and a run's occurrence cannot.
func TestScheduleTemplateStaysEditable(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	s := newSchedule(ns, "editable", nil)
	require.NoError(t, env.Client.Create(ctx, s))
	s.Spec.RunTemplate.Spec.Batch = v1alpha1.BatchSpec{Query: "SELECT id AS entity, current_setting('runledger.occurrence') AS occurrence FROM accounts"}
	s.Spec.RunTemplate.Spec.Database.SecretRef.Name = "other-db"
	s.Spec.RunTemplate.Spec.Workers = 4
	require.NoError(t, env.Client.Update(ctx, s))

	run := schedule.NewRun(s, "2026-10", time.Now(), schedule.CreatedByTrigger)
	require.NoError(t, env.Client.Create(ctx, run))
	run.Spec.Occurrence = "2026-11"
	require.ErrorContains(t, env.Client.Update(ctx, run), "occurrence is immutable")
}

// TestScheduleEditDuringAPassThatStartedARun: the user suspends the schedule
// between a pass's creation of a tick's run and its status write (the write
// conflicts). The status still records the tick as started, on the edited
// schedule; the next pass, suspended, neither lists the tick as missed (its
// run exists) nor announces the run as found again.
func TestScheduleEditDuringAPassThatStartedARun(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "edited", nil)
	ctx := context.Background()
	p := startPasses(t, f)
	mgr, req := p.mgr, p.req

	var edited sync.Once
	c := &createHook{Client: mgr.GetClient(), after: func(obj client.Object) {
		if _, ok := obj.(*v1alpha1.ProcessingRun); ok {
			edited.Do(func() {
				s := f.get(t)
				s.Spec.Suspend = true
				require.NoError(t, f.env.Client.Update(ctx, s), "the user's edit")
			})
		}
	}}
	r := p.reconciler(c)
	f.clock.SetTime(f.hour.Add(time.Second))
	_, err := r.Reconcile(ctx, req)
	require.NoError(t, err)
	require.Equal(t, []string{f.runName(f.hour)}, f.runNames(t))
	s := f.get(t)
	require.True(t, s.Spec.Suspend, "the edit landed during the pass")
	require.NoError(t, lastScheduled(f.hour)(&s.Status), "the started tick is recorded on the edited schedule")

	// The next pass sees the edit (and the run) in its cache.
	p.waitCached(t, "the edit and the run", func(cached *v1alpha1.ProcessingSchedule, runs int) bool {
		return cached.Spec.Suspend && cached.Status.LastScheduleTime != nil && runs == 1
	})
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	s = f.get(t)
	require.NoError(t, lastScheduled(f.hour)(&s.Status))
	require.Empty(t, s.Status.Missed, "the tick started a run: it was not missed")
	require.Zero(t, s.Status.MissedTicks)
	require.Equal(t, []string{f.runName(f.hour)}, f.runNames(t), "one run")
	time.Sleep(time.Second) // the recorder sends its events asynchronously
	require.Empty(t, scheduleEvents(t, f.env, f.ns, f.name, "Missed"), "no tick announced as missed")
	require.Empty(t, scheduleEvents(t, f.env, f.ns, f.name, "RunExists"), "the run is not announced as found again")
	require.Len(t, scheduleEvents(t, f.env, f.ns, f.name, "RunCreated"), 1)
}

// passes is a manager whose cache serves the schedule's namespace, with the
// reconciler's run index but not its controller: a test runs the passes
// itself, with the client it chooses.
type passes struct {
	f   *scheduleFixture
	mgr ctrl.Manager
	req ctrl.Request
}

func startPasses(t *testing.T, f *scheduleFixture) *passes {
	t.Helper()
	ctx := context.Background()
	cacheOpts := CacheOptions()
	cacheOpts.DefaultNamespaces = map[string]cache.Config{f.ns: {}}
	mgr, err := ctrl.NewManager(rest.CopyConfig(f.env.Config), ctrl.Options{
		Scheme: f.env.Scheme, Cache: cacheOpts,
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0", Logger: testLogger(),
	})
	require.NoError(t, err)
	require.NoError(t, mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.ProcessingRun{}, runScheduleKey, indexRunSchedule))
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(mctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx))
	return &passes{f: f, mgr: mgr, req: ctrl.Request{NamespacedName: client.ObjectKey{Namespace: f.ns, Name: f.name}}}
}

// reconciler is the schedule reconciler over c, reading the manager's cache
// for its index and the API server for its re-reads.
func (p *passes) reconciler(c client.Client) *ScheduleReconciler {
	return &ScheduleReconciler{Client: c, APIReader: p.mgr.GetAPIReader(), Recorder: p.mgr.GetEventRecorder("runledger-controller"),
		Clock: p.f.clock, MaxRunsPerPass: DefaultMaxRunsPerPass, MaxTicksPerPass: DefaultMaxTicksPerPass}
}

// waitCached waits until the manager's cache holds a schedule and runs for
// which ok is true: what the next pass will read.
func (p *passes) waitCached(t *testing.T, what string, ok func(cached *v1alpha1.ProcessingSchedule, runs int) bool) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, "the cache has "+what, func() error {
		cached := &v1alpha1.ProcessingSchedule{}
		if err := p.mgr.GetClient().Get(ctx, p.req.NamespacedName, cached); err != nil {
			return err
		}
		var runs v1alpha1.ProcessingRunList
		if err := p.mgr.GetClient().List(ctx, &runs, client.InNamespace(p.f.ns)); err != nil {
			return err
		}
		if !ok(cached, len(runs.Items)) {
			return fmt.Errorf("suspend %v, lastScheduleTime %v, %d runs", cached.Spec.Suspend, cached.Status.LastScheduleTime, len(runs.Items))
		}
		return nil
	})
}

// createHook is a client that calls after once a Create succeeded.
type createHook struct {
	client.Client
	after func(client.Object)
}

func (c *createHook) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := c.Client.Create(ctx, obj, opts...)
	if err == nil {
		c.after(obj)
	}
	return err
}

// lostStatus is a client whose status writes never land (the leader died
// right after its pass created a run).
type lostStatus struct{ client.Client }

func (c lostStatus) Status() client.SubResourceWriter { return lostWriter{c.Client.Status()} }

type lostWriter struct{ client.SubResourceWriter }

func (lostWriter) Apply(context.Context, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
	return errors.New("the leader died before its status write")
}

// TestScheduleStatusLostThenSuspended: a pass creates a tick's run and its
// status write never lands (its leader died); the user then suspends the
// schedule. The next leader's pass finds the tick's run (RunExists) and
// records the tick as started: it is not listed as missed, for its run
// exists and runs.
func TestScheduleStatusLostThenSuspended(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "lost", nil)
	ctx := context.Background()
	p := startPasses(t, f)
	mgr, req := p.mgr, p.req

	f.clock.SetTime(f.hour.Add(time.Second))
	_, err := p.reconciler(lostStatus{mgr.GetClient()}).Reconcile(ctx, req)
	require.ErrorContains(t, err, "the leader died")
	require.Equal(t, []string{f.runName(f.hour)}, f.runNames(t))
	s := f.get(t)
	require.Nil(t, s.Status.LastScheduleTime, "the status write was lost")
	s.Spec.Suspend = true
	require.NoError(t, f.env.Client.Update(ctx, s))

	p.waitCached(t, "the suspension and the run", func(cached *v1alpha1.ProcessingSchedule, runs int) bool {
		return cached.Spec.Suspend && runs == 1
	})
	f.clock.SetTime(f.hour.Add(20 * time.Second))
	_, err = p.reconciler(mgr.GetClient()).Reconcile(ctx, req)
	require.NoError(t, err)
	s = f.get(t)
	require.NoError(t, lastScheduled(f.hour)(&s.Status), "the tick is recorded")
	require.Empty(t, s.Status.Missed, "the tick started its run: not missed")
	require.Zero(t, s.Status.MissedTicks)
	require.NotNil(t, s.Status.LastRun)
	require.Equal(t, f.runName(f.hour), s.Status.LastRun.Name)
	require.Equal(t, []string{f.runName(f.hour)}, f.runNames(t), "one run")
	waitScheduleEvent(t, f, "RunExists", "Run "+f.runName(f.hour)+" ")
	require.Empty(t, scheduleEvents(t, f.env, f.ns, f.name, "Missed"), "no tick announced as missed")
}

// TestScheduleRunNameTakenStalls: a tick whose run name is taken by a run
// the schedule does not control stalls the schedule (Stalled and Ready
// False, RunNameTaken, what to do): nothing is created or claimed, the tick
// stays due, and once the name is free the tick's run is created.
func TestScheduleRunNameTakenStalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newScheduleFixture(t, "taken", nil)
	foreign := schedule.NewRun(f.get(t), occ(f.hour), f.hour, "test")
	foreign.OwnerReferences = nil
	require.NoError(t, f.env.Client.Create(ctx, foreign))
	startScheduleManager(t, f.env, f.ns, "sched-taken", f.clock)
	f.at(t, f.hour.Add(time.Second))
	want := "run name " + f.runName(f.hour) + " (occurrence " + occ(f.hour) + ") is taken by a ProcessingRun this schedule does not control"
	s := f.waitStatus(t, "stalled", func(st *v1alpha1.ProcessingScheduleStatus) error {
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStalled)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonRunNameTaken {
			return fmt.Errorf("stalled: %+v", c)
		}
		return nil
	})
	stalled := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionStalled)
	require.Contains(t, stalled.Message, want)
	require.Contains(t, stalled.Message, "delete or rename it")
	ready := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady)
	require.Equal(t, metav1.ConditionFalse, ready.Status)
	require.Equal(t, ReasonRunNameTaken, ready.Reason)
	require.Nil(t, s.Status.LastScheduleTime, "the tick stays due")
	require.Equal(t, []string{foreign.Name}, f.runNames(t), "nothing created beside the foreign run (it has the schedule's labels)")
	require.Nil(t, metav1.GetControllerOf(getRun(t, f.env, f.ns, foreign.Name)), "the foreign run is not claimed")

	require.NoError(t, f.env.Client.Delete(ctx, foreign))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(f.env.Client.Get(ctx, client.ObjectKeyFromObject(foreign), &v1alpha1.ProcessingRun{}))
	}, time.Minute, 50*time.Millisecond, "the foreign run is gone")
	f.poke(t)
	f.waitStatus(t, "the tick, once the name is free", lastScheduled(f.hour))
	require.Equal(t, []string{f.runName(f.hour)}, f.runNames(t))
	require.Nil(t, meta.FindStatusCondition(f.get(t).Status.Conditions, v1alpha1.ConditionStalled), "no longer stalled")
}

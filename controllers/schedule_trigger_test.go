package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/schedule"
)

// annotate sets an annotation of the schedule (kubectl annotate --overwrite).
func (f *scheduleFixture) annotate(t *testing.T, key, value string) {
	t.Helper()
	s := f.get(t)
	patch := client.MergeFrom(s.DeepCopy())
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[key] = value
	require.NoError(t, f.env.Client.Patch(context.Background(), s, patch))
}

// suspend sets spec.suspend.
func (f *scheduleFixture) suspend(t *testing.T, on bool) {
	t.Helper()
	s := f.get(t)
	patch := client.MergeFrom(s.DeepCopy())
	s.Spec.Suspend = on
	require.NoError(t, f.env.Client.Patch(context.Background(), s, patch))
}

// trigger sets the trigger annotation and waits until status.trigger says
// what became of it.
func (f *scheduleFixture) trigger(t *testing.T, occurrence string) *v1alpha1.TriggerStatus {
	t.Helper()
	f.annotate(t, v1alpha1.AnnotationTrigger, occurrence)
	want := v1alpha1.Truncate(occurrence, v1alpha1.MaxKeyPartBytes)
	s := f.waitStatus(t, "trigger "+want, func(st *v1alpha1.ProcessingScheduleStatus) error {
		if st.Trigger == nil || st.Trigger.Occurrence != want {
			return fmt.Errorf("status.trigger %+v", st.Trigger)
		}
		return nil
	})
	return s.Status.Trigger
}

// TestScheduleTriggerAnnotation: the kubectl-only trigger. The annotation
// processing.runledger.dev/trigger starts its occurrence's run once (also
// an occurrence whose run name is hashed, also while suspended); an
// occurrence a tick started is that run, never a second; a value already
// dealt with starts nothing again, even once its run is gone; a bad
// occurrence or a name taken by another run is refused, said in the status
// and an Event, and creates nothing.
func TestScheduleTriggerAnnotation(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "trigger", nil)
	startScheduleManager(t, f.env, f.ns, "sched", f.clock)
	ctx := context.Background()
	uid := f.get(t).UID

	tr := f.trigger(t, "2026-10")
	require.Equal(t, v1alpha1.TriggerCreated, tr.Result)
	require.Equal(t, "trigger-2026-10", tr.Run)
	run := getRun(t, f.env, f.ns, tr.Run)
	require.Equal(t, "2026-10", run.Spec.Occurrence)
	require.Equal(t, schedule.CreatedByTrigger, run.Annotations[v1alpha1.AnnotationCreatedBy])
	require.NotContains(t, run.Annotations, v1alpha1.AnnotationScheduledTime, "a trigger names no time")
	require.Equal(t, "billing", run.Labels["team"])
	require.Equal(t, uid, metav1.GetControllerOf(run).UID)
	waitScheduleEvent(t, f, "RunCreated", "Created run trigger-2026-10 for occurrence 2026-10 (annotation "+v1alpha1.AnnotationTrigger+")")
	s := f.get(t)
	require.Equal(t, []v1alpha1.ScheduledRun{{Name: tr.Run, Occurrence: "2026-10"}}, s.Status.Active)
	require.Nil(t, s.Status.LastRun, "a trigger is not a tick")

	// Dealt with: later passes start nothing, even once the run is gone
	// (the history limit deleted it): the annotation asks once.
	for range 3 {
		f.poke(t)
	}
	require.NoError(t, f.env.Client.Delete(ctx, run))
	waitFor(t, "run deleted", func() error {
		if names := f.runNames(t); len(names) != 0 {
			return fmt.Errorf("runs %v", names)
		}
		return nil
	})
	f.poke(t)
	time.Sleep(500 * time.Millisecond)
	require.Empty(t, f.runNames(t), "the annotation dealt with starts no run again")
	require.True(t, tr.Time.Equal(&f.get(t).Status.Trigger.Time), "status.trigger is the first pass's")

	// An occurrence a run name cannot hold as it is: the hashed name, the
	// exact occurrence; suspension does not apply to a manual run.
	f.suspend(t, true)
	tr = f.trigger(t, "2026-11 EU/Süd")
	require.Equal(t, v1alpha1.TriggerCreated, tr.Result)
	require.Equal(t, schedule.RunName("trigger", "2026-11 EU/Süd"), tr.Run)
	require.NotEqual(t, "trigger-2026-11 EU/Süd", tr.Run)
	require.Equal(t, "2026-11 EU/Süd", getRun(t, f.env, f.ns, tr.Run).Spec.Occurrence)
	f.suspend(t, false)

	// A tick's occurrence: the tick's run, never a second.
	f.at(t, f.hour.Add(time.Second))
	f.waitStatus(t, "the tick", lastScheduled(f.hour))
	tr = f.trigger(t, occ(f.hour))
	require.Equal(t, v1alpha1.TriggerExists, tr.Result)
	require.Equal(t, f.runName(f.hour), tr.Run)
	waitScheduleEvent(t, f, "RunExists", "(annotation "+v1alpha1.AnnotationTrigger+")")
	require.ElementsMatch(t, []string{f.runName(f.hour), schedule.RunName("trigger", "2026-11 EU/Süd")}, f.runNames(t))
	// And the other way round: a triggered occurrence its tick then finds.
	second := f.hour.Add(time.Hour)
	tr = f.trigger(t, occ(second))
	require.Equal(t, v1alpha1.TriggerCreated, tr.Result)
	f.at(t, second.Add(time.Second))
	f.waitStatus(t, "the second tick", lastScheduled(second))
	waitScheduleEvent(t, f, "RunExists", "Run "+f.runName(second)+" of occurrence "+occ(second)+" already exists: not started again")
	require.Equal(t, f.runName(second), f.get(t).Status.LastRun.Name)

	// Refused: nothing created, the reason in the status and an Event.
	before := f.runNames(t)
	foreign := schedule.NewRun(f.get(t), "2026-07", time.Time{}, "test")
	foreign.OwnerReferences = nil
	require.NoError(t, f.env.Client.Create(ctx, foreign))
	for _, tc := range []struct{ occurrence, want string }{
		{" ", "the occurrence is blank (only white space): no run started"},
		{strings.Repeat("x", v1alpha1.MaxKeyPartBytes+1), fmt.Sprintf("is %d bytes long, more than the %d allowed", v1alpha1.MaxKeyPartBytes+1, v1alpha1.MaxKeyPartBytes)},
		{"2026-07", "run name trigger-2026-07 (occurrence 2026-07) is taken by a ProcessingRun this schedule does not control"},
	} {
		tr = f.trigger(t, tc.occurrence)
		require.Equal(t, v1alpha1.TriggerRefused, tr.Result, tc.occurrence)
		require.Contains(t, tr.Message, tc.want)
		require.Empty(t, tr.Run)
		waitScheduleEvent(t, f, "TriggerRefused", tc.want)
	}
	require.LessOrEqual(t, len(f.get(t).Status.Trigger.Occurrence), v1alpha1.MaxKeyPartBytes)
	f.poke(t)
	time.Sleep(300 * time.Millisecond)
	require.Len(t, scheduleEvents(t, f.env, f.ns, f.name, "TriggerRefused"), 3, "a refusal is announced once")
	require.ElementsMatch(t, append(before, "trigger-2026-07"), f.runNames(t), "nothing created; the foreign run untouched")
	require.Nil(t, metav1.GetControllerOf(getRun(t, f.env, f.ns, "trigger-2026-07")), "the foreign run is not claimed")

	// The long occurrence refused again after another value: dealt with
	// again (its cut value is no longer the last one).
	tr = f.trigger(t, strings.Repeat("x", v1alpha1.MaxKeyPartBytes+1))
	require.Equal(t, v1alpha1.TriggerRefused, tr.Result)
}

// TestScheduleMissedAnnounced: a controller away for 25 ticks under
// catchUp None: every tick is counted (status.missedTicks and the
// runledger_schedule_missed_ticks_total counter, never capped), the latest
// 20 are listed and each has a Missed Event, and one Event counts the rest;
// the next-tick and last-success gauges follow the status.
func TestScheduleMissedAnnounced(t *testing.T) {
	t.Parallel()
	f := newScheduleFixture(t, "missed", func(s *v1alpha1.ProcessingScheduleSpec) { s.CatchUp = v1alpha1.CatchUpNone })
	f.clock.SetTime(f.hour.Add(24*time.Hour + time.Minute))
	startScheduleManager(t, f.env, f.ns, "sched", f.clock)
	last := f.hour.Add(24 * time.Hour)
	s := f.waitStatus(t, "25 ticks missed", lastScheduled(last))
	require.Empty(t, f.runNames(t))
	require.EqualValues(t, 25, s.Status.MissedTicks)
	require.Len(t, s.Status.Missed, v1alpha1.MaxMissedListed)
	require.True(t, s.Status.Missed[len(s.Status.Missed)-1].ScheduledTime.Time.Equal(last), "the latest last")
	require.True(t, s.Status.Missed[0].ScheduledTime.Time.Equal(f.hour.Add(5*time.Hour)), "the oldest listed is the 6th")
	require.Equal(t, 25.0, testutil.ToFloat64(schedMissed.WithLabelValues(f.ns, f.name, string(v1alpha1.MissedNotCaughtUp))))
	waitScheduleEvent(t, f, "Missed", "Tick "+last.UTC().Format(time.RFC3339)+" (occurrence "+occ(last)+") started no run: NotCaughtUp")
	waitScheduleEvent(t, f, "Missed", "5 more ticks started no run (status.missedTicks counts them)")
	// One Event per listed tick (not one series keeping the first tick's
	// note), naming the run it did not start.
	waitFor(t, "a Missed event per listed tick", func() error {
		if n := len(scheduleEvents(t, f.env, f.ns, f.name, "Missed")); n != v1alpha1.MaxMissedListed+1 {
			return fmt.Errorf("%d Missed events", n)
		}
		return nil
	})
	for _, e := range scheduleEvents(t, f.env, f.ns, f.name, "Missed") {
		require.Nil(t, e.Series, "event %q is not a series", e.Note)
		if strings.HasPrefix(e.Note, "Tick ") {
			require.NotNil(t, e.Related, e.Note)
			require.Equal(t, "ProcessingRun", e.Related.Kind)
			require.Contains(t, e.Note, "(occurrence "+strings.TrimPrefix(e.Related.Name, f.name+"-")+")")
		}
	}
	next := last.Add(time.Hour)
	require.Equal(t, float64(next.Unix()), testutil.ToFloat64(schedNextTick.WithLabelValues(f.ns, f.name)))

	// The next tick runs; its run's success is the last-success gauge.
	f.at(t, next.Add(time.Second))
	f.waitStatus(t, "next tick", lastScheduled(next))
	done := next.Add(2 * time.Minute)
	f.finish(t, f.runName(next), true, done)
	f.waitStatus(t, "last success", func(st *v1alpha1.ProcessingScheduleStatus) error {
		if st.LastSuccessfulTime == nil || !st.LastSuccessfulTime.Time.Equal(done) {
			return fmt.Errorf("lastSuccessfulTime %v", st.LastSuccessfulTime)
		}
		return nil
	})
	waitFor(t, "last-success gauge", func() error {
		if v := testutil.ToFloat64(schedLastSuccess.WithLabelValues(f.ns, f.name)); v != float64(done.Unix()) {
			return fmt.Errorf("gauge %v", v)
		}
		return nil
	})
	require.EqualValues(t, 25, f.get(t).Status.MissedTicks, "a tick that ran is not missed")
	require.Equal(t, 1.0, testutil.ToFloat64(schedRunsCreated.WithLabelValues(f.ns, f.name)))
}

//go:build e2e

package e2e

// A ProcessingSchedule on the real cluster: runs every minute that
// complete, and its manager killed at a tick. Runs alone (no t.Parallel):
// it kills manager processes.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/schedule"
)

// scheduleItems is how many accounts each occurrence's run bills.
const scheduleItems = 200

// occurrenceBatch bills accounts 1..n for the run's occurrence, which the
// query reads as the setting the worker gives it.
func occurrenceBatch(n int) v1alpha1.BatchSpec {
	return v1alpha1.BatchSpec{Query: fmt.Sprintf(`SELECT 'acct-' || i AS entity, current_setting('%s') AS occurrence, `+
		`jsonb_build_object('amount', i) AS payload FROM generate_series(1, %d) i`, v1alpha1.OccurrenceSetting, n)}
}

// leaseHolder is the manager Lease's holder identity ("<pod>_<uuid>": a
// restarted container of the same pod is another holder).
func (e *env) leaseHolder(ctx context.Context) (string, error) {
	var lease coordinationv1.Lease
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: leaseName}, &lease); err != nil {
		return "", err
	}
	return ptr.Deref(lease.Spec.HolderIdentity, ""), nil
}

// waitNewHolder waits until the Lease is held by another identity than
// was, and returns it and when it took the Lease.
func (e *env) waitNewHolder(t *testing.T, was string, timeout time.Duration) (string, time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var lease coordinationv1.Lease
		require.NoError(t, e.c.Get(context.Background(), client.ObjectKey{Namespace: systemNamespace, Name: leaseName}, &lease))
		if now := ptr.Deref(lease.Spec.HolderIdentity, ""); now != "" && now != was {
			require.NotNil(t, lease.Spec.AcquireTime, "lease %s: no acquireTime", leaseName)
			return now, lease.Spec.AcquireTime.Time
		}
		require.True(t, time.Now().Before(deadline), "the Lease is still held by %q %s after the leader was killed", was, timeout)
		time.Sleep(200 * time.Millisecond)
	}
}

// waitManagersReady waits until every manager pod is ready (a killed
// container restarted) and the Lease is held by one of them; it returns
// the leader's pod and the Lease holder.
func (e *env) waitManagersReady(t *testing.T, replicas int, timeout time.Duration) (corev1.Pod, string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		pods, err := e.managerPods(ctx)
		require.NoError(t, err)
		holder, err := e.leaseHolder(ctx)
		require.NoError(t, err)
		pod, _, _ := strings.Cut(holder, "_")
		ready := 0
		for _, p := range pods {
			if podReady(p) {
				ready++
			}
		}
		if leader, ok := pods[pod]; ok && podReady(leader) && ready == replicas && len(pods) == replicas {
			return leader, holder
		}
		require.True(t, time.Now().Before(deadline), "waiting for %d ready manager pods and a leader among them (%d ready of %d, holder %q)", replicas, ready, len(pods), holder)
		time.Sleep(500 * time.Millisecond)
	}
}

// managerKiller prepares to end the manager container of pod the hard
// way, as a crash or the OOM killer would: it finds the container's cgroup
// on its node now, and the function it returns sends SIGKILL to every
// process of it until none is left, and returns when the first was sent. It
// hands no Lease over; the kubelet restarts the container in the same pod.
func (e *env) managerKiller(t *testing.T, pod corev1.Pod) func() time.Time {
	t.Helper()
	var id string
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == "manager" {
			_, id, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	require.NotEmpty(t, id, "pod %s: no manager container id in %+v", pod.Name, pod.Status.ContainerStatuses)
	node := e.node(t, pod.Spec.NodeName)
	var dir string
	err := filepath.WalkDir(node.vars["POD_CGROUP"], func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() && strings.Contains(d.Name(), id) {
			dir = path
			return filepath.SkipAll
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, dir, "no cgroup of container %s (pod %s) under %s", id, pod.Name, node.vars["POD_CGROUP"])
	require.NotEmpty(t, cgroupPIDs(t, dir), "container %s of pod %s: no process in %s", id, pod.Name, dir)
	return func() time.Time {
		t.Helper()
		var first time.Time
		killed := 0
		for i := 0; ; i++ {
			pids := cgroupPIDs(t, dir)
			if len(pids) == 0 {
				break
			}
			require.Less(t, i, 100, "pod %s: manager processes still alive after SIGKILL: %v", pod.Name, pids)
			for _, pid := range pids {
				if first.IsZero() {
					first = time.Now()
				}
				if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
					killed++
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		require.Positive(t, killed, "killed no process of the manager container of %s", pod.Name)
		t.Logf("killed the manager container of %s on %s (SIGKILL to %d processes of %s)", pod.Name, pod.Spec.NodeName, killed, dir)
		return first
	}
}

// nextMinute is the first minute boundary at least margin from now.
func nextMinute(margin time.Duration) time.Time {
	return time.Now().Add(margin).Truncate(time.Minute).Add(time.Minute)
}

func tickOccurrence(tick time.Time) string {
	return tick.UTC().Format(v1alpha1.DefaultOccurrenceFormat)
}

// createSchedule creates a schedule of every minute whose runs bill
// scheduleItems accounts per occurrence, keeping every finished run.
func (f *fixture) createSchedule(name string, suspend bool) *v1alpha1.ProcessingSchedule {
	f.t.Helper()
	tmpl := f.newRun(name, runSpec{workers: 2, chunk: 50, batch: occurrenceBatch(scheduleItems)}).Spec
	sched := &v1alpha1.ProcessingSchedule{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: v1alpha1.ProcessingScheduleSpec{
			Schedule:                   "* * * * *",
			Suspend:                    suspend,
			SuccessfulRunsHistoryLimit: ptr.To[int32](100),
			FailedRunsHistoryLimit:     ptr.To[int32](100),
			RunTemplate:                v1alpha1.RunTemplate{Spec: tmpl},
		},
	}
	require.NoError(f.t, f.c.Create(f.ctx, sched), "create schedule %s", name)
	f.t.Logf("created schedule %s/%s (%q, UTC)", f.ns, name, sched.Spec.Schedule)
	return sched
}

// scheduleRuns are the runs of a schedule (by its label), by name.
func (f *fixture) scheduleRuns(name string) []v1alpha1.ProcessingRun {
	f.t.Helper()
	var runs v1alpha1.ProcessingRunList
	require.NoError(f.t, f.c.List(f.ctx, &runs, client.InNamespace(f.ns), client.MatchingLabels{v1alpha1.LabelSchedule: name}))
	slices.SortFunc(runs.Items, func(a, b v1alpha1.ProcessingRun) int { return strings.Compare(a.Name, b.Name) })
	return runs.Items
}

// waitRunExists polls for a run (every 20 ms, to act right after it is
// created) and returns it.
func (f *fixture) waitRunExists(name string, timeout time.Duration) *v1alpha1.ProcessingRun {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		run := &v1alpha1.ProcessingRun{}
		err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: name}, run)
		if err == nil {
			return run
		}
		require.True(f.t, apierrors.IsNotFound(err), "get run %s: %v", name, err)
		require.True(f.t, time.Now().Before(deadline), "run %s was not created within %s", name, timeout)
		time.Sleep(20 * time.Millisecond)
	}
}

// watchRunCreated starts watching for a run's creation (a watch, to act
// within milliseconds of it); the function it returns waits for it.
func (f *fixture) watchRunCreated(name string) func(timeout time.Duration) *v1alpha1.ProcessingRun {
	f.t.Helper()
	ctx, cancel := context.WithCancel(f.ctx)
	w, err := f.wc.Watch(ctx, &v1alpha1.ProcessingRunList{}, client.InNamespace(f.ns), client.MatchingFields{"metadata.name": name})
	if err != nil {
		cancel()
	}
	require.NoError(f.t, err, "watch run %s", name)
	return func(timeout time.Duration) *v1alpha1.ProcessingRun {
		f.t.Helper()
		defer cancel()
		defer w.Stop()
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		for {
			select {
			case ev, ok := <-w.ResultChan():
				require.True(f.t, ok, "the watch of run %s ended", name)
				if run, isRun := ev.Object.(*v1alpha1.ProcessingRun); isRun && ev.Type == watch.Added {
					return run
				}
				require.NotEqual(f.t, watch.Error, ev.Type, "watch of run %s: %v", name, ev.Object)
			case <-timer.C:
				f.t.Fatalf("run %s was not created within %s", name, timeout)
			}
		}
	}
}

// waitRunExistsEvent waits for the Event that says a pass found the run of
// a tick already there.
func (f *fixture) waitRunExistsEvent(sched, run string, timeout time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, ev := range f.events(sched) {
			if ev.Reason == "RunExists" && strings.HasPrefix(ev.Message, "Run "+run+" ") {
				f.t.Logf("the new leader dealt with the tick: %s", ev.Message)
				return
			}
		}
		require.True(f.t, time.Now().Before(deadline), "no RunExists event about run %s after %s", run, timeout)
		time.Sleep(500 * time.Millisecond)
	}
}

// requireOccurrenceOnce: the occurrence's run completed with exact counts,
// and its every ledger row is that run's (no other run ever took an item of
// the occurrence).
func (f *fixture) requireOccurrenceOnce(run *v1alpha1.ProcessingRun) {
	f.t.Helper()
	occ := run.Spec.Occurrence
	require.Equal(f.t, counts{Total: scheduleItems, Completed: scheduleItems}, countsOf(run), "run %s (occurrence %s): exact counts", run.Name, occ)
	f.requireShardsAddUp(run)
	require.EqualValues(f.t, scheduleItems, f.committedRows(string(run.UID)), "run %s: completed == its committed ledger rows", run.Name)
	require.EqualValues(f.t, 1, f.int(`SELECT count(DISTINCT run_uid) FROM runledger.ledger WHERE occurrence = $1`, occ),
		"occurrence %s: every ledger row is one run's", occ)
	require.EqualValues(f.t, scheduleItems, f.int(`SELECT count(*) FROM runledger.ledger WHERE occurrence = $1 AND state = 'committed'`, occ),
		"occurrence %s: each item committed once", occ)
}

// TestScheduleLeaderKilledAtTick: a schedule of every minute, two manager
// replicas. Its first run completes; then the leader is killed (SIGKILL, no
// Lease handed over) just before a tick, so that only the next leader can
// start that tick's run, and again right after it created a tick's run,
// before or while it writes the schedule's status, so that the next leader
// may find the tick due and its run there. Every minute from the first tick
// to the last has exactly one run, each Complete with exact counts, each
// occurrence's items committed once in the ledger, and no tick was missed.
func TestScheduleLeaderKilledAtTick(t *testing.T) {
	e := setup(t)
	e.scaleManager(t, 2)
	t.Cleanup(func() { e.scaleManager(t, 1) })
	f := newFixture(t, "schedule", 0.1)
	sched := f.createSchedule("every-minute", false)
	runName := func(tick time.Time) string { return schedule.RunName(sched.Name, tickOccurrence(tick)) }

	// (a) The first tick after the schedule's creation (its second, as the
	// API keeps it) starts a run that completes.
	first := sched.CreationTimestamp.Truncate(time.Minute).Add(time.Minute)
	run := f.waitRunExists(runName(first), 2*time.Minute)
	require.Equal(t, tickOccurrence(first), run.Spec.Occurrence)
	require.Equal(t, first.UTC().Format(time.RFC3339), run.Annotations[v1alpha1.AnnotationScheduledTime])
	require.Equal(t, schedule.CreatedByController, run.Annotations[v1alpha1.AnnotationCreatedBy])
	run = f.waitComplete(run.Name, runTimeout)
	f.requireOccurrenceOnce(run)
	t.Logf("tick %s: run %s completed", first.Format(time.TimeOnly), run.Name)

	// (b) The leader is killed 300 ms before a tick: the next leader takes
	// the Lease once it expires and starts the tick's run, late.
	leader, holder := e.waitManagersReady(t, 2, 3*time.Minute)
	before := nextMinute(15 * time.Second)
	kill := e.managerKiller(t, leader)
	time.Sleep(time.Until(before.Add(-300 * time.Millisecond)))
	killed := kill()
	require.True(t, killed.Before(before), "the kill came %s after the tick: the machine is too slow for this test's timing", killed.Sub(before))
	now, acquired := e.waitNewHolder(t, holder, time.Minute)
	t.Logf("leader %s killed %s before the tick %s; %s took the Lease %.1fs after the kill",
		holder, before.Sub(killed), before.Format(time.TimeOnly), now, acquired.Sub(killed).Seconds())
	run = f.waitRunExists(runName(before), 2*time.Minute)
	require.False(t, run.CreationTimestamp.Time.Before(acquired.Truncate(time.Second)),
		"the run of %s was created by the new leader (at %s, the Lease taken at %s)", before.Format(time.TimeOnly),
		run.CreationTimestamp.Format(time.TimeOnly), acquired.Format(time.StampMilli))
	t.Logf("tick %s: run %s created %.0fs late by the new leader", before.Format(time.TimeOnly), run.Name, run.CreationTimestamp.Sub(before).Seconds())

	// (c) The leader is killed right after it created a tick's run: the
	// next leader finds the tick due (unless the status was written in
	// between) and the run already there.
	leader, holder = e.waitManagersReady(t, 2, 3*time.Minute)
	at := nextMinute(15 * time.Second)
	kill = e.managerKiller(t, leader)
	time.Sleep(time.Until(at.Add(-3 * time.Second)))
	created := f.watchRunCreated(runName(at))
	run = created(time.Minute)
	killed = kill()
	h, err := e.leaseHolder(f.ctx)
	require.NoError(t, err)
	require.Equal(t, holder, h, "the pod killed was the leader, which created the run")
	time.Sleep(time.Second) // what the dead leader had sent has landed
	st := &v1alpha1.ProcessingSchedule{}
	require.NoError(t, f.c.Get(f.ctx, client.ObjectKeyFromObject(sched), st))
	statusWritten := st.Status.LastScheduleTime != nil && !st.Status.LastScheduleTime.Time.Before(at)
	now, acquired = e.waitNewHolder(t, holder, time.Minute)
	t.Logf("tick %s: leader %s created run %s and was killed %.0fms after the tick (it had written the status: %v); %s took the Lease %.1fs after the kill",
		at.Format(time.TimeOnly), holder, run.Name, killed.Sub(at).Seconds()*1000, statusWritten, now, acquired.Sub(killed).Seconds())
	if !statusWritten {
		f.waitRunExistsEvent(sched.Name, run.Name, 2*time.Minute)
	}

	// The new leader goes on: the next tick's run is created on time.
	next := at.Add(time.Minute)
	if time.Now().After(next.Add(-5 * time.Second)) {
		next = next.Add(time.Minute) // the takeover ran into that tick
	}
	run = f.waitRunExists(runName(next), 2*time.Minute)
	require.Less(t, run.CreationTimestamp.Sub(next), 5*time.Second, "the new leader starts a tick's run on time")
	require.NoError(t, f.c.Patch(f.ctx, sched, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"suspend":true}}`))), "suspend the schedule")
	t.Logf("tick %s: run %s created by %s; schedule suspended", next.Format(time.TimeOnly), run.Name, now)

	// Every run finishes; the checks of the whole.
	deadline := time.Now().Add(runTimeout)
	var runs []v1alpha1.ProcessingRun
	for {
		runs = f.scheduleRuns(sched.Name)
		done := 0
		for i := range runs {
			if isTrue(&runs[i], v1alpha1.ConditionComplete) || isTrue(&runs[i], v1alpha1.ConditionFailed) {
				done++
			}
		}
		if done == len(runs) {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d of the schedule's %d runs finished after %s", done, len(runs), runTimeout)
		time.Sleep(time.Second)
	}
	var occs []string
	for i := range runs {
		r := &runs[i]
		require.True(t, isTrue(r, v1alpha1.ConditionComplete), "run %s: %s", r.Name, statusLine(r))
		require.Equal(t, schedule.RunName(sched.Name, r.Spec.Occurrence), r.Name, "the run's name is its occurrence's")
		f.requireOccurrenceOnce(r)
		occs = append(occs, r.Spec.Occurrence)
	}
	var want []string
	for tick := first; !tick.After(next); tick = tick.Add(time.Minute) {
		want = append(want, tickOccurrence(tick))
	}
	require.Equal(t, want, occs, "one run per minute from the first tick to the last, none twice, none lost to the kills")
	f.requireExactlyOnce(int64(len(want) * scheduleItems))

	// The pass after the last run finished writes the status.
	deadline = time.Now().Add(time.Minute)
	for {
		st = &v1alpha1.ProcessingSchedule{}
		require.NoError(t, f.c.Get(f.ctx, client.ObjectKeyFromObject(sched), st))
		if st.Status.ActiveCount == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "status.activeCount is %d a minute after every run finished: %+v", st.Status.ActiveCount, st.Status.Active)
		time.Sleep(time.Second)
	}
	for _, m := range st.Status.Missed {
		require.Equal(t, v1alpha1.MissedSuspended, m.Reason, "only ticks after the suspension were missed: %+v", st.Status.Missed)
	}
	require.EqualValues(t, len(st.Status.Missed), st.Status.MissedTicks, "the missed ticks are all listed")
	require.NotNil(t, st.Status.LastSuccessfulTime, "status.lastSuccessfulTime")
	// A leader killed right after creating a run may never have sent its
	// Event; no run has two.
	events := map[string]int{}
	for _, ev := range f.events(sched.Name) {
		if ev.Reason == "RunCreated" {
			name, _, _ := strings.Cut(strings.TrimPrefix(ev.Message, "Created run "), " ")
			events[name]++
		}
	}
	t.Logf("RunCreated events by run: %v", events)
	for _, ev := range f.events(sched.Name) {
		if ev.Reason == "RunExists" {
			require.True(t, strings.HasPrefix(ev.Message, "Run "+runName(at)+" "), "only the run the killed leader left unrecorded was found again: %s", ev.Message)
		}
	}
	require.GreaterOrEqual(t, len(events), len(want)-1, "a RunCreated event per run (but the one whose creator was killed)")
	for name, n := range events {
		require.Equal(t, 1, n, "run %s: one RunCreated event", name)
		require.Contains(t, want, strings.TrimPrefix(name, sched.Name+"-"), "RunCreated names a run of the schedule")
	}
}

// TestScheduleKubectlTrigger: the kubectl-only trigger and backfill of
// docs/recurring-batches.md on a suspended schedule: kubectl annotate with
// an occurrence (one whose run name is hashed, then another), kubectl wait
// until status.trigger names it; each starts its occurrence's run, which
// completes with its items committed once; an occurrence whose run exists
// is that run, never a second.
func TestScheduleKubectlTrigger(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "schedtrigger", 0.05)
	sched := f.createSchedule("manual", true)
	trigger := func(occ string) (result, run string) {
		t.Helper()
		out, err := f.kubectl("annotate", "processingschedule", sched.Name, "--overwrite", v1alpha1.AnnotationTrigger+"="+occ)
		require.NoError(t, err, out)
		out, err = f.kubectl("wait", "processingschedule/"+sched.Name, "--timeout=120s", "--for=jsonpath={.status.trigger.occurrence}="+occ)
		require.NoError(t, err, out)
		out, err = f.kubectl("get", "processingschedule", sched.Name, "-o", "jsonpath={.status.trigger.result} {.status.trigger.run}")
		require.NoError(t, err, out)
		result, run, _ = strings.Cut(strings.TrimSpace(out), " ")
		t.Logf("trigger %s: %s %s", occ, result, run)
		return result, run
	}

	result, name := trigger("2026-Q1")
	require.Equal(t, string(v1alpha1.TriggerCreated), result)
	require.Equal(t, schedule.RunName(sched.Name, "2026-Q1"), name)
	require.NotEqual(t, sched.Name+"-2026-Q1", name, "a hashed run name, which the annotation needs no one to compute")
	q1 := f.waitComplete(name, runTimeout)
	require.Equal(t, "2026-Q1", q1.Spec.Occurrence)
	require.Equal(t, schedule.CreatedByTrigger, q1.Annotations[v1alpha1.AnnotationCreatedBy])
	f.requireOccurrenceOnce(q1)

	result, name = trigger("2026-01")
	require.Equal(t, string(v1alpha1.TriggerCreated), result)
	require.Equal(t, sched.Name+"-2026-01", name)
	jan := f.waitComplete(name, runTimeout)
	f.requireOccurrenceOnce(jan)

	result, name = trigger("2026-Q1")
	require.Equal(t, string(v1alpha1.TriggerExists), result, "the occurrence's run is there: not a second one")
	require.Equal(t, q1.Name, name)
	require.Len(t, f.scheduleRuns(sched.Name), 2)
	f.requireOccurrenceOnce(f.get(q1.Name))
	f.requireExactlyOnce(2 * scheduleItems)
}

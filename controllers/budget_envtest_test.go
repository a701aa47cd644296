package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// The connection budget against a real apiserver: the tests play the
// kubelet (pod phases) and the workers (their final reports).

// budgetIs checks status.connections and status.active.
func budgetIs(want *v1alpha1.ConnectionsStatus, active int32) func(*v1alpha1.ProcessingRun) error {
	return func(r *v1alpha1.ProcessingRun) error {
		got := r.Status.Connections
		switch {
		case (got == nil) != (want == nil) || got != nil && *got != *want:
			return fmt.Errorf("connections %+v, want %+v", got, want)
		case r.Status.Active != active:
			return fmt.Errorf("active %d, want %d", r.Status.Active, active)
		}
		return nil
	}
}

func succeedShard(t *testing.T, env *envtestutil.Env, ns, run string, shard, attempt int32) {
	t.Helper()
	setPod(t, env, ns, v1alpha1.PodName(run, shard, attempt), corev1.PodSucceeded, 0,
		shardReport(shard, attempt, v1alpha1.ItemCounts{Total: 1, Completed: 1}, ""))
}

func setMaxConnections(t *testing.T, env *envtestutil.Env, ns, name string, n *int32) {
	t.Helper()
	run := getRun(t, env, ns, name)
	patch := client.MergeFrom(run.DeepCopy()) // no resourceVersion: the manager writes the status meanwhile
	run.Spec.Database.MaxConnections = n
	require.NoError(t, env.Client.Patch(context.Background(), run, patch))
}

// TestConnectionBudgetHoldsShards: a run of 5 shards with maxConnections 4
// runs 2 pods at once; the others wait (Pending, not failed) and say so,
// start as others finish (a retry waits like any start), follow the budget
// when it is raised or lowered (a lowered budget stops the pods above it),
// and suspend and resume within it.
func TestConnectionBudgetHoldsShards(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	spec := newRun(ns, "budget", 5, 5)
	spec.Spec.Database.MaxConnections = ptr.To[int32](4)
	create(t, env, spec)

	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0")
	r := waitRun(t, env, ns, "budget", "3 shards wait", all(
		budgetIs(&v1alpha1.ConnectionsStatus{Limit: 4, Source: v1alpha1.BudgetFromRun, Parallelism: 2, Waiting: 3}, 2),
		conditionIs(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonWaitingForConnectionBudget),
	))
	require.True(t, strings.HasPrefix(condition(r, v1alpha1.ConditionReconciling).Message,
		"3 of 5 shards wait for the connection budget: 4 connections (spec.database.maxConnections): 2 pods at once, 2 connections each; "),
		condition(r, v1alpha1.ConditionReconciling).Message)
	for i := int32(2); i < 5; i++ {
		e := shardEntry(r, i)
		require.Equal(t, v1alpha1.ShardPending, e.Phase, "shard %d waits, not failed", i)
		require.Empty(t, e.Pod, "shard %d has no pod yet", i)
	}
	cols := printerColumns(t, env, ns, "budget")
	require.EqualValues(t, 2, cols["Active"])
	require.EqualValues(t, 4, cols["Max-Connections"])
	require.EqualValues(t, 3, cols["Waiting"])
	waitEvent(t, env, ns, "budget", corev1.EventTypeNormal, ReasonWaitingForConnectionBudget, "3 of 5 shards wait for the connection budget")
	stillPods(t, env, ns, "budget", 500*time.Millisecond, "budget-0-0", "budget-1-0")

	// A shard finishes: the lowest waiting one takes its slot.
	succeedShard(t, env, ns, "budget", 0, 0)
	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0", "budget-2-0")
	// A shard fails: its slot goes to the next shard while it backs off;
	// its retry then waits for a slot like any start.
	setPod(t, env, ns, "budget-1-0", corev1.PodFailed, v1alpha1.ExitFailed, nil)
	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0", "budget-2-0", "budget-3-0")
	waitRun(t, env, ns, "budget", "shard 1 retrying, waiting", all(
		budgetIs(&v1alpha1.ConnectionsStatus{Limit: 4, Source: v1alpha1.BudgetFromRun, Parallelism: 2, Waiting: 2}, 2),
		func(r *v1alpha1.ProcessingRun) error { return shardPhaseIs(r, 1, v1alpha1.ShardRetrying) },
	))
	succeedShard(t, env, ns, "budget", 2, 0)
	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0", "budget-2-0", "budget-3-0", "budget-1-1")

	// Raised: the waiting shard starts.
	setMaxConnections(t, env, ns, "budget", ptr.To[int32](8))
	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0", "budget-2-0", "budget-3-0", "budget-1-1", "budget-4-0")
	waitRun(t, env, ns, "budget", "no shard waits", all(
		budgetIs(&v1alpha1.ConnectionsStatus{Limit: 8, Source: v1alpha1.BudgetFromRun, Parallelism: 4}, 3),
		conditionIs(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonRunning),
	))

	// Lowered to one pod: of the three live, the one not running yet stops
	// first, then the highest shard.
	setPod(t, env, ns, "budget-1-1", corev1.PodRunning, 0, nil)
	setPod(t, env, ns, "budget-3-0", corev1.PodRunning, 0, nil)
	setMaxConnections(t, env, ns, "budget", ptr.To[int32](2))
	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0", "budget-2-0", "budget-1-1")
	waitEvent(t, env, ns, "budget", corev1.EventTypeNormal, "PodDeleted", "Deleted pod budget-4-0: more pods run than the connection budget allows (2 connections (spec.database.maxConnections): 1 pods at once")
	waitEvent(t, env, ns, "budget", corev1.EventTypeNormal, "PodDeleted", "Deleted pod budget-3-0: more pods run than the connection budget allows")
	r = waitRun(t, env, ns, "budget", "two shards wait again", budgetIs(&v1alpha1.ConnectionsStatus{Limit: 2, Source: v1alpha1.BudgetFromRun, Parallelism: 1, Waiting: 2}, 1))
	require.Zero(t, shardEntry(r, 3).FailedAttempts, "a pod stopped for the budget is no failure")
	require.Equal(t, v1alpha1.ShardPending, shardEntry(r, 3).Phase)

	// Suspended: every pod stops; resumed: within the budget again.
	setSuspend(t, env, ns, "budget", true)
	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0", "budget-2-0")
	waitRun(t, env, ns, "budget", "suspended", all(phaseIs(v1alpha1.RunSuspended),
		budgetIs(&v1alpha1.ConnectionsStatus{Limit: 2, Source: v1alpha1.BudgetFromRun, Parallelism: 1}, 0)))
	setSuspend(t, env, ns, "budget", false)
	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0", "budget-2-0", "budget-1-2")
	stillPods(t, env, ns, "budget", 500*time.Millisecond, "budget-0-0", "budget-1-0", "budget-2-0", "budget-1-2")

	// The budget removed: the rest start at once, and the run finishes.
	setMaxConnections(t, env, ns, "budget", nil)
	waitPods(t, env, ns, "budget", "budget-0-0", "budget-1-0", "budget-2-0", "budget-1-2", "budget-3-1", "budget-4-1")
	succeedShard(t, env, ns, "budget", 1, 2)
	succeedShard(t, env, ns, "budget", 3, 1)
	succeedShard(t, env, ns, "budget", 4, 1)
	waitRun(t, env, ns, "budget", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded),
		countsAre(v1alpha1.ItemCounts{Total: 5, Completed: 5}), budgetIs(nil, 0)))
}

// TestConnectionBudgetFromTheManager: the manager's default applies to a
// run that sets no budget, its maximum caps one that asks more, and a run's
// own lower budget stays.
func TestConnectionBudgetFromTheManager(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{budget: v1alpha1.ConnectionBudgetSettings{Default: 4, Maximum: 6}})
	for _, tc := range []struct {
		name string
		own  *int32
		want v1alpha1.ConnectionsStatus
		pods []string
	}{
		{"by-default", nil, v1alpha1.ConnectionsStatus{Limit: 4, Source: v1alpha1.BudgetFromManagerDefault, Parallelism: 2, Waiting: 2}, []string{"by-default-0-0", "by-default-1-0"}},
		{"capped", ptr.To[int32](100), v1alpha1.ConnectionsStatus{Limit: 6, Source: v1alpha1.BudgetFromManagerMaximum, Parallelism: 3, Waiting: 1}, []string{"capped-0-0", "capped-1-0", "capped-2-0"}},
		{"own", ptr.To[int32](2), v1alpha1.ConnectionsStatus{Limit: 2, Source: v1alpha1.BudgetFromRun, Parallelism: 1, Waiting: 3}, []string{"own-0-0"}},
	} {
		spec := newRun(ns, tc.name, 4, 4)
		spec.Spec.Database.MaxConnections = tc.own
		create(t, env, spec)
		waitPods(t, env, ns, tc.name, tc.pods...)
		waitRun(t, env, ns, tc.name, "its budget", budgetIs(&tc.want, int32(len(tc.pods))))
	}
	stillPods(t, env, ns, "capped", 500*time.Millisecond, "capped-0-0", "capped-1-0", "capped-2-0")
}

// TestConnectionBudgetReplacesLostPodsWithinIt: a pod on a lost node is
// replaced at once, in the slot its lost pod held (not given to a waiting
// shard); the lost pod, still Terminating, no longer counts.
func TestConnectionBudgetReplacesLostPodsWithinIt(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	node := addNode(t, env, ns+"-node")
	spec := newRun(ns, "lost", 3, 3)
	spec.Spec.NodeLostAfterSeconds = ptr.To[int32](0)
	spec.Spec.Database.MaxConnections = ptr.To[int32](5) // 2 pods at once
	create(t, env, spec)
	waitPods(t, env, ns, "lost", "lost-0-0", "lost-1-0")
	bindPod(t, env, ns, "lost-0-0", node.Name)
	setPod(t, env, ns, "lost-0-0", corev1.PodRunning, 0, nil)

	setNodeReady(t, env, node.Name, corev1.ConditionUnknown)
	pods := waitPods(t, env, ns, "lost", "lost-0-0", "lost-0-1", "lost-1-0")
	require.NotNil(t, pods["lost-0-0"].DeletionTimestamp)
	stillPods(t, env, ns, "lost", 500*time.Millisecond, "lost-0-0", "lost-0-1", "lost-1-0")
	waitRun(t, env, ns, "lost", "shard 2 still waits", budgetIs(&v1alpha1.ConnectionsStatus{Limit: 5, Source: v1alpha1.BudgetFromRun, Parallelism: 2, Waiting: 1}, 2))
	require.NoError(t, env.Client.Delete(context.Background(), pods["lost-0-0"], client.GracePeriodSeconds(0)))
}

// TestConnectionBudgetCountsStoppingPods: pods being stopped (Terminating on
// their node) hold their slots until they are gone.
func TestConnectionBudgetCountsStoppingPods(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	node := addNode(t, env, ns+"-node")
	spec := newRun(ns, "slow-stop", 4, 4)
	spec.Spec.Database.MaxConnections = ptr.To[int32](6)
	create(t, env, spec)
	waitPods(t, env, ns, "slow-stop", "slow-stop-0-0", "slow-stop-1-0", "slow-stop-2-0")
	for _, p := range []string{"slow-stop-0-0", "slow-stop-1-0", "slow-stop-2-0"} {
		bindPod(t, env, ns, p, node.Name)
		setPod(t, env, ns, p, corev1.PodRunning, 0, nil)
	}
	// Lowered to one pod: two stop (the highest shards), and stay
	// Terminating (their kubelet has not confirmed): nothing starts.
	setMaxConnections(t, env, ns, "slow-stop", ptr.To[int32](2))
	waitFor(t, "two pods stopping", func() error {
		pods := runPods(t, env, ns, "slow-stop")
		if pods["slow-stop-1-0"].DeletionTimestamp == nil || pods["slow-stop-2-0"].DeletionTimestamp == nil || pods["slow-stop-0-0"].DeletionTimestamp != nil {
			return fmt.Errorf("not yet: %v", podNames(pods))
		}
		return nil
	})
	// Shard 0 finishes: its slot is free, but the stopping pods still hold
	// theirs (3 live for a budget of 1): nothing starts until they are gone.
	succeedShard(t, env, ns, "slow-stop", 0, 0)
	stillPods(t, env, ns, "slow-stop", time.Second, "slow-stop-0-0", "slow-stop-1-0", "slow-stop-2-0")
	ctx := context.Background()
	for _, p := range []string{"slow-stop-1-0", "slow-stop-2-0"} {
		require.NoError(t, env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p}}, client.GracePeriodSeconds(0)))
	}
	waitPods(t, env, ns, "slow-stop", "slow-stop-0-0", "slow-stop-1-1")
	stillPods(t, env, ns, "slow-stop", 500*time.Millisecond, "slow-stop-0-0", "slow-stop-1-1")
}

// TestConnectionBudget256Shards measures the controller's side of the
// README's formula: a 256-shard run with maxConnections 64 never has more
// than 64 / 2 = 32 live worker pods, watched on the apiserver from its
// first pod to its last, while the test plays the kubelet finishing pods
// as they come; the run succeeds with exact counts. (test/cli's
// TestConnectionBudget counts the workers' real connections.)
func TestConnectionBudget256Shards(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	most := watchLivePods(t, env, ns)
	spec := newRun(ns, "big", v1alpha1.MaxWorkers, v1alpha1.MaxWorkers)
	spec.Spec.Database.MaxConnections = ptr.To[int32](64)
	create(t, env, spec)

	// The first pass starts as many as the budget allows, and no more.
	waitFor(t, "32 pods", func() error {
		if n := len(runPods(t, env, ns, "big")); n != 32 {
			return fmt.Errorf("%d pods", n)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	require.Len(t, runPods(t, env, ns, "big"), 32)

	ctx := context.Background()
	done := map[string]bool{}
	deadline := time.Now().Add(5 * time.Minute)
	for len(done) < v1alpha1.MaxWorkers {
		require.True(t, time.Now().Before(deadline), "%d shards done", len(done))
		var pods corev1.PodList
		require.NoError(t, env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelRun: "big"}))
		progressed := false
		for i := range pods.Items {
			p := &pods.Items[i]
			if done[p.Name] || p.Status.Phase == corev1.PodSucceeded {
				continue
			}
			var shard int32
			_, err := fmt.Sscanf(p.Labels[v1alpha1.LabelShard], "%d", &shard)
			require.NoError(t, err)
			succeedShard(t, env, ns, "big", shard, 0)
			done[p.Name], progressed = true, true
		}
		if !progressed {
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitRun(t, env, ns, "big", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded),
		countsAre(v1alpha1.ItemCounts{Total: v1alpha1.MaxWorkers, Completed: v1alpha1.MaxWorkers})))
	peak := most()
	t.Logf("256 shards, maxConnections 64: at most %d live worker pods (%d connections by the formula)", peak, v1alpha1.MaxConnectionsOf(peak))
	require.LessOrEqual(t, peak, int32(32), "never more live pods than the budget allows")
	require.LessOrEqual(t, v1alpha1.MaxConnectionsOf(peak), int32(64))
	require.Equal(t, int32(32), peak, "the budget is used, not only respected")
}

// watchLivePods watches the namespace's pods from now on and returns a
// func that gives the most that were ever live (created, not finished, not
// gone) at once.
func watchLivePods(t *testing.T, env *envtestutil.Env, ns string) func() int32 {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns))
	require.NoError(t, err)
	var mu sync.Mutex
	live := map[string]bool{}
	var most int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			mu.Lock()
			if ev.Type != watch.Deleted && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
				live[pod.Name] = true
			} else {
				delete(live, pod.Name)
			}
			most = max(most, int32(len(live)))
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
	})
	return func() int32 {
		mu.Lock()
		defer mu.Unlock()
		return most
	}
}

// TestKueueRunWithinConnectionBudget: a queued run's Workload asks quota
// for the pods its budget runs at once (as a Job's for its parallelism),
// its pods never exceed what Kueue admitted, and a budget changed while it
// is queued queues a new Workload with the new count.
func TestKueueRunWithinConnectionBudget(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	kueueManager(t, env, ns)
	livePodGuard(t, env, ns)
	createFlavor(t, env, ns+"-flavor", kueue.ResourceFlavorSpec{})
	spec := queuedRun(ns, "queued", 6, 6, "team-a")
	spec.Spec.Database.MaxConnections = ptr.To[int32](4)
	run := create(t, env, spec)
	wl := waitWorkload(t, env, run, "2 pods", func(wl *kueue.Workload) error {
		if n := wl.Spec.PodSets[0].Count; n != 2 {
			return fmt.Errorf("count %d", n)
		}
		return nil
	})
	oldUID := wl.UID

	// Queued, the budget raised: a new Workload for 3 pods.
	setMaxConnections(t, env, ns, "queued", ptr.To[int32](6))
	wl = waitWorkload(t, env, run, "a new one for 3 pods", func(wl *kueue.Workload) error {
		if wl.UID == oldUID || wl.Spec.PodSets[0].Count != 3 {
			return fmt.Errorf("uid %s count %d", wl.UID, wl.Spec.PodSets[0].Count)
		}
		return nil
	})
	stillPods(t, env, ns, "queued", 300*time.Millisecond)

	admitWorkload(t, env, wl, "cq", ns+"-flavor")
	waitPods(t, env, ns, "queued", "queued-0-0", "queued-1-0", "queued-2-0")
	stillPods(t, env, ns, "queued", 500*time.Millisecond, "queued-0-0", "queued-1-0", "queued-2-0")

	// Admitted, the budget raised again: the Workload stays as admitted,
	// and the pods stay within its count.
	setMaxConnections(t, env, ns, "queued", ptr.To[int32](12))
	r := waitRun(t, env, ns, "queued", "within Kueue's count", budgetIs(&v1alpha1.ConnectionsStatus{Limit: 12, Source: v1alpha1.BudgetFromRun, Parallelism: 3, Waiting: 3}, 3))
	require.Contains(t, condition(r, v1alpha1.ConditionReconciling).Message, "12 connections (spec.database.maxConnections), within the pods Kueue admitted: 3 pods at once")
	stillPods(t, env, ns, "queued", 500*time.Millisecond, "queued-0-0", "queued-1-0", "queued-2-0")
	require.Equal(t, wl.UID, waitWorkload(t, env, run, "kept", nil).UID)

	succeedShard(t, env, ns, "queued", 0, 0)
	waitPods(t, env, ns, "queued", "queued-0-0", "queued-1-0", "queued-2-0", "queued-3-0")
}

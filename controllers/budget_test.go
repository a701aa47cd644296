package controllers

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
)

// budgetShard is one shard as decideBudget sees it.
type budgetShard string

const (
	bsRunning   budgetShard = "running"   // a live pod, running
	bsPending   budgetShard = "pending"   // a live pod, not running yet
	bsStopping  budgetShard = "stopping"  // a live pod being deleted
	bsCacheWait budgetShard = "cacheWait" // a pod the cache does not show yet
	bsWants     budgetShard = "wants"     // wants a pod now (first attempt, retry, a lost pod's replacement)
	bsIdle      budgetShard = "idle"      // succeeded, failed, or retrying after a back-off
)

func budgetShards(kinds ...budgetShard) []shardDecision {
	out := make([]shardDecision, len(kinds))
	for i, k := range kinds {
		d := shardDecision{index: int32(i)}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.PodName("r", int32(i), 0)}}
		switch k {
		case bsRunning:
			d.live, d.stoppable, d.stoppableRunning = 1, pod, true
		case bsPending:
			d.live, d.stoppable = 1, pod
		case bsStopping:
			d.live = 1
		case bsCacheWait:
			d.waitForCache = true
		case bsWants:
			d.create = ptr.To(int32(1))
		}
		out[i] = d
	}
	return out
}

func repeat(k budgetShard, n int) []budgetShard {
	out := make([]budgetShard, n)
	for i := range out {
		out[i] = k
	}
	return out
}

func TestDecideBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		shards      []budgetShard
		parallelism int32
		stopping    bool // suspended or finished
		create      []int32
		wait        []int32
		stop        []int32
		want        budgetOutcome
	}{
		{name: "no budget: every shard starts", shards: repeat(bsWants, 4), parallelism: 4,
			create: []int32{0, 1, 2, 3}},
		{name: "a fresh run: the lowest shards start, the others wait", shards: repeat(bsWants, 8), parallelism: 3,
			create: []int32{0, 1, 2}, wait: []int32{3, 4, 5, 6, 7}, want: budgetOutcome{waiting: 5}},
		{name: "a shard finished: the lowest waiting one takes its slot",
			shards: []budgetShard{bsIdle, bsRunning, bsRunning, bsWants, bsWants}, parallelism: 3,
			create: []int32{3}, wait: []int32{4}, want: budgetOutcome{active: 2, waiting: 1}},
		{name: "full: nothing starts", shards: []budgetShard{bsRunning, bsPending, bsRunning, bsWants}, parallelism: 3,
			wait: []int32{3}, want: budgetOutcome{active: 3, waiting: 1}},
		{name: "a pod the cache does not show yet holds its slot",
			shards: []budgetShard{bsRunning, bsRunning, bsCacheWait, bsWants}, parallelism: 3,
			wait: []int32{3}, want: budgetOutcome{active: 2, waiting: 1}},
		{name: "a pod being stopped holds its slot until it is gone",
			shards: []budgetShard{bsRunning, bsStopping, bsRunning, bsWants}, parallelism: 3,
			wait: []int32{3}, want: budgetOutcome{active: 3, waiting: 1}},
		{name: "a retry waits like any other start: the lower shard goes first",
			shards: []budgetShard{bsRunning, bsWants, bsIdle, bsWants, bsWants}, parallelism: 2,
			create: []int32{1}, wait: []int32{3, 4}, want: budgetOutcome{active: 1, waiting: 2}},
		{name: "a lost pod's replacement takes the slot its lost pod held",
			shards: []budgetShard{bsRunning, bsWants, bsRunning}, parallelism: 3,
			create: []int32{1}, want: budgetOutcome{active: 2}},
		{name: "the budget lowered: pods not yet running stop first, then the highest shards",
			shards: []budgetShard{bsRunning, bsPending, bsRunning, bsRunning, bsRunning, bsWants}, parallelism: 2,
			stop: []int32{1, 4, 3}, wait: []int32{5}, want: budgetOutcome{active: 5, waiting: 1, stopped: 3}},
		{name: "the budget lowered: pods already stopping count towards it",
			shards: []budgetShard{bsRunning, bsStopping, bsRunning, bsRunning}, parallelism: 2,
			stop: []int32{3}, want: budgetOutcome{active: 4, stopped: 1}},
		{name: "the budget lowered: pods the cache does not show yet are not stopped, the others are",
			shards: []budgetShard{bsCacheWait, bsRunning, bsRunning}, parallelism: 1,
			stop: []int32{2, 1}, want: budgetOutcome{active: 2, stopped: 2}},
		{name: "suspended or finished: every pod stops anyway, only counted",
			shards: []budgetShard{bsRunning, bsRunning, bsRunning, bsWants}, parallelism: 1, stopping: true,
			create: []int32{3}, want: budgetOutcome{active: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shards := budgetShards(tc.shards...)
			got := decideBudget(shards, tc.parallelism, tc.stopping)
			require.Equal(t, tc.want, got)
			var create, wait, stop []int32
			for _, d := range shards {
				if d.create != nil {
					create = append(create, d.index)
				}
				if d.waitsForBudget {
					wait = append(wait, d.index)
				}
				if d.overBudget != nil {
					stop = append(stop, d.index)
					require.Same(t, d.stoppable, d.overBudget)
				}
			}
			require.Equal(t, tc.create, create, "creates")
			require.Equal(t, tc.wait, wait, "waiting")
			if tc.stop != nil {
				// The order they were chosen in is not kept: compare as sets.
				require.ElementsMatch(t, tc.stop, stop, "stopped")
			} else {
				require.Empty(t, stop, "stopped")
			}
		})
	}
}

// TestDecideBudgetStopsInOrder: of the pods above a lowered budget, those
// not running yet go first, then the highest shards.
func TestDecideBudgetStopsInOrder(t *testing.T) {
	t.Parallel()
	kinds := []budgetShard{bsRunning, bsRunning, bsPending, bsRunning, bsRunning}
	for parallelism, want := range map[int32][]int32{
		4: {2},
		3: {2, 4},
		2: {2, 4, 3},
		1: {2, 4, 3, 1},
	} {
		shards := budgetShards(kinds...)
		decideBudget(shards, parallelism, false)
		var stop []int32
		for _, d := range shards {
			if d.overBudget != nil {
				stop = append(stop, d.index)
			}
		}
		require.ElementsMatch(t, want, stop, "parallelism %d", parallelism)
	}
}

// TestBudgetNeverExceeded plays a 256-shard run pass after pass through the
// real per-shard decision (decideShard) and decideBudget: pods start when
// told, run, succeed, fail and are retried, or are lost with their node, in
// a random order; the budget changes midway. After every pass the live pods
// (lost ones aside) never exceed the budget's pods at once, nor, once the
// excess pods of a lowered budget are gone, the lowered one; every shard
// ends succeeded.
func TestBudgetNeverExceeded(t *testing.T) {
	t.Parallel()
	const shards = 256
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 0))
			sim := newBudgetSim(shards)
			parallelism := int32(32)
			most := int32(0)
			passes := 0
			for pass := 0; pass < 20000 && !sim.done(); pass++ {
				passes++
				if pass == 30 {
					parallelism = 10 // a DBA lowers the budget
				}
				if pass == 80 {
					parallelism = 40
				}
				sim.pass(t, parallelism)
				// After the pass: pods stopped for a lowered budget are live
				// until they exit, the others within the budget.
				live, stopping := sim.live()
				if live-stopping > parallelism {
					t.Fatalf("pass %d: %d live pods (%d being stopped), budget %d", pass, live, stopping, parallelism)
				}
				most = max(most, live-stopping)
				if pass == 79 {
					require.LessOrEqual(t, live, parallelism, "the pods above the lowered budget are gone")
				}
				sim.step(rnd)
			}
			t.Logf("seed %d: every shard succeeded after %d passes; at most %d live pods (not being stopped), %d lost pods replaced, %d retries, %d pods stopped for the budget",
				seed, passes, most, sim.lost, sim.retries, sim.stopped)
			require.True(t, sim.done(), "every shard succeeds")
			require.LessOrEqual(t, most, int32(40))
			require.Greater(t, most, int32(0))
			require.LessOrEqual(t, sim.mostLive, int32(40), "no pass ever saw more live pods than the largest budget")
		})
	}
}

// budgetSim is a run's pods as a kubelet, the API and the controller's
// record of them would show them, without the API.
type budgetSim struct {
	pods                   [][]fakePod // by shard
	entries                []*v1alpha1.ShardStatus
	mostLive               int32
	lost, retries, stopped int
}

func newBudgetSim(n int) *budgetSim {
	return &budgetSim{pods: make([][]fakePod, n), entries: make([]*v1alpha1.ShardStatus, n)}
}

func (s *budgetSim) done() bool {
	for i := range s.pods {
		if e := s.entries[i]; e == nil || e.Phase != v1alpha1.ShardSucceeded {
			return false
		}
	}
	return true
}

// pass decides every shard and the budget, and carries the decisions out:
// creates pods, deletes the ones given up or stopped (a stopped one is
// being deleted until it exits), records the status.
func (s *budgetSim) pass(t *testing.T, parallelism int32) {
	t.Helper()
	p := shardPolicy{backoffLimit: 1000, backoffBase: 0, backoffMax: 0}
	out := make([]shardDecision, len(s.pods))
	for i := range s.pods {
		in := shardInput{runName: "r", index: int32(i), entry: s.entries[i], recordedAttempt: -1, recordedGone: true}
		if in.entry != nil && in.entry.Pod != "" {
			in.recordedAttempt = attemptOfPodName(in.entry.Pod, int32(i))
		}
		for _, f := range s.pods[i] {
			info, ok := observePod(f.pod(), int32(i))
			require.True(t, ok)
			info.lost = f.lost
			in.pods = append(in.pods, info)
		}
		out[i] = decideShard(in, p, t0.Add(1e9))
	}
	o := decideBudget(out, parallelism, false)
	live, stopping := s.live()
	require.Equal(t, live, o.active, "decideBudget counts the live pods (lost ones aside)")
	s.mostLive = max(s.mostLive, live-stopping)
	for i := range out {
		d := &out[i]
		if d.create != nil && *d.create > 0 {
			s.retries++
		}
		if d.overBudget != nil {
			s.stopped++
			for k := range s.pods[i] {
				if s.pods[i][k].pod().Name == d.overBudget.Name {
					s.pods[i][k].deleting = true
				}
			}
		}
		for _, lost := range d.lostPods {
			s.remove(i, lost.Name)
		}
		for _, del := range d.deletePods {
			s.remove(i, del.Name)
		}
		if d.create != nil {
			s.pods[i] = append(s.pods[i], fakePod{shard: int32(i), attempt: *d.create, phase: corev1.PodPending})
			d.pod = v1alpha1.PodName("r", int32(i), *d.create)
			d.phase = v1alpha1.ShardPending
		}
		e := &v1alpha1.ShardStatus{Index: int32(i), Pod: d.pod, Phase: d.phase, FailedAttempts: d.failures, LastFailedAttempt: d.lastFailedAttempt}
		if d.pod == "" {
			e = nil
		}
		s.entries[i] = e
	}
}

// live counts the live pods (lost ones aside) and those of them being
// stopped.
func (s *budgetSim) live() (live, stopping int32) {
	for i := range s.pods {
		for _, f := range s.pods[i] {
			if f.exit != nil || f.lost {
				continue
			}
			live++
			if f.deleting {
				stopping++
			}
		}
	}
	return live, stopping
}

func (s *budgetSim) remove(shard int, name string) {
	kept := s.pods[shard][:0]
	for _, f := range s.pods[shard] {
		if f.pod().Name != name {
			kept = append(kept, f)
		}
	}
	s.pods[shard] = kept
}

// step plays the kubelet and the nodes: live pods start running, then
// succeed, fail, or are lost; stopped pods exit and go.
func (s *budgetSim) step(rnd *rand.Rand) {
	for i := range s.pods {
		kept := s.pods[i][:0]
		for _, f := range s.pods[i] {
			if !f.deleting || f.exit == nil {
				kept = append(kept, f)
			}
		}
		s.pods[i] = kept
		for k := range s.pods[i] {
			f := &s.pods[i][k]
			switch {
			case f.exit != nil || f.lost:
			case f.deleting:
				f.phase, f.exit = corev1.PodFailed, exit(143) // it exits, and goes below
			case f.phase == corev1.PodPending && rnd.IntN(3) == 0:
				f.phase = corev1.PodRunning
			case f.phase == corev1.PodRunning:
				switch r := rnd.IntN(40); {
				case r == 0:
					f.phase, f.exit = corev1.PodFailed, exit(1)
				case r == 1:
					f.lost = true // its node is lost: the shard gets a replacement
					s.lost++
				case r < 8:
					f.phase, f.exit = corev1.PodSucceeded, exit(0)
					f.report = &v1alpha1.ShardReport{Shard: f.shard, Attempt: f.attempt}
				}
			}
		}
	}
}

func TestBudgetFor(t *testing.T) {
	t.Parallel()
	run := newRun("ns", "r", 256, 1)
	require.Equal(t, runBudget{parallelism: 256}, budgetFor(run, v1alpha1.ConnectionBudgetSettings{}, 0))
	run.Spec.Database.MaxConnections = ptr.To(int32(64))
	b := budgetFor(run, v1alpha1.ConnectionBudgetSettings{}, 0)
	require.Equal(t, int32(32), b.parallelism)
	require.Equal(t, "64 connections (spec.database.maxConnections): 32 pods at once, 2 connections each", b.describe())
	b = budgetFor(run, v1alpha1.ConnectionBudgetSettings{Maximum: 20}, 0)
	require.Equal(t, runBudget{ConnectionBudget: v1alpha1.ConnectionBudget{Limit: 20, Source: v1alpha1.BudgetFromManagerMaximum}, parallelism: 10}, b)
	require.Equal(t, "20 connections (the manager's maximum): 10 pods at once, 2 connections each", b.describe())
	b = budgetFor(run, v1alpha1.ConnectionBudgetSettings{}, 8)
	require.Equal(t, int32(8), b.parallelism, "never more pods than Kueue admitted")
	require.Equal(t, "64 connections (spec.database.maxConnections), within the pods Kueue admitted: 8 pods at once, 2 connections each", b.describe())
	require.Equal(t, int32(32), budgetFor(run, v1alpha1.ConnectionBudgetSettings{}, 32).parallelism)
	require.Equal(t, int32(32), budgetFor(run, v1alpha1.ConnectionBudgetSettings{}, 256).parallelism, "an admission above the budget: the budget's")

	wl := &kueue.Workload{Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{Name: workloadPodSet, Count: 32}}}}
	require.Equal(t, int32(0), admittedPods(wl), "not admitted")
	wl.Status.Admission = &kueue.Admission{PodSetAssignments: []kueue.PodSetAssignment{{Name: workloadPodSet}}}
	require.Equal(t, int32(32), admittedPods(wl), "the pod set's count when the admission has none")
	wl.Status.Admission.PodSetAssignments[0].Count = ptr.To(int32(12))
	require.Equal(t, int32(12), admittedPods(wl))
}

// TestBudgetInConditions: waiting shards show as the Reconciling
// condition's reason, below the reasons that need someone to act.
func TestBudgetInConditions(t *testing.T) {
	t.Parallel()
	run := newRun("ns", "r", 4, 4)
	run.Spec.Database.MaxConnections = ptr.To(int32(4))
	b := budgetFor(run, v1alpha1.ConnectionBudgetSettings{}, 0)
	shards := budgetShards(bsRunning, bsRunning, bsWants, bsWants)
	o := decideBudget(shards, b.parallelism, false)
	for i := range shards {
		shards[i].phase = v1alpha1.ShardPending
	}
	in := statusInput{shards: shards, outcome: runOutcome{phase: v1alpha1.RunRunning}, budget: b, budgetOut: o}
	st := buildStatus(run, in)
	require.Equal(t, int32(2), st.Active)
	require.Equal(t, &v1alpha1.ConnectionsStatus{Limit: 4, Source: v1alpha1.BudgetFromRun, Parallelism: 2, Waiting: 2}, st.Connections)
	rec := findCondition(st.Conditions, v1alpha1.ConditionReconciling)
	require.Equal(t, ReasonWaitingForConnectionBudget, rec.Reason)
	require.True(t, strings.HasPrefix(rec.Message, "2 of 4 shards wait for the connection budget: 4 connections (spec.database.maxConnections): 2 pods at once, 2 connections each; "), rec.Message)

	shards[0].unschedulable = "pod r-0-0: 0/3 nodes are available"
	st = buildStatus(run, statusInput{shards: shards, outcome: runOutcome{phase: v1alpha1.RunRunning}, budget: b, budgetOut: o})
	require.Equal(t, ReasonUnschedulable, findCondition(st.Conditions, v1alpha1.ConditionReconciling).Reason, "what needs someone to act comes first")

	st = buildStatus(run, statusInput{shards: shards, outcome: runOutcome{phase: v1alpha1.RunSucceeded, finished: true}, budget: b})
	require.Nil(t, st.Connections, "a finished run shows no budget")
	require.Zero(t, st.Active)
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// TestStallLeavesNoShardWaitingForTheBudget: a run stalled before its pods
// start (a missing ConfigMap) says so; no shard then waits for the budget.
func TestStallLeavesNoShardWaitingForTheBudget(t *testing.T) {
	t.Parallel()
	s := &scope{shards: budgetShards(bsRunning, bsWants, bsWants, bsWants)}
	s.budgetOut = decideBudget(s.shards, 2, false)
	require.Equal(t, int32(2), s.budgetOut.waiting)
	s.stallStart(&problem{reason: ReasonConfigMapNotFound, message: "ConfigMap \"june\" not found"}, 0)
	require.Zero(t, s.budgetOut.waiting)
	require.False(t, s.needsPods())
	require.Equal(t, int32(1), s.budgetOut.active)
}

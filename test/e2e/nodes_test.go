//go:build e2e

package e2e

// Tests that take a node away (power loss, partition): they do not call
// t.Parallel, so they run alone, and they put the node back before the
// next test.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// nodeLossBound: a run whose node is lost finishes within this of the loss
// (20 s until the node is unreachable, nodeLostAfterSeconds 0, up to ~35 s
// for PostgreSQL to drop a dead lock holder's session, and the rest of the
// work).
const nodeLossBound = 3 * time.Minute

// busyWatcher polls a run's status and remembers every shard message that
// says a worker waits for the shard's lock, each once.
type busyWatcher struct {
	mu   sync.Mutex
	seen []string
	stop context.CancelFunc
	done chan struct{}
}

func (f *fixture) watchBusy(name string) *busyWatcher {
	ctx, cancel := context.WithCancel(f.ctx)
	w := &busyWatcher{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			run := &v1alpha1.ProcessingRun{}
			if err := f.c.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, run); err == nil {
				for _, s := range run.Status.Shards {
					if strings.HasPrefix(s.Message, v1alpha1.ShardBusyMessage) {
						line := fmt.Sprintf("shard %d pod %s (%s): %s", s.Index, s.Pod, s.Phase, s.Message)
						w.mu.Lock()
						if !slices.Contains(w.seen, line) { // each once: two shards' waits alternate
							w.seen = append(w.seen, line)
						}
						w.mu.Unlock()
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *busyWatcher) messages() []string {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.seen...)
}

// nodeOfMostShards is the node running the most of the run's worker pods
// once every shard runs.
func (f *fixture) nodeOfMostShards(run *v1alpha1.ProcessingRun) (string, []string) {
	f.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		byNode := map[string][]string{}
		running := 0
		for _, p := range f.runPods(run) {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
				byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p.Name)
			}
		}
		if running == int(run.Spec.Workers) {
			best := ""
			for n, pods := range byNode {
				if best == "" || len(pods) > len(byNode[best]) || (len(pods) == len(byNode[best]) && n < best) {
					best = n
				}
			}
			sort.Strings(byNode[best])
			f.t.Logf("worker pods by node: %v", byNode)
			return best, byNode[best]
		}
		require.True(f.t, time.Now().Before(deadline), "the run's %d shards are not all Running", run.Spec.Workers)
		time.Sleep(300 * time.Millisecond)
	}
}

// lostNodeRun is a run whose shards are replaced as soon as their node is
// unreachable.
func (f *fixture) lostNodeRun(name string, s runSpec) *v1alpha1.ProcessingRun {
	f.t.Helper()
	run := f.newRun(name, s)
	run.Spec.NodeLostAfterSeconds = ptr.To[int32](0)
	require.NoError(f.t, f.c.Create(f.ctx, run), "create run %s", name)
	f.t.Logf("created run %s/%s (uid %s): %d workers, nodeLostAfterSeconds 0", f.ns, name, run.UID, run.Spec.Workers)
	return run
}

// requireReplacedOnLostNode: every pod that was on the lost node was
// replaced, and the controller said why.
func (f *fixture) requireReplacedOnLostNode(run *v1alpha1.ProcessingRun, lostPods []string) {
	f.t.Helper()
	for _, p := range lostPods {
		found := false
		for _, s := range run.Status.Shards {
			if attemptOf(s.Pod) > attemptOf(p) && strings.HasPrefix(p, fmt.Sprintf("%s-%d-", run.Name, s.Index)) {
				found = true
			}
		}
		require.True(f.t, found, "pod %s on the lost node was replaced: %+v", p, run.Status.Shards)
	}
	var notes []string
	for _, e := range f.events(run.Name) {
		if e.Reason == "PodCreated" && strings.Contains(e.Message, "to replace a pod on a lost node") {
			notes = append(notes, e.Message)
		}
	}
	require.NotEmpty(f.t, notes, "an Event says a pod was replaced because its node was lost")
	f.t.Logf("replacements: %v", notes)
	for _, s := range run.Status.Shards {
		require.Zero(f.t, s.FailedAttempts, "shard %d: a lost pod is not a failed attempt", s.Index)
	}
}

func attemptOf(pod string) int {
	i := strings.LastIndex(pod, "-")
	var a int
	_, _ = fmt.Sscanf(pod[i+1:], "%d", &a)
	return a
}

// TestNodePowerLoss: the node running most of a run's shards loses power in
// the middle of the run. Its pods are replaced without waiting for them to
// be confirmed gone; a replacement whose predecessor's database session is
// still open waits for the shard's lock and says so in the status; the run
// Succeeds within a bound with counts equal to the ledger and one committed
// row per key.
func TestNodePowerLoss(t *testing.T) {
	e := setup(t)
	e.clusterNodes(t, 2)
	e.scaleManager(t, 2) // a standby, should the leader's node be the one lost
	t.Cleanup(func() { e.scaleManager(t, 1) })

	f := newFixture(t, "powerloss", 1.0)
	run := f.lostNodeRun("powerloss", runSpec{workers: 4, chunk: 50, batch: queryBatch(1, 4000, 0)})
	victim, lostPods := f.nodeOfMostShards(run)
	f.waitRowsOfShard(run, 0, 50)
	node := e.node(t, victim)
	t.Cleanup(func() { node.powerOn(t) })
	busy := f.watchBusy(run.Name)

	f.mon.nodeLost(victim)
	lost := time.Now()
	node.powerOff(t)
	t.Logf("node %s unreachable %.1fs after the power loss", victim, node.waitReady(t, corev1.ConditionUnknown, time.Minute).Seconds())

	run = f.waitComplete(run.Name, nodeLossBound)
	took := time.Since(lost)
	t.Logf("run Succeeded %.1fs after node %s lost power", took.Seconds(), victim)
	require.Equal(t, counts{Total: 4000, Completed: 4000}, countsOf(run), "exact counts despite the lost node")
	f.requireShardsAddUp(run)
	require.EqualValues(t, 4000, f.committedRows(string(run.UID)), "completed == the run's ledger rows")
	f.requireExactlyOnce(4000)
	f.requireReplacedOnLostNode(run, lostPods)
	waits := busy.messages()
	t.Logf("shard lock waits seen in the status: %v", waits)
	require.NotEmpty(t, waits, "a replacement waited for the lost pod's lock, and the status said so")
}

// TestNodePartition: a node is cut off from the control plane while its pod
// keeps working and reaching PostgreSQL. The pod is replaced; the
// replacement waits for the shard's lock (the status says so) while the
// cut-off pod finishes its shard; nothing is committed twice, the counts
// are exact, and the run Succeeds.
func TestNodePartition(t *testing.T) {
	e := setup(t)
	e.clusterNodes(t, 2)
	e.scaleManager(t, 2)
	t.Cleanup(func() { e.scaleManager(t, 1) })

	f := newFixture(t, "partition", 1.0)
	run := f.lostNodeRun("partition", runSpec{workers: 2, chunk: 50, batch: queryBatch(1, 3000, 0)})
	f.nodeOfMostShards(run)
	f.waitRowsOfShard(run, 0, 50)
	victimPod := f.runPods(run)[0]
	require.Equal(t, v1alpha1.PodName(run.Name, 0, 0), victimPod.Name)
	victim := victimPod.Spec.NodeName
	var lostPods []string
	for _, p := range f.runPods(run) {
		if p.Spec.NodeName == victim {
			lostPods = append(lostPods, p.Name)
		}
	}
	// Manager pods on the cut-off node lose the Lease, and the standby leads.
	node := e.node(t, victim)
	t.Cleanup(func() { node.heal(t) })
	busy := f.watchBusy(run.Name)

	f.mon.nodeLost(victim)
	before := f.int(`SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND shard = 0`, string(run.UID))
	cut := time.Now()
	node.partition(t)
	node.waitReady(t, corev1.ConditionUnknown, time.Minute)

	run = f.waitComplete(run.Name, nodeLossBound)
	t.Logf("run Succeeded %.1fs after node %s was cut off", time.Since(cut).Seconds(), victim)
	after := f.int(`SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND shard = 0 AND attempt = 0`, string(run.UID))
	t.Logf("the cut-off pod %s had committed %d rows of shard 0 when it was cut off, %d in all", victimPod.Name, before, after)
	require.Greater(t, after, before, "the cut-off pod kept working (it still reached PostgreSQL)")
	require.Equal(t, counts{Total: 3000, Completed: 3000}, countsOf(run), "exact counts: the cut-off pod's rows count once")
	f.requireShardsAddUp(run)
	require.EqualValues(t, 3000, f.committedRows(string(run.UID)))
	f.requireExactlyOnce(3000)
	f.requireReplacedOnLostNode(run, lostPods)
	waits := busy.messages()
	t.Logf("shard lock waits seen in the status: %v", waits)
	require.NotEmpty(t, waits, "the replacement waited for the cut-off pod's lock, and the status said so")

	node.heal(t)
	node.waitReady(t, corev1.ConditionTrue, 2*time.Minute)
}

// TestNodeOfTheLeaderLost: two manager replicas on different nodes; the leader's
// node loses power in the middle of a run. The standby takes the Lease
// within its duration, and the run in flight completes with exact counts.
func TestNodeOfTheLeaderLost(t *testing.T) {
	e := setup(t)
	e.clusterNodes(t, 2)
	pods := e.scaleManager(t, 2)
	t.Cleanup(func() { e.scaleManager(t, 1) })
	ctx := context.Background()
	leader, err := e.leaderPod(ctx)
	require.NoError(t, err)
	nodes := map[string]bool{}
	for _, p := range pods {
		nodes[p.Spec.NodeName] = true
	}
	require.Len(t, nodes, 2, "the manager's replicas run on different nodes (podAntiAffinity): %v", nodes)
	victim := pods[leader].Spec.NodeName

	f := newFixture(t, "leadernode", 1.0)
	run := f.lostNodeRun("leadernode", runSpec{workers: 2, chunk: 50, batch: queryBatch(1, 2000, 0)})
	f.nodeOfMostShards(run)
	f.waitRowsOfShard(run, 0, 50)
	node := e.node(t, victim)
	t.Cleanup(func() { node.powerOn(t) })

	f.mon.nodeLost(victim)
	lost := time.Now()
	node.powerOff(t)
	var now string
	for {
		now, err = e.leaderPod(ctx)
		require.NoError(t, err)
		if now != "" && now != leader {
			break
		}
		require.Less(t, time.Since(lost), time.Minute, "no new leader a minute after the leader's node lost power")
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("leader %s on %s lost power; %s took the Lease %.1fs later", leader, victim, now, time.Since(lost).Seconds())
	require.Contains(t, pods, now, "the standby leads")

	run = f.waitComplete(run.Name, nodeLossBound)
	t.Logf("run Succeeded %.1fs after the leader's node lost power", time.Since(lost).Seconds())
	require.Equal(t, counts{Total: 2000, Completed: 2000}, countsOf(run))
	f.requireShardsAddUp(run)
	require.EqualValues(t, 2000, f.committedRows(string(run.UID)))
	f.requireExactlyOnce(2000)
}

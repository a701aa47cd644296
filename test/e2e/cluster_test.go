//go:build e2e

package e2e

// Tests that disturb the whole cluster (the manager, PostgreSQL): they do
// not call t.Parallel, so they run alone, before the parallel tests start.

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// leaderPod is the pod named by the manager's Lease ("<pod>_<uuid>").
func (e *env) leaderPod(ctx context.Context) (string, error) {
	var lease coordinationv1.Lease
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: leaseName}, &lease); err != nil {
		return "", err
	}
	if lease.Spec.HolderIdentity == nil {
		return "", nil
	}
	pod, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_")
	return pod, nil
}

func podReady(p corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// scaleManager scales the manager Deployment and waits until it has that
// many ready pods and the Lease is held by one of them.
func (e *env) scaleManager(t *testing.T, replicas int) map[string]corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out, err := e.kubectlRun(ctx, "-n", systemNamespace, "scale", "deployment/"+managerName, "--replicas="+strconv.Itoa(replicas))
	require.NoError(t, err, out)
	out, err = e.kubectlRun(ctx, "-n", systemNamespace, "rollout", "status", "deployment/"+managerName, "--timeout=180s")
	require.NoError(t, err, out)
	for {
		pods, err := e.managerPods(ctx)
		require.NoError(t, err)
		ready := map[string]corev1.Pod{}
		for n, p := range pods {
			if podReady(p) {
				ready[n] = p
			}
		}
		leader, err := e.leaderPod(ctx)
		require.NoError(t, err)
		if _, ok := ready[leader]; ok && len(ready) == len(pods) && len(ready) == replicas {
			return ready
		}
		require.NoError(t, ctx.Err(), "waiting for %d ready manager pods holding the Lease (have %d of %d, leader %q)", replicas, len(ready), len(pods), leader)
		time.Sleep(500 * time.Millisecond)
	}
}

// TestLeaderFailover: two manager replicas; the leader's pod is deleted in
// the middle of a run. Another replica takes the Lease, the run completes
// with exact counts, and no shard ever had two live pods (nor a needless
// second one).
func TestLeaderFailover(t *testing.T) {
	e := setup(t)
	pods := e.scaleManager(t, 2)
	t.Cleanup(func() { e.scaleManager(t, 1) })
	ctx := context.Background()
	leader, err := e.leaderPod(ctx)
	require.NoError(t, err)
	var standby string
	for n := range pods {
		if n != leader {
			standby = n
		}
	}
	require.NotEmpty(t, standby, "a standby replica: %v", pods)
	t.Logf("leader %s, standby %s", leader, standby)

	f := newFixture(t, "failover", 1.5)
	run := f.createRun("failover", runSpec{workers: 3, chunk: 100, batch: queryBatch(1, 3000, 0)})
	f.waitRowsOfShard(run, 0, 100)

	deleted := time.Now()
	require.NoError(t, e.c.Delete(ctx, &corev1.Pod{ObjectMeta: pods[leader].ObjectMeta}))
	t.Logf("deleted the leader's pod %s", leader)
	var now string
	for {
		now, err = e.leaderPod(ctx)
		require.NoError(t, err)
		if now != "" && now != leader {
			break
		}
		require.Less(t, time.Since(deleted), time.Minute, "no new leader a minute after the leader's pod was deleted")
		time.Sleep(200 * time.Millisecond)
	}
	tookOver := time.Now()
	// The old leader released the Lease on its way out; whichever candidate
	// asks first takes it: the standby, or the pod the ReplicaSet started
	// in place of the deleted one.
	who := "the standby replica"
	if now != standby {
		who = "the replacement pod the ReplicaSet started"
	}
	t.Logf("%s (%s) took the Lease %.1fs after the leader's pod was deleted", now, who, tookOver.Sub(deleted).Seconds())
	mgrs, err := e.managerPods(ctx)
	require.NoError(t, err)
	require.Contains(t, mgrs, now, "the new leader is a manager pod")
	require.Nil(t, mgrs[now].DeletionTimestamp, "the new leader is not the deleted pod")
	mid := f.get(run.Name)
	require.False(t, isTrue(mid, v1alpha1.ConditionComplete) || isTrue(mid, v1alpha1.ConditionFailed),
		"the run was still going when the leader changed (else make the batch slower): %s", statusLine(mid))

	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: 3000, Completed: 3000}, countsOf(run))
	f.requireShardsAddUp(run)
	require.False(t, run.Status.CompletionTime.Time.Before(tookOver.Truncate(time.Second)), "the new leader finished the run")
	for i := range 3 {
		require.Len(t, f.mon.podsOfShard(run, i), 1, "shard %d: one pod, the new leader created none", i)
	}
	require.EqualValues(t, 3000, f.committedRows(string(run.UID)))
	f.requireExactlyOnce(3000)
}

// TestPostgresRestart: PostgreSQL restarts in the middle of a run. The run
// completes with exact counts or fails with a condition that says why;
// never a key twice.
func TestPostgresRestart(t *testing.T) {
	f := newFixture(t, "pgrestart", 1.0)
	run := f.createRun("restart", runSpec{workers: 2, chunk: 100, batch: queryBatch(1, 2000, 0)})
	f.waitRowsOfShard(run, 0, 200)
	before := f.int(`SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, string(run.UID))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, f.clusterSh, "postgres", "restart")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "hack/cluster.sh postgres restart:\n%s", out)
	t.Logf("$ hack/cluster.sh postgres restart (the run had committed %d of 2000)\n%s", before, out)

	run = f.waitFinished(run.Name, runTimeout)
	// What the workers said while the database was away.
	for _, p := range f.runPods(run) {
		if logs, err := f.kubectl("logs", p.Name); err == nil {
			for _, l := range strings.Split(logs, "\n") {
				if strings.Contains(l, "retrying") {
					t.Logf("%s: %s", p.Name, l)
				}
			}
		}
	}
	committed := f.committedRows(string(run.UID))
	if isTrue(run, v1alpha1.ConditionComplete) {
		t.Logf("outcome: Complete")
		require.Equal(t, counts{Total: 2000, Completed: 2000}, countsOf(run))
		f.requireShardsAddUp(run)
		require.EqualValues(t, 2000, committed)
		require.Less(t, before, committed, "the run went on after the restart")
		f.requireExactlyOnce(2000)
		return
	}
	c := findCondition(run, v1alpha1.ConditionFailed)
	require.NotNil(t, c)
	t.Logf("outcome: Failed: %s: %s", c.Reason, c.Message)
	msg := strings.ToLower(c.Message)
	require.True(t, strings.Contains(msg, "database") || strings.Contains(msg, "connect") || strings.Contains(msg, "postgres"),
		"the Failed condition says the database was the problem: %s", c.Message)
	require.Equal(t, run.Status.Completed, committed, "completed is exactly what was committed")
	f.requireExactlyOnce(committed)
}

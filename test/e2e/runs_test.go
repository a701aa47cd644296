//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// How long a run may take on a busy 2-core machine.
const runTimeout = 5 * time.Minute

// inlineItems is accounts lo..hi as inline items.
func inlineItems(lo, hi int) v1alpha1.BatchSpec {
	var items []v1alpha1.Item
	for i := lo; i <= hi; i++ {
		items = append(items, v1alpha1.Item{
			Entity: fmt.Sprintf("acct-%d", i), Occurrence: "2026-01",
			Payload: &apiextensionsv1.JSON{Raw: []byte(fmt.Sprintf(`{"amount":%d}`, i))},
		})
	}
	return v1alpha1.BatchSpec{Items: items}
}

// TestHappyPath: a ConfigMap batch with duplicates inside it, three shards:
// every pod Succeeded with its report in its termination message, the counts
// are exact, and the run's completed is exactly its committed ledger rows.
func TestHappyPath(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "happy", 0.05)
	f.createConfigMap("invoices", "batch.jsonl", jsonLines(1, 1000)+jsonLines(1, 20))
	run := f.createRun("invoices", runSpec{workers: 3, chunk: 100, batch: v1alpha1.BatchSpec{
		ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "invoices", Key: "batch.jsonl"},
	}})

	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: 1020, Completed: 1000, AlreadyHandled: 20}, countsOf(run),
		"1000 distinct keys committed; the 20 repeats inside the batch are already handled")
	f.requireShardsAddUp(run)
	require.NotNil(t, run.Status.StartTime)
	require.NotNil(t, run.Status.CompletionTime)
	require.Equal(t, run.Generation, run.Status.ObservedGeneration)

	pods := f.waitPodsFinished(run, 30*time.Second)
	require.Len(t, pods, 3, "one pod per shard, none replaced")
	// One image setting: the workers run the very image the manager runs.
	mgrs, err := f.managerPods(f.ctx)
	require.NoError(t, err)
	require.NotEmpty(t, mgrs)
	for _, m := range mgrs {
		for _, a := range m.Spec.Containers[0].Args {
			require.NotContains(t, a, "--worker-image", "config/default sets the image once")
		}
		require.Len(t, m.Status.ContainerStatuses, 1)
		require.Contains(t, m.Spec.Containers[0].Image, "@sha256:", "installed by digest, pulled from the cluster's registry")
		for _, p := range pods {
			require.Equal(t, m.Spec.Containers[0].Image, p.Spec.Containers[0].Image, "worker %s", p.Name)
			require.Equal(t, m.Status.ContainerStatuses[0].ImageID, p.Status.ContainerStatuses[0].ImageID,
				"worker %s (image %s) runs the manager's image %s", p.Name, p.Spec.Containers[0].Image, m.Spec.Containers[0].Image)
		}
	}
	for i, p := range pods {
		require.Equal(t, v1alpha1.PodName(run.Name, int32(i), 0), p.Name)
		require.Equal(t, corev1.PodSucceeded, p.Status.Phase, "pod %s", p.Name)
		require.Len(t, p.Status.ContainerStatuses, 1)
		term := p.Status.ContainerStatuses[0].State.Terminated
		require.NotNil(t, term, "pod %s terminated", p.Name)
		require.Zero(t, term.ExitCode, "pod %s exit code", p.Name)
		rep, err := v1alpha1.ParseShardReport(term.Message)
		require.NoError(t, err, "pod %s's termination message is its report: %q", p.Name, term.Message)
		require.EqualValues(t, i, rep.Shard)
		sh := run.Status.Shards[i]
		require.Equal(t, [4]int64{sh.Total, sh.Completed, sh.AlreadyHandled, sh.Failed},
			[4]int64{rep.Total, rep.Completed, rep.AlreadyHandled, rep.Failed}, "shard %d: status entry == termination report", i)
		require.Equal(t, p.Name, sh.Pod)
		// The worker reported on its own pod (its ServiceAccount may patch
		// pods, not the run): its last report there is its final one.
		progress, err := v1alpha1.ParseShardReport(p.Annotations[v1alpha1.AnnotationProgress])
		require.NoError(t, err, "pod %s's progress annotation: %v", p.Name, p.Annotations)
		require.Equal(t, rep.ItemCounts, progress.ItemCounts, "pod %s: last progress report == termination report", p.Name)
		require.NotNil(t, progress.ReportTime)
	}
	for _, mf := range run.ManagedFields {
		if mf.Subresource == "status" {
			require.Equal(t, v1alpha1.ControllerFieldManager, mf.Manager, "only the controller writes the run's status")
		}
	}

	require.Equal(t, run.Status.Completed, f.committedRows(string(run.UID)), "ledger rows of the run == completed")
	f.requireExactlyOnce(1000)
	f.waitEvent(run.Name, "Succeeded", 30*time.Second)
}

// TestRerunSameBatch: a second run over the same batch completes nothing:
// every item is already handled, and it commits no ledger row.
func TestRerunSameBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "rerun", 0)
	first := f.createRun("first", runSpec{workers: 2, batch: inlineItems(1, 200)})
	first = f.waitComplete(first.Name, runTimeout)
	require.Equal(t, counts{Total: 200, Completed: 200}, countsOf(first))

	again := f.createRun("again", runSpec{workers: 2, batch: inlineItems(1, 200)})
	again = f.waitComplete(again.Name, runTimeout)
	require.Equal(t, counts{Total: 200, Completed: 0, AlreadyHandled: 200}, countsOf(again),
		"a rerun of the same batch: completed 0, all already handled")
	f.requireShardsAddUp(again)
	require.Zero(t, f.committedRows(string(again.UID)), "the rerun committed nothing")
	require.EqualValues(t, 200, f.committedRows(string(first.UID)))
	f.requireExactlyOnce(200)
}

// TestOverlappingRunsAtOnce: two runs over overlapping batches (500 keys in
// common), created together and running at the same time: one committed row
// per key, and the counts add up across both runs.
func TestOverlappingRunsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "overlap", 0.1)
	a := f.newRun("left", runSpec{workers: 2, chunk: 100, batch: queryBatch(1, 1500, 0)})
	b := f.newRun("right", runSpec{workers: 2, chunk: 100, batch: queryBatch(1001, 2500, 0)})
	require.NoError(t, f.c.Create(f.ctx, a))
	require.NoError(t, f.c.Create(f.ctx, b))

	a = f.waitComplete(a.Name, runTimeout)
	b = f.waitComplete(b.Name, runTimeout)
	ca, cb := countsOf(a), countsOf(b)
	t.Logf("left: %+v, right: %+v", ca, cb)
	require.EqualValues(t, 1500, ca.Total)
	require.EqualValues(t, 1500, cb.Total)
	require.Zero(t, ca.Failed+cb.Failed)
	require.EqualValues(t, 2500, ca.Completed+cb.Completed, "Σ completed == distinct keys")
	require.EqualValues(t, 500, ca.AlreadyHandled+cb.AlreadyHandled, "Σ already handled == the overlap")
	require.Equal(t, ca.Completed, f.committedRows(string(a.UID)), "left's completed are its ledger rows")
	require.Equal(t, cb.Completed, f.committedRows(string(b.UID)), "right's completed are its ledger rows")
	f.requireShardsAddUp(a)
	f.requireShardsAddUp(b)
	f.requireExactlyOnce(2500)
	if a.Status.CompletionTime.Before(b.Status.StartTime) || b.Status.CompletionTime.Before(a.Status.StartTime) {
		t.Logf("note: the two runs did not overlap in time (left %s..%s, right %s..%s)",
			a.Status.StartTime, a.Status.CompletionTime, b.Status.StartTime, b.Status.CompletionTime)
	}
}

// waitRowsOfShard waits until a shard of a run has committed at least n rows
// while the run is still going.
func (f *fixture) waitRowsOfShard(run *v1alpha1.ProcessingRun, shard int, n int64) int64 {
	f.t.Helper()
	deadline := time.Now().Add(runTimeout)
	for {
		if f.ledgerExists() {
			got := f.int(`SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND shard = $2`, string(run.UID), shard)
			if got >= n {
				return got
			}
		}
		cur := f.get(run.Name)
		require.False(f.t, isTrue(cur, v1alpha1.ConditionComplete) || isTrue(cur, v1alpha1.ConditionFailed),
			"run %s finished before shard %d committed %d rows: %s", run.Name, shard, n, statusLine(cur))
		require.True(f.t, time.Now().Before(deadline), "timed out waiting for shard %d of %s to commit %d rows", shard, run.Name, n)
		time.Sleep(200 * time.Millisecond)
	}
}

// TestWorkerPodKilled: a shard's pod deleted with --grace-period=0 --force
// mid-run is replaced by its next attempt; the final counts are exactly an
// uninterrupted run's (what the killed attempt committed counts as
// completed, not as already handled), and no key is committed twice.
func TestWorkerPodKilled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "podkill", 1.0)
	run := f.createRun("killed", runSpec{workers: 2, chunk: 100, batch: queryBatch(1, 2000, 0)})

	before := f.waitRowsOfShard(run, 0, 100)
	victim := v1alpha1.PodName(run.Name, 0, 0)
	out, err := f.kubectl("delete", "pod", victim, "--grace-period=0", "--force")
	require.NoError(t, err, out)
	t.Logf("shard 0 had committed %d rows; $ kubectl delete pod %s --grace-period=0 --force\n%s", before, victim, out)

	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: 2000, Completed: 2000}, countsOf(run), "exact counts despite the killed pod")
	f.requireShardsAddUp(run)
	seen := f.mon.podsOfShard(run, 0)
	t.Logf("shard 0's pods: %v", seen)
	require.GreaterOrEqual(t, len(seen), 2, "the killed pod was replaced")
	require.Equal(t, victim, seen[0])
	require.Equal(t, seen[len(seen)-1], run.Status.Shards[0].Pod, "the status names the replacement")
	require.NotEqual(t, victim, run.Status.Shards[0].Pod)
	require.Positive(t, f.int(`SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND shard = 0 AND attempt > 0`, string(run.UID)),
		"the replacement committed the rest of the shard (the pod was killed mid-run)")
	require.Len(t, f.mon.podsOfShard(run, 1), 1, "shard 1 was left alone")
	require.EqualValues(t, 2000, f.committedRows(string(run.UID)))
	f.requireExactlyOnce(2000)
}

// TestBadInput: what a user sees when the input is wrong. A missing
// ConfigMap, or an invalid worker image, stalls the run (condition, Event)
// without creating a pod; a missing Secret (which the manager may not read)
// stalls it once the kubelet reports its pods' CreateContainerConfigError,
// and the run starts once the Secret exists; a malformed ConfigMap line fails the
// run at once with the line in its condition, one pod per shard, no retry,
// nothing committed.
func TestBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "badinput", 0)

	t.Run("missing Secret", func(t *testing.T) {
		f := f.with(t)
		run := f.createRun("no-secret", runSpec{workers: 2, batch: inlineItems(1, 10), secret: "late-secret"})
		run = f.waitRun(run.Name, time.Minute, "Stalled", func(r *v1alpha1.ProcessingRun) bool { return isTrue(r, v1alpha1.ConditionStalled) })
		c := findCondition(run, v1alpha1.ConditionStalled)
		require.Equal(t, "SecretNotFound", c.Reason)
		require.Contains(t, c.Message, `Secret "late-secret" not found`)
		require.Contains(t, c.Message, `"dsn"`, "the message says which key to put there")
		require.Contains(t, c.Message, "CreateContainerConfigError", "as the kubelet reported it")
		ev := f.waitEvent(run.Name, "SecretNotFound", 30*time.Second)
		require.Equal(t, corev1.EventTypeWarning, ev.Type)
		require.Contains(t, ev.Message, "late-secret")
		time.Sleep(3 * time.Second)
		require.Len(t, f.runPods(run), 2, "one pod per shard, waiting for the Secret; none replaced")

		f.createSecret("late-secret")
		run = f.waitComplete(run.Name, runTimeout)
		require.Equal(t, counts{Total: 10, Completed: 10}, countsOf(run), "runs once the Secret exists")
		require.Nil(t, findCondition(run, v1alpha1.ConditionStalled), "no longer Stalled")
	})

	t.Run("missing ConfigMap", func(t *testing.T) {
		f := f.with(t)
		run := f.createRun("no-configmap", runSpec{batch: v1alpha1.BatchSpec{ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "absent", Key: "batch.jsonl"}}})
		run = f.waitRun(run.Name, time.Minute, "Stalled", func(r *v1alpha1.ProcessingRun) bool { return isTrue(r, v1alpha1.ConditionStalled) })
		c := findCondition(run, v1alpha1.ConditionStalled)
		require.Equal(t, "ConfigMapNotFound", c.Reason)
		require.Contains(t, c.Message, `ConfigMap "absent" not found`)
		f.waitEvent(run.Name, "ConfigMapNotFound", 30*time.Second)
		require.Empty(t, f.runPods(run))
	})

	t.Run("worker image not allowed", func(t *testing.T) {
		// The install's admission policy (config/policy) refuses it; the
		// controller's own check (Stalled, InvalidImage) is in envtest.
		f := f.with(t)
		run := f.newRun("bad-image", runSpec{batch: inlineItems(1, 3)})
		run.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{Image: "Not A Valid:image"}
		err := f.c.Create(f.ctx, run)
		require.Error(t, err)
		require.Contains(t, err.Error(), "spec.workerTemplate.image Not A Valid:image is not allowed: worker images must start with one of")
	})

	t.Run("malformed ConfigMap line", func(t *testing.T) {
		f := f.with(t)
		lines := jsonLines(1, 2) + `{"entity": "acct-3", "occurrence": ` + "\n" + jsonLines(4, 10)
		f.createConfigMap("broken", "batch.jsonl", lines)
		run := f.createRun("malformed", runSpec{workers: 2, batch: v1alpha1.BatchSpec{ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "broken", Key: "batch.jsonl"}}})
		run = f.waitFinished(run.Name, runTimeout)
		require.True(t, isTrue(run, v1alpha1.ConditionFailed), "Failed: %s", statusLine(run))
		require.Equal(t, v1alpha1.RunFailed, run.Status.Phase)
		c := findCondition(run, v1alpha1.ConditionFailed)
		require.Equal(t, "BadInput", c.Reason)
		require.Contains(t, c.Message, "line 3 is not valid JSON", "the condition names the line")
		require.Contains(t, c.Message, "not retried")
		require.True(t, isTrue(run, v1alpha1.ConditionStalled), "a failed run needs someone to act")
		ev := f.waitEvent(run.Name, "BadInput", 30*time.Second)
		require.Equal(t, corev1.EventTypeWarning, ev.Type)
		require.Contains(t, ev.Message, "line 3")
		var shardMsgs []string
		for _, s := range run.Status.Shards {
			shardMsgs = append(shardMsgs, s.Message)
		}
		assert.Contains(t, strings.Join(shardMsgs, "\n"), "line 3", "the shard's message names the line")

		// Once a shard fails for good the run is Failed and the other
		// shard's pod is stopped (as a Job's): nothing is retried, nothing
		// restarts, no pod is left running.
		time.Sleep(5 * time.Second)
		pods := f.runPods(run)
		require.NotEmpty(t, pods)
		exited2 := 0
		for _, p := range pods {
			require.Contains(t, []corev1.PodPhase{corev1.PodFailed, corev1.PodSucceeded}, p.Status.Phase, "pod %s is not left running", p.Name)
			require.Zero(t, p.Status.ContainerStatuses[0].RestartCount, "pod %s never restarted", p.Name)
			if term := p.Status.ContainerStatuses[0].State.Terminated; term != nil && term.ExitCode == v1alpha1.ExitBadInput {
				exited2++
			}
		}
		require.Positive(t, exited2, "a worker exited 2 (bad input)")
		for i := range 2 {
			require.LessOrEqual(t, len(f.mon.podsOfShard(run, i)), 1, "shard %d: no retry", i)
		}
		require.Zero(t, run.Status.Completed)
		if f.ledgerExists() {
			require.Zero(t, f.committedRows(string(run.UID)), "nothing committed from a malformed batch")
		}
	})
}

func findCondition(run *v1alpha1.ProcessingRun, t string) *metav1.Condition {
	for i := range run.Status.Conditions {
		if run.Status.Conditions[i].Type == t {
			return &run.Status.Conditions[i]
		}
	}
	return nil
}

package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// backoffLimit holds even when failed pods are deleted (by hand, or the
// pod garbage collector): the status counts the failures.
func TestBackoffLimitSurvivesDeletedFailedPods(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	spec := newRun(ns, "durable", 1, 3)
	spec.Spec.BackoffLimit = ptr.To[int32](1)
	create(t, env, spec)
	ctx := context.Background()

	pods := waitPods(t, env, ns, "durable", "durable-0-0")
	setPod(t, env, ns, "durable-0-0", corev1.PodFailed, 1, nil)
	waitPods(t, env, ns, "durable", "durable-0-0", "durable-0-1")
	require.NoError(t, env.Client.Delete(ctx, pods["durable-0-0"]))
	waitPods(t, env, ns, "durable", "durable-0-1")
	r := getRun(t, env, ns, "durable")
	require.NotEqual(t, v1alpha1.RunFailed, r.Status.Phase)
	failedBefore := shardEntry(r, 0).FailedAttempts

	// The second failure is the one backoffLimit 1 does not allow.
	setPod(t, env, ns, "durable-0-1", corev1.PodFailed, 1, nil)
	r = waitRun(t, env, ns, "durable", "Failed", all(
		phaseIs(v1alpha1.RunFailed),
		conditionIs(v1alpha1.ConditionFailed, metav1.ConditionTrue, ReasonBackoffLimitExceeded),
	))
	require.Contains(t, condition(r, v1alpha1.ConditionFailed).Message, "shard 0 failed 2 times (backoffLimit 1)")
	require.Equal(t, int32(1), failedBefore, "the deleted pod's failure still counted")
	require.Equal(t, int32(2), shardEntry(r, 0).FailedAttempts)
	require.Equal(t, ptr.To[int32](1), shardEntry(r, 0).LastFailedAttempt)
	stillPods(t, env, ns, "durable", time.Second, "durable-0-1")
}

// A replacement pod that found the shard's lock taken (the old pod's
// process still running) exits ExitShardBusy: it is retried, and does not
// count against backoffLimit.
func TestLockBusyAttemptIsRetriedNotCounted(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	spec := newRun(ns, "busy", 1, 2)
	spec.Spec.BackoffLimit = ptr.To[int32](0)
	run := create(t, env, spec)

	waitPods(t, env, ns, "busy", "busy-0-0")
	setPod(t, env, ns, "busy-0-0", corev1.PodRunning, 0, nil)
	workerReport(t, env, run, 0, 0, v1alpha1.ItemCounts{}, v1alpha1.ShardBusyMessage+": another process still runs this shard")
	setPod(t, env, ns, "busy-0-0", corev1.PodFailed, v1alpha1.ExitShardBusy,
		shardReport(0, 0, v1alpha1.ItemCounts{}, v1alpha1.ShardBusyMessage+": gave up"))
	waitPods(t, env, ns, "busy", "busy-0-0", "busy-0-1")
	waitEvent(t, env, ns, "busy", corev1.EventTypeNormal, "ShardBusy", "not counted against backoffLimit")
	r := getRun(t, env, ns, "busy")
	require.Nil(t, finishedCondition(&r.Status), "conditions: %+v", r.Status.Conditions)
	require.Zero(t, shardEntry(r, 0).FailedAttempts)

	setPod(t, env, ns, "busy-0-1", corev1.PodSucceeded, 0, shardReport(0, 1, v1alpha1.ItemCounts{Total: 2, Completed: 2}, ""))
	waitRun(t, env, ns, "busy", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded), countsAre(v1alpha1.ItemCounts{Total: 2, Completed: 2})))
}

// A shard that succeeded after its ledger's server changed under it (a
// failover) and processed again items whose commits were lost is announced
// by one Warning Event naming what its report says; a shard that saw
// nothing of the kind is not. Its counts are its report's, the ledger's.
func TestLedgerServerChangeIsAnnounced(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	run := create(t, env, newRun(ns, "failover", 2, 6))
	waitPods(t, env, ns, "failover", "failover-0-0", "failover-1-0")

	moved := shardReport(0, 0, v1alpha1.ItemCounts{Total: 3, Completed: 3}, "")
	moved.ServerChanges, moved.Reproven, moved.Reprocessed = 1, 1, 2
	setPod(t, env, ns, "failover-0-0", corev1.PodSucceeded, 0, moved)
	setPod(t, env, ns, "failover-1-0", corev1.PodSucceeded, 0, shardReport(1, 0, v1alpha1.ItemCounts{Total: 3, Completed: 3}, ""))
	waitRun(t, env, ns, "failover", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded), countsAre(v1alpha1.ItemCounts{Total: 6, Completed: 6})))
	waitEvent(t, env, ns, "failover", corev1.EventTypeWarning, ReasonLedgerServerChanged,
		"Shard 0 attempt 0: its ledger sessions reached another database server, or a restarted one, 1 time(s) (a failover?); the ledger no longer held 2 item(s)")

	// Passes after the run's end announce nothing more.
	require.NoError(t, env.Client.Patch(context.Background(), run, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"poke":"1"}}}`))))
	time.Sleep(2 * time.Second)
	var announced []string
	for _, e := range runEvents(t, env, ns, "failover") {
		if e.Reason == ReasonLedgerServerChanged {
			announced = append(announced, e.Note)
			require.Nil(t, e.Series, "announced once, not again: %s", e.Note)
		}
	}
	require.Len(t, announced, 1, "one Event, for shard 0 only: %q", announced)
}

// A shard is finished when its worker container is, not when the pod phase
// says so: an injected sidecar (a service mesh) keeps the pod Running.
func TestWorkerFinishedWhileASidecarRuns(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	create(t, env, newRun(ns, "meshed", 2, 4))
	waitPods(t, env, ns, "meshed", "meshed-0-0", "meshed-1-0")

	// Shard 0 succeeds and shard 1 fails once, each beside a sidecar that
	// runs on.
	setPodWithSidecar(t, env, ns, "meshed-0-0", 0, shardReport(0, 0, v1alpha1.ItemCounts{Total: 2, Completed: 2}, ""))
	setPodWithSidecar(t, env, ns, "meshed-1-0", 1, shardReport(1, 0, v1alpha1.ItemCounts{Total: 2, Completed: 1}, "connection reset"))
	// The finished pods are deleted (they would hold their quota forever);
	// shard 1 is retried.
	waitPods(t, env, ns, "meshed", "meshed-1-1")
	r := waitRun(t, env, ns, "meshed", "shard 0 Succeeded", func(r *v1alpha1.ProcessingRun) error {
		if e := shardEntry(r, 0); e.Phase != v1alpha1.ShardSucceeded || e.Completed != 2 {
			return fmt.Errorf("shard 0: %+v", e)
		}
		return nil
	})
	require.Equal(t, int32(1), shardEntry(r, 1).FailedAttempts)
	waitEvent(t, env, ns, "meshed", corev1.EventTypeNormal, "PodDeleted", "its worker container finished")

	setPodWithSidecar(t, env, ns, "meshed-1-1", 0, shardReport(1, 1, v1alpha1.ItemCounts{Total: 2, Completed: 2}, ""))
	waitRun(t, env, ns, "meshed", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded), countsAre(v1alpha1.ItemCounts{Total: 4, Completed: 4})))
	waitPods(t, env, ns, "meshed")
}

// setPodWithSidecar plays a kubelet whose pod has a second, long-running
// container: the worker container terminated, the pod stays Running.
func setPodWithSidecar(t *testing.T, env *envtestutil.Env, ns, name string, exitCode int32, report *v1alpha1.ShardReport) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod))
	msg, err := report.TerminationMessage()
	require.NoError(t, err)
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{
		{Name: v1alpha1.WorkerContainerName, Image: pod.Spec.Containers[0].Image, ImageID: "sha256:test",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exitCode, Reason: "Completed", Message: string(msg), StartedAt: now, FinishedAt: now}}},
		{Name: "istio-proxy", Image: "proxyv2:test", ImageID: "sha256:proxy", Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}},
	}
	require.NoError(t, env.Client.Status().Update(ctx, pod))
}

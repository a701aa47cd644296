package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

func TestRunCreatesPodsAndFollowsReports(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	run := create(t, env, newRun(ns, "invoices", 2, 5))

	pods := waitPods(t, env, ns, "invoices", "invoices-0-0", "invoices-1-0")
	pod := pods["invoices-0-0"]
	require.Equal(t, "invoices", metav1.GetControllerOf(pod).Name)
	require.Equal(t, run.UID, metav1.GetControllerOf(pod).UID)
	require.Equal(t, corev1.RestartPolicyNever, pod.Spec.RestartPolicy)
	require.Equal(t, "runledger:test", pod.Spec.Containers[0].Image)

	r := waitRun(t, env, ns, "invoices", "Running", all(
		phaseIs(v1alpha1.RunRunning),
		conditionIs(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonRunning),
		conditionIs(v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonRunning),
		countsAre(v1alpha1.ItemCounts{Total: 5}),
	))
	require.NotNil(t, r.Status.StartTime)
	require.Equal(t, "invoices-0-0", shardEntry(r, 0).Pod)
	require.Equal(t, r.Generation, r.Status.ObservedGeneration)
	waitEvent(t, env, ns, "invoices", corev1.EventTypeNormal, "PodCreated", "Created pod invoices-1-0 for shard 1")

	// Shard 0 runs and reports progress.
	setPod(t, env, ns, "invoices-0-0", corev1.PodRunning, 0, nil)
	workerReport(t, env, run, 0, 0, v1alpha1.ItemCounts{Total: 3, Completed: 1}, "")
	waitRun(t, env, ns, "invoices", "progress", all(countsAre(v1alpha1.ItemCounts{Total: 5, Completed: 1}), func(r *v1alpha1.ProcessingRun) error {
		if p := shardEntry(r, 0).Phase; p != v1alpha1.ShardRunning {
			return fmt.Errorf("shard 0 is %s", p)
		}
		return nil
	}))
	cols := printerColumns(t, env, ns, "invoices")
	require.Equal(t, "Running", cols["Phase"])
	require.EqualValues(t, 1, cols["Completed"])
	require.EqualValues(t, 5, cols["Total"])

	// Shard 0 finishes and reports; shard 1 finishes but its last status
	// write is lost: its termination message carries the numbers.
	final0 := v1alpha1.ItemCounts{Total: 3, Completed: 2, AlreadyHandled: 1}
	workerReport(t, env, run, 0, 0, final0, "")
	setPod(t, env, ns, "invoices-0-0", corev1.PodSucceeded, 0, shardReport(0, 0, final0, ""))
	setPod(t, env, ns, "invoices-1-0", corev1.PodSucceeded, 0, shardReport(1, 0, v1alpha1.ItemCounts{Total: 2, Completed: 2}, "all new"))

	r = waitRun(t, env, ns, "invoices", "Succeeded", all(
		phaseIs(v1alpha1.RunSucceeded),
		countsAre(v1alpha1.ItemCounts{Total: 5, Completed: 4, AlreadyHandled: 1}),
		conditionIs(v1alpha1.ConditionComplete, metav1.ConditionTrue, ReasonSucceeded),
		conditionIs(v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonSucceeded),
	))
	require.Nil(t, condition(r, v1alpha1.ConditionReconciling))
	require.Nil(t, condition(r, v1alpha1.ConditionStalled))
	require.Nil(t, condition(r, v1alpha1.ConditionFailed))
	require.NotNil(t, r.Status.CompletionTime)
	s1 := shardEntry(r, 1)
	require.Equal(t, v1alpha1.ShardSucceeded, s1.Phase)
	require.Equal(t, int64(2), s1.Completed, "restored from the termination message")
	require.Equal(t, "all new", s1.Message)

	cols = printerColumns(t, env, ns, "invoices")
	require.Equal(t, "Succeeded", cols["Phase"])
	require.EqualValues(t, 4, cols["Completed"])
	require.EqualValues(t, 1, cols["Already-Handled"])
	require.EqualValues(t, 0, cols["Failed"])
	require.EqualValues(t, 5, cols["Total"])
	require.Equal(t, r.Status.Duration.Duration.String(), cols["Duration"])
	require.Equal(t, r.Status.CompletionTime.Sub(r.Status.StartTime.Time).Round(time.Second), r.Status.Duration.Duration)
	require.Empty(t, cols["Reason"], "nothing to explain")
	waitEvent(t, env, ns, "invoices", corev1.EventTypeNormal, ReasonSucceeded, "5 items: 4 completed, 1 already handled")

	// Ownership: the controller alone writes the run's status; the
	// workers' reports reach it from their pods.
	owners := map[string]bool{}
	for _, mf := range r.ManagedFields {
		if mf.Subresource == "status" {
			owners[mf.Manager] = true
		}
	}
	require.Equal(t, map[string]bool{v1alpha1.ControllerFieldManager: true}, owners)
	require.NotNil(t, shardEntry(r, 0).LastReportTime, "the worker's report time, from its pod")

	// The Secret's value is nowhere in the status or the events.
	for _, e := range runEvents(t, env, ns, "invoices") {
		require.NotContains(t, e.Note, "s3cret")
	}
	stillPods(t, env, ns, "invoices", 500*time.Millisecond, "invoices-0-0", "invoices-1-0")
}

func TestFailedShardIsRetriedUpToBackoffLimit(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	spec := newRun(ns, "retry", 1, 10)
	spec.Spec.BackoffLimit = ptr.To[int32](2)
	run := create(t, env, spec)

	waitPods(t, env, ns, "retry", "retry-0-0")
	setPod(t, env, ns, "retry-0-0", corev1.PodRunning, 0, nil)
	workerReport(t, env, run, 0, 0, v1alpha1.ItemCounts{Total: 10, Completed: 5}, "")
	waitRun(t, env, ns, "retry", "progress", countsAre(v1alpha1.ItemCounts{Total: 10, Completed: 5}))

	// Attempt 0 fails having committed 6 items, one failed.
	setPod(t, env, ns, "retry-0-0", corev1.PodFailed, 1,
		shardReport(0, 0, v1alpha1.ItemCounts{Total: 10, Completed: 6, Failed: 1}, "item acct-3/2026-01: violates foreign key"))
	pods := waitPods(t, env, ns, "retry", "retry-0-0", "retry-0-1")
	require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 6, Failed: 1}, parseFloor(pods["retry-0-1"].Annotations))
	require.Equal(t, "1", pods["retry-0-1"].Labels[v1alpha1.LabelAttempt])
	waitEvent(t, env, ns, "retry", corev1.EventTypeWarning, "ShardFailed", "violates foreign key")
	waitEvent(t, env, ns, "retry", corev1.EventTypeNormal, "PodCreated", "(retry 1 of 2)")

	// Attempt 1 starts over: its first reports are below what attempt 0
	// reached, and the run's counts do not go down.
	setPod(t, env, ns, "retry-0-1", corev1.PodRunning, 0, nil)
	workerReport(t, env, run, 0, 1, v1alpha1.ItemCounts{Total: 10, Completed: 2}, "")
	r := waitRun(t, env, ns, "retry", "attempt 1 reporting", func(r *v1alpha1.ProcessingRun) error {
		if e := shardEntry(r, 0); e.Attempt != 1 || e.Phase != v1alpha1.ShardRunning {
			return fmt.Errorf("shard 0: %+v", e)
		}
		return nil
	})
	require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 6, Failed: 1}, r.Status.ItemCounts)

	// Attempt 1 is OOM-killed (no report); attempt 2 fails; that is 3
	// failures with backoffLimit 2: the run is Failed.
	setPod(t, env, ns, "retry-0-1", corev1.PodFailed, 137, nil)
	waitPods(t, env, ns, "retry", "retry-0-0", "retry-0-1", "retry-0-2")
	setPod(t, env, ns, "retry-0-2", corev1.PodFailed, 1, shardReport(0, 2, v1alpha1.ItemCounts{Total: 10, Completed: 9, Failed: 1}, "gave up on acct-3"))
	r = waitRun(t, env, ns, "retry", "Failed", all(
		phaseIs(v1alpha1.RunFailed),
		conditionIs(v1alpha1.ConditionFailed, metav1.ConditionTrue, ReasonBackoffLimitExceeded),
		conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonBackoffLimitExceeded),
		conditionIs(v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonBackoffLimitExceeded),
		countsAre(v1alpha1.ItemCounts{Total: 10, Completed: 9, Failed: 1}),
	))
	msg := condition(r, v1alpha1.ConditionFailed).Message
	require.Contains(t, msg, "shard 0 failed 3 times (backoffLimit 2)")
	require.Contains(t, msg, "gave up on acct-3")
	require.Nil(t, condition(r, v1alpha1.ConditionReconciling))
	require.Equal(t, v1alpha1.ShardFailed, shardEntry(r, 0).Phase)
	waitEvent(t, env, ns, "retry", corev1.EventTypeWarning, ReasonBackoffLimitExceeded, "shard 0")
	waitEvent(t, env, ns, "retry", corev1.EventTypeWarning, "ShardFailed", "OOMKilled")
	stillPods(t, env, ns, "retry", time.Second, "retry-0-0", "retry-0-1", "retry-0-2")
}

func TestBadInputFailsTheRunWithoutRetry(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	create(t, env, newRun(ns, "bad", 2, 4))
	waitPods(t, env, ns, "bad", "bad-0-0", "bad-1-0")
	setPod(t, env, ns, "bad-1-0", corev1.PodRunning, 0, nil)
	setPod(t, env, ns, "bad-0-0", corev1.PodFailed, v1alpha1.ExitBadInput,
		shardReport(0, 0, v1alpha1.ItemCounts{}, "line 3: occurrence is empty"))
	r := waitRun(t, env, ns, "bad", "Failed", all(
		phaseIs(v1alpha1.RunFailed),
		conditionIs(v1alpha1.ConditionFailed, metav1.ConditionTrue, ReasonBadInput),
	))
	require.Contains(t, condition(r, v1alpha1.ConditionFailed).Message, "line 3: occurrence is empty")
	require.Contains(t, condition(r, v1alpha1.ConditionFailed).Message, "shard 0")
	cols := printerColumns(t, env, ns, "bad")
	require.Equal(t, ReasonBadInput, cols["Reason"], "kubectl get says why it failed")
	require.NotEmpty(t, cols["Duration"])
	waitFor(t, "runledger_runs_finished_total counts it", func() error {
		if n := testutil.ToFloat64(runsFinished.WithLabelValues("Failed", ReasonBadInput)); n < 1 {
			return fmt.Errorf("%v runs finished Failed/BadInput", n)
		}
		return nil
	})
	// The other shard's live pod is stopped; nothing is retried.
	waitPods(t, env, ns, "bad", "bad-0-0")
	stillPods(t, env, ns, "bad", time.Second, "bad-0-0")
}

func TestMissingDependenciesStallTheRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		mutate  func(*v1alpha1.ProcessingRun)
		prepare func(t *testing.T, ctx context.Context, c client.Client, ns string)
		reason  string
		message string
	}{
		{
			name: "ConfigMap",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Batch = v1alpha1.BatchSpec{ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "batch", Key: "items.jsonl"}}
			},
			reason:  ReasonConfigMapNotFound,
			message: `ConfigMap "batch" not found`,
		},
		{
			name: "ConfigMap key",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Batch = v1alpha1.BatchSpec{ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "batch", Key: "items.jsonl"}}
			},
			prepare: func(t *testing.T, ctx context.Context, c client.Client, ns string) {
				require.NoError(t, c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "batch", Namespace: ns},
					Data: map[string]string{"other.jsonl": "{}"}}))
			},
			reason:  ReasonConfigMapKeyNotFound,
			message: `has no key "items.jsonl"`,
		},
		{
			name: "ServiceAccount",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{ServiceAccountName: "nobody"}
			},
			reason:  ReasonServiceAccountNotFound,
			message: `ServiceAccount "nobody" not found`,
		},
		{
			name: "image",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{Image: "Not A Valid:Image"}
			},
			reason:  ReasonInvalidImage,
			message: `invalid worker image "Not A Valid:Image"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env, ns := setup(t)
			if tt.prepare != nil {
				tt.prepare(t, context.Background(), env.Client, ns)
			}
			startManager(t, env, ns, managerConfig{})
			run := newRun(ns, "stalled", 1, 2)
			tt.mutate(run)
			create(t, env, run)
			r := waitRun(t, env, ns, "stalled", "Stalled", all(
				phaseIs(v1alpha1.RunPending),
				conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, tt.reason),
				conditionIs(v1alpha1.ConditionReady, metav1.ConditionFalse, tt.reason),
			))
			require.Contains(t, condition(r, v1alpha1.ConditionStalled).Message, tt.message)
			require.Nil(t, condition(r, v1alpha1.ConditionReconciling))
			waitEvent(t, env, ns, "stalled", corev1.EventTypeWarning, tt.reason, tt.message)
			stillPods(t, env, ns, "stalled", 700*time.Millisecond)
		})
	}
}

// TestMissingSecretThenCreated: the manager does not read Secrets, so a run
// whose Secret is missing gets its pod, and the kubelet's
// CreateContainerConfigError names the Secret: the run is Stalled
// (SecretNotFound) with no second pod, until the kubelet starts the worker
// once the Secret exists. A missing key shows the same way
// (SecretKeyNotFound); another reason the container cannot start stays the
// kubelet's own words.
func TestMissingSecretThenCreated(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	run := newRun(ns, "later", 1, 2)
	run.Spec.Database.SecretRef.Name = "created-later"
	create(t, env, run)
	waitPods(t, env, ns, "later", "later-0-0")
	setPodWaiting(t, env, ns, "later-0-0", "CreateContainerConfigError", `secret "created-later" not found`)
	r := waitRun(t, env, ns, "later", "Stalled", conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonSecretNotFound))
	require.Contains(t, condition(r, v1alpha1.ConditionStalled).Message, `Secret "created-later" not found in namespace "`+ns+`": create it with the key "dsn"`)
	waitEvent(t, env, ns, "later", corev1.EventTypeWarning, ReasonSecretNotFound, `Secret "created-later" not found`)
	stillPods(t, env, ns, "later", 500*time.Millisecond, "later-0-0")
	cols := printerColumns(t, env, ns, "later")
	require.Equal(t, ReasonSecretNotFound, cols["Reason"], "kubectl get says why")
	require.Empty(t, cols["Duration"], "not finished")

	require.NoError(t, env.Client.Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "created-later", Namespace: ns},
		StringData: map[string]string{"dsn": "postgres://db/ledger"},
	}))
	setPod(t, env, ns, "later-0-0", corev1.PodRunning, 0, nil) // the kubelet started it
	r = waitRun(t, env, ns, "later", "Running", all(phaseIs(v1alpha1.RunRunning), noCondition(v1alpha1.ConditionStalled),
		conditionIs(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonRunning)))
	require.Nil(t, condition(r, v1alpha1.ConditionStalled))

	// The Secret's key is wrong, which only the kubelet can see.
	setPodWaiting(t, env, ns, "later-0-0", "CreateContainerConfigError", `couldn't find key dsn in Secret `+ns+`/created-later`)
	r = waitRun(t, env, ns, "later", "Stalled", conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonSecretKeyNotFound))
	require.Contains(t, condition(r, v1alpha1.ConditionStalled).Message, `has no key "dsn"`)
	require.Contains(t, condition(r, v1alpha1.ConditionStalled).Message, "later-0-0: CreateContainerConfigError")
	stillPods(t, env, ns, "later", 500*time.Millisecond, "later-0-0")
}

func TestSuspendAndResume(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	run := create(t, env, newRun(ns, "pausable", 2, 7))
	waitPods(t, env, ns, "pausable", "pausable-0-0", "pausable-1-0")

	setPod(t, env, ns, "pausable-0-0", corev1.PodRunning, 0, nil)
	workerReport(t, env, run, 0, 0, v1alpha1.ItemCounts{Total: 4, Completed: 2}, "")
	setPod(t, env, ns, "pausable-1-0", corev1.PodSucceeded, 0, shardReport(1, 0, v1alpha1.ItemCounts{Total: 3, Completed: 3}, ""))
	waitRun(t, env, ns, "pausable", "progress", countsAre(v1alpha1.ItemCounts{Total: 7, Completed: 5}))

	setSuspend(t, env, ns, "pausable", true)
	// Unscheduled pods are deleted at once (there is no kubelet here).
	waitPods(t, env, ns, "pausable", "pausable-1-0")
	r := waitRun(t, env, ns, "pausable", "Suspended", all(
		phaseIs(v1alpha1.RunSuspended),
		conditionIs(v1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonSuspended),
		countsAre(v1alpha1.ItemCounts{Total: 7, Completed: 5}),
		noCondition(v1alpha1.ConditionReconciling), // no pod left to stop
	))
	require.Equal(t, v1alpha1.ShardSucceeded, shardEntry(r, 1).Phase)
	waitEvent(t, env, ns, "pausable", corev1.EventTypeNormal, ReasonSuspended, "Suspended")
	stillPods(t, env, ns, "pausable", 700*time.Millisecond, "pausable-1-0")

	setSuspend(t, env, ns, "pausable", false)
	pods := waitPods(t, env, ns, "pausable", "pausable-0-1", "pausable-1-0")
	require.Equal(t, v1alpha1.ItemCounts{Total: 4, Completed: 2}, parseFloor(pods["pausable-0-1"].Annotations))
	waitRun(t, env, ns, "pausable", "resumed", all(
		phaseIs(v1alpha1.RunRunning),
		conditionIs(v1alpha1.ConditionSuspended, metav1.ConditionFalse, ReasonResumed),
	))
	setPod(t, env, ns, "pausable-0-1", corev1.PodSucceeded, 0, shardReport(0, 1, v1alpha1.ItemCounts{Total: 4, Completed: 4}, ""))
	waitRun(t, env, ns, "pausable", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded), countsAre(v1alpha1.ItemCounts{Total: 7, Completed: 7})))
}

func setSuspend(t *testing.T, env *envtestutil.Env, ns, name string, suspend bool) {
	t.Helper()
	run := getRun(t, env, ns, name)
	patch := client.MergeFrom(run.DeepCopy())
	run.Spec.Suspend = suspend
	require.NoError(t, env.Client.Patch(context.Background(), run, patch))
}

func TestDeletingARunLeavesNoPodBehind(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	create(t, env, newRun(ns, "gone", 2, 2))
	pods := waitPods(t, env, ns, "gone", "gone-0-0", "gone-1-0")
	for _, p := range pods {
		ref := metav1.GetControllerOf(p)
		require.NotNil(t, ref)
		require.True(t, *ref.BlockOwnerDeletion, "foreground deletion waits for the pods")
	}
	ctx := context.Background()
	require.NoError(t, env.Client.Delete(ctx, getRun(t, env, ns, "gone")))
	waitFor(t, "run deleted", func() error {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gone"}, &v1alpha1.ProcessingRun{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %w", err)
	})
	// envtest runs no garbage collector: play it, then check that the
	// controller does not bring the pods back.
	for _, p := range pods {
		require.NoError(t, client.IgnoreNotFound(env.Client.Delete(ctx, p)))
	}
	stillPods(t, env, ns, "gone", time.Second)
}

func TestTTLAfterFinishedDeletesTheRun(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	run := newRun(ns, "ephemeral", 1, 1)
	run.Spec.TTLSecondsAfterFinished = ptr.To[int32](1)
	create(t, env, run)
	// Watched, not polled: completionTime has whole seconds, so with a TTL of
	// one second the run may be Succeeded for only a moment before it goes.
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	w, err := wc.Watch(ctx, &v1alpha1.ProcessingRunList{}, client.InNamespace(ns),
		client.MatchingFields{"metadata.name": "ephemeral"}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: run.ResourceVersion}})
	require.NoError(t, err)
	defer w.Stop()

	waitPods(t, env, ns, "ephemeral", "ephemeral-0-0")
	setPod(t, env, ns, "ephemeral-0-0", corev1.PodSucceeded, 0, shardReport(0, 0, v1alpha1.ItemCounts{Total: 1, Completed: 1}, ""))

	var completed *metav1.Time
	for ev := range w.ResultChan() {
		got, ok := ev.Object.(*v1alpha1.ProcessingRun)
		require.True(t, ok, "watch event %s carries %T, want a ProcessingRun", ev.Type, ev.Object)
		switch {
		case ev.Type == watch.Deleted:
			require.NotNil(t, completed, "the run was deleted before it was seen Succeeded")
			require.False(t, time.Now().Before(completed.Add(time.Second)),
				"the run was deleted before its TTL of 1s after completion at %s passed", completed)
			return
		case got.Status.Phase == v1alpha1.RunSucceeded && completed == nil:
			require.NotNil(t, got.Status.CompletionTime, "a Succeeded run must have a completionTime")
			completed = got.Status.CompletionTime
		}
	}
	t.Fatalf("the run was not deleted within %s after it succeeded (last seen completion: %v)", testTimeout, completed)
}

// TestActiveDeadlineFailsTheRun: a run still active after
// activeDeadlineSeconds is Failed with reason DeadlineExceeded and its live
// pods are deleted, as a Job's.
func TestActiveDeadlineFailsTheRun(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	run := newRun(ns, "slow", 2, 4)
	run.Spec.ActiveDeadlineSeconds = ptr.To[int64](2)
	create(t, env, run)
	waitPods(t, env, ns, "slow", "slow-0-0", "slow-1-0")
	setPod(t, env, ns, "slow-0-0", corev1.PodRunning, 0, nil)

	r := waitRun(t, env, ns, "slow", "Failed by its deadline", all(
		phaseIs(v1alpha1.RunFailed),
		conditionIs(v1alpha1.ConditionFailed, metav1.ConditionTrue, ReasonDeadlineExceeded),
	))
	require.Contains(t, condition(r, v1alpha1.ConditionFailed).Message, "active longer than activeDeadlineSeconds (2s)")
	require.GreaterOrEqual(t, condition(r, v1alpha1.ConditionFailed).LastTransitionTime.Sub(r.Status.StartTime.Time), 2*time.Second)
	waitFor(t, "the run's pods are stopped", func() error {
		for name, pod := range runPods(t, env, ns, "slow") {
			if pod.DeletionTimestamp == nil {
				return fmt.Errorf("pod %s is not being deleted", name)
			}
		}
		return nil
	})
}

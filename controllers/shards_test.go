package controllers

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakePod is a worker pod of run "r", shard 0, in a given state.
type fakePod struct {
	// shard of the pod (run "r"), 0 unless set.
	shard   int32
	attempt int32
	phase   corev1.PodPhase
	exit    *int32
	report  *v1alpha1.ShardReport
	floor   *v1alpha1.ItemCounts
	waiting string
	// unschedulable is the scheduler's message on PodScheduled=False.
	unschedulable string
	deleting      bool
	finished      time.Time
	// sidecar: another container runs on in the pod; nativeSidecar: an
	// init container with restartPolicy Always does.
	sidecar, nativeSidecar bool
	// lost: on a lost node (what observe sets from podOnLostNode).
	lost bool
	// processorRestarts and processorWaiting: the status of the processor
	// sidecar (spec.effect.processor), when either is set.
	processorRestarts int32
	processorWaiting  string
}

func (f fakePod) pod() *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              v1alpha1.PodName("r", f.shard, f.attempt),
			Labels:            map[string]string{v1alpha1.LabelRun: "r", v1alpha1.LabelAttempt: strconv.Itoa(int(f.attempt))},
			CreationTimestamp: metav1.NewTime(t0),
		},
		Status: corev1.PodStatus{Phase: f.phase},
	}
	if f.floor != nil {
		b, _ := json.Marshal(*f.floor)
		p.Annotations = map[string]string{annotationCountsFloor: string(b)}
	}
	if f.deleting {
		p.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
	}
	cs := corev1.ContainerStatus{Name: v1alpha1.WorkerContainerName}
	if f.exit != nil {
		msg := "some log line"
		if f.report != nil {
			b, _ := f.report.TerminationMessage()
			msg = string(b)
		}
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: *f.exit, Message: msg, FinishedAt: metav1.NewTime(f.finished)}
	}
	if f.waiting != "" {
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: f.waiting, Message: "pulling failed"}
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	if f.unschedulable != "" {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, Message: f.unschedulable}}
	}
	if f.nativeSidecar {
		p.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}}}}
	}
	if f.processorRestarts > 0 || f.processorWaiting != "" {
		ps := corev1.ContainerStatus{Name: v1alpha1.ProcessorContainerName, RestartCount: f.processorRestarts}
		if f.processorRestarts > 0 {
			ps.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "listen tcp :8080: bind: address already in use\n"}
		}
		if f.processorWaiting != "" {
			ps.State.Waiting = &corev1.ContainerStateWaiting{Reason: f.processorWaiting, Message: "back-off pulling image"}
		}
		p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, ps)
	}
	if f.sidecar {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "istio-proxy",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0)}}})
	}
	return p
}

func infos(t *testing.T, pods ...fakePod) []podInfo {
	t.Helper()
	var out []podInfo
	for _, f := range pods {
		info, ok := observePod(f.pod(), 0)
		require.True(t, ok)
		if f.lost {
			info.lost, info.lostWhy = true, "node n1 has been unreachable for 1m0s"
		}
		out = append(out, info)
	}
	return out
}

func exit(c int32) *int32 { return &c }

func report(attempt int32, c v1alpha1.ItemCounts, msg string) *v1alpha1.ShardReport {
	return &v1alpha1.ShardReport{Shard: 0, Attempt: attempt, ItemCounts: c, Message: msg}
}

// failureRecorded is e with failures failed attempts counted, the latest
// attempt last.
func failureRecorded(e *v1alpha1.ShardStatus, failures, last int32) *v1alpha1.ShardStatus {
	e.FailedAttempts, e.LastFailedAttempt = failures, ptr.To(last)
	return e
}

func entry(pod string, phase v1alpha1.ShardPhase, attempt int32, c v1alpha1.ItemCounts) *v1alpha1.ShardStatus {
	return &v1alpha1.ShardStatus{Index: 0, Pod: pod, Phase: phase, Attempt: attempt,
		ItemCounts: c}
}

// failedEntry is a shard entry whose status counts failures, the latest
// being attempt last.
func failedEntry(pod string, phase v1alpha1.ShardPhase, failures, last int32) *v1alpha1.ShardStatus {
	e := entry(pod, phase, attemptOfPodName(pod, 0), v1alpha1.ItemCounts{})
	e.FailedAttempts, e.LastFailedAttempt = failures, &last
	return e
}

func TestDecideShard(t *testing.T) {
	policy := shardPolicy{backoffLimit: 2, backoffBase: 10 * time.Second, backoffMax: time.Minute}
	now := t0.Add(time.Hour)
	tests := []struct {
		name   string
		pods   []fakePod
		entry  *v1alpha1.ShardStatus
		gone   bool
		policy func(*shardPolicy)
		check  func(t *testing.T, d shardDecision)
	}{
		{
			name: "no pod yet: create attempt 0",
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardPending, d.phase)
				require.Equal(t, int32(0), *d.create)
				require.Empty(t, d.pod, "named once created")
				require.Equal(t, v1alpha1.ItemCounts{}, d.createFloor)
			},
		},
		{
			name: "pending pod: nothing to do",
			pods: []fakePod{{attempt: 0, phase: corev1.PodPending}},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardPending, d.phase)
				require.Nil(t, d.create)
				require.Equal(t, 1, d.live)
			},
		},
		{
			name:  "running pod: counts from the worker's report",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodRunning}},
			entry: entry("r-0-0", v1alpha1.ShardRunning, 0, v1alpha1.ItemCounts{Total: 10, Completed: 4}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardRunning, d.phase)
				require.Nil(t, d.create)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 4}, d.counts)
				require.False(t, d.final)
			},
		},
		{
			name: "image cannot be pulled: a start problem, no new pod",
			pods: []fakePod{{attempt: 0, phase: corev1.PodPending, waiting: "ImagePullBackOff"}},
			check: func(t *testing.T, d shardDecision) {
				require.Nil(t, d.create)
				require.Contains(t, d.startProblem, "ImagePullBackOff")
				require.Contains(t, d.startProblem, "r-0-0")
			},
		},
		{
			name: "the scheduler cannot place the pod: its message, no new pod",
			pods: []fakePod{{attempt: 0, phase: corev1.PodPending, unschedulable: "0/3 nodes are available: 3 Insufficient cpu."}},
			check: func(t *testing.T, d shardDecision) {
				require.Nil(t, d.create)
				require.Equal(t, v1alpha1.ShardPending, d.phase)
				require.Equal(t, "pod r-0-0: 0/3 nodes are available: 3 Insufficient cpu.", d.unschedulable)
				require.Empty(t, d.startProblem)
			},
		},
		{
			name: "a scheduled pod says nothing of scheduling",
			pods: []fakePod{{attempt: 0, phase: corev1.PodRunning}},
			check: func(t *testing.T, d shardDecision) {
				require.Empty(t, d.unschedulable)
			},
		},
		{
			name:  "succeeded: the termination report is final, even if the last status write was lost",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodSucceeded, exit: exit(0), report: report(0, v1alpha1.ItemCounts{Total: 10, Completed: 7, AlreadyHandled: 3}, "")}},
			entry: entry("r-0-0", v1alpha1.ShardRunning, 0, v1alpha1.ItemCounts{Total: 10, Completed: 5, AlreadyHandled: 2}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.True(t, d.final)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 7, AlreadyHandled: 3}, d.counts)
				require.NotNil(t, d.report)
			},
		},
		{
			name:  "succeeded without a readable termination message: the current attempt's report",
			pods:  []fakePod{{attempt: 1, phase: corev1.PodSucceeded, exit: exit(0)}},
			entry: entry("r-0-1", v1alpha1.ShardRunning, 1, v1alpha1.ItemCounts{Total: 10, Completed: 10}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 10}, d.counts)
			},
		},
		{
			name: "failed, back-off not over: retrying later",
			pods: []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-5 * time.Second),
				report: report(0, v1alpha1.ItemCounts{Total: 10, Completed: 4, Failed: 1}, "item a/1: foreign key violation")}},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardRetrying, d.phase)
				require.Nil(t, d.create)
				require.Equal(t, now.Add(5*time.Second), d.retryAt)
				require.Equal(t, int32(1), d.failures)
				require.Contains(t, d.lastFailure, "r-0-0 exited 1: item a/1: foreign key violation")
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 4, Failed: 1}, d.counts)
			},
		},
		{
			name:  "failed, back-off over, failure recorded: attempt 1 starts from the failed attempt's counts",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(137), finished: now.Add(-11 * time.Second)}},
			entry: failureRecorded(entry("r-0-0", v1alpha1.ShardRunning, 0, v1alpha1.ItemCounts{Total: 10, Completed: 6}), 1, 0),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(1), *d.create)
				require.Equal(t, "r-0-0", d.pod, "until the new pod is created")
				require.Equal(t, "r-0-0", d.failedPod)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 6}, d.createFloor)
			},
		},
		{
			name:  "failed, back-off over, failure not in the status yet: nothing is created until it is",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(137), finished: now.Add(-11 * time.Second)}},
			entry: entry("r-0-0", v1alpha1.ShardRunning, 0, v1alpha1.ItemCounts{Total: 10, Completed: 6}),
			check: func(t *testing.T, d shardDecision) {
				require.Nil(t, d.create, "a refused status write and a deleted pod would lose the failure")
				require.True(t, d.awaitRecord)
				require.Equal(t, int32(1), d.failures, "the write counts it")
				require.Equal(t, ptr.To[int32](0), d.lastFailedAttempt)
				require.Equal(t, v1alpha1.ShardRetrying, d.phase)
			},
		},
		{
			name: "second failure waits twice as long",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Minute)},
				{attempt: 1, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-15 * time.Second)},
			},
			check: func(t *testing.T, d shardDecision) {
				require.Nil(t, d.create)
				require.Equal(t, int32(2), d.failures)
				require.Equal(t, now.Add(5*time.Second), d.retryAt)
			},
		},
		{
			name: "exit 2 (bad input) is never retried",
			pods: []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(2), finished: now.Add(-time.Hour),
				report: report(0, v1alpha1.ItemCounts{}, "line 3: entity is empty")}},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardFailed, d.phase)
				require.Nil(t, d.create)
				require.Equal(t, ReasonBadInput, d.failure.reason)
				require.Contains(t, d.failure.message, "shard 0")
				require.Contains(t, d.failure.message, "line 3: entity is empty")
			},
		},
		{
			name: "processor crashing before its worker started: the attempt failed, no new pod until it is gone",
			pods: []fakePod{{attempt: 0, phase: corev1.PodPending, waiting: "PodInitializing", processorRestarts: 3}},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardRetrying, d.phase)
				require.Equal(t, int32(1), d.failures)
				require.Nil(t, d.create, "the failed pod goes first")
				require.Equal(t, "pod r-0-0: container processor crashed or never became ready (restarted 3 times); it last exited 1 (Error): listen tcp :8080: bind: address already in use", d.lastFailure)
				require.Empty(t, d.deletePods, "not before the status records the failure")
			},
		},
		{
			name:  "processor crashing, failure recorded: its pod is deleted, still no new pod",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodPending, waiting: "PodInitializing", processorRestarts: 4}},
			entry: failedEntry("r-0-0", v1alpha1.ShardRetrying, 1, 0),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(1), d.failures, "counted once")
				require.Nil(t, d.create)
				require.Len(t, d.deletePods, 1)
				require.Equal(t, "r-0-0", d.deletePods[0].Name)
			},
		},
		{
			name:  "processor's failed pod gone: the next attempt",
			entry: failedEntry("r-0-0", v1alpha1.ShardRetrying, 1, 0),
			gone:  true,
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(1), *d.create)
			},
		},
		{
			name: "processor restarting while its worker runs: the kubelet's business, the worker retries its calls",
			pods: []fakePod{{attempt: 0, phase: corev1.PodRunning, processorRestarts: 5}},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardRunning, d.phase)
				require.Zero(t, d.failures)
				require.Empty(t, d.deletePods)
			},
		},
		{
			name: "processor image not pulled: the worker does not start, said naming the container",
			pods: []fakePod{{attempt: 0, phase: corev1.PodPending, waiting: "PodInitializing", processorWaiting: "ImagePullBackOff"}},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardPending, d.phase)
				require.Equal(t, "pod r-0-0: container processor: ImagePullBackOff: back-off pulling image", d.startProblem)
				require.Zero(t, d.failures)
			},
		},
		{
			name: "backoffLimit exceeded, last by the processor: ProcessorFailed, naming the container",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 1, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 2, phase: corev1.PodPending, waiting: "PodInitializing", processorRestarts: 3},
			},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardFailed, d.phase)
				require.True(t, d.final)
				require.Equal(t, ReasonProcessorFailed, d.failure.reason)
				require.Contains(t, d.failure.message, "shard 0 failed 3 times (backoffLimit 2)")
				require.Contains(t, d.failure.message, "container processor crashed or never became ready")
			},
		},
		{
			name: "backoffLimit exceeded: failed for good, naming the shard and its last error",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 1, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 2, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour),
					report: report(2, v1alpha1.ItemCounts{Total: 10, Completed: 8, Failed: 2}, "2 items failed")},
			},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardFailed, d.phase)
				require.Nil(t, d.create)
				require.True(t, d.final)
				require.Equal(t, ReasonBackoffLimitExceeded, d.failure.reason)
				require.Contains(t, d.failure.message, "shard 0 failed 3 times (backoffLimit 2)")
				require.Contains(t, d.failure.message, "r-0-2 exited 1: 2 items failed")
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 8, Failed: 2}, d.counts)
			},
		},
		{
			name:  "recorded pod missing from the cache: wait, never a second pod",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)}},
			entry: entry("r-0-1", v1alpha1.ShardPending, 0, v1alpha1.ItemCounts{}),
			check: func(t *testing.T, d shardDecision) {
				require.True(t, d.waitForCache)
				require.Nil(t, d.create)
				require.Equal(t, "r-0-1", d.pod)
			},
		},
		{
			name:  "recorded pod confirmed gone (deleted by someone): next attempt, not a failure",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)}},
			entry: entry("r-0-1", v1alpha1.ShardRunning, 1, v1alpha1.ItemCounts{Total: 10, Completed: 3}),
			gone:  true,
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(2), *d.create)
				require.Equal(t, int32(1), d.failures)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 3}, d.createFloor)
			},
		},
		{
			name:  "succeeded shard whose pod is gone stays succeeded",
			entry: entry("r-0-0", v1alpha1.ShardSucceeded, 0, v1alpha1.ItemCounts{Total: 5, Completed: 5}),
			gone:  true,
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.Nil(t, d.create)
				require.True(t, d.final)
				require.Equal(t, v1alpha1.ItemCounts{Total: 5, Completed: 5}, d.counts)
			},
		},
		{
			name:   "suspended: the live pod is deleted, nothing created",
			pods:   []fakePod{{attempt: 0, phase: corev1.PodRunning}},
			policy: func(p *shardPolicy) { p.suspended = true },
			check: func(t *testing.T, d shardDecision) {
				require.Nil(t, d.create)
				require.Len(t, d.deletePods, 1)
				require.Equal(t, "r-0-0", d.deletePods[0].Name)
			},
		},
		{
			name:   "suspended, pod already terminating: not deleted twice, nothing created",
			pods:   []fakePod{{attempt: 0, phase: corev1.PodRunning, deleting: true}},
			policy: func(p *shardPolicy) { p.suspended = true },
			check: func(t *testing.T, d shardDecision) {
				require.Nil(t, d.create)
				require.Empty(t, d.deletePods)
				require.Equal(t, 1, d.live)
			},
		},
		{
			name:  "resumed after a suspension: the stopped attempt is not a failure",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(1), deleting: true, finished: now}},
			entry: entry("r-0-0", v1alpha1.ShardRunning, 0, v1alpha1.ItemCounts{Total: 10, Completed: 4}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(0), d.failures)
				require.Equal(t, int32(1), *d.create)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 4}, d.createFloor)
			},
		},
		{
			name:  "pods deleted while suspended: numbering continues from the record",
			entry: entry("r-0-3", v1alpha1.ShardRunning, 3, v1alpha1.ItemCounts{Total: 4, Completed: 1}),
			gone:  true,
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(4), *d.create)
				require.Equal(t, int32(0), d.failures)
				require.Equal(t, "r-0-3", d.pod)
			},
		},
		{
			name: "a new attempt catching up never shows less than the floor",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 1, phase: corev1.PodRunning, floor: &v1alpha1.ItemCounts{Total: 10, Completed: 6, Failed: 1}},
			},
			entry: entry("r-0-1", v1alpha1.ShardRunning, 1, v1alpha1.ItemCounts{Total: 10, Completed: 2}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardRunning, d.phase)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 6, Failed: 1}, d.counts)
			},
		},
		{
			name: "a retry that succeeds reports exact final numbers (fewer failures than before)",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 1, phase: corev1.PodSucceeded, exit: exit(0), floor: &v1alpha1.ItemCounts{Total: 10, Completed: 6, Failed: 1},
					report: report(1, v1alpha1.ItemCounts{Total: 10, Completed: 10}, "")},
			},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 10}, d.counts)
			},
		},
		{
			name:   "stopped run: live pods are deleted, no retry",
			pods:   []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)}},
			policy: func(p *shardPolicy) { p.stopped = true },
			check: func(t *testing.T, d shardDecision) {
				require.Nil(t, d.create)
				require.Equal(t, v1alpha1.ShardRetrying, d.phase)
			},
		},
		{
			name:  "failures are durable: a deleted failed pod still counts",
			entry: failedEntry("r-0-0", v1alpha1.ShardRetrying, 1, 0),
			gone:  true,
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(1), d.failures)
				require.Equal(t, ptr.To[int32](0), d.lastFailedAttempt)
				require.Equal(t, int32(1), *d.create)
			},
		},
		{
			name: "failures are durable: the status's count plus the new failure exceed backoffLimit",
			pods: []fakePod{{attempt: 2, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)}},
			// Attempts 0 and 1 failed; their pods were deleted.
			entry: failedEntry("r-0-2", v1alpha1.ShardRunning, 2, 1),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardFailed, d.phase)
				require.Equal(t, int32(3), d.failures)
				require.Equal(t, ptr.To[int32](2), d.lastFailedAttempt)
				require.Equal(t, ReasonBackoffLimitExceeded, d.failure.reason)
				require.Nil(t, d.create)
			},
		},
		{
			name:  "a failure already counted is not counted again",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-5 * time.Second)}},
			entry: failedEntry("r-0-0", v1alpha1.ShardRetrying, 1, 0),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(1), d.failures)
				require.Equal(t, v1alpha1.ShardRetrying, d.phase)
			},
		},
		{
			name: "lock taken (exit 3): retried after a back-off, not counted",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 1, phase: corev1.PodFailed, exit: exit(v1alpha1.ExitShardBusy), finished: now.Add(-5 * time.Second)},
			},
			entry:  failedEntry("r-0-1", v1alpha1.ShardRunning, 1, 0),
			policy: func(p *shardPolicy) { p.backoffLimit = 0 },
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(1), d.failures, "only attempt 0")
				require.Nil(t, d.failure, "backoffLimit 0 is not exceeded by a busy lock")
				require.Equal(t, v1alpha1.ShardRetrying, d.phase)
				require.Equal(t, now.Add(5*time.Second), d.retryAt)
				require.Equal(t, "r-0-1", d.busyPod)
				require.Equal(t, "r-0-0", d.failedPod)
			},
		},
		{
			name: "worker finished, a sidecar keeps the pod Running: succeeded",
			pods: []fakePod{{attempt: 0, phase: corev1.PodRunning, exit: exit(0), sidecar: true,
				report: report(0, v1alpha1.ItemCounts{Total: 4, Completed: 4}, "")}},
			entry: entry("r-0-0", v1alpha1.ShardRunning, 0, v1alpha1.ItemCounts{Total: 4, Completed: 2}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.True(t, d.final)
				require.Equal(t, 0, d.live)
				require.Equal(t, v1alpha1.ItemCounts{Total: 4, Completed: 4}, d.counts)
				require.Empty(t, d.deletePods, "kept until the status says Succeeded")
			},
		},
		{
			name: "worker finished, a sidecar keeps the pod Running, the status says Succeeded: the pod is deleted",
			pods: []fakePod{{attempt: 0, phase: corev1.PodRunning, exit: exit(0), sidecar: true,
				report: report(0, v1alpha1.ItemCounts{Total: 4, Completed: 4}, "")}},
			entry: entry("r-0-0", v1alpha1.ShardSucceeded, 0, v1alpha1.ItemCounts{Total: 4, Completed: 4}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.Len(t, d.deletePods, 1)
				require.Equal(t, "r-0-0", d.deletePods[0].Name)
			},
		},
		{
			name: "worker finished, no other container, the phase still Running, the status says Succeeded: finished, the pod is kept",
			pods: []fakePod{{attempt: 0, phase: corev1.PodRunning, exit: exit(0),
				report: report(0, v1alpha1.ItemCounts{Total: 4, Completed: 4}, "")}},
			entry: entry("r-0-0", v1alpha1.ShardSucceeded, 0, v1alpha1.ItemCounts{Total: 4, Completed: 4}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.True(t, d.final)
				require.Empty(t, d.deletePods, "the kubelet reports the phase; the pod and its logs stay like any finished pod")
			},
		},
		{
			name: "worker finished, a native sidecar (restartPolicy Always) still runs: succeeded",
			pods: []fakePod{{attempt: 0, phase: corev1.PodRunning, exit: exit(0), nativeSidecar: true,
				report: report(0, v1alpha1.ItemCounts{Total: 4, Completed: 4}, "")}},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.Equal(t, v1alpha1.ItemCounts{Total: 4, Completed: 4}, d.counts)
			},
		},
		{
			name: "worker failed, a sidecar keeps the pod Running: retried, the pod is kept for the back-off",
			pods: []fakePod{{attempt: 0, phase: corev1.PodRunning, exit: exit(1), sidecar: true, finished: now.Add(-5 * time.Second)}},
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardRetrying, d.phase)
				require.Equal(t, int32(1), d.failures)
				require.Nil(t, d.create)
				require.Empty(t, d.deletePods)
			},
		},
		{
			name:  "worker failed, a sidecar keeps the pod Running, failure recorded, back-off over: deleted as the retry starts",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodRunning, exit: exit(1), sidecar: true, finished: now.Add(-time.Minute)}},
			entry: failedEntry("r-0-0", v1alpha1.ShardRetrying, 1, 0),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(1), *d.create)
				require.Len(t, d.deletePods, 1)
			},
		},
		{
			name:  "pod on a lost node: replaced at once, without waiting for it; deleted; no failure counted",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodRunning, lost: true}},
			entry: entry("r-0-0", v1alpha1.ShardRunning, 0, v1alpha1.ItemCounts{Total: 10, Completed: 4}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(1), *d.create)
				require.Equal(t, int64(4), d.createFloor.Completed, "the replacement starts from what the lost pod reported")
				require.Equal(t, 0, d.live)
				require.Equal(t, int32(0), d.failures)
				require.Len(t, d.lostPods, 1)
				require.Contains(t, d.lostWhy, "pod r-0-0: node n1")
				require.True(t, d.retryAt.IsZero(), "no back-off: nothing failed")
			},
		},
		{
			name:  "lost pod (being deleted) and its replacement running: Running, one live pod, nothing to create or delete",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodRunning, lost: true, deleting: true}, {attempt: 1, phase: corev1.PodRunning}},
			entry: entry("r-0-1", v1alpha1.ShardRunning, 1, v1alpha1.ItemCounts{}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardRunning, d.phase)
				require.Equal(t, 1, d.live)
				require.Nil(t, d.create)
				require.Empty(t, d.lostPods)
				require.Empty(t, d.deletePods)
			},
		},
		{
			name: "lost pod still holds the lock, its replacement gave up waiting (exit 3): retried, not counted",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodRunning, lost: true, deleting: true},
				{attempt: 1, phase: corev1.PodFailed, exit: exit(v1alpha1.ExitShardBusy), finished: now.Add(-time.Minute)},
			},
			entry:  entry("r-0-1", v1alpha1.ShardRunning, 1, v1alpha1.ItemCounts{}),
			policy: func(p *shardPolicy) { p.backoffLimit = 0 },
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(0), d.failures)
				require.Nil(t, d.failure)
				require.Equal(t, "r-0-1", d.busyPod)
				require.Equal(t, int32(2), *d.create)
			},
		},
		{
			name:  "the lost pod's worker reported success before its node was lost: Succeeded, no replacement",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodRunning, lost: true}},
			entry: entry("r-0-0", v1alpha1.ShardSucceeded, 0, v1alpha1.ItemCounts{Total: 3, Completed: 3}),
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardSucceeded, d.phase)
				require.True(t, d.final)
				require.Nil(t, d.create)
			},
		},
		{
			name: "the lost pod comes back and fails after it was deleted: not counted",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodFailed, exit: exit(1), deleting: true, finished: now.Add(-time.Second)},
				{attempt: 1, phase: corev1.PodRunning},
			},
			entry:  entry("r-0-1", v1alpha1.ShardRunning, 1, v1alpha1.ItemCounts{}),
			policy: func(p *shardPolicy) { p.backoffLimit = 0 },
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, int32(0), d.failures)
				require.Equal(t, v1alpha1.ShardRunning, d.phase)
			},
		},
		{
			name:   "pod on a lost node of a suspended run: deleted, not replaced",
			pods:   []fakePod{{attempt: 0, phase: corev1.PodRunning, lost: true}},
			policy: func(p *shardPolicy) { p.suspended = true },
			check: func(t *testing.T, d shardDecision) {
				require.Nil(t, d.create)
				require.Len(t, d.lostPods, 1)
			},
		},
		// One case per boundary between decidePods' phases.
		{
			name: "bad input past the backoff limit: the bad input is the reason",
			pods: []fakePod{
				{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 1, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)},
				{attempt: 2, phase: corev1.PodFailed, exit: exit(v1alpha1.ExitBadInput), finished: now},
			},
			policy: func(p *shardPolicy) { p.backoffLimit = 1 },
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardFailed, d.phase)
				require.True(t, d.final)
				require.Equal(t, ReasonBadInput, d.failure.reason)
				require.Equal(t, int32(3), d.failures)
				require.Nil(t, d.create)
			},
		},
		{
			name: "a previous release's worker the upgrade's RBAC refused its run: retried, by this release's pod",
			pods: []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(v1alpha1.ExitBadInput), finished: now.Add(-time.Hour),
				report: report(0, v1alpha1.ItemCounts{}, `reading ProcessingRun billing/r: processingruns.processing.runledger.dev "r" is forbidden: `+
					`User "system:serviceaccount:billing:runledger-worker" cannot get resource "processingruns" in API group "processing.runledger.dev" in the namespace "billing"`)}},
			entry: failedEntry("r-0-0", v1alpha1.ShardRetrying, 1, 0),
			check: func(t *testing.T, d shardDecision) {
				require.False(t, d.final, "not bad input for good")
				require.Nil(t, d.failure)
				require.Equal(t, int32(1), d.failures)
				require.Equal(t, ptr.To[int32](1), d.create)
			},
		},
		{
			name: "bad input that names processingruns but is no refused read: failed for good",
			pods: []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(v1alpha1.ExitBadInput), finished: now,
				report: report(0, v1alpha1.ItemCounts{}, `line 3: field "entity" is missing (processingruns)`)}},
			check: func(t *testing.T, d shardDecision) {
				require.True(t, d.final)
				require.Equal(t, ReasonBadInput, d.failure.reason)
			},
		},
		{
			name:  "the recorded pod missing from the cache outranks a succeeded earlier attempt",
			pods:  []fakePod{{attempt: 0, phase: corev1.PodSucceeded, exit: exit(0)}},
			entry: entry("r-0-1", v1alpha1.ShardRunning, 1, v1alpha1.ItemCounts{Total: 4, Completed: 2}),
			check: func(t *testing.T, d shardDecision) {
				require.True(t, d.waitForCache)
				require.False(t, d.final)
				require.Equal(t, "r-0-1", d.pod)
				require.Equal(t, v1alpha1.ShardRunning, d.phase)
				require.Nil(t, d.create)
			},
		},
		{
			name:   "a failed attempt of a suspended run: retrying, nothing created",
			pods:   []fakePod{{attempt: 0, phase: corev1.PodFailed, exit: exit(1), finished: now.Add(-time.Hour)}},
			policy: func(p *shardPolicy) { p.suspended = true },
			check: func(t *testing.T, d shardDecision) {
				require.Equal(t, v1alpha1.ShardRetrying, d.phase)
				require.Equal(t, int32(1), d.failures)
				require.Nil(t, d.create)
				require.False(t, d.awaitRecord, "suspended before the record is awaited")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy
			if tt.policy != nil {
				tt.policy(&p)
			}
			in := shardInput{runName: "r", index: 0, pods: infos(t, tt.pods...), entry: tt.entry, recordedAttempt: -1, recordedGone: tt.gone}
			if tt.entry != nil {
				in.recordedAttempt = attemptOfPodName(tt.entry.Pod, 0)
			}
			tt.check(t, decideShard(in, p, now))
		})
	}
}

func TestPodOnLostNode(t *testing.T) {
	now := t0.Add(time.Hour)
	after := time.Minute
	node := func(status corev1.ConditionStatus, since time.Duration) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
			{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(now.Add(-since))},
		}}}
	}
	tests := []struct {
		name     string
		nodeName string
		deleting bool
		node     *corev1.Node
		after    time.Duration
		lost     bool
		wait     time.Duration
		why      string
	}{
		{name: "not scheduled", nodeName: "", node: nil},
		{name: "node Ready", nodeName: "n1", node: node(corev1.ConditionTrue, time.Hour)},
		{name: "node has not reported yet", nodeName: "n1", node: &corev1.Node{}},
		{name: "node gone", nodeName: "n1", node: nil, lost: true, why: "node n1 no longer exists"},
		{name: "NotReady, not for long enough: wait the rest", nodeName: "n1", node: node(corev1.ConditionFalse, 20*time.Second), wait: 40 * time.Second},
		{name: "unreachable just past the bound", nodeName: "n1", node: node(corev1.ConditionUnknown, time.Minute+time.Second), lost: true,
			why: "node n1 has been unreachable for 1m1s (nodeLostAfterSeconds: 60)"},
		{name: "NotReady exactly at the bound", nodeName: "n1", node: node(corev1.ConditionFalse, time.Minute), lost: true,
			why: "node n1 has been NotReady for 1m0s (nodeLostAfterSeconds: 60)"},
		{name: "being deleted on an unreachable node: lost at once", nodeName: "n1", deleting: true, node: node(corev1.ConditionUnknown, time.Second), lost: true,
			why: "node n1 is unreachable and the pod is being deleted"},
		{name: "being deleted on a Ready node: the kubelet will confirm", nodeName: "n1", deleting: true, node: node(corev1.ConditionTrue, time.Second)},
		{name: "bound 0: lost as soon as NotReady", nodeName: "n1", node: node(corev1.ConditionFalse, 0), after: -1, lost: true,
			why: "node n1 has been NotReady for 0s (nodeLostAfterSeconds: 0)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{NodeName: tt.nodeName}}
			if tt.deleting {
				pod.DeletionTimestamp = ptr.To(metav1.NewTime(now))
			}
			a := after
			if tt.after < 0 {
				a = 0
			}
			lost, wait, why := podOnLostNode(pod, tt.node, a, now)
			require.Equal(t, tt.lost, lost)
			require.Equal(t, tt.wait, wait)
			require.Equal(t, tt.why, why)
		})
	}
}

func TestBackoff(t *testing.T) {
	for n, want := range map[int32]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 6: 5*time.Minute + 20*time.Second, 7: 6 * time.Minute, 40: 6 * time.Minute} {
		require.Equal(t, want, backoff(n, 10*time.Second, 6*time.Minute), "n=%d", n)
	}
}

func TestAttemptOfPodName(t *testing.T) {
	require.Equal(t, int32(3), attemptOfPodName("my-run-12-3", 12))
	require.Equal(t, int32(0), attemptOfPodName("a-0-0", 0))
	require.Equal(t, int32(-1), attemptOfPodName("a-1-0", 0))
	require.Equal(t, int32(-1), attemptOfPodName("garbage", 0))
}

func TestObservePodIgnoresForeignReports(t *testing.T) {
	// A termination message of another shard or attempt, or plain log lines
	// (FallbackToLogsOnError), is not a report.
	f := fakePod{attempt: 1, phase: corev1.PodSucceeded, exit: exit(0), report: report(0, v1alpha1.ItemCounts{Completed: 5}, "")}
	info, ok := observePod(f.pod(), 0)
	require.True(t, ok)
	require.Nil(t, info.report)
	f.report = nil
	info, _ = observePod(f.pod(), 0)
	require.Nil(t, info.report)
}

func TestExpectations(t *testing.T) {
	now := t0
	e := newExpectations(func() time.Time { return now })
	key := runKey("ns", "r")
	_, pending := e.pending(key, "u1", 0, -1)
	require.False(t, pending)
	e.expectCreate(key, "u1", 0, 2)
	a, pending := e.pending(key, "u1", 0, 1)
	require.True(t, pending)
	require.Equal(t, int32(2), a)
	_, pending = e.pending(key, "u2", 0, 1)
	require.False(t, pending, "another run of the same name")
	e.expectCreate(key, "u1", 0, 2)
	_, pending = e.pending(key, "u1", 0, 2)
	require.False(t, pending, "observed")
	e.expectCreate(key, "u1", 1, 0)
	now = now.Add(expectationTTL + time.Second)
	_, pending = e.pending(key, "u1", 1, -1)
	require.False(t, pending, "expired")
	e.expectCreate(key, "u1", 1, 0)
	e.cancel(key, 1)
	_, pending = e.pending(key, "u1", 1, -1)
	require.False(t, pending, "cancelled")
}

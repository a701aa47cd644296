package controllers

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestWorkerPodTransform: the cache's copy of a worker pod drops its spec
// (but the node) and managed fields, and the controller reads it exactly as
// it reads the whole pod, in every state it tells apart: what it observes,
// whether its node is lost, how it describes a failure.
func TestWorkerPodTransform(t *testing.T) {
	run := testRun()
	run.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{Image: "registry.example/mailer:1"}}
	base, err := buildWorkerPod(run, workerPodParams{shard: 1, attempt: 2, floor: v1alpha1.ItemCounts{Total: 9, Completed: 3}}, PodOptions{Image: "registry.example/runledger:v1"})
	require.NoError(t, err)
	base.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "runledger-controller", Operation: metav1.ManagedFieldsOperationApply}}
	report, err := shardReport(1, 2, v1alpha1.ItemCounts{Total: 9, Completed: 9}, "done").TerminationMessage()
	require.NoError(t, err)
	ago := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	terminated := func(code int32, reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg, FinishedAt: ago}}
	}
	states := map[string]func(*corev1.Pod){
		"pending, unschedulable": func(p *corev1.Pod) {
			p.Spec.NodeName = ""
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled,
				Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/2 nodes are available"}}}
		},
		"image pull back-off": func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: v1alpha1.WorkerContainerName,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "not found"}}}}}
		},
		"processor crashing": func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{{Name: v1alpha1.ProcessorContainerName,
				RestartCount: processorMaxRestarts, LastTerminationState: terminated(1, "Error", "listen: address in use")}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: v1alpha1.WorkerContainerName,
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}}
		},
		"running, reporting": func(p *corev1.Pod) {
			p.Annotations[v1alpha1.AnnotationProgress] = `{"shard":1,"attempt":2,"total":9,"completed":5}`
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: v1alpha1.WorkerContainerName,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ago}}}}}
		},
		"worker done, a sidecar lingering": func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
				{Name: v1alpha1.WorkerContainerName, State: terminated(0, "Completed", string(report))},
				{Name: "istio-proxy", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
		},
		"succeeded": func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{
				{Name: v1alpha1.WorkerContainerName, State: terminated(0, "Completed", string(report))}}}
		},
		"OOM killed": func(p *corev1.Pod) {
			p.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{
				{Name: v1alpha1.WorkerContainerName, State: terminated(137, "OOMKilled", "")}}}
		},
		"evicted, being deleted": func(p *corev1.Pod) {
			p.DeletionTimestamp = &ago
			p.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "the node was low on ephemeral-storage",
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: ago}}}
		},
	}
	node := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady,
		Status: corev1.ConditionUnknown, LastTransitionTime: ago}}}}
	for name, set := range states {
		full := base.DeepCopy()
		full.Spec.NodeName = "node-1"
		set(full)
		before := full.DeepCopy()
		obj, err := workerPodTransform(full)
		require.NoError(t, err)
		cached := obj.(*corev1.Pod)
		require.Equal(t, before, full, "%s: the informer's object is not changed", name)
		require.Empty(t, cached.ManagedFields, name)
		require.Empty(t, cached.Spec.Containers, name)
		require.Empty(t, cached.Spec.Volumes, name)
		require.Equal(t, full.Spec.NodeName, cached.Spec.NodeName, name)

		want, ok := observePod(full, 1)
		require.True(t, ok, name)
		got, ok := observePod(cached, 1)
		require.True(t, ok, name)
		require.Equal(t, describeFailure(want), describeFailure(got), name)
		want.pod, got.pod = nil, nil
		require.Equal(t, want, got, name)
		for _, n := range []*corev1.Node{nil, node} {
			l1, w1, why1 := podOnLostNode(full, n, 40*time.Second, time.Now())
			l2, w2, why2 := podOnLostNode(cached, n, 40*time.Second, time.Now())
			require.Equal(t, []any{l1, why1}, []any{l2, why2}, name)
			require.InDelta(t, w1.Seconds(), w2.Seconds(), 1, name)
		}
	}
	tomb := "not a pod"
	got, err := workerPodTransform(tomb)
	require.NoError(t, err)
	require.Equal(t, tomb, got)
}

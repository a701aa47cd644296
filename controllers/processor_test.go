package controllers

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// A run with spec.effect.processor: its pods carry the processor as a
// native sidecar, which the apiserver accepts. A processor that keeps
// crashing before its worker starts fails the attempt (an event naming the
// container), its pod goes before the next one is created, and once
// backoffLimit is spent the run is Failed with reason ProcessorFailed.
func TestProcessorSidecarCrashing(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	spec := newRun(ns, "mailer", 1, 3)
	spec.Spec.BackoffLimit = ptr.To[int32](1)
	spec.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{Image: "registry.example/mailer:1"}}
	create(t, env, spec)

	pods := waitPods(t, env, ns, "mailer", "mailer-0-0")
	p := pods["mailer-0-0"]
	require.Len(t, p.Spec.InitContainers, 1)
	sc := p.Spec.InitContainers[0]
	require.Equal(t, v1alpha1.ProcessorContainerName, sc.Name)
	require.Equal(t, corev1.ContainerRestartPolicyAlways, *sc.RestartPolicy)
	require.Equal(t, int32(v1alpha1.DefaultProcessorPort), sc.StartupProbe.TCPSocket.Port.IntVal)
	got := getRun(t, env, ns, "mailer")
	require.Equal(t, v1alpha1.DefaultProcessorPath, got.Spec.Effect.Processor.Path, "the CRD's defaults")
	require.Equal(t, v1alpha1.DefaultProcessorTimeout, got.Spec.Effect.Processor.Timeout.Duration)
	require.Equal(t, int32(v1alpha1.DefaultMaxItemsPerCall), got.Spec.Effect.Processor.MaxItemsPerCall)

	setProcessorCrashing(t, env, ns, "mailer-0-0")
	waitEvent(t, env, ns, "mailer", corev1.EventTypeWarning, "ShardFailed", "container processor crashed or never became ready (restarted 3 times)")
	waitPods(t, env, ns, "mailer", "mailer-0-1")

	setProcessorCrashing(t, env, ns, "mailer-0-1")
	r := waitRun(t, env, ns, "mailer", "Failed", all(
		phaseIs(v1alpha1.RunFailed),
		conditionIs(v1alpha1.ConditionFailed, metav1.ConditionTrue, ReasonProcessorFailed),
	))
	require.Contains(t, condition(r, v1alpha1.ConditionFailed).Message, "container processor crashed or never became ready")
	require.Equal(t, int32(2), shardEntry(r, 0).FailedAttempts)
	waitPods(t, env, ns, "mailer")
}

// setProcessorCrashing plays a kubelet whose processor sidecar crashed three
// times before its startup probe ever passed: the worker never started.
func setProcessorCrashing(t *testing.T, env *envtestutil.Env, ns, name string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod))
	now := metav1.Now()
	pod.Status.Phase = corev1.PodPending
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: v1alpha1.ProcessorContainerName,
		Image: pod.Spec.InitContainers[0].Image, RestartCount: 3,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s restarting failed container"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 2, Reason: "Error", Message: "panic: no SMTP_HOST\n", StartedAt: now, FinishedAt: now}}}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: v1alpha1.WorkerContainerName, Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}
	require.NoError(t, env.Client.Status().Update(ctx, pod))
}

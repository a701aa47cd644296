package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// A shard whose pod sits on a node that stopped answering gets a
// replacement once the node has been NotReady for nodeLostAfterSeconds,
// without waiting for the old pod to be confirmed gone (no kubelet ever
// will): the old pod is deleted (it stays Terminating), its failure is never
// counted, and the replacement finishes the run.
func TestPodOnLostNodeIsReplaced(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	ctx := context.Background()
	node := addNode(t, env, ns+"-node")
	spec := newRun(ns, "lost", 1, 2)
	spec.Spec.NodeLostAfterSeconds = ptr.To[int32](2)
	spec.Spec.BackoffLimit = ptr.To[int32](0)
	create(t, env, spec)

	waitPods(t, env, ns, "lost", "lost-0-0")
	bindPod(t, env, ns, "lost-0-0", node.Name)
	setPod(t, env, ns, "lost-0-0", corev1.PodRunning, 0, nil)
	waitRun(t, env, ns, "lost", "shard 0 Running", func(r *v1alpha1.ProcessingRun) error {
		return shardPhaseIs(r, 0, v1alpha1.ShardRunning)
	})

	// The node controller's mark of an unreachable kubelet.
	lostAt := time.Now()
	setNodeReady(t, env, node.Name, corev1.ConditionUnknown)
	stillPods(t, env, ns, "lost", time.Second, "lost-0-0")
	pods := waitPods(t, env, ns, "lost", "lost-0-0", "lost-0-1")
	// (The condition's time is kept in whole seconds: up to 1 s early.)
	require.GreaterOrEqual(t, time.Since(lostAt), time.Second, "replaced only after nodeLostAfterSeconds")
	require.NotNil(t, pods["lost-0-0"].DeletionTimestamp, "the lost pod is deleted, so its kubelet stops it if the node comes back")
	waitEvent(t, env, ns, "lost", corev1.EventTypeNormal, "PodCreated", "to replace a pod on a lost node (pod lost-0-0: node "+node.Name+" has been unreachable")
	waitEvent(t, env, ns, "lost", corev1.EventTypeNormal, "PodDeleted", "its node is lost")

	setPod(t, env, ns, "lost-0-1", corev1.PodSucceeded, 0, shardReport(0, 1, v1alpha1.ItemCounts{Total: 2, Completed: 2}, ""))
	r := waitRun(t, env, ns, "lost", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded), countsAre(v1alpha1.ItemCounts{Total: 2, Completed: 2})))
	require.Zero(t, shardEntry(r, 0).FailedAttempts)
	require.NoError(t, env.Client.Delete(ctx, pods["lost-0-0"], client.GracePeriodSeconds(0)))
}

// A pod on a node that is NotReady for less than nodeLostAfterSeconds
// stays the shard's only pod.
func TestPodOnBrieflyNotReadyNodeIsKept(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	livePodGuard(t, env, ns)
	node := addNode(t, env, ns+"-node")
	spec := newRun(ns, "blip", 1, 2)
	spec.Spec.NodeLostAfterSeconds = ptr.To[int32](60)
	create(t, env, spec)

	waitPods(t, env, ns, "blip", "blip-0-0")
	bindPod(t, env, ns, "blip-0-0", node.Name)
	setPod(t, env, ns, "blip-0-0", corev1.PodRunning, 0, nil)
	setNodeReady(t, env, node.Name, corev1.ConditionFalse)
	stillPods(t, env, ns, "blip", 3*time.Second, "blip-0-0")
	setNodeReady(t, env, node.Name, corev1.ConditionTrue)
	setPod(t, env, ns, "blip-0-0", corev1.PodSucceeded, 0, shardReport(0, 0, v1alpha1.ItemCounts{Total: 2, Completed: 2}, ""))
	waitRun(t, env, ns, "blip", "Succeeded", phaseIs(v1alpha1.RunSucceeded))
}

func shardPhaseIs(r *v1alpha1.ProcessingRun, i int32, p v1alpha1.ShardPhase) error {
	if e := shardEntry(r, i); e == nil || e.Phase != p {
		return fmt.Errorf("shard %d: %+v", i, e)
	}
	return nil
}

// addNode registers a Ready node (no kubelet behind it); it is removed
// after the test.
func addNode(t *testing.T, env *envtestutil.Env, name string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	require.NoError(t, env.Client.Create(ctx, node))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), node) })
	setNodeReady(t, env, name, corev1.ConditionTrue)
	return node
}

// setNodeReady plays the kubelet (True) or the node controller (False,
// Unknown): the node's Ready condition, changed now.
func setNodeReady(t *testing.T, env *envtestutil.Env, name string, status corev1.ConditionStatus) {
	t.Helper()
	ctx := context.Background()
	node := &corev1.Node{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: name}, node))
	now := metav1.Now()
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status,
		LastHeartbeatTime: now, LastTransitionTime: now, Reason: "Test"}}
	require.NoError(t, env.Client.Status().Update(ctx, node))
}

// bindPod plays the scheduler.
func bindPod(t *testing.T, env *envtestutil.Env, ns, name, node string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	require.NoError(t, env.Client.SubResource("binding").Create(context.Background(), pod, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}))
}

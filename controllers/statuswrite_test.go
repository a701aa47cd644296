package controllers

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// failingPodCreates fails the creates of pods whose name has the given
// suffix while failing is set, with an API error that is no admission
// refusal (a 500).
type failingPodCreates struct {
	client.Client
	suffix  string
	failing atomic.Bool
}

func (c *failingPodCreates) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*corev1.Pod); ok && c.failing.Load() && strings.HasSuffix(obj.GetName(), c.suffix) {
		return apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
	}
	return c.Client.Create(ctx, obj, opts...)
}

// A pass whose syncPods fails still writes the status (as Cluster API's
// patch helper does): the pods it did create are recorded, and Reconciling
// and Ready say what failed; the run does not stay without a word.
func TestStatusIsWrittenWhenSyncPodsFails(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	fc := &failingPodCreates{suffix: "-1-0"}
	fc.failing.Store(true)
	startManager(t, env, ns, managerConfig{wrapClient: func(c client.Client) client.Client {
		fc.Client = c
		return fc
	}})
	create(t, env, newRun(ns, "apidown", 2, 4))

	r := waitRun(t, env, ns, "apidown", "the error in the status", all(
		phaseIs(v1alpha1.RunRunning),
		conditionIs(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonReconcileError),
		conditionIs(v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonReconcileError),
	))
	msg := condition(r, v1alpha1.ConditionReconciling).Message
	require.Contains(t, msg, "syncPods: create pod apidown-1-0")
	require.Contains(t, msg, "etcdserver: request timed out")
	require.Equal(t, "apidown-0-0", shardEntry(r, 0).Pod, "the pod created before the error is recorded")
	require.Equal(t, r.Generation, r.Status.ObservedGeneration)

	fc.failing.Store(false)
	waitPods(t, env, ns, "apidown", "apidown-0-0", "apidown-1-0")
	waitRun(t, env, ns, "apidown", "the error gone", all(
		conditionIs(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonRunning),
		func(r *v1alpha1.ProcessingRun) error {
			if strings.Contains(condition(r, v1alpha1.ConditionReconciling).Message, "etcdserver") {
				return errors.New("still the error")
			}
			return nil
		}))
}

// A run whose pod the scheduler cannot place says so: Reconciling and Ready
// with the reason Unschedulable, and a Warning Event naming the
// scheduler's message (from the pod's PodScheduled condition).
func TestUnschedulablePodIsReported(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	create(t, env, newRun(ns, "nofit", 1, 2))
	waitPods(t, env, ns, "nofit", "nofit-0-0")

	const sched = "0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
	ctx := context.Background()
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "nofit-0-0"}, pod))
	pod.Status.Phase = corev1.PodPending
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: sched, LastTransitionTime: metav1.Now()}}
	require.NoError(t, env.Client.Status().Update(ctx, pod))

	r := waitRun(t, env, ns, "nofit", "Unschedulable", all(
		phaseIs(v1alpha1.RunRunning),
		conditionIs(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonUnschedulable),
		conditionIs(v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonUnschedulable),
	))
	require.Contains(t, condition(r, v1alpha1.ConditionReconciling).Message, "pod nofit-0-0: "+sched)
	waitEvent(t, env, ns, "nofit", corev1.EventTypeWarning, ReasonUnschedulable, "pod nofit-0-0: "+sched)

	// Scheduled and running: the reason goes.
	setPod(t, env, ns, "nofit-0-0", corev1.PodRunning, 0, nil)
	waitRun(t, env, ns, "nofit", "scheduled", conditionIs(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonRunning))
}

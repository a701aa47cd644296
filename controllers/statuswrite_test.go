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

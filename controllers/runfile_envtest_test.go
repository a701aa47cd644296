package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestRunConfigMap: a run's pods come with the run's ConfigMap, owned by
// the run, holding the run as the workers read it (they cannot read runs
// through the API); an edited spec is written again before the next pods;
// one an earlier run of the name left is taken over; a ConfigMap of that
// name that is not a run's keeps every pod of the run from starting,
// visibly, until it is gone.
func TestRunConfigMap(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	foreign := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "runledger-taken", Namespace: ns},
		Data: map[string]string{"settings": "someone else's"}}
	require.NoError(t, env.Client.Create(ctx, foreign))

	startManager(t, env, ns, managerConfig{})
	run := create(t, env, newRun(ns, "spec", 2, 4))
	pods := waitPods(t, env, ns, "spec", "spec-0-0", "spec-1-0")

	read := func(name string) (*corev1.ConfigMap, *v1alpha1.ProcessingRun) {
		t.Helper()
		var cm corev1.ConfigMap
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm))
		got, err := v1alpha1.DecodeRunFile(cm.BinaryData[v1alpha1.WorkerRunFile])
		require.NoError(t, err)
		return &cm, got
	}
	cm, got := read("runledger-spec")
	ref := metav1.GetControllerOf(cm)
	require.NotNil(t, ref, "owned by the run: deleted with it")
	require.Equal(t, run.UID, ref.UID)
	require.Equal(t, run.UID, got.UID)
	require.Equal(t, "spec", got.Name)
	stored := &v1alpha1.ProcessingRun{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(run), stored))
	require.Equal(t, stored.Spec, got.Spec, "the run as the API server stored it, defaults included")
	for name, pod := range pods {
		var vol *corev1.Volume
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == v1alpha1.WorkerRunVolume {
				vol = &pod.Spec.Volumes[i]
			}
		}
		require.NotNil(t, vol, "%s mounts the run's file", name)
		require.Equal(t, "runledger-spec", vol.ConfigMap.Name)
	}

	// An edited (mutable) field is written again, in place.
	stored.Spec.MaxFailedItems = 5
	r := &Reconciler{Client: env.Client, APIReader: env.Client}
	p, err := r.ensureRunConfigMap(ctx, stored)
	require.NoError(t, err)
	require.Nil(t, p)
	cm2, got := read("runledger-spec")
	require.EqualValues(t, 5, got.Spec.MaxFailedItems)
	require.Equal(t, cm.UID, cm2.UID, "the same ConfigMap, updated")

	// The name is taken: no pod, a Stalled condition that says why, and
	// the other ConfigMap untouched.
	create(t, env, newRun(ns, "taken", 1, 1))
	tr := waitRun(t, env, ns, "taken", "Stalled", conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonPodCreateFailed))
	require.Contains(t, condition(tr, v1alpha1.ConditionStalled).Message, "ConfigMap runledger-taken exists and is not this run's")
	stillPods(t, env, ns, "taken", 500*time.Millisecond)
	var have corev1.ConfigMap
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(foreign), &have))
	require.Equal(t, foreign.Data, have.Data)
	require.Empty(t, have.BinaryData)
	// Once it is gone, the run gets its own and its pod.
	require.NoError(t, env.Client.Delete(ctx, foreign))
	waitPods(t, env, ns, "taken", "taken-0-0")
	_, got = read("runledger-taken")
	require.Equal(t, "taken", got.Name)

	// An earlier run of the name, deleted, whose ConfigMap the garbage
	// collector has not removed yet (envtest runs none): the new run takes
	// it over, with its own file, and starts.
	earlier := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "runledger-again", Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProcessingRun",
			Name: "again", UID: "0b4f1d7e-0000-4000-8000-000000000001", Controller: ptr.To(true)}}},
		BinaryData: map[string][]byte{v1alpha1.WorkerRunFile: []byte("the earlier run's")}}
	require.NoError(t, env.Client.Create(ctx, earlier))
	again := create(t, env, newRun(ns, "again", 1, 1))
	waitPods(t, env, ns, "again", "again-0-0")
	cm, got = read("runledger-again")
	require.Equal(t, again.UID, got.UID)
	require.Equal(t, again.UID, metav1.GetControllerOf(cm).UID)
	require.Len(t, cm.OwnerReferences, 1)
}

package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestRunConfigMap: a run's pods come with the run's ConfigMap, immutable,
// owned by the run, holding the run as the API server stored it, which is
// what the workers read (they cannot read runs through the API), and each
// pod names its digest; an edited spec gets its own ConfigMap for the pods
// created after; a ConfigMap of that name that is not the run's keeps
// every pod of the run from starting, visibly, until it is gone.
func TestRunConfigMap(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	startManager(t, env, ns, managerConfig{})
	run := create(t, env, newRun(ns, "spec", 2, 4))
	pods := waitPods(t, env, ns, "spec", "spec-0-0", "spec-1-0")

	stored := &v1alpha1.ProcessingRun{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(run), stored))
	mounted := func(pod *corev1.Pod) (*corev1.ConfigMap, *v1alpha1.ProcessingRun) {
		t.Helper()
		var name, digest string
		for _, v := range pod.Spec.Volumes {
			if v.Name == v1alpha1.WorkerRunVolume {
				name = v.ConfigMap.Name
			}
		}
		for _, e := range pod.Spec.Containers[0].Env {
			if e.Name == v1alpha1.EnvRunDigest {
				digest = e.Value
			}
		}
		require.Equal(t, v1alpha1.RunConfigMapName(pod.Labels[v1alpha1.LabelRun], digest), name, "pod %s", pod.Name)
		var cm corev1.ConfigMap
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm))
		file := cm.BinaryData[v1alpha1.WorkerRunFile]
		require.Equal(t, digest, v1alpha1.RunFileDigest(file), "pod %s names its file's digest", pod.Name)
		got, err := v1alpha1.DecodeRunFile(file)
		require.NoError(t, err)
		return &cm, got
	}
	cm, got := mounted(pods["spec-0-0"])
	cm1, _ := mounted(pods["spec-1-0"])
	require.Equal(t, cm.UID, cm1.UID, "one ConfigMap for the run's pods")
	require.True(t, *cm.Immutable)
	ref := metav1.GetControllerOf(cm)
	require.NotNil(t, ref, "owned by the run: deleted with it")
	require.Equal(t, run.UID, ref.UID)
	require.Equal(t, run.UID, got.UID)
	require.Equal(t, stored.Spec, got.Spec, "the run as the API server stored it, defaults included")

	// An edited (mutable) field: the next pod gets a file of its own; the
	// earlier pods' stays as they mount it.
	// A merge patch, not an update of the version read: the manager writes
	// the run's status meanwhile.
	patch := client.MergeFrom(stored.DeepCopy())
	stored.Spec.MaxFailedItems = 5
	require.NoError(t, env.Client.Patch(ctx, stored, patch))
	setPod(t, env, ns, "spec-1-0", corev1.PodFailed, v1alpha1.ExitFailed, nil)
	next := waitPods(t, env, ns, "spec", "spec-0-0", "spec-1-0", "spec-1-1")
	cm2, got := mounted(next["spec-1-1"])
	require.NotEqual(t, cm.Name, cm2.Name)
	require.EqualValues(t, 5, got.Spec.MaxFailedItems)
	mounted(next["spec-0-0"])

	// The name is taken: no pod, a Stalled condition that says why, and
	// the other ConfigMap untouched.
	// (Created suspended, so that no pass writes the run's own first.)
	taken := newRun(ns, "taken", 1, 1)
	taken.Spec.Suspend = true
	create(t, env, taken)
	taken.Spec.Suspend = false
	foreign, _, _, err := buildRunConfigMap(taken)
	require.NoError(t, err)
	foreign.OwnerReferences = nil
	foreign.BinaryData[v1alpha1.WorkerRunFile] = []byte("not the run's")
	require.NoError(t, env.Client.Create(ctx, foreign))
	r := &Reconciler{Client: env.Client, APIReader: env.Client}
	_, p, err := r.ensureRunConfigMap(ctx, taken)
	require.NoError(t, err)
	require.NotNil(t, p)
	require.Contains(t, p.message, "ConfigMap "+foreign.Name+" exists and is not this run's file")
	require.NoError(t, env.Client.Patch(ctx, taken, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"suspend":false}}`))))
	tr := waitRun(t, env, ns, "taken", "Stalled", conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonPodCreateFailed))
	require.Contains(t, condition(tr, v1alpha1.ConditionStalled).Message, "exists and is not this run's file")
	stillPods(t, env, ns, "taken", 500*time.Millisecond)
	// Once it is gone, the run gets its own and its pod.
	require.NoError(t, env.Client.Delete(ctx, foreign))
	tp := waitPods(t, env, ns, "taken", "taken-0-0")
	_, got = mounted(tp["taken-0-0"])
	require.Equal(t, taken.UID, got.UID)
}

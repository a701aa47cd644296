package controllers

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestBuildRunConfigMap: the run's ConfigMap carries the run's identity
// and spec for its pods, owned by the run, the same bytes for the same
// run; a run whose file exceeds what a ConfigMap holds is a problem that
// names the way out, not a pod that cannot start.
func TestBuildRunConfigMap(t *testing.T) {
	run := testRun()
	cm, p, err := buildRunConfigMap(run)
	require.NoError(t, err)
	require.Nil(t, p)
	require.Equal(t, "runledger-invoices", cm.Name)
	require.Equal(t, "billing", cm.Namespace)
	require.Equal(t, "invoices", cm.Labels[v1alpha1.LabelRun])
	ref := metav1.GetControllerOf(cm)
	require.NotNil(t, ref)
	require.Equal(t, run.UID, ref.UID)
	require.Equal(t, "ProcessingRun", ref.Kind)
	require.Empty(t, cm.Data)

	got, err := v1alpha1.DecodeRunFile(cm.BinaryData[v1alpha1.WorkerRunFile])
	require.NoError(t, err)
	require.Equal(t, run.Spec, got.Spec)
	require.Equal(t, run.UID, got.UID)
	require.Equal(t, run.Name, got.Name)

	again, _, err := buildRunConfigMap(run.DeepCopy())
	require.NoError(t, err)
	require.Equal(t, cm.BinaryData, again.BinaryData, "the same run, the same bytes: no rewrite on every pass")
	run.Spec.MaxFailedItems = 7
	changed, _, err := buildRunConfigMap(run)
	require.NoError(t, err)
	require.NotEqual(t, cm.BinaryData, changed.BinaryData, "an edited spec is written again")

	// Random text hardly compresses: 10,000 items of 400 bytes each.
	huge := testRun()
	huge.Spec.Batch = v1alpha1.BatchSpec{}
	rnd := uint64(1)
	for range 10000 {
		var b strings.Builder
		for range 400 {
			rnd = rnd*6364136223846793005 + 1442695040888963407
			b.WriteByte(byte('a' + rnd>>59))
		}
		huge.Spec.Batch.Items = append(huge.Spec.Batch.Items, v1alpha1.Item{Entity: b.String(), Occurrence: "2026-01"})
	}
	_, p, err = buildRunConfigMap(huge)
	require.NoError(t, err)
	require.NotNil(t, p)
	require.Equal(t, ReasonPodCreateFailed, p.reason)
	require.Contains(t, p.message, "more than the 1 MiB a ConfigMap runledger-invoices holds")
}

package controllers

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestBuildRunConfigMap: the run's ConfigMap carries the run's identity
// and spec for its pods, immutable, owned by the run and named by its
// file's digest, the same for the same run and another for an edited spec;
// a run whose file exceeds what a ConfigMap holds is a problem that names
// the way out, not a pod that cannot start.
func TestBuildRunConfigMap(t *testing.T) {
	run := testRun()
	cm, rf, p, err := buildRunConfigMap(run)
	require.NoError(t, err)
	require.Nil(t, p)
	file := cm.BinaryData[v1alpha1.WorkerRunFile]
	require.Equal(t, v1alpha1.RunFileDigest(file), rf.digest)
	require.Equal(t, "runledger-invoices-"+rf.digest[:10], cm.Name)
	require.Equal(t, cm.Name, rf.configMap)
	require.Equal(t, "billing", cm.Namespace)
	require.True(t, *cm.Immutable, "nobody edits a file a pod may still mount")
	require.Equal(t, "invoices", cm.Labels[v1alpha1.LabelRun])
	ref := metav1.GetControllerOf(cm)
	require.NotNil(t, ref)
	require.Equal(t, run.UID, ref.UID)
	require.Equal(t, "ProcessingRun", ref.Kind)
	require.Empty(t, cm.Data)

	got, err := v1alpha1.DecodeRunFile(file)
	require.NoError(t, err)
	require.Equal(t, run.Spec, got.Spec)
	require.Equal(t, run.UID, got.UID)
	require.Equal(t, run.Name, got.Name)

	again, rf2, _, err := buildRunConfigMap(run.DeepCopy())
	require.NoError(t, err)
	require.Equal(t, cm, again, "the same run, the same ConfigMap")
	require.Equal(t, rf, rf2)
	run.Spec.MaxFailedItems = 7
	changed, rf3, _, err := buildRunConfigMap(run)
	require.NoError(t, err)
	require.NotEqual(t, rf.digest, rf3.digest, "an edited spec is another file")
	require.NotEqual(t, cm.Name, changed.Name)
	other := testRun()
	other.UID = "uid-2"
	_, rf4, _, err := buildRunConfigMap(other)
	require.NoError(t, err)
	require.NotEqual(t, rf.configMap, rf4.configMap, "a run created again under the name has its own")

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
	_, _, p, err = buildRunConfigMap(huge)
	require.NoError(t, err)
	require.NotNil(t, p)
	require.Equal(t, ReasonPodCreateFailed, p.reason)
	require.Contains(t, p.message, "bytes compressed, more than the 1 MiB a ConfigMap holds")
}

// TestWithRunFile: the worker container alone mounts the run's file, from
// its ConfigMap, which must exist, and learns its digest; the processor
// sidecar sees none of it.
func TestWithRunFile(t *testing.T) {
	run := testRun()
	run.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{Image: "registry.example/mailer:1"}}
	rf := runFile{configMap: "runledger-invoices-0123456789", digest: "0123456789abcdef"}
	pod, err := buildWorkerPod(run, workerPodParams{runFile: rf}, PodOptions{Image: "registry.example/runledger:v1"})
	require.NoError(t, err)

	c := pod.Spec.Containers[0]
	env := envMap(t, c)
	require.Equal(t, "/var/run/runledger/run/run.json.gz", env[v1alpha1.EnvRunFile].Value)
	require.Equal(t, "0123456789abcdef", env[v1alpha1.EnvRunDigest].Value)
	require.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.WorkerRunVolume, MountPath: "/var/run/runledger/run", ReadOnly: true})
	v := pod.Spec.Volumes[len(pod.Spec.Volumes)-1]
	require.Equal(t, v1alpha1.WorkerRunVolume, v.Name)
	require.Equal(t, "runledger-invoices-0123456789", v.ConfigMap.Name)
	require.Equal(t, []corev1.KeyToPath{{Key: v1alpha1.WorkerRunFile, Path: v1alpha1.WorkerRunFile}}, v.ConfigMap.Items)
	require.False(t, *v.ConfigMap.Optional, "a pod waits for its run's ConfigMap rather than start without it")
	for _, m := range pod.Spec.InitContainers[0].VolumeMounts {
		require.NotEqual(t, v1alpha1.WorkerRunVolume, m.Name, "the processor does not see the run's file")
	}
	for _, e := range pod.Spec.InitContainers[0].Env {
		require.NotEqual(t, v1alpha1.EnvRunDigest, e.Name)
	}
}

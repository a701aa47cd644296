package controllers

import (
	"bytes"
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create

// maxRunFileConfigMapBytes is what a ConfigMap's data may hold (the API
// server's limit, data and binaryData together).
const maxRunFileConfigMapBytes = 1 << 20

// runFile names the run's file the pods of a pass mount: its ConfigMap and
// its digest (the pods' EnvRunDigest).
type runFile struct {
	configMap, digest string
}

// buildRunConfigMap is the immutable ConfigMap that carries a run's file
// (v1alpha1.EncodeRunFile) to its pods, owned by the run and named by the
// file's digest. It is a pure function of the run; a run whose file does not
// fit a ConfigMap is a problem (no pod can start).
func buildRunConfigMap(run *v1alpha1.ProcessingRun) (*corev1.ConfigMap, runFile, *problem, error) {
	b, err := v1alpha1.EncodeRunFile(run)
	if err != nil {
		return nil, runFile{}, nil, err
	}
	rf := runFile{digest: v1alpha1.RunFileDigest(b)}
	rf.configMap = v1alpha1.RunConfigMapName(run.Name, rf.digest)
	if len(b) > maxRunFileConfigMapBytes {
		return nil, rf, &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf(
			"the run's spec is %d bytes compressed, more than the 1 MiB a ConfigMap holds for its pods: split its batch (a query or a configMapRef batch instead of inline items)",
			len(b))}, nil
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      rf.configMap,
			Namespace: run.Namespace,
			Labels: map[string]string{
				labelAppName: "runledger", labelAppComponent: "worker", labelAppInstance: run.Name,
				labelAppManagedBy: "runledger-controller", v1alpha1.LabelRun: run.Name,
			},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(run, v1alpha1.GroupVersion.WithKind("ProcessingRun")),
			},
		},
		Immutable:  ptr.To(true),
		BinaryData: map[string][]byte{v1alpha1.WorkerRunFile: b},
	}, rf, nil, nil
}

// withRunFile mounts the run's file into the worker container of a pod
// (buildWorkerPod) and tells the worker its digest. The volume is required:
// a pod whose ConfigMap is missing waits for it instead of starting
// without its run.
func withRunFile(pod *corev1.Pod, rf runFile) {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: v1alpha1.WorkerRunVolume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: rf.configMap},
			Items:                []corev1.KeyToPath{{Key: v1alpha1.WorkerRunFile, Path: v1alpha1.WorkerRunFile}},
			DefaultMode:          ptr.To[int32](0o444),
			Optional:             ptr.To(false),
		},
	}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.WorkerRunVolume, MountPath: v1alpha1.WorkerRunPath, ReadOnly: true})
	c.Env = append(c.Env,
		corev1.EnvVar{Name: v1alpha1.EnvRunFile, Value: v1alpha1.WorkerRunPath + "/" + v1alpha1.WorkerRunFile},
		corev1.EnvVar{Name: v1alpha1.EnvRunDigest, Value: rf.digest})
}

// ensureRunConfigMap writes the ConfigMap of the run's current file unless
// it exists. It returns a problem when the name is taken by another object
// or another file (not this run's: a pod would refuse it) or the run does
// not fit: no pod of the run starts without its own run. The ConfigMaps of
// files before an edit of the spec stay until the run goes (owned by it):
// pods created before the edit mount them.
func (r *Reconciler) ensureRunConfigMap(ctx context.Context, run *v1alpha1.ProcessingRun) (runFile, *problem, error) {
	cm, rf, p, err := buildRunConfigMap(run)
	if p != nil || err != nil {
		return rf, p, err
	}
	err = r.Client.Create(ctx, cm)
	switch {
	case err == nil:
		return rf, nil, nil
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) || apierrors.IsRequestEntityTooLargeError(err):
		return rf, &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf("cannot create ConfigMap %s, the run's spec for its pods: %v", cm.Name, err)}, nil
	case !apierrors.IsAlreadyExists(err):
		return rf, nil, fmt.Errorf("create ConfigMap %s: %w", cm.Name, err)
	}
	var have corev1.ConfigMap
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cm), &have); err != nil {
		return rf, nil, fmt.Errorf("read ConfigMap %s: %w", cm.Name, err)
	}
	ref := metav1.GetControllerOf(&have)
	if ref == nil || ref.UID != run.UID || !bytes.Equal(have.BinaryData[v1alpha1.WorkerRunFile], cm.BinaryData[v1alpha1.WorkerRunFile]) {
		return rf, &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf(
			"ConfigMap %s exists and is not this run's file: no worker pod starts until it is gone", cm.Name)}, nil
	}
	return rf, nil, nil
}

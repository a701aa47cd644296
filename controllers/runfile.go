package controllers

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update

// maxRunFileConfigMapBytes is what a ConfigMap's data may hold (the API
// server's limit, data and binaryData together).
const maxRunFileConfigMapBytes = 1 << 20

// buildRunConfigMap is the ConfigMap that carries a run's file
// (v1alpha1.EncodeRunFile) to its pods, owned by the run. It is a pure
// function of the run; a run whose file does not fit a ConfigMap is a
// problem (no pod can start).
func buildRunConfigMap(run *v1alpha1.ProcessingRun) (*corev1.ConfigMap, *problem, error) {
	b, err := v1alpha1.EncodeRunFile(run)
	if err != nil {
		return nil, nil, err
	}
	if len(b) > maxRunFileConfigMapBytes {
		return nil, &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf(
			"the run's spec is %d bytes compressed, more than the 1 MiB a ConfigMap %s holds for its pods: split its batch (a query or a configMapRef batch instead of inline items)",
			len(b), v1alpha1.RunConfigMapName(run.Name))}, nil
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      v1alpha1.RunConfigMapName(run.Name),
			Namespace: run.Namespace,
			Labels: map[string]string{
				labelAppName: "runledger", labelAppComponent: "worker", labelAppInstance: run.Name,
				labelAppManagedBy: "runledger-controller", v1alpha1.LabelRun: run.Name,
			},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(run, v1alpha1.GroupVersion.WithKind("ProcessingRun")),
			},
		},
		BinaryData: map[string][]byte{v1alpha1.WorkerRunFile: b},
	}, nil, nil
}

// runVolume mounts the run's ConfigMap: required, so a pod whose ConfigMap
// is missing waits for it (the controller writes it again before creating
// pods) instead of starting without its run.
func runVolume(run *v1alpha1.ProcessingRun) corev1.Volume {
	return corev1.Volume{Name: v1alpha1.WorkerRunVolume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.RunConfigMapName(run.Name)},
			Items:                []corev1.KeyToPath{{Key: v1alpha1.WorkerRunFile, Path: v1alpha1.WorkerRunFile}},
			DefaultMode:          ptr.To[int32](0o444),
			Optional:             ptr.To(false),
		},
	}}
}

// ensureRunConfigMap writes the run's ConfigMap unless it already holds the
// run's current file, taking over one an earlier run of the same name left
// behind. It returns a problem when the name is taken by another object
// (not a run's) or the run does not fit: no pod of the run starts without
// its own run.
func (r *Reconciler) ensureRunConfigMap(ctx context.Context, run *v1alpha1.ProcessingRun) (*problem, error) {
	cm, p, err := buildRunConfigMap(run)
	if p != nil || err != nil {
		return p, err
	}
	refused := func(err error) *problem {
		return &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf("cannot write ConfigMap %s, the run's spec for its pods: %v", cm.Name, err)}
	}
	err = r.Client.Create(ctx, cm)
	switch {
	case err == nil:
		return nil, nil
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) || apierrors.IsRequestEntityTooLargeError(err):
		return refused(err), nil
	case !apierrors.IsAlreadyExists(err):
		return nil, fmt.Errorf("create ConfigMap %s: %w", cm.Name, err)
	}
	var have corev1.ConfigMap
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cm), &have); err != nil {
		return nil, fmt.Errorf("read ConfigMap %s: %w", cm.Name, err)
	}
	ref := metav1.GetControllerOf(&have)
	switch {
	case ref == nil || ref.Kind != "ProcessingRun" || ref.Name != run.Name || !strings.HasPrefix(ref.APIVersion, v1alpha1.Group+"/"):
		return &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf(
			"ConfigMap %s exists and is not this run's: no worker pod starts until it is gone", cm.Name)}, nil
	case ref.UID != run.UID:
		// An earlier run of this name, deleted (names are unique), whose
		// ConfigMap the garbage collector has not removed yet: taken over
		// (the collector checks the owners again before it deletes).
		have.OwnerReferences, have.Labels = cm.OwnerReferences, cm.Labels
	case bytes.Equal(have.BinaryData[v1alpha1.WorkerRunFile], cm.BinaryData[v1alpha1.WorkerRunFile]) && len(have.Data) == 0:
		return nil, nil
	}
	// A new owner, or the spec changed since (a mutable field): new pods
	// read the new one.
	have.BinaryData = cm.BinaryData
	have.Data = nil
	err = r.Client.Update(ctx, &have)
	switch {
	case err == nil:
		return nil, nil
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsRequestEntityTooLargeError(err):
		return refused(err), nil
	}
	return nil, fmt.Errorf("update ConfigMap %s: %w", cm.Name, err)
}

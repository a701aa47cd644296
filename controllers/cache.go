package controllers

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CacheOptions are the manager's cache settings for this controller: only
// worker pods (those with the run-uid label) are cached, not every pod of
// the cluster, of each only what the controller reads (workerPodTransform),
// and managed fields are dropped from cached objects. Given
// namespaces, the cache (so the controller) sees only those: the manager
// then needs Roles in them, no ClusterRole (config/namespaced).
func CacheOptions(namespaces ...string) cache.Options {
	workerPods, err := labels.NewRequirement(labelRunUIDKey, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant requirement
	}
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.NewSelector().Add(*workerPods), Transform: workerPodTransform},
		},
	}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = make(map[string]cache.Config, len(namespaces))
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return opts
}

// workerPodTransform keeps of a cached worker pod what the controller reads
// (its metadata, node, phase, conditions and containers' states; never its
// spec's containers, volumes or placement, which it wrote itself) and drops
// its managed fields: a finished run's pods stay cached for as long as the
// run exists, and their specs were most of the cache of a manager with
// thousands of runs. The controller never writes a pod it read (it deletes
// them with a UID precondition), so nothing is written back from the copy.
func workerPodTransform(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a deleted object's tombstone: as it is
	}
	out := &corev1.Pod{TypeMeta: pod.TypeMeta, ObjectMeta: pod.ObjectMeta}
	out.ManagedFields = nil
	out.Spec.NodeName = pod.Spec.NodeName
	out.Status = corev1.PodStatus{
		Phase: pod.Status.Phase, Reason: pod.Status.Reason, Message: pod.Status.Message,
		Conditions: pod.Status.Conditions, ContainerStatuses: pod.Status.ContainerStatuses,
		InitContainerStatuses: pod.Status.InitContainerStatuses,
	}
	return out, nil
}

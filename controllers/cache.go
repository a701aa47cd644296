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
// the cluster, and managed fields are dropped from cached objects.
func CacheOptions() cache.Options {
	workerPods, err := labels.NewRequirement(labelRunUIDKey, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant requirement
	}
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.NewSelector().Add(*workerPods)},
		},
	}
}

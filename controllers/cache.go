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
// the cluster, and managed fields are dropped from cached objects. Given
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
			&corev1.Pod{}: {Label: labels.NewSelector().Add(*workerPods)},
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

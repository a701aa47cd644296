// Package kueuerbac holds the markers of the manager's Kueue permissions
// (make manifests turns them into config/kueue/role.yaml, the ClusterRole
// runledger-manager-kueue): they are granted only where the integration is
// turned on (config/kueue, the manager's --kueue), so the manager's own
// ClusterRole does not grow. What each is for: create and watch each run's
// Workload, update it (spec.active, its LocalQueue, Kueue's finalizer),
// delete it with its run, patch its status (an eviction's admission given
// back, Finished); read the admitted ResourceFlavors (node labels,
// tolerations) and the WorkloadPriorityClass a run names.
//
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=workloads,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=workloads/status,verbs=get;patch
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=resourceflavors,verbs=get
// +kubebuilder:rbac:groups=kueue.x-k8s.io,resources=workloadpriorityclasses,verbs=get
package kueuerbac

package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// The Kueue integration against a real apiserver with Kueue's CRDs (from the
// module go.mod pins). There is no Kueue controller here: the tests play its
// part by writing the Workload's status as Kueue's scheduler does (quota
// reserved and admitted, evicted, admitted again).

// kueueManager runs the manager with the integration on, as the manager's
// ServiceAccount with only its two generated ClusterRoles' rules
// (config/rbac/role.yaml and config/kueue/role.yaml): they are all the
// integration needs, and the first has no Kueue rule of its own.
func kueueManager(t *testing.T, env *envtestutil.Env, ns string) *testManager {
	t.Helper()
	var rules []rbacv1.PolicyRule
	for _, file := range []string{"config/rbac/role.yaml", "config/kueue/role.yaml"} {
		b, err := os.ReadFile(filepath.Join(envtestutil.RepoRoot(), file))
		require.NoError(t, err)
		var role rbacv1.ClusterRole
		require.NoError(t, yaml.Unmarshal(b, &role))
		for _, rule := range role.Rules {
			if file == "config/rbac/role.yaml" {
				require.NotContains(t, rule.APIGroups, kueue.GroupVersion.Group, "the manager's own ClusterRole does not grow")
			}
		}
		rules = append(rules, role.Rules...)
	}
	user := "system:serviceaccount:" + ns + ":runledger-manager"
	bindClusterRole(t, env, ns, user, rules)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return startManager(t, env, ns, managerConfig{kueue: true, restConfig: cfg})
}

func queuedRun(ns, name string, workers int32, nItems int, queue string) *v1alpha1.ProcessingRun {
	run := newRun(ns, name, workers, nItems)
	run.Labels = map[string]string{LabelQueueName: queue}
	return run
}

// createFlavor creates a ResourceFlavor for one test (they are cluster-wide).
func createFlavor(t *testing.T, env *envtestutil.Env, name string, spec kueue.ResourceFlavorSpec) *kueue.ResourceFlavor {
	t.Helper()
	f := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	require.NoError(t, env.Client.Create(context.Background(), f))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), f) })
	return f
}

// waitWorkload waits for the run's Workload and checks it is the run's.
func waitWorkload(t *testing.T, env *envtestutil.Env, run *v1alpha1.ProcessingRun, what string, check func(*kueue.Workload) error) *kueue.Workload {
	t.Helper()
	run = getRun(t, env, run.Namespace, run.Name)
	wl := &kueue.Workload{}
	waitFor(t, "workload: "+what, func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: run.Namespace, Name: WorkloadName(run)}, wl); err != nil {
			return err
		}
		if !metav1.IsControlledBy(wl, run) {
			return fmt.Errorf("workload %s not controlled by the run", wl.Name)
		}
		if check != nil {
			return check(wl)
		}
		return nil
	})
	return wl
}

// admitWorkload writes what Kueue's scheduler writes on admission: the
// quota reserved in cq with flavor for every resource, Admitted, and an
// earlier eviction over.
func admitWorkload(t *testing.T, env *envtestutil.Env, wl *kueue.Workload, cq, flavor string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(wl), wl))
	patch := client.MergeFrom(wl.DeepCopy())
	now := metav1.Now()
	wl.Status.Admission = &kueue.Admission{
		ClusterQueue: kueue.ClusterQueueReference(cq),
		PodSetAssignments: []kueue.PodSetAssignment{{
			Name:    workloadPodSet,
			Flavors: map[corev1.ResourceName]kueue.ResourceFlavorReference{corev1.ResourceCPU: kueue.ResourceFlavorReference(flavor), corev1.ResourceMemory: kueue.ResourceFlavorReference(flavor)},
			Count:   ptr.To(wl.Spec.PodSets[0].Count),
		}},
	}
	set := func(typ string, s metav1.ConditionStatus, reason string) {
		meta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: reason, LastTransitionTime: now})
	}
	set(kueue.WorkloadQuotaReserved, metav1.ConditionTrue, "QuotaReserved")
	set(kueue.WorkloadAdmitted, metav1.ConditionTrue, "Admitted")
	if meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted) != nil {
		set(kueue.WorkloadEvicted, metav1.ConditionFalse, "QuotaReserved")
	}
	require.NoError(t, env.Client.Status().Patch(ctx, wl, patch))
	// Kueue's finalizer, added with the reservation.
	// A merge patch, not an update of the version read: the manager writes
	// the Workload meanwhile.
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(wl), wl))
	fpatch := client.MergeFrom(wl.DeepCopy())
	if controllerutil.AddFinalizer(wl, kueue.ResourceInUseFinalizerName) {
		require.NoError(t, env.Client.Patch(ctx, wl, fpatch))
	}
}

// evictWorkload writes what Kueue writes when it preempts a Workload:
// Evicted (reason Preempted); the reservation stays until the integration
// says the pods are gone.
func evictWorkload(t *testing.T, env *envtestutil.Env, wl *kueue.Workload) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(wl), wl))
	patch := client.MergeFrom(wl.DeepCopy())
	meta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue,
		Reason: kueue.WorkloadEvictedByPreemption, Message: "Preempted to accommodate a workload of higher priority", LastTransitionTime: metav1.Now()})
	require.NoError(t, env.Client.Status().Patch(ctx, wl, patch))
}

func wlCondition(typ string, s metav1.ConditionStatus) func(*kueue.Workload) error {
	return func(wl *kueue.Workload) error {
		c := meta.FindStatusCondition(wl.Status.Conditions, typ)
		if c == nil || c.Status != s {
			return fmt.Errorf("condition %s is %v, want %s", typ, c, s)
		}
		return nil
	}
}

func admittedReason(reason string) func(*v1alpha1.ProcessingRun) error {
	s := metav1.ConditionFalse
	if reason == ReasonAdmitted {
		s = metav1.ConditionTrue
	}
	return conditionIs(v1alpha1.ConditionAdmitted, s, reason)
}

// A run that names a queue, applied without suspend, gets a Workload (one
// pod set: count = shards, the worker pod's template with the processor
// sidecar's requests) and no pod until Kueue admits it; it shows Suspended,
// Admitted False (Queued).
func TestKueueRunWaitsForAdmission(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	kueueManager(t, env, ns)
	livePodGuard(t, env, ns)
	spec := queuedRun(ns, "queued", 3, 6, "team-a")
	spec.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{Image: "registry.example/mailer:1",
		Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}}}}
	spec.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{Resources: &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}}
	run := create(t, env, spec)

	wl := waitWorkload(t, env, run, "created", nil)
	require.Equal(t, kueue.LocalQueueName("team-a"), wl.Spec.QueueName)
	require.True(t, ptr.Deref(wl.Spec.Active, false))
	require.Len(t, wl.Spec.PodSets, 1)
	ps := wl.Spec.PodSets[0]
	require.Equal(t, kueue.PodSetReference(workloadPodSet), ps.Name)
	require.Equal(t, int32(3), ps.Count)
	require.Len(t, ps.Template.Spec.Containers, 1)
	require.Equal(t, "500m", ps.Template.Spec.Containers[0].Resources.Requests.Cpu().String())
	require.Len(t, ps.Template.Spec.InitContainers, 1, "the processor sidecar")
	side := ps.Template.Spec.InitContainers[0]
	require.Equal(t, v1alpha1.ProcessorContainerName, side.Name)
	require.Equal(t, corev1.ContainerRestartPolicyAlways, *side.RestartPolicy)
	require.Equal(t, "250m", side.Resources.Requests.Cpu().String())
	require.Equal(t, string(run.UID), wl.Labels[labelJobUID])

	stillPods(t, env, ns, "queued", time.Second)
	r := waitRun(t, env, ns, "queued", "held", all(
		phaseIs(v1alpha1.RunSuspended),
		admittedReason(ReasonQueued),
		conditionIs(v1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonQueued),
	))
	require.Equal(t, &v1alpha1.QueueStatus{Workload: wl.Name}, r.Status.Queue)
	require.False(t, r.Spec.Suspend, "the hold is the controller's, not a change of the user's spec")
	waitEvent(t, env, ns, "queued", corev1.EventTypeNormal, ReasonQueued, "LocalQueue \"team-a\"")
	cols := printerColumns(t, env, ns, "queued")
	require.Equal(t, ReasonQueued, cols["Admission"])
	require.Equal(t, "Suspended", cols["Phase"])

	// The user suspends it: the Workload is deactivated (its quota given
	// back), and active again on resume.
	setSuspend(t, env, ns, "queued", true)
	waitWorkload(t, env, run, "inactive", func(wl *kueue.Workload) error {
		if ptr.Deref(wl.Spec.Active, true) {
			return fmt.Errorf("still active")
		}
		return nil
	})
	setSuspend(t, env, ns, "queued", false)
	waitWorkload(t, env, run, "active", func(wl *kueue.Workload) error {
		if !ptr.Deref(wl.Spec.Active, false) {
			return fmt.Errorf("not active")
		}
		return nil
	})
	stillPods(t, env, ns, "queued", 500*time.Millisecond)

	// A run without the label behaves as today: pods at once, no Workload.
	create(t, env, newRun(ns, "plain", 1, 1))
	waitPods(t, env, ns, "plain", "plain-0-0")
	var wls kueue.WorkloadList
	require.NoError(t, env.Client.List(context.Background(), &wls, client.InNamespace(ns)))
	require.Len(t, wls.Items, 1, "only the queued run's")
	plain := waitRun(t, env, ns, "plain", "running", phaseIs(v1alpha1.RunRunning))
	require.Nil(t, plain.Status.Queue)
	require.Nil(t, condition(plain, v1alpha1.ConditionAdmitted))
}

// Admission starts the pods with the flavor's node labels and tolerations;
// an eviction (preemption) stops them and keeps the shards' progress, and
// once they are gone the Workload's quota is given back (Requeued); a new
// admission resumes the run from where its shards were, and the finished
// run finishes its Workload and drops Kueue's finalizer.
func TestKueueAdmissionEvictionReadmission(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	flavor := createFlavor(t, env, ns+"-spot", kueue.ResourceFlavorSpec{
		NodeLabels:  map[string]string{"node.example/pool": "spot"},
		Tolerations: []corev1.Toleration{{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
	})
	kueueManager(t, env, ns)
	livePodGuard(t, env, ns)
	run := create(t, env, queuedRun(ns, "preemptible", 2, 7, "team-a"))
	wl := waitWorkload(t, env, run, "created", nil)
	stillPods(t, env, ns, "preemptible", 500*time.Millisecond)

	admitWorkload(t, env, wl, "cluster-a", flavor.Name)
	pods := waitPods(t, env, ns, "preemptible", "preemptible-0-0", "preemptible-1-0")
	for _, p := range pods {
		require.Equal(t, "spot", p.Spec.NodeSelector["node.example/pool"], p.Name)
		require.Contains(t, p.Spec.Tolerations, flavor.Spec.Tolerations[0], p.Name)
	}
	r := waitRun(t, env, ns, "preemptible", "admitted", all(admittedReason(ReasonAdmitted),
		conditionIs(v1alpha1.ConditionSuspended, metav1.ConditionFalse, ReasonResumed)))
	require.Equal(t, "cluster-a", r.Status.Queue.ClusterQueue)
	require.Contains(t, condition(r, v1alpha1.ConditionAdmitted).Message, `ClusterQueue "cluster-a"`)
	waitEvent(t, env, ns, "preemptible", corev1.EventTypeNormal, ReasonAdmitted, `ClusterQueue "cluster-a"`)

	setPod(t, env, ns, "preemptible-0-0", corev1.PodRunning, 0, nil)
	workerReport(t, env, run, 0, 0, v1alpha1.ItemCounts{Total: 4, Completed: 2}, "")
	setPod(t, env, ns, "preemptible-1-0", corev1.PodSucceeded, 0, shardReport(1, 0, v1alpha1.ItemCounts{Total: 3, Completed: 3}, ""))
	waitRun(t, env, ns, "preemptible", "progress", countsAre(v1alpha1.ItemCounts{Total: 7, Completed: 5}))

	evictWorkload(t, env, wl)
	// Unscheduled pods are deleted at once (there is no kubelet here).
	waitPods(t, env, ns, "preemptible", "preemptible-1-0")
	r = waitRun(t, env, ns, "preemptible", "evicted", all(
		phaseIs(v1alpha1.RunSuspended),
		admittedReason(ReasonEvicted),
		conditionIs(v1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonEvicted),
		countsAre(v1alpha1.ItemCounts{Total: 7, Completed: 5}),
	))
	require.Equal(t, "", r.Status.Queue.ClusterQueue)
	require.Equal(t, v1alpha1.ShardSucceeded, shardEntry(r, 1).Phase)
	waitEvent(t, env, ns, "preemptible", corev1.EventTypeWarning, ReasonEvicted, "Preempted")
	wl = waitWorkload(t, env, run, "quota given back", all2(
		wlCondition(kueue.WorkloadQuotaReserved, metav1.ConditionFalse),
		wlCondition(kueue.WorkloadAdmitted, metav1.ConditionFalse),
		wlCondition(kueue.WorkloadRequeued, metav1.ConditionTrue),
		func(wl *kueue.Workload) error {
			if wl.Status.Admission != nil {
				return fmt.Errorf("admission still set")
			}
			return nil
		}))
	stillPods(t, env, ns, "preemptible", 700*time.Millisecond, "preemptible-1-0")

	admitWorkload(t, env, wl, "cluster-b", flavor.Name)
	pods = waitPods(t, env, ns, "preemptible", "preemptible-0-1", "preemptible-1-0")
	require.Equal(t, v1alpha1.ItemCounts{Total: 4, Completed: 2}, parseFloor(pods["preemptible-0-1"].Annotations), "the shard resumes from its progress")
	require.Equal(t, "spot", pods["preemptible-0-1"].Spec.NodeSelector["node.example/pool"])
	r = waitRun(t, env, ns, "preemptible", "admitted again", all(admittedReason(ReasonAdmitted), phaseIs(v1alpha1.RunRunning)))
	require.Equal(t, "cluster-b", r.Status.Queue.ClusterQueue)

	setPod(t, env, ns, "preemptible-0-1", corev1.PodSucceeded, 0, shardReport(0, 1, v1alpha1.ItemCounts{Total: 4, Completed: 4}, ""))
	waitRun(t, env, ns, "preemptible", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded),
		countsAre(v1alpha1.ItemCounts{Total: 7, Completed: 7})))
	waitWorkload(t, env, run, "finished", all2(wlCondition(kueue.WorkloadFinished, metav1.ConditionTrue),
		func(wl *kueue.Workload) error {
			if controllerutil.ContainsFinalizer(wl, kueue.ResourceInUseFinalizerName) {
				return fmt.Errorf("finalizer still there")
			}
			return nil
		}))
}

// all2 is all for Workloads.
func all2(checks ...func(*kueue.Workload) error) func(*kueue.Workload) error {
	return func(wl *kueue.Workload) error {
		for _, c := range checks {
			if err := c(wl); err != nil {
				return err
			}
		}
		return nil
	}
}

// Deleting a queued run deletes its Workload, Kueue's finalizer dropped
// (there is no garbage collector in envtest: the controller does it, as
// Kueue's integrations do).
func TestKueueDeletedRunCleansUpItsWorkload(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	kueueManager(t, env, ns)
	flavor := createFlavor(t, env, ns+"-default", kueue.ResourceFlavorSpec{})
	run := create(t, env, queuedRun(ns, "short-lived", 1, 1, "team-a"))
	wl := waitWorkload(t, env, run, "created", nil)
	admitWorkload(t, env, wl, "cluster-a", flavor.Name)
	waitPods(t, env, ns, "short-lived", "short-lived-0-0")
	require.NoError(t, env.Client.Delete(context.Background(), run))
	waitFor(t, "workload gone", func() error {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(wl), &kueue.Workload{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %w", err)
	})
}

// spec.managedBy naming MultiKueue: the manager creates no pod and writes no
// status for the run, but keeps its Workload (which MultiKueue dispatches)
// and finishes it when the status MultiKueue copies back says the run is
// finished. The field is immutable.
func TestKueueManagedByMultiKueue(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	kueueManager(t, env, ns)
	spec := queuedRun(ns, "dispatched", 2, 4, "team-a")
	spec.Spec.ManagedBy = ptr.To(kueue.MultiKueueControllerName)
	run := create(t, env, spec)
	wl := waitWorkload(t, env, run, "created", nil)
	require.Equal(t, int32(2), wl.Spec.PodSets[0].Count)
	admitWorkload(t, env, wl, "multikueue", "none")
	stillPods(t, env, ns, "dispatched", time.Second)
	got := getRun(t, env, ns, "dispatched")
	require.Empty(t, got.Status.Phase, "no status from this manager")
	require.Empty(t, got.Status.Conditions)

	got.Spec.ManagedBy = ptr.To(v1alpha1.ManagedByController)
	err := env.Client.Update(ctx, got)
	require.True(t, apierrors.IsInvalid(err), "%v", err)
	require.Contains(t, err.Error(), "managedBy is immutable")
	got = getRun(t, env, ns, "dispatched")
	got.Spec.ManagedBy = nil
	require.True(t, apierrors.IsInvalid(env.Client.Update(ctx, got)))

	// The worker cluster's status, copied back by MultiKueue.
	got = getRun(t, env, ns, "dispatched")
	patch := client.MergeFrom(got.DeepCopy())
	got.Status.Phase = v1alpha1.RunSucceeded
	got.Status.ItemCounts = v1alpha1.ItemCounts{Total: 4, Completed: 4}
	got.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionComplete, Status: metav1.ConditionTrue, Reason: ReasonSucceeded,
		Message: "4 items: 4 completed", LastTransitionTime: metav1.Now()}}
	require.NoError(t, env.Client.Status().Patch(ctx, got, patch))
	waitWorkload(t, env, run, "finished", wlCondition(kueue.WorkloadFinished, metav1.ConditionTrue))
	stillPods(t, env, ns, "dispatched", 300*time.Millisecond)
	got = getRun(t, env, ns, "dispatched")
	require.Equal(t, v1alpha1.ItemCounts{Total: 4, Completed: 4}, got.Status.ItemCounts, "the copied status is left as it is")

	// A managedBy of our own controller is ours: pods after admission.
	own := queuedRun(ns, "own", 1, 1, "team-a")
	own.Spec.ManagedBy = ptr.To(v1alpha1.ManagedByController)
	create(t, env, own)
	flavor := createFlavor(t, env, ns+"-default", kueue.ResourceFlavorSpec{})
	owl := waitWorkload(t, env, own, "created", nil)
	admitWorkload(t, env, owl, "cluster-a", flavor.Name)
	waitPods(t, env, ns, "own", "own-0-0")
}

// Bad input a person must fix: a priority-class label naming no
// WorkloadPriorityClass holds the run without a Workload (a Warning says
// why) until the class exists; an admitted flavor whose node label
// contradicts the run's own nodeSelector stalls it (PlacementConflict)
// with no pod created.
func TestKueueBadInputs(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	kueueManager(t, env, ns)
	prioName := ns + "-urgent"
	spec := queuedRun(ns, "prioritized", 1, 1, "team-a")
	spec.Labels[LabelPriorityClass] = prioName
	run := create(t, env, spec)
	r := waitRun(t, env, ns, "prioritized", "held without a Workload", all(phaseIs(v1alpha1.RunSuspended),
		admittedReason(ReasonPriorityClassNotFound),
		conditionIs(v1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonPriorityClassNotFound)))
	require.Contains(t, condition(r, v1alpha1.ConditionAdmitted).Message, fmt.Sprintf("WorkloadPriorityClass %q", prioName))
	waitEvent(t, env, ns, "prioritized", corev1.EventTypeWarning, ReasonPriorityClassNotFound, prioName)
	var wls kueue.WorkloadList
	require.NoError(t, env.Client.List(ctx, &wls, client.InNamespace(ns)))
	require.Empty(t, wls.Items)
	stillPods(t, env, ns, "prioritized", 300*time.Millisecond)

	prio := &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: prioName}, Value: 1000}
	require.NoError(t, env.Client.Create(ctx, prio))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), prio) })
	wl := waitWorkload(t, env, run, "created once the class exists", nil)
	require.Equal(t, int32(1000), ptr.Deref(wl.Spec.Priority, 0))
	require.Equal(t, prioName, wl.Spec.PriorityClassRef.Name)
	waitRun(t, env, ns, "prioritized", "queued", admittedReason(ReasonQueued))

	flavor := createFlavor(t, env, ns+"-zone-b", kueue.ResourceFlavorSpec{NodeLabels: map[string]string{"zone": "b"}})
	pinned := queuedRun(ns, "pinned", 1, 1, "team-a")
	pinned.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{NodeSelector: map[string]string{"zone": "a"}}
	create(t, env, pinned)
	pwl := waitWorkload(t, env, pinned, "created", nil)
	admitWorkload(t, env, pwl, "cluster-a", flavor.Name)
	r = waitRun(t, env, ns, "pinned", "stalled", conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonPlacementConflict))
	require.Contains(t, condition(r, v1alpha1.ConditionStalled).Message, "the run's workerTemplate.nodeSelector says zone=a")
	stillPods(t, env, ns, "pinned", 500*time.Millisecond)
}

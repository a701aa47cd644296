package controllers

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
)

func testWorkload(conds ...metav1.Condition) *kueue.Workload {
	wl := &kueue.Workload{Spec: kueue.WorkloadSpec{QueueName: "team-a", Active: ptr.To(true)}}
	for _, c := range conds {
		meta.SetStatusCondition(&wl.Status.Conditions, c)
	}
	return wl
}

// withPods gives the Workload its pod set of worker pods.
func withPods(wl *kueue.Workload, n int32) *kueue.Workload {
	wl.Spec.PodSets = []kueue.PodSet{{Name: workloadPodSet, Count: n}}
	return wl
}

func wlCond(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: reason + " message"}
}

func TestDecideQueue(t *testing.T) {
	t.Parallel()
	run := queuedRun("ns", "r", 2, 2, "team-a")
	suspended := run.DeepCopy()
	suspended.Spec.Suspend = true
	moved := run.DeepCopy()
	moved.Labels[LabelQueueName] = "team-b"
	admitted := func() *kueue.Workload {
		wl := testWorkload(wlCond(kueue.WorkloadQuotaReserved, metav1.ConditionTrue, "QuotaReserved"),
			wlCond(kueue.WorkloadAdmitted, metav1.ConditionTrue, "Admitted"))
		wl.Status.Admission = &kueue.Admission{ClusterQueue: "cq"}
		return wl
	}
	evicted := func() *kueue.Workload {
		wl := admitted()
		meta.SetStatusCondition(&wl.Status.Conditions, wlCond(kueue.WorkloadEvicted, metav1.ConditionTrue, "Preempted"))
		return wl
	}
	withFinalizer := func(wl *kueue.Workload) *kueue.Workload {
		wl.Finalizers = []string{kueue.ResourceInUseFinalizerName}
		return wl
	}
	deleting := withFinalizer(admitted())
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	finishedElsewhere := withFinalizer(admitted())
	meta.SetStatusCondition(&finishedElsewhere.Status.Conditions, wlCond(kueue.WorkloadFinished, metav1.ConditionTrue, "Succeeded"))

	tests := []struct {
		name string
		in   queueInput
		want queueDecision
	}{
		{"no workload: create it, held", queueInput{run: run},
			queueDecision{held: true, create: true, reason: ReasonQueued}},
		{"no workload, finished: nothing", queueInput{run: run, finished: true},
			queueDecision{reason: ReasonQueued}},
		{"pending: held", queueInput{run: run, wl: testWorkload()},
			queueDecision{held: true, reason: ReasonQueued}},
		{"pending, quota reserved but admission checks pending: held", queueInput{run: run,
			wl: testWorkload(wlCond(kueue.WorkloadQuotaReserved, metav1.ConditionTrue, "QuotaReserved"))},
			queueDecision{held: true, reason: ReasonQueued}},
		{"pending, queue label changed: follow it", queueInput{run: moved, wl: testWorkload()},
			queueDecision{held: true, reason: ReasonQueued, setQueue: true}},
		{"admitted: runs", queueInput{run: run, wl: admitted(), live: 2},
			queueDecision{reason: ReasonAdmitted, clusterQueue: "cq"}},
		{"admitted, user suspends: deactivate", queueInput{run: suspended, wl: admitted(), live: 2},
			queueDecision{reason: ReasonAdmitted, clusterQueue: "cq", setActive: ptr.To(false)}},
		{"evicted, pods still stopping: held, quota kept", queueInput{run: run, wl: evicted(), live: 1},
			queueDecision{held: true, reason: ReasonEvicted}},
		{"evicted, pods gone: give the quota back", queueInput{run: run, wl: evicted()},
			queueDecision{held: true, reason: ReasonEvicted, clearAdmission: true}},
		{"run finished: finish the workload, drop the finalizer", queueInput{run: run, wl: withFinalizer(admitted()), finished: true},
			queueDecision{reason: ReasonAdmitted, finish: true, removeFinalizer: true}},
		{"run finished, a pod still stopping: finalizer kept", queueInput{run: run, wl: withFinalizer(admitted()), finished: true, live: 1},
			queueDecision{reason: ReasonAdmitted, finish: true}},
		{"workload finished without the run: held", queueInput{run: run, wl: finishedElsewhere},
			queueDecision{held: true, reason: ReasonEvicted, removeFinalizer: true}},
		{"workload being deleted: held, finalizer dropped once pods are gone", queueInput{run: run, wl: deleting},
			queueDecision{held: true, reason: ReasonEvicted, removeFinalizer: true}},
		{"workload being deleted, pods running: held", queueInput{run: run, wl: deleting, live: 2},
			queueDecision{held: true, reason: ReasonEvicted}},
		{"pending, asks the pods the budget allows: held", queueInput{run: run, wl: withPods(testWorkload(), 2), pods: 2},
			queueDecision{held: true, reason: ReasonQueued}},
		{"pending, the budget changed: queue a new Workload", queueInput{run: run, wl: withPods(testWorkload(), 2), pods: 1},
			queueDecision{held: true, reason: ReasonQueued, recreate: true}},
		{"pending, the budget changed and the queue too: one new Workload", queueInput{run: moved, wl: withPods(testWorkload(), 2), pods: 1},
			queueDecision{held: true, reason: ReasonQueued, recreate: true}},
		{"quota reserved, the budget changed: kept (pods stay within both)", queueInput{run: run,
			wl: withPods(testWorkload(wlCond(kueue.WorkloadQuotaReserved, metav1.ConditionTrue, "QuotaReserved")), 2), pods: 1},
			queueDecision{held: true, reason: ReasonQueued}},
		{"admitted, the budget changed: runs within both", queueInput{run: run, wl: withPods(admitted(), 2), pods: 1, live: 1},
			queueDecision{reason: ReasonAdmitted, clusterQueue: "cq"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decideQueue(tt.in)
			require.NotEmpty(t, got.message)
			got.message = ""
			require.Equal(t, tt.want, got)
		})
	}
}

func TestClearAdmission(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	for _, tt := range []struct {
		reason       string
		wantRequeued metav1.ConditionStatus
	}{
		{kueue.WorkloadEvictedByPreemption, metav1.ConditionTrue},
		{kueue.WorkloadDeactivated, metav1.ConditionFalse},
	} {
		wl := testWorkload(wlCond(kueue.WorkloadQuotaReserved, metav1.ConditionTrue, "QuotaReserved"),
			wlCond(kueue.WorkloadAdmitted, metav1.ConditionTrue, "Admitted"),
			wlCond(kueue.WorkloadEvicted, metav1.ConditionTrue, tt.reason))
		wl.Status.Admission = &kueue.Admission{ClusterQueue: "cq"}
		require.True(t, clearAdmission(wl, now))
		require.Nil(t, wl.Status.Admission)
		require.True(t, meta.IsStatusConditionFalse(wl.Status.Conditions, kueue.WorkloadQuotaReserved))
		require.True(t, meta.IsStatusConditionFalse(wl.Status.Conditions, kueue.WorkloadAdmitted))
		require.Equal(t, tt.wantRequeued, meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadRequeued).Status, tt.reason)
		require.False(t, clearAdmission(wl, now), "once is enough")
	}
	require.False(t, clearAdmission(testWorkload(), now), "not evicted")
}

func TestPlacement(t *testing.T) {
	t.Parallel()
	spot := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: "spot"}, Spec: kueue.ResourceFlavorSpec{
		NodeLabels:  map[string]string{"pool": "spot", "zone": "a"},
		Tolerations: []corev1.Toleration{{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
	}}
	otherZone := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: kueue.ResourceFlavorSpec{NodeLabels: map[string]string{"zone": "b"}}}
	run := newRun("ns", "r", 1, 1)

	p, prob := placementOf(run, []*kueue.ResourceFlavor{spot, spot})
	require.Nil(t, prob)
	require.Equal(t, map[string]string{"pool": "spot", "zone": "a"}, p.nodeSelector)
	require.Len(t, p.tolerations, 1, "the same toleration once")

	_, prob = placementOf(run, []*kueue.ResourceFlavor{spot, otherZone})
	require.Equal(t, ReasonPlacementConflict, prob.reason)
	require.Contains(t, prob.message, `flavor "b" needs node label zone=b, another admitted flavor zone=a`)

	own := run.DeepCopy()
	own.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{NodeSelector: map[string]string{"zone": "c"}}
	_, prob = placementOf(own, []*kueue.ResourceFlavor{spot})
	require.Contains(t, prob.message, "the run's workerTemplate.nodeSelector says zone=c")

	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: map[string]string{"disk": "ssd"},
		Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists}}}}
	shared := pod.Spec.NodeSelector
	applyPlacement(pod, &p)
	require.Equal(t, map[string]string{"disk": "ssd", "pool": "spot", "zone": "a"}, pod.Spec.NodeSelector)
	require.Equal(t, map[string]string{"disk": "ssd"}, shared, "the template's map is not written to")
	require.Len(t, pod.Spec.Tolerations, 2)
	applyPlacement(pod, nil)
	require.Len(t, pod.Spec.Tolerations, 2)

	wl := &kueue.Workload{Status: kueue.WorkloadStatus{Admission: &kueue.Admission{PodSetAssignments: []kueue.PodSetAssignment{
		{Name: workloadPodSet, Flavors: map[corev1.ResourceName]kueue.ResourceFlavorReference{"cpu": "spot", "memory": "spot", "nvidia.com/gpu": "a100"}},
		{Name: "other", Flavors: map[corev1.ResourceName]kueue.ResourceFlavorReference{"cpu": "x"}},
	}}}}
	require.Equal(t, []string{"a100", "spot"}, admittedFlavors(wl))
}

func TestBuildWorkload(t *testing.T) {
	t.Parallel()
	run := queuedRun("ns", "r", 4, 8, "team-a")
	run.UID = "uid-1"
	run.Spec.Suspend = true
	prio := &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000}
	wl, err := buildWorkload(run, PodOptions{Image: "runledger:test"}, prio, 4)
	require.NoError(t, err)
	require.Equal(t, WorkloadName(run), wl.Name)
	require.False(t, *wl.Spec.Active, "a suspended run's Workload is inactive")
	require.Equal(t, int32(4), wl.Spec.PodSets[0].Count)
	capped, err := buildWorkload(run, PodOptions{Image: "runledger:test"}, nil, 2)
	require.NoError(t, err)
	require.Equal(t, int32(2), capped.Spec.PodSets[0].Count, "the pods the budget runs at once, as a Job's parallelism")
	require.Equal(t, int32(1000), *wl.Spec.Priority)
	require.Equal(t, "high", wl.Spec.PriorityClassRef.Name)
	require.NotContains(t, wl.Spec.PodSets[0].Template.Labels, v1alpha1.LabelShard)

	again := run.DeepCopy()
	again.UID = "uid-2"
	require.NotEqual(t, WorkloadName(run), WorkloadName(again), "a run of the same name never takes the Workload of the one before it")
	long := run.DeepCopy()
	long.Name = "r234567890123456789012345678901234567890123456789012345678901x"
	require.LessOrEqual(t, len(WorkloadName(long)), 253)
}

package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
)

// The Kueue job-integration protocol, implemented against Kueue's API types
// alone: Kueue's jobframework package does not build with this module's
// Kubernetes libraries (it pulls in other frameworks' APIs built for older
// ones). A run labelled with a queue has one Workload, owned by the run;
// the run is held (no pod) until the Workload is Admitted and again while it
// is Evicted; Kueue's own controllers admit, evict and preempt.
const (
	// LabelQueueName is Kueue's label naming a run's LocalQueue.
	LabelQueueName = "kueue.x-k8s.io/queue-name"
	// LabelPriorityClass names a run's WorkloadPriorityClass, as on
	// Kueue's own job integrations.
	LabelPriorityClass = "kueue.x-k8s.io/priority-class"
	// labelJobUID is the label Kueue's integrations put on a Workload: the
	// UID of the object it stands for.
	labelJobUID = "kueue.x-k8s.io/job-uid"
	// workloadPodSet is the name of the Workload's one pod set: the
	// run's worker pods, one per shard.
	workloadPodSet = "workers"
	// kueueFieldManager writes the Workloads' status fields that belong to
	// the integration (a cleared admission, Finished).
	kueueFieldManager = "runledger-kueue"
)

// Reasons of the Admitted condition (also Events).
const (
	ReasonQueued   = "Queued"
	ReasonAdmitted = "Admitted"
	ReasonEvicted  = "Evicted"
	// ReasonPlacementConflict: the admitted flavors' node labels contradict
	// the run's own workerTemplate.nodeSelector.
	ReasonPlacementConflict = "PlacementConflict"
	// ReasonPriorityClassNotFound: the label kueue.x-k8s.io/priority-class
	// names no WorkloadPriorityClass; no Workload is created until it does.
	ReasonPriorityClassNotFound = "WorkloadPriorityClassNotFound"
)

// queueLabel is the run's LocalQueue, empty for a run outside Kueue.
func queueLabel(run *v1alpha1.ProcessingRun) string {
	return run.Labels[LabelQueueName]
}

// WorkloadName is the name of a run's Workload: the run's kind and name and
// a hash of its UID, so that a run created again under the same name never
// takes over the Workload of the one before it.
func WorkloadName(run *v1alpha1.ProcessingRun) string {
	sum := sha256.Sum256([]byte(run.UID))
	return "processingrun-" + run.Name + "-" + hex.EncodeToString(sum[:])[:5]
}

// buildWorkload is the Workload Kueue queues for a run: one pod set with
// count = the pods the run runs at once (its shards, or fewer under its
// connection budget, as a Job's pod set counts its parallelism) and the
// template of a worker pod (the processor sidecar's requests included, as
// an init container with restartPolicy Always), owned by the run so that
// deleting the run deletes it.
func buildWorkload(run *v1alpha1.ProcessingRun, opts PodOptions, priority *kueue.WorkloadPriorityClass, pods int32) (*kueue.Workload, error) {
	// The template of shard 0's first pod, without the run's file: no pod
	// is created from it.
	pod, err := buildWorkerPod(run, workerPodParams{}, opts)
	if err != nil {
		return nil, err
	}
	wl := &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{
			Name:      WorkloadName(run),
			Namespace: run.Namespace,
			Labels:    map[string]string{labelJobUID: string(run.UID)},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(run, v1alpha1.GroupVersion.WithKind("ProcessingRun")),
			},
		},
		Spec: kueue.WorkloadSpec{
			QueueName: kueue.LocalQueueName(queueLabel(run)),
			Active:    ptr.To(!run.Spec.Suspend),
			PodSets: []kueue.PodSet{{
				Name:  workloadPodSet,
				Count: pods,
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels},
					Spec:       pod.Spec,
				},
			}},
		},
	}
	// The template stands for every shard: no shard's own values.
	delete(wl.Spec.PodSets[0].Template.Labels, v1alpha1.LabelShard)
	delete(wl.Spec.PodSets[0].Template.Labels, v1alpha1.LabelAttempt)
	if priority != nil {
		wl.Spec.PriorityClassRef = kueue.NewWorkloadPriorityClassRef(priority.Name)
		wl.Spec.Priority = ptr.To(priority.Value)
	}
	return wl, nil
}

// queueInput is what decideQueue looks at.
type queueInput struct {
	run *v1alpha1.ProcessingRun
	// wl is the run's Workload, nil when there is none.
	wl *kueue.Workload
	// finished: the run Succeeded or Failed.
	finished bool
	// live is the number of the run's pods still running or stopping.
	live int
	// pods is the pod set's count the run asks for now (buildWorkload's),
	// 0 when it does not matter (a run another controller runs).
	pods int32
}

// queueDecision is what a pass does about a queued run's Workload and
// whether the run is held.
type queueDecision struct {
	// held: no pod may run (not admitted, evicted, or the Workload is being
	// deleted).
	held bool
	// reason and message are the Admitted condition's.
	reason, message string
	// clusterQueue admitted the run (empty unless Admitted).
	clusterQueue string
	// create the Workload (there is none).
	create bool
	// setActive, when set, is the value spec.active must take.
	setActive *bool
	// setQueue: the run names another LocalQueue than its pending Workload.
	setQueue bool
	// clearAdmission: evicted, and no pod runs any more: give the quota
	// back (Kueue requeues the Workload).
	clearAdmission bool
	// finish: mark the Workload Finished (the run is).
	finish bool
	// removeFinalizer: Kueue's resource-in-use finalizer can go (the
	// Workload is finished or being deleted and no pod runs).
	removeFinalizer bool
	// recreate: the pending Workload asks quota for another number of pods
	// than the run now runs at once (its connection budget changed); a
	// Workload's pod sets cannot change, so it is deleted and the next pass
	// queues a new one, as Kueue's own integrations do.
	recreate bool
}

// decideQueue decides, for a run with a queue label, what its Workload says
// and what to do with it. It is pure.
func decideQueue(in queueInput) queueDecision {
	run, wl := in.run, in.wl
	q := queueLabel(run)
	if wl == nil {
		if in.finished {
			return queueDecision{reason: ReasonQueued, message: "finished before Kueue admitted it"}
		}
		return queueDecision{held: true, create: true, reason: ReasonQueued,
			message: fmt.Sprintf("waiting for Kueue to admit its Workload in LocalQueue %q", q)}
	}
	hasFinalizer := slices.Contains(wl.Finalizers, kueue.ResourceInUseFinalizerName)
	wlFinished := meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished)
	if in.finished || wlFinished {
		d := queueDecision{reason: ReasonAdmitted, message: "finished", finish: in.finished && !wlFinished,
			removeFinalizer: hasFinalizer && in.live == 0}
		if !in.finished {
			// Finished by someone else: the run must not go on under it.
			d.held, d.reason, d.message = true, ReasonEvicted, "its Workload was declared finished without the run"
		}
		return d
	}
	if wl.DeletionTimestamp != nil {
		return queueDecision{held: true, reason: ReasonEvicted, removeFinalizer: hasFinalizer && in.live == 0,
			message: "its Workload is being deleted; a new one is queued once it is gone"}
	}
	d := decideAdmission(in, q)
	if active := !run.Spec.Suspend; ptr.Deref(wl.Spec.Active, true) != active {
		d.setActive = ptr.To(active)
	}
	return d
}

// decideAdmission reads a live, unfinished Workload's admission.
func decideAdmission(in queueInput, q string) queueDecision {
	wl := in.wl
	reserved := meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
	if ev := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted); ev != nil && ev.Status == metav1.ConditionTrue {
		return queueDecision{held: true, reason: ReasonEvicted,
			message:        fmt.Sprintf("evicted by Kueue (%s: %s); its pods stop, its shards' progress stays in the ledger and it resumes when admitted again", ev.Reason, ev.Message),
			clearAdmission: reserved && in.live == 0}
	}
	if meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) && wl.Status.Admission != nil {
		cq := string(wl.Status.Admission.ClusterQueue)
		return queueDecision{reason: ReasonAdmitted, clusterQueue: cq,
			message: fmt.Sprintf("admitted by ClusterQueue %q (LocalQueue %q)", cq, wl.Spec.QueueName)}
	}
	d := queueDecision{held: true, reason: ReasonQueued, setQueue: !reserved && string(wl.Spec.QueueName) != q,
		message: fmt.Sprintf("waiting for Kueue to admit its Workload in LocalQueue %q", q)}
	if n := podSetCount(wl); !reserved && in.pods > 0 && n != in.pods {
		d.setQueue, d.recreate = false, true
		d.message = fmt.Sprintf("its Workload asks quota for %d pods, its connection budget now allows %d at once: a new Workload is queued in LocalQueue %q", n, in.pods, q)
		return d
	}
	if c := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved); c != nil && c.Message != "" {
		d.message += ": " + c.Message
	}
	return d
}

// podSetCount is the count of the Workload's pod set of worker pods.
func podSetCount(wl *kueue.Workload) int32 {
	for _, ps := range wl.Spec.PodSets {
		if ps.Name == workloadPodSet {
			return ps.Count
		}
	}
	return 0
}

// clearAdmission gives an evicted Workload's quota back, as Kueue's job
// integrations do once their pods are gone: no admission, QuotaReserved and
// Admitted False, Requeued True when the eviction was a preemption (Kueue
// then queues it again). It reports whether anything changed.
func clearAdmission(wl *kueue.Workload, now time.Time) bool {
	ev := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted)
	if ev == nil {
		return false
	}
	at := metav1.NewTime(now)
	set := func(t string, s metav1.ConditionStatus, reason string) bool {
		return meta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason,
			Message: ev.Message, LastTransitionTime: at, ObservedGeneration: wl.Generation})
	}
	requeued := metav1.ConditionFalse
	if ev.Reason == kueue.WorkloadEvictedByPreemption || ev.Reason == kueue.WorkloadEvictedDueToNodeFailures {
		requeued = metav1.ConditionTrue
	}
	changed := set(kueue.WorkloadRequeued, requeued, ev.Reason)
	changed = set(kueue.WorkloadQuotaReserved, metav1.ConditionFalse, "Pending") || changed
	if c := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadAdmitted); c != nil && c.Status == metav1.ConditionTrue {
		changed = set(kueue.WorkloadAdmitted, metav1.ConditionFalse, "NoReservation") || changed
	}
	if wl.Status.Admission != nil {
		wl.Status.Admission = nil
		changed = true
	}
	return changed
}

// finishWorkload marks a Workload Finished with the run's outcome.
func finishWorkload(wl *kueue.Workload, succeeded bool, message string, now time.Time) bool {
	reason := kueue.WorkloadFinishedReasonSucceeded
	if !succeeded {
		reason = kueue.WorkloadFinishedReasonFailed
	}
	return meta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{Type: kueue.WorkloadFinished,
		Status: metav1.ConditionTrue, Reason: reason, Message: truncateMessage(message),
		LastTransitionTime: metav1.NewTime(now), ObservedGeneration: wl.Generation})
}

// placement is where an admitted run's pods go: its flavors' node labels
// and tolerations.
type placement struct {
	nodeSelector map[string]string
	tolerations  []corev1.Toleration
}

// admittedFlavors are the names of the flavors assigned to the pod set, in
// order.
func admittedFlavors(wl *kueue.Workload) []string {
	seen := map[string]bool{}
	if wl.Status.Admission == nil {
		return nil
	}
	for _, psa := range wl.Status.Admission.PodSetAssignments {
		if psa.Name != workloadPodSet {
			continue
		}
		for _, f := range psa.Flavors {
			seen[string(f)] = true
		}
	}
	out := slices.Collect(maps.Keys(seen))
	sort.Strings(out)
	return out
}

// placementOf merges the flavors' node labels and tolerations; two flavors
// (or a flavor and the run's own node selector) asking for different values
// of one label is a problem (PlacementConflict), as Kueue's integrations
// refuse to start such a job.
func placementOf(run *v1alpha1.ProcessingRun, flavors []*kueue.ResourceFlavor) (placement, *problem) {
	p := placement{nodeSelector: map[string]string{}}
	var own map[string]string
	if t := run.Spec.WorkerTemplate; t != nil {
		own = t.NodeSelector
	}
	for _, f := range flavors {
		keys := slices.Sorted(maps.Keys(f.Spec.NodeLabels))
		for _, k := range keys {
			v := f.Spec.NodeLabels[k]
			if have, ok := own[k]; ok && have != v {
				return placement{}, placementConflict("flavor %q needs node label %s=%s, the run's workerTemplate.nodeSelector says %s=%s", f.Name, k, v, k, have)
			}
			if have, ok := p.nodeSelector[k]; ok && have != v {
				return placement{}, placementConflict("flavor %q needs node label %s=%s, another admitted flavor %s=%s", f.Name, k, v, k, have)
			}
			p.nodeSelector[k] = v
		}
		for _, t := range f.Spec.Tolerations {
			p.tolerations = addToleration(p.tolerations, t)
		}
	}
	return p, nil
}

func placementConflict(format string, args ...any) *problem {
	return &problem{reason: ReasonPlacementConflict, message: fmt.Sprintf(format, args...) + ": the run's pods cannot start on the admitted flavors"}
}

// applyPlacement puts a placement onto a worker pod about to be created.
func applyPlacement(pod *corev1.Pod, p *placement) {
	if p == nil {
		return
	}
	if len(p.nodeSelector) > 0 {
		sel := maps.Clone(pod.Spec.NodeSelector)
		if sel == nil {
			sel = map[string]string{}
		}
		maps.Copy(sel, p.nodeSelector)
		pod.Spec.NodeSelector = sel
	}
	for _, t := range p.tolerations {
		pod.Spec.Tolerations = addToleration(pod.Spec.Tolerations, t)
	}
}

// addToleration appends t unless have holds it already.
func addToleration(have []corev1.Toleration, t corev1.Toleration) []corev1.Toleration {
	for i := range have {
		if have[i].MatchToleration(&t) {
			return have
		}
	}
	return append(have, t)
}

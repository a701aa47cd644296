package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
)

// queueView is what a pass knows of a queued run's Workload and decided
// about it.
type queueView struct {
	wl       *kueue.Workload
	decision queueDecision
	// placement is the admitted flavors' (resolved only when pods are
	// created in the pass).
	placement *placement
}

// held: the run is queued and Kueue does not (or no longer) admit it.
func (s *scope) held() bool {
	return s.queue != nil && s.queue.decision.held
}

// suspended: the run's pods must stop, by spec.suspend or Kueue's hold.
func (s *scope) suspended() bool {
	return s.run.Spec.Suspend || s.held()
}

// observeQueue reads a queued run's Workload from the cache and decides
// whether the run is held, before the pods are looked at.
func (r *Reconciler) observeQueue(ctx context.Context, s *scope) error {
	if !r.Kueue || queueLabel(s.run) == "" {
		return nil
	}
	wl, err := r.getWorkload(ctx, s.run)
	if err != nil {
		return err
	}
	s.queue = &queueView{wl: wl}
	s.queue.decision = decideQueue(queueInput{run: s.run, wl: wl, finished: finishedCondition(&s.run.Status) != nil, pods: r.workloadPods(s.run)})
	return nil
}

// getWorkload is the run's Workload from the cache, nil when there is none.
// One of that name that the run does not control is an error: it is never
// taken over.
func (r *Reconciler) getWorkload(ctx context.Context, run *v1alpha1.ProcessingRun) (*kueue.Workload, error) {
	wl := &kueue.Workload{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: WorkloadName(run)}, wl)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get workload: %w", err)
	case !metav1.IsControlledBy(wl, run):
		return nil, fmt.Errorf("workload %s exists but does not belong to this run", wl.Name)
	}
	return wl, nil
}

// syncQueue carries out what the pass decided about the Workload, now that
// the pods and the outcome are known, and resolves the admitted placement
// when pods are about to be created.
func (r *Reconciler) syncQueue(ctx context.Context, s *scope) error {
	if s.queue == nil {
		return nil
	}
	in := queueInput{run: s.run, wl: s.queue.wl, finished: s.outcome.finished, live: liveShards(s.shards), pods: r.workloadPods(s.run)}
	s.queue.decision = decideQueue(in)
	prob, err := r.applyQueueDecision(ctx, s.run, s.queue.wl, s.queue.decision, s.outcome)
	if err != nil {
		return err
	}
	if prob != nil {
		// No Workload yet: the run stays held and says why.
		s.queue.decision.reason, s.queue.decision.message = prob.reason, prob.message
		s.requeueIn(r.DependencyRetry)
		return nil
	}
	if s.queue.decision.held || !s.needsPods() {
		return nil
	}
	p, prob, err := r.resolvePlacement(ctx, s.run, s.queue.wl)
	if err != nil {
		return err
	}
	if prob != nil {
		s.stallStart(prob, r.DependencyRetry)
		return nil
	}
	s.queue.placement = p
	return nil
}

// applyQueueDecision writes what d decided onto the Workload: create it,
// (de)activate it, follow the run's LocalQueue, clear an eviction's
// admission, finish it, drop Kueue's finalizer. A Workload that cannot be
// created until someone acts is a problem, not an error.
func (r *Reconciler) applyQueueDecision(ctx context.Context, run *v1alpha1.ProcessingRun, cur *kueue.Workload, d queueDecision, o runOutcome) (*problem, error) {
	if d.create {
		return r.createWorkload(ctx, run)
	}
	if cur == nil {
		return nil, nil
	}
	return nil, r.updateWorkload(ctx, run, cur, d, o)
}

// workloadPods is the number of pods a run's Workload asks quota for: the
// pods it runs at once under its connection budget.
func (r *Reconciler) workloadPods(run *v1alpha1.ProcessingRun) int32 {
	return budgetFor(run, r.ConnectionBudget, 0).parallelism
}

// updateWorkload carries out d on an existing Workload.
func (r *Reconciler) updateWorkload(ctx context.Context, run *v1alpha1.ProcessingRun, cur *kueue.Workload, d queueDecision, o runOutcome) error {
	wl := cur.DeepCopy()
	logger := log.FromContext(ctx).WithValues("workload", wl.Name)
	if d.recreate {
		if err := r.Client.Delete(ctx, wl, client.Preconditions{UID: &wl.UID}); err != nil {
			return ignoreGoneOrConflict(err, "delete workload")
		}
		r.event(run, wl, corev1.EventTypeNormal, ReasonQueued, "Queue", "Deleted Workload "+wl.Name+": "+d.message)
		logger.Info("deleted a pending workload to queue another pod count", "pods", podSetCount(wl))
		return nil
	}
	if d.setActive != nil || d.setQueue {
		if d.setActive != nil {
			wl.Spec.Active = d.setActive
		}
		if d.setQueue {
			wl.Spec.QueueName = kueue.LocalQueueName(queueLabel(run))
		}
		if err := r.Client.Update(ctx, wl); err != nil {
			return ignoreGoneOrConflict(err, "update workload")
		}
		logger.Info("updated workload", "active", *wl.Spec.Active, "queue", wl.Spec.QueueName)
	}
	if d.clearAdmission || d.finish {
		old := wl.DeepCopy()
		changed := false
		if d.clearAdmission {
			changed = clearAdmission(wl, r.Clock.Now())
		}
		if d.finish {
			changed = finishWorkload(wl, o.phase == v1alpha1.RunSucceeded, o.message, r.Clock.Now()) || changed
		}
		if changed {
			patch := client.MergeFromWithOptions(old, client.MergeFromWithOptimisticLock{})
			if err := r.Client.Status().Patch(ctx, wl, patch, client.FieldOwner(kueueFieldManager)); err != nil {
				return ignoreGoneOrConflict(err, "patch workload status")
			}
			logger.Info("wrote workload status", "clearedAdmission", d.clearAdmission, "finished", d.finish)
		}
	}
	if d.removeFinalizer && controllerutil.RemoveFinalizer(wl, kueue.ResourceInUseFinalizerName) {
		if err := r.Client.Update(ctx, wl); err != nil {
			return ignoreGoneOrConflict(err, "remove workload finalizer")
		}
	}
	return nil
}

// ignoreGoneOrConflict: a Workload deleted or changed meanwhile is looked at
// again on its watch event; other errors are wrapped.
func ignoreGoneOrConflict(err error, what string) error {
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// createWorkload creates a run's Workload, with the priority of the
// WorkloadPriorityClass its label names.
func (r *Reconciler) createWorkload(ctx context.Context, run *v1alpha1.ProcessingRun) (*problem, error) {
	var prio *kueue.WorkloadPriorityClass
	if name := run.Labels[LabelPriorityClass]; name != "" {
		prio = &kueue.WorkloadPriorityClass{}
		err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, prio)
		if apierrors.IsNotFound(err) {
			return &problem{reason: ReasonPriorityClassNotFound, message: fmt.Sprintf(
				"WorkloadPriorityClass %q (label %s) not found: create it or fix the label; the run waits without a Workload", name, LabelPriorityClass)}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("get workloadpriorityclass %s: %w", name, err)
		}
	}
	wl, err := buildWorkload(run, r.Pods, prio, r.workloadPods(run))
	if err != nil {
		return nil, err
	}
	if err := r.Client.Create(ctx, wl); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, nil // created by an earlier pass, not in the cache yet
		}
		return nil, fmt.Errorf("create workload: %w", err)
	}
	r.event(run, wl, corev1.EventTypeNormal, ReasonQueued, "Queue", fmt.Sprintf("Created Workload %s in LocalQueue %q: the run waits for Kueue to admit it", wl.Name, queueLabel(run)))
	log.FromContext(ctx).Info("created workload", "workload", wl.Name, "queue", queueLabel(run))
	return nil, nil
}

// resolvePlacement reads the admitted flavors and merges their placement; a
// missing flavor or a conflict is a problem for a person, not an error.
func (r *Reconciler) resolvePlacement(ctx context.Context, run *v1alpha1.ProcessingRun, wl *kueue.Workload) (*placement, *problem, error) {
	var flavors []*kueue.ResourceFlavor
	for _, name := range admittedFlavors(wl) {
		f := &kueue.ResourceFlavor{}
		err := r.APIReader.Get(ctx, client.ObjectKey{Name: name}, f)
		if apierrors.IsNotFound(err) {
			return nil, placementConflict("ResourceFlavor %q of the admission is not found", name), nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("get resourceflavor %s: %w", name, err)
		}
		flavors = append(flavors, f)
	}
	p, prob := placementOf(run, flavors)
	if prob != nil {
		return nil, prob, nil
	}
	return &p, nil, nil
}

// reconcileManagedElsewhere is all the manager does for a run that
// spec.managedBy gives to another controller (MultiKueue's): keep its
// Workload, which the other controller dispatches, and finish it when the
// run's status (written by that controller) says the run is finished. No
// pod, no status.
func (r *Reconciler) reconcileManagedElsewhere(ctx context.Context, run *v1alpha1.ProcessingRun) error {
	if !r.Kueue || queueLabel(run) == "" {
		return nil
	}
	wl, err := r.getWorkload(ctx, run)
	if err != nil {
		return err
	}
	fin := finishedCondition(&run.Status)
	d := decideQueue(queueInput{run: run, wl: wl, finished: fin != nil})
	o := runOutcome{}
	if fin != nil {
		o = runOutcome{phase: run.Status.Phase, message: fin.Message, finished: true}
	}
	prob, err := r.applyQueueDecision(ctx, run, wl, d, o)
	if prob != nil {
		// No status of ours to show it on: the error is logged and retried.
		return fmt.Errorf("%s: %s", prob.reason, prob.message)
	}
	return err
}

// admittedCondition is the Admitted condition a queued run shows.
func admittedCondition(d queueDecision) (metav1.ConditionStatus, string, string) {
	if !d.held && d.reason == ReasonAdmitted {
		return metav1.ConditionTrue, d.reason, d.message
	}
	return metav1.ConditionFalse, d.reason, d.message
}

// admissionChanged reports an Admitted condition that is new or changed.
func admissionChanged(old, cur []metav1.Condition) *metav1.Condition {
	c := meta.FindStatusCondition(cur, v1alpha1.ConditionAdmitted)
	if c == nil {
		return nil
	}
	before := meta.FindStatusCondition(old, v1alpha1.ConditionAdmitted)
	if before != nil && before.Status == c.Status && before.Reason == c.Reason {
		return nil
	}
	return c
}

// cleanupWorkloads deletes the Workloads of a run that is deleted (uid set:
// being deleted; empty: gone) and drops Kueue's finalizer from them, as
// Kueue's integrations do: the garbage collector alone would leave them
// held by the finalizer.
func (r *Reconciler) cleanupWorkloads(ctx context.Context, key types.NamespacedName, uid types.UID) error {
	if !r.Kueue {
		return nil
	}
	var list kueue.WorkloadList
	if err := r.Client.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingFields{runOwnerKey: key.Name}); err != nil {
		return fmt.Errorf("list workloads: %w", err)
	}
	for i := range list.Items {
		wl := &list.Items[i]
		// The index names the controlling run; a Workload of an earlier
		// run of the same name is not this one's.
		if owner := metav1.GetControllerOf(wl); owner == nil || (uid != "" && owner.UID != uid) {
			continue
		}
		if controllerutil.RemoveFinalizer(wl, kueue.ResourceInUseFinalizerName) {
			if err := ignoreGoneOrConflict(r.Client.Update(ctx, wl), "remove workload finalizer"); err != nil {
				return err
			}
		}
		if wl.DeletionTimestamp == nil {
			if err := ignoreGoneOrConflict(r.Client.Delete(ctx, wl, client.Preconditions{UID: &wl.UID}), "delete workload"); err != nil {
				return err
			}
			log.FromContext(ctx).Info("deleted the workload of a deleted run", "workload", wl.Name)
		}
	}
	return nil
}

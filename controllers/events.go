package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/runledger/runledger/api/v1alpha1"
)

// maxEventNote is the events.k8s.io/v1 limit on an Event's note.
const maxEventNote = 1024

// event records an Event on the run (related: a pod, or nil). Notes never
// hold a secret: the controller never reads one.
func (r *Reconciler) event(run *v1alpha1.ProcessingRun, related runtime.Object, eventType, reason, action, note string) {
	if r.Recorder == nil {
		return
	}
	note = v1alpha1.Truncate(note, maxEventNote)
	r.Recorder.Eventf(run, related, eventType, reason, action, "%s", note)
}

// transitionEvents records what changed between the status the run had and
// the one just written: shard failures and retries, suspension, stalls and
// the outcome.
func (r *Reconciler) transitionEvents(ctx context.Context, s *scope, old, cur *v1alpha1.ProcessingRunStatus) {
	r.shardEvents(s, old)
	r.conditionEvents(s, old, cur)
	r.phaseEvents(ctx, s, old, cur)
}

// shardEvents announce each shard's failed and busy attempts, once.
func (r *Reconciler) shardEvents(s *scope, old *v1alpha1.ProcessingRunStatus) {
	run := s.run
	oldEntries := make(map[int32]v1alpha1.ShardStatus, len(old.Shards))
	for _, e := range old.Shards {
		oldEntries[e.Index] = e
	}
	for _, d := range s.shards {
		// A failed attempt is announced once: when the status still shows
		// its pod as pending or running.
		was, ok := oldEntries[d.index]
		if d.phase == v1alpha1.ShardSucceeded && d.report != nil && (!ok || was.Phase != v1alpha1.ShardSucceeded || was.Pod != d.pod) {
			if note := ledgerChangedNote(d.index, d.report); note != "" {
				r.event(run, nil, corev1.EventTypeWarning, ReasonLedgerServerChanged, "Prove", note)
			}
		}
		if d.busyPod != "" && ok && was.Pod == d.busyPod && was.Phase != v1alpha1.ShardRetrying {
			r.event(run, nil, corev1.EventTypeNormal, "ShardBusy", "Retry", fmt.Sprintf(
				"Shard %d attempt %d found the shard's lock taken (an earlier pod still finishing); retrying, not counted against backoffLimit",
				d.index, d.busyAttempt))
		}
		if d.failedPod == "" || !ok || was.Pod != d.failedPod ||
			was.Phase == v1alpha1.ShardRetrying || was.Phase == v1alpha1.ShardFailed {
			continue
		}
		attemptsFailed.Inc()
		note := fmt.Sprintf("Shard %d attempt %d failed: %s", d.index, d.failedAttempt, d.lastFailure)
		switch {
		case d.failure != nil:
			note += "; not retried: " + d.failure.reason
		case d.pod != d.failedPod:
			note += fmt.Sprintf("; retry %d of %d is pod %s", d.failures, run.Spec.BackoffLimitOrDefault(), d.pod)
		case !d.retryAt.IsZero():
			note += fmt.Sprintf("; retry %d of %d after %s", d.failures, run.Spec.BackoffLimitOrDefault(),
				d.retryAt.Sub(s.now).Round(100*time.Millisecond))
		}
		r.event(run, nil, corev1.EventTypeWarning, "ShardFailed", "Retry", note)
	}
}

// conditionEvents announce a new stall and a pod the scheduler cannot place.
func (r *Reconciler) conditionEvents(s *scope, old, cur *v1alpha1.ProcessingRunStatus) {
	run := s.run
	if stalled := meta.FindStatusCondition(cur.Conditions, v1alpha1.ConditionStalled); stalled != nil &&
		stalled.Status == metav1.ConditionTrue && cur.Phase != v1alpha1.RunFailed {
		before := meta.FindStatusCondition(old.Conditions, v1alpha1.ConditionStalled)
		if before == nil || before.Reason != stalled.Reason || before.Message != stalled.Message {
			r.event(run, nil, corev1.EventTypeWarning, stalled.Reason, "Reconcile", stalled.Message)
		}
	}

	if c := admissionChanged(old.Conditions, cur.Conditions); c != nil {
		eventType := corev1.EventTypeNormal
		if c.Reason == ReasonEvicted || c.Reason == ReasonPriorityClassNotFound {
			eventType = corev1.EventTypeWarning
		}
		r.event(run, nil, eventType, c.Reason, "Admission", c.Message)
	}

	if rec := meta.FindStatusCondition(cur.Conditions, v1alpha1.ConditionReconciling); rec != nil &&
		rec.Status == metav1.ConditionTrue && rec.Reason == ReasonWaitingForConnectionBudget {
		// Once when shards start to wait, not at every shard that starts.
		if before := meta.FindStatusCondition(old.Conditions, v1alpha1.ConditionReconciling); before == nil || before.Reason != rec.Reason {
			r.event(run, nil, corev1.EventTypeNormal, ReasonWaitingForConnectionBudget, "Throttle",
				budgetWait(s.budget, s.budgetOut, len(s.shards))+"; they start as running pods finish")
		}
	}

	if rec := meta.FindStatusCondition(cur.Conditions, v1alpha1.ConditionReconciling); rec != nil &&
		rec.Status == metav1.ConditionTrue && rec.Reason == ReasonUnschedulable {
		u := unschedulable(s.shards)
		before := meta.FindStatusCondition(old.Conditions, v1alpha1.ConditionReconciling)
		if before == nil || before.Reason != rec.Reason || !strings.HasPrefix(before.Message, u+"; ") {
			r.event(run, nil, corev1.EventTypeWarning, ReasonUnschedulable, "Schedule", u)
		}
	}
}

// phaseEvents announce the run's outcome, a suspension and a resume.
func (r *Reconciler) phaseEvents(ctx context.Context, s *scope, old, cur *v1alpha1.ProcessingRunStatus) {
	run := s.run
	if old.Phase == cur.Phase {
		return
	}
	logger := log.FromContext(ctx)
	switch cur.Phase {
	case v1alpha1.RunSucceeded:
		recordFinished(cur, s.outcome.reason)
		r.event(run, nil, corev1.EventTypeNormal, ReasonSucceeded, "Complete", s.outcome.message)
		logger.Info("run succeeded", "total", cur.Total, "completed", cur.Completed,
			"alreadyHandled", cur.AlreadyHandled, "failed", cur.Failed, "payloadChanged", cur.PayloadChanged)
	case v1alpha1.RunFailed:
		recordFinished(cur, s.outcome.reason)
		r.event(run, nil, corev1.EventTypeWarning, s.outcome.reason, "Fail", s.outcome.message)
		logger.Info("run failed", "reason", s.outcome.reason, "message", s.outcome.message)
	case v1alpha1.RunSuspended:
		r.event(run, nil, corev1.EventTypeNormal, ReasonSuspended, "Suspend", "Suspended: worker pods stop, counts are kept")
	default:
		if old.Phase == v1alpha1.RunSuspended {
			r.event(run, nil, corev1.EventTypeNormal, ReasonResumed, "Resume", "Resumed")
		}
	}
}

// ledgerChangedNote says what a succeeded shard's report tells of its
// ledger changing under it (a failover or a restart) and of items whose
// commits the ledger lost, processed again; "" when neither happened.
func ledgerChangedNote(shard int32, rep *v1alpha1.ShardReport) string {
	if rep.ServerChanges == 0 && rep.Reproven == 0 {
		return ""
	}
	var parts []string
	if rep.ServerChanges > 0 {
		parts = append(parts, fmt.Sprintf("its ledger sessions reached another database server, or a restarted one, %d time(s) (a failover?)", rep.ServerChanges))
	}
	if rep.Reproven > 0 {
		parts = append(parts, fmt.Sprintf("the ledger no longer held %d item(s) the shard had counted (their commits lost with the old server): processed again in %d more pass(es), SQL effects once on the new server, a processor's items again with the same key", rep.Reprocessed, rep.Reproven))
	} else {
		parts = append(parts, "the ledger held everything the shard had counted")
	}
	parts = append(parts, "the shard's counts are the ledger's, proven before it reported")
	return fmt.Sprintf("Shard %d attempt %d: %s", shard, rep.Attempt, strings.Join(parts, "; "))
}

package controllers

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

// Condition reasons (also used as Event reasons).
const (
	ReasonPending                = "Pending"
	ReasonRunning                = "Running"
	ReasonSucceeded              = "Succeeded"
	ReasonFailed                 = "Failed"
	ReasonSuspended              = "Suspended"
	ReasonSuspending             = "Suspending"
	ReasonResumed                = "Resumed"
	ReasonBadInput               = "BadInput"
	ReasonBackoffLimitExceeded   = "BackoffLimitExceeded"
	ReasonTooManyFailedItems     = "TooManyFailedItems"
	ReasonSecretNotFound         = "SecretNotFound"
	ReasonSecretKeyNotFound      = "SecretKeyNotFound"
	ReasonConfigMapNotFound      = "ConfigMapNotFound"
	ReasonConfigMapKeyNotFound   = "ConfigMapKeyNotFound"
	ReasonServiceAccountNotFound = "ServiceAccountNotFound"
	ReasonInvalidImage           = "InvalidImage"
	ReasonPodCreateFailed        = "PodCreateFailed"
	ReasonWorkerNotStarting      = "WorkerNotStarting"
	// ReasonProcessorFailed: a shard failed backoffLimit+1 times, the last
	// time because its processor (spec.effect.processor) crashed or never
	// became ready.
	ReasonProcessorFailed = "ProcessorFailed"
	// ReasonReconcileError: a reconcile pass failed (an API error); it is
	// retried with back-off and the message says what failed.
	ReasonReconcileError = "ReconcileError"
	// ReasonUnschedulable: the scheduler cannot place a worker pod (the
	// message is its own); the run waits, as the scheduler retries, for a
	// node to fit (an autoscaler, a freed node, a changed workerTemplate).
	ReasonUnschedulable = "Unschedulable"

	// ReasonDatabaseRefusingConnections: a worker waits for a database
	// connection, which the server refuses because it has as many as it
	// allows (SQLSTATE 53300, too_many_connections: max_connections, a
	// role's or the database's CONNECTION LIMIT); it retries.
	ReasonDatabaseRefusingConnections = "DatabaseRefusingConnections"
	// ReasonDeadlineExceeded: the run was active longer than
	// spec.activeDeadlineSeconds (as a Job's reason).
	ReasonDeadlineExceeded = "DeadlineExceeded"

	// ReasonLedgerServerChanged (an Event): a shard that succeeded saw its
	// ledger's sessions reach another server, or a restarted one (a
	// failover), or processed again items whose commits the ledger lost;
	// its counts are the ledger's, proven before it reported.
	ReasonLedgerServerChanged = "LedgerServerChanged"

	// ReasonSynchronousStandby (SynchronousReplication True): the ledger's
	// server acknowledges a commit only once a synchronous standby has it.
	ReasonSynchronousStandby = "SynchronousStandby"
	// ReasonAsynchronousReplication (SynchronousReplication False): the
	// ledger's server acknowledges a commit before any standby has it (or
	// before even it has flushed it): a failover can lose the latest
	// commits.
	ReasonAsynchronousReplication = "AsynchronousReplication"
)

// problem is something only a person can fix: a missing Secret, ConfigMap
// or ServiceAccount, an invalid image, a worker that cannot start. It makes
// the run Stalled (and, until fixed, no pod is created for it).
type problem struct {
	reason  string
	message string
}

// runOutcome is the run-level result of its shards' decisions.
type runOutcome struct {
	phase v1alpha1.RunPhase
	// reason and message of the terminal state (Succeeded or Failed).
	reason  string
	message string
	// finished is true when the run Succeeded or Failed (now or before).
	finished bool
	// finishedBefore is true when the current status already says so: the
	// outcome is sticky, as a Job's.
	finishedBefore bool
	counts         v1alpha1.ItemCounts
}

// finishedCondition returns the True Complete or Failed condition of a
// status, nil when the run is not finished.
func finishedCondition(st *v1alpha1.ProcessingRunStatus) *metav1.Condition {
	for _, t := range []string{v1alpha1.ConditionComplete, v1alpha1.ConditionFailed} {
		if c := meta.FindStatusCondition(st.Conditions, t); c != nil && c.Status == metav1.ConditionTrue {
			return c
		}
	}
	return nil
}

// sumCounts adds the shards' counts. While the run is not finished, no total
// goes below what the status already shows.
func sumCounts(run *v1alpha1.ProcessingRun, shards []shardDecision, finished bool) v1alpha1.ItemCounts {
	var sum v1alpha1.ItemCounts
	for _, d := range shards {
		sum.Add(d.counts)
	}
	if run.Spec.Batch.Items != nil {
		// Inline: every declared item counts, duplicates included.
		sum.Total = int64(len(run.Spec.Batch.Items))
	}
	if !finished {
		sum = sum.MaxEach(run.Status.ItemCounts)
	}
	return sum
}

// deadlineLeft is how long the run may still be active under
// spec.activeDeadlineSeconds, counted from its start (its first pod), and
// false when no deadline applies: none set, not started, or suspended.
func deadlineLeft(run *v1alpha1.ProcessingRun, startTime *metav1.Time, now time.Time) (time.Duration, bool) {
	if run.Spec.ActiveDeadlineSeconds == nil || startTime == nil || run.Spec.Suspend {
		return 0, false
	}
	return startTime.Add(time.Duration(*run.Spec.ActiveDeadlineSeconds) * time.Second).Sub(now), true
}

// decideRun is the run's phase and outcome from its shards. A finished run
// stays finished.
func decideRun(run *v1alpha1.ProcessingRun, shards []shardDecision, started bool) runOutcome {
	if c := finishedCondition(&run.Status); c != nil {
		o := runOutcome{phase: run.Status.Phase, reason: c.Reason, message: c.Message, finished: true, finishedBefore: true}
		allFinal := true
		for _, d := range shards {
			allFinal = allFinal && d.final
		}
		o.counts = sumCounts(run, shards, allFinal)
		return o
	}
	for _, d := range shards {
		if d.failure != nil {
			return runOutcome{phase: v1alpha1.RunFailed, reason: d.failure.reason, message: d.failure.message,
				finished: true, counts: sumCounts(run, shards, false)}
		}
	}
	done := 0
	for _, d := range shards {
		if d.phase == v1alpha1.ShardSucceeded {
			done++
		}
	}
	if done == len(shards) {
		c := sumCounts(run, shards, true)
		if c.Failed > run.Spec.MaxFailedItems {
			return runOutcome{phase: v1alpha1.RunFailed, reason: ReasonTooManyFailedItems, finished: true, counts: c,
				message: fmt.Sprintf("%d items failed, more than maxFailedItems (%d); the shards' messages say why",
					c.Failed, run.Spec.MaxFailedItems)}
		}
		return runOutcome{phase: v1alpha1.RunSucceeded, reason: ReasonSucceeded, finished: true, counts: c,
			message: fmt.Sprintf("%d items: %d completed, %d already handled, %d failed%s",
				c.Total, c.Completed, c.AlreadyHandled, c.Failed, payloadChangedNote(c))}
	}
	o := runOutcome{phase: v1alpha1.RunRunning, counts: sumCounts(run, shards, false)}
	switch {
	case run.Spec.Suspend:
		o.phase = v1alpha1.RunSuspended
	case !started:
		o.phase = v1alpha1.RunPending
	}
	return o
}

// statusInput is what buildStatus needs beyond the run itself.
type statusInput struct {
	shards []shardDecision
	// entries are the shards' entries with their pods' latest reports
	// folded in (withProgress), by index; a shard missing here keeps the
	// entry the run shows.
	entries map[int32]*v1alpha1.ShardStatus
	outcome runOutcome
	// stalled is the problem that keeps the run from progressing, if any.
	stalled *problem
	// startTime is when the first pod was created, nil before.
	startTime *metav1.Time
	now       time.Time
	// reconcileError is the error that ended the pass early, empty when
	// none did.
	reconcileError string
	// queue is a queued run's Workload and admission, nil for another run.
	queue *queueStatus
	// budget is the run's connection budget, budgetOut what holding the
	// shards within it found (live pods, shards waiting).
	budget    runBudget
	budgetOut budgetOutcome
	// replication is what the workers' latest report says of the ledger's
	// replication, nil when none says (the condition stays as it is).
	replication *v1alpha1.LedgerReplication
}

// queueStatus is what the status shows of a queued run's Workload.
type queueStatus struct {
	workload string
	decision queueDecision
}

// queueStatus is the pass's view of the Workload for the status.
func (s *scope) queueStatus() *queueStatus {
	if s.queue == nil {
		return nil
	}
	return &queueStatus{workload: WorkloadName(s.run), decision: s.queue.decision}
}

// buildStatus is the status the run should have. It starts from the current
// one, so conditions keep their transition times, takes the shards' reports
// from in.entries, and rewrites every other field.
func buildStatus(run *v1alpha1.ProcessingRun, in statusInput) v1alpha1.ProcessingRunStatus {
	st := *run.Status.DeepCopy()
	o := in.outcome
	st.ObservedGeneration = run.Generation
	st.Phase = o.phase
	st.ItemCounts = o.counts
	st.Active = in.budgetOut.active
	st.Connections = budgetStatus(in.budget, in.budgetOut, o.finished)
	// Times to the second, as the API stores them: the duration below is
	// then the difference the status shows, the same on every pass.
	st.StartTime = nil
	if in.startTime != nil {
		st.StartTime = ptr.To(in.startTime.Rfc3339Copy())
	}
	if o.finished && st.CompletionTime == nil {
		st.CompletionTime = ptr.To(metav1.NewTime(in.now).Rfc3339Copy())
	}
	if !o.finished {
		st.CompletionTime = nil
	}
	st.Duration = nil
	if st.CompletionTime != nil && st.StartTime != nil {
		st.Duration = &metav1.Duration{Duration: st.CompletionTime.Sub(st.StartTime.Time).Round(time.Second)}
	}

	entries := make(map[int32]v1alpha1.ShardStatus, len(st.Shards))
	for _, e := range st.Shards {
		entries[e.Index] = e
	}
	for i, e := range in.entries {
		if e != nil {
			entries[i] = *e.DeepCopy()
		}
	}
	st.Shards = make([]v1alpha1.ShardStatus, 0, len(in.shards))
	for _, d := range in.shards {
		e := entries[d.index]
		e.Index = d.index
		e.Pod = d.pod
		e.Phase = d.phase
		e.FailedAttempts = d.failures
		e.LastFailedAttempt = d.lastFailedAttempt
		if o.finished && d.phase == v1alpha1.ShardRetrying {
			// No retry comes after the run is finished.
			e.Phase = v1alpha1.ShardFailed
		}
		// While the shard runs, the most any attempt reported (a new attempt
		// catching up never makes it go down); once finished, the final
		// report, restored in case the worker's last report was lost (the
		// termination message survived it).
		e.ItemCounts = d.counts
		if d.final && d.report != nil {
			e.Attempt = d.report.Attempt
			e.Message = d.report.Message
			e.Failures = append([]v1alpha1.FailureSample(nil), d.report.Failures...)
		}
		st.Shards = append(st.Shards, e)
	}

	boundFailureSamples(st.Shards)
	st.FailedItems = ""
	if st.Failed > 0 {
		st.FailedItems = FailedItemsCommand(run.Namespace, run.Name)
	}
	switch q := in.queue; {
	case q != nil && !o.finished:
		st.Queue = &v1alpha1.QueueStatus{Workload: q.workload, ClusterQueue: q.decision.clusterQueue}
	case q != nil && st.Queue == nil:
		// Finished: the ClusterQueue that admitted it last stays shown.
		st.Queue = &v1alpha1.QueueStatus{Workload: q.workload}
	}
	st.Conditions = buildConditions(run, in)
	return st
}

// MaxRunFailureSamples bounds the failures the shards' entries show
// together: the first shards' (in index order) keep theirs, so that the
// sample's size does not grow with the shard count.
const MaxRunFailureSamples = 10

// boundFailureSamples applies MaxRunFailureSamples to entries (in index
// order).
func boundFailureSamples(entries []v1alpha1.ShardStatus) {
	left := MaxRunFailureSamples
	for i := range entries {
		f := entries[i].Failures
		if len(f) > left {
			entries[i].Failures = f[:left:left]
		}
		left -= len(entries[i].Failures)
		if len(entries[i].Failures) == 0 {
			entries[i].Failures = nil
		}
	}
}

// FailedItemsCommand is the command that lists a run's failed items from the
// ledger database (status.failedItems).
func FailedItemsCommand(namespace, name string) string {
	return fmt.Sprintf("runledger items %s -n %s --failed", name, namespace)
}

// buildConditions are the run's conditions: Complete, Failed and Suspended
// as batch/v1 Job has them; Ready, Reconciling and Stalled as kstatus reads
// them (Reconciling and Stalled are present only when True); Admitted for a
// queued run; SynchronousReplication once a worker reported the ledger's.
func buildConditions(run *v1alpha1.ProcessingRun, in statusInput) []metav1.Condition {
	conds := make([]metav1.Condition, 0, len(run.Status.Conditions)+3)
	for _, c := range run.Status.Conditions {
		conds = append(conds, *c.DeepCopy())
	}
	gen := run.Generation
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&conds, metav1.Condition{
			Type: t, Status: s, Reason: reason, Message: truncateMessage(msg), ObservedGeneration: gen,
		})
	}
	unset := func(t string) { meta.RemoveStatusCondition(&conds, t) }
	o := in.outcome

	if o.finishedBefore {
		// Sticky: only the generation moves.
		for i := range conds {
			conds[i].ObservedGeneration = gen
		}
		return conds
	}

	if q := in.queue; q != nil && !o.finished {
		status, reason, msg := admittedCondition(q.decision)
		set(v1alpha1.ConditionAdmitted, status, reason, msg)
	}
	if r := in.replication; r != nil {
		status, reason := replicationCondition(r)
		set(v1alpha1.ConditionSynchronousReplication, status, reason, r.Message())
	}

	switch {
	case o.finished && o.phase == v1alpha1.RunSucceeded:
		set(v1alpha1.ConditionComplete, metav1.ConditionTrue, o.reason, o.message)
		set(v1alpha1.ConditionReady, metav1.ConditionTrue, o.reason, o.message)
		unset(v1alpha1.ConditionReconciling)
		unset(v1alpha1.ConditionStalled)
	case o.finished:
		set(v1alpha1.ConditionFailed, metav1.ConditionTrue, o.reason, o.message)
		set(v1alpha1.ConditionReady, metav1.ConditionFalse, o.reason, o.message)
		set(v1alpha1.ConditionStalled, metav1.ConditionTrue, o.reason, o.message)
		unset(v1alpha1.ConditionReconciling)
	case o.phase == v1alpha1.RunSuspended:
		reason, msg := ReasonSuspended, fmt.Sprintf("suspended with %s; set spec.suspend to false to resume", progress(in.shards))
		if q := in.queue; q != nil && q.decision.held && !run.Spec.Suspend {
			reason, msg = q.decision.reason, fmt.Sprintf("held by Kueue with %s: %s", progress(in.shards), q.decision.message)
		}
		set(v1alpha1.ConditionSuspended, metav1.ConditionTrue, reason, msg)
		set(v1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
		unset(v1alpha1.ConditionStalled)
		if live := liveShards(in.shards); live > 0 {
			set(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonSuspending,
				fmt.Sprintf("waiting for %d worker pods to stop", live))
		} else {
			unset(v1alpha1.ConditionReconciling)
		}
	default:
		if c := meta.FindStatusCondition(conds, v1alpha1.ConditionSuspended); c != nil && c.Status == metav1.ConditionTrue {
			set(v1alpha1.ConditionSuspended, metav1.ConditionFalse, ReasonResumed, "resumed")
		}
		reason := ReasonRunning
		if o.phase == v1alpha1.RunPending {
			reason = ReasonPending
		}
		msg := progress(in.shards)
		if w := budgetWait(in.budget, in.budgetOut, len(in.shards)); w != "" {
			reason, msg = ReasonWaitingForConnectionBudget, w+"; "+msg
		}
		if u := unschedulable(in.shards); u != "" {
			reason, msg = ReasonUnschedulable, u+"; "+msg
		}
		if w := refusedConnections(run, in); w != "" {
			reason, msg = ReasonDatabaseRefusingConnections, w+"; "+msg
		}
		if in.reconcileError != "" {
			reason, msg = ReasonReconcileError, in.reconcileError+" (retrying); "+msg
		}
		if in.stalled != nil {
			set(v1alpha1.ConditionStalled, metav1.ConditionTrue, in.stalled.reason, in.stalled.message)
			set(v1alpha1.ConditionReady, metav1.ConditionFalse, in.stalled.reason, in.stalled.message)
			unset(v1alpha1.ConditionReconciling)
		} else {
			set(v1alpha1.ConditionReconciling, metav1.ConditionTrue, reason, msg)
			set(v1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg)
			unset(v1alpha1.ConditionStalled)
		}
	}
	return conds
}

// replicationCondition is the SynchronousReplication condition's status
// and reason for what the workers reported of the ledger's replication.
func replicationCondition(r *v1alpha1.LedgerReplication) (metav1.ConditionStatus, string) {
	if r.Synchronous {
		return metav1.ConditionTrue, ReasonSynchronousStandby
	}
	return metav1.ConditionFalse, ReasonAsynchronousReplication
}

// unschedulable says which of the shards' pods the scheduler cannot place
// and why (its message for the first), empty when it places them all.
func unschedulable(shards []shardDecision) string {
	var first string
	n := 0
	for _, d := range shards {
		if d.unschedulable != "" {
			n++
			if first == "" {
				first = d.unschedulable
			}
		}
	}
	switch n {
	case 0:
		return ""
	case 1:
		return "cannot be scheduled: " + first
	default:
		return fmt.Sprintf("%d pods cannot be scheduled, e.g. %s", n, first)
	}
}

// refusedConnections says which live shards wait for a database
// connection (their latest report starts with
// v1alpha1.DatabaseRefusingMessage), empty when none does.
func refusedConnections(run *v1alpha1.ProcessingRun, in statusInput) string {
	var first string
	n := 0
	for _, d := range in.shards {
		e := in.entries[d.index]
		for i := range run.Status.Shards {
			if e == nil && run.Status.Shards[i].Index == d.index {
				e = &run.Status.Shards[i]
			}
		}
		if d.live == 0 || e == nil || !strings.HasPrefix(e.Message, v1alpha1.DatabaseRefusingMessage) {
			continue
		}
		if n++; first == "" {
			first = fmt.Sprintf("shard %d: %s", d.index, e.Message)
		}
	}
	switch n {
	case 0:
		return ""
	case 1:
		return first
	default:
		return fmt.Sprintf("%d shards wait for a database connection, e.g. %s", n, first)
	}
}

func liveShards(shards []shardDecision) int {
	n := 0
	for _, d := range shards {
		n += d.live
	}
	return n
}

// progress is a short summary such as "2/4 shards succeeded, 1 running, 1
// retrying".
func progress(shards []shardDecision) string {
	var succeeded, running, retrying, pending int
	for _, d := range shards {
		switch d.phase {
		case v1alpha1.ShardSucceeded:
			succeeded++
		case v1alpha1.ShardRunning:
			running++
		case v1alpha1.ShardRetrying:
			retrying++
		default:
			pending++
		}
	}
	msg := fmt.Sprintf("%d/%d shards succeeded", succeeded, len(shards))
	for _, p := range []struct {
		n    int
		what string
	}{{running, "running"}, {retrying, "retrying"}, {pending, "pending"}} {
		if p.n > 0 {
			msg += fmt.Sprintf(", %d %s", p.n, p.what)
		}
	}
	return msg
}

// maxConditionMessage is the API's limit on a condition message.
const maxConditionMessage = 32768

func truncateMessage(s string) string {
	return v1alpha1.Truncate(s, maxConditionMessage)
}

// payloadChangedNote says how many already handled items had another
// payload than the committed row's, if any.
func payloadChangedNote(c v1alpha1.ItemCounts) string {
	if c.PayloadChanged == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d with a payload that differs from the committed row's)", c.PayloadChanged)
}

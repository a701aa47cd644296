package controllers

import (
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	acv1alpha1 "github.com/runledger/runledger/api/applyconfiguration/api/v1alpha1"
	"github.com/runledger/runledger/api/v1alpha1"
)

// statusApplyConfiguration is the controller's server-side apply of a run's
// status: every field, the shards' reports included (folded in from their
// pods' annotations, or restored from the final report when the worker's
// last write was lost). applyStatus pins it to the run it was built for.
func statusApplyConfiguration(run *v1alpha1.ProcessingRun, st *v1alpha1.ProcessingRunStatus, shards []shardDecision) *acv1alpha1.ProcessingRunApplyConfiguration {
	status := acv1alpha1.ProcessingRunStatus().
		WithObservedGeneration(st.ObservedGeneration).
		WithPhase(st.Phase).
		WithTotal(st.Total).
		WithCompleted(st.Completed).
		WithAlreadyHandled(st.AlreadyHandled).
		WithFailed(st.Failed)
	if st.PayloadChanged > 0 {
		status.WithPayloadChanged(st.PayloadChanged)
	}
	status.WithActive(st.Active)
	if c := st.Connections; c != nil {
		cs := acv1alpha1.ConnectionsStatus().WithLimit(c.Limit).WithSource(c.Source).WithParallelism(c.Parallelism)
		if c.Waiting > 0 {
			cs.WithWaiting(c.Waiting)
		}
		status.WithConnections(cs)
	}
	if st.StartTime != nil {
		status.WithStartTime(*st.StartTime)
	}
	if st.CompletionTime != nil {
		status.WithCompletionTime(*st.CompletionTime)
	}
	if st.Duration != nil {
		status.WithDuration(*st.Duration)
	}
	if st.FailedItems != "" {
		status.WithFailedItems(st.FailedItems)
	}
	if q := st.Queue; q != nil {
		qs := acv1alpha1.QueueStatus()
		if q.Workload != "" {
			qs.WithWorkload(q.Workload)
		}
		if q.ClusterQueue != "" {
			qs.WithClusterQueue(q.ClusterQueue)
		}
		status.WithQueue(qs)
	}
	final := make(map[int32]bool, len(shards))
	for _, d := range shards {
		final[d.index] = d.final
	}
	for _, e := range st.Shards {
		sh := acv1alpha1.ShardStatus().WithIndex(e.Index)
		if e.Phase != "" {
			sh.WithPhase(e.Phase)
		}
		if e.Pod != "" {
			sh.WithPod(e.Pod)
		}
		if e.FailedAttempts > 0 {
			sh.WithFailedAttempts(e.FailedAttempts)
		}
		if e.LastFailedAttempt != nil {
			sh.WithLastFailedAttempt(*e.LastFailedAttempt)
		}
		if final[e.Index] || e.LastReportTime != nil {
			sh.WithAttempt(e.Attempt).WithTotal(e.Total).WithCompleted(e.Completed).
				WithAlreadyHandled(e.AlreadyHandled).WithFailed(e.Failed)
			if e.PayloadChanged > 0 {
				sh.WithPayloadChanged(e.PayloadChanged)
			}
			if e.Message != "" {
				sh.WithMessage(e.Message)
			}
			for _, f := range e.Failures {
				fs := acv1alpha1.FailureSample().WithEntity(f.Entity).WithOccurrence(f.Occurrence)
				if f.Class != "" {
					fs.WithClass(f.Class)
				}
				if f.Error != "" {
					fs.WithError(f.Error)
				}
				sh.WithFailures(fs)
			}
			if e.LastReportTime != nil {
				sh.WithLastReportTime(*e.LastReportTime)
			}
		}
		status.WithShards(sh)
	}
	for _, c := range st.Conditions {
		status.WithConditions(metav1ac.Condition().
			WithType(c.Type).
			WithStatus(c.Status).
			WithReason(c.Reason).
			WithMessage(c.Message).
			WithObservedGeneration(c.ObservedGeneration).
			WithLastTransitionTime(c.LastTransitionTime))
	}
	return acv1alpha1.ProcessingRun(run.Name, run.Namespace).WithUID(run.UID).WithStatus(status)
}

package controllers

import (
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// The controller's side of the reports of api/v1alpha1/contract.go: it folds
// the workers' reports on their pods into the shards' status entries.

// parseProgress reads a pod's progress annotation; a missing or unreadable
// value, or a report of another shard or attempt, is no report.
func parseProgress(annotations map[string]string, shard, attempt int32) *v1alpha1.ShardReport {
	v, ok := annotations[v1alpha1.AnnotationProgress]
	if !ok {
		return nil
	}
	r, err := v1alpha1.ParseShardReport(v)
	if err != nil || r.Shard != shard || r.Attempt != attempt {
		return nil
	}
	return &r
}

// parseRunReport reads a pod's progress annotation when it is a RunReport
// (the pod's worker is, or was, its run's reporter); anything else is nil.
func parseRunReport(annotations map[string]string) *v1alpha1.RunReport {
	v, ok := annotations[v1alpha1.AnnotationProgress]
	if !ok {
		return nil
	}
	_, rr, err := v1alpha1.ParseProgress(v)
	if err != nil {
		return nil
	}
	return rr
}

// shardAttempt names one attempt of one shard.
type shardAttempt struct{ shard, attempt int32 }

// foldRunReports folds the RunReports on a run's pods (byShard, by shard
// index) into the progress of the pods of the shards and attempts they
// report on, whatever pod carries them: of every report of one attempt, the
// merge (mergeReports). An entry for a shard or attempt without a pod is
// dropped.
func foldRunReports(byShard [][]podInfo) {
	reports := map[shardAttempt]*v1alpha1.ShardReport{}
	for _, pods := range byShard {
		for _, p := range pods {
			if p.runReport == nil {
				continue
			}
			for i := range p.runReport.Shards {
				e := &p.runReport.Shards[i]
				k := shardAttempt{e.Shard, e.Attempt}
				reports[k] = mergeReports(reports[k], e)
			}
		}
	}
	if len(reports) == 0 {
		return
	}
	for shard, pods := range byShard {
		for i := range pods {
			if r, ok := reports[shardAttempt{int32(shard), pods[i].attempt}]; ok {
				pods[i].progress = mergeReports(pods[i].progress, r)
			}
		}
	}
}

// mergeReports is what two reports of one shard's attempt say together:
// each count the higher (counts only grow within an attempt, so the higher is
// the later), the message and report time of the later report, the longer
// failure sample (a sample only grows too). Either may be nil; the result
// is a or b itself when the other adds nothing, else a new report.
func mergeReports(a, b *v1alpha1.ShardReport) *v1alpha1.ShardReport {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	later, other := a, b
	if b.ReportTime != nil && (a.ReportTime == nil || b.ReportTime.After(a.ReportTime.Time)) {
		later, other = b, a
	}
	counts := later.MaxEach(other.ItemCounts)
	if counts == later.ItemCounts && len(later.Failures) >= len(other.Failures) {
		return later
	}
	m := *later
	m.ItemCounts = counts
	if len(other.Failures) > len(later.Failures) {
		m.Failures = other.Failures
	}
	return &m
}

// withProgress is the shard's status entry with the latest report of its
// pods folded in, as the worker's own write of it would have left it: the
// report of the latest attempt that has one replaces the entry's report
// fields, unless the entry already holds a later attempt's report (its pod
// is gone). entry may be nil; the result is a copy, or entry itself when no
// pod has a newer report.
func withProgress(entry *v1alpha1.ShardStatus, index int32, pods []podInfo) *v1alpha1.ShardStatus {
	var latest *v1alpha1.ShardReport
	for _, p := range pods {
		if p.progress != nil && (latest == nil || p.progress.Attempt > latest.Attempt) {
			latest = p.progress
		}
	}
	if latest == nil || (entry != nil && entry.LastReportTime != nil && entry.Attempt > latest.Attempt) {
		return entry
	}
	e := v1alpha1.ShardStatus{Index: index}
	if entry != nil {
		e = *entry.DeepCopy()
	}
	e.Attempt = latest.Attempt
	e.ItemCounts = latest.ItemCounts
	e.Message = latest.Message
	e.Failures = append([]v1alpha1.FailureSample(nil), latest.Failures...)
	e.LastReportTime = latest.ReportTime.DeepCopy()
	return &e
}

// progressOnlyChange reports whether two statuses differ only in counts and
// in the shards' report fields (counts, message, failures, report time): what moves
// with every report, and is written at most every StatusInterval.
func progressOnlyChange(old, desired *v1alpha1.ProcessingRunStatus) bool {
	if len(old.Shards) != len(desired.Shards) {
		return false
	}
	c := desired.DeepCopy()
	c.ItemCounts = old.ItemCounts
	for i := range c.Shards {
		o, e := &old.Shards[i], &c.Shards[i]
		if o.Index != e.Index {
			return false
		}
		e.ItemCounts = o.ItemCounts
		e.Message, e.LastReportTime, e.Failures = o.Message, o.LastReportTime, o.Failures
	}
	return equality.Semantic.DeepEqual(*old, *c)
}

// latestReplication is what the latest report on the run's pods says of the
// ledger's replication (each worker reads it at start: a progress report,
// a RunReport or a termination message, dated by its report time or the
// pod's finish), nil when none says: the run's SynchronousReplication
// condition then stays as it is. A termination message wins a tie (the
// API keeps times to the second): its worker wrote it last.
func latestReplication(byShard [][]podInfo) *v1alpha1.LedgerReplication {
	var latest *v1alpha1.LedgerReplication
	var at time.Time
	consider := func(r *v1alpha1.LedgerReplication, t *metav1.Time, fallback time.Time) {
		when, final := fallback, t == nil
		if t != nil {
			when = t.Time
		}
		if r != nil && (latest == nil || when.After(at) || (final && when.Equal(at))) {
			latest, at = r, when
		}
	}
	for _, pods := range byShard {
		for _, p := range pods {
			if p.progress != nil {
				consider(p.progress.Replication, p.progress.ReportTime, time.Time{})
			}
			if p.runReport != nil {
				consider(p.runReport.Replication, p.runReport.ReportTime, time.Time{})
			}
			if p.report != nil {
				consider(p.report.Replication, p.report.ReportTime, p.finishedAt)
			}
		}
	}
	return latest
}

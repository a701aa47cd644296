package controllers

import (
	"k8s.io/apimachinery/pkg/api/equality"

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

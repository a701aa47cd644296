package controllers

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

func TestParseProgress(t *testing.T) {
	ann := func(v string) map[string]string { return map[string]string{v1alpha1.AnnotationProgress: v} }
	tests := []struct {
		name        string
		annotations map[string]string
		want        *v1alpha1.ShardReport
	}{
		{"none", nil, nil},
		{"this shard and attempt", ann(`{"shard":2,"attempt":1,"total":9,"completed":3,"alreadyHandled":1,"failed":0,"message":"m","reportTime":"2026-01-01T00:00:00Z"}`),
			&v1alpha1.ShardReport{Shard: 2, Attempt: 1, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 3, AlreadyHandled: 1}, Message: "m",
				ReportTime: &metav1.Time{Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Local()}}},
		{"another shard", ann(`{"shard":3,"attempt":1,"total":9,"completed":3,"alreadyHandled":0,"failed":0}`), nil},
		{"another attempt", ann(`{"shard":2,"attempt":0,"total":9,"completed":3,"alreadyHandled":0,"failed":0}`), nil},
		{"negative", ann(`{"shard":2,"attempt":1,"total":9,"completed":-3,"alreadyHandled":0,"failed":0}`), nil},
		{"unknown field", ann(`{"shard":2,"attempt":1,"total":9,"completed":3,"alreadyHandled":0,"failed":0,"x":1}`), nil},
		{"not JSON", ann(`processing`), nil},
		// Issue #20.5: a report with a field given twice is no report.
		{"field given twice", ann(`{"shard":2,"attempt":1,"total":9,"completed":3,"completed":9,"alreadyHandled":0,"failed":0}`), nil},
		{"lone surrogate", ann(`{"shard":2,"attempt":1,"total":9,"completed":3,"alreadyHandled":0,"failed":0,"message":"\ud800"}`), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, parseProgress(tt.annotations, 2, 1))
		})
	}
}

func TestWithProgress(t *testing.T) {
	t1, t2 := metav1.NewTime(t0), metav1.NewTime(t0.Add(time.Second))
	pod := func(attempt int32, c v1alpha1.ItemCounts, msg string, at *metav1.Time) podInfo {
		return podInfo{pod: &corev1.Pod{}, attempt: attempt, progress: &v1alpha1.ShardReport{Shard: 1, Attempt: attempt,
			ItemCounts: c, Message: msg, ReportTime: at}}
	}
	controllerFields := v1alpha1.ShardStatus{Index: 1, Pod: "r-1-1", Phase: v1alpha1.ShardRunning, FailedAttempts: 1, LastFailedAttempt: ptr.To[int32](0)}
	with := func(e v1alpha1.ShardStatus, attempt int32, c v1alpha1.ItemCounts, msg string, at *metav1.Time) *v1alpha1.ShardStatus {
		e.Attempt, e.ItemCounts, e.Message, e.LastReportTime = attempt, c, msg, at
		return &e
	}
	tests := []struct {
		name  string
		entry *v1alpha1.ShardStatus
		pods  []podInfo
		want  *v1alpha1.ShardStatus
	}{
		{"no entry, no report", nil, []podInfo{{pod: &corev1.Pod{}}}, nil},
		{"entry, no report: kept", with(controllerFields, 0, v1alpha1.ItemCounts{Total: 9, Completed: 5}, "old", &t1), nil,
			with(controllerFields, 0, v1alpha1.ItemCounts{Total: 9, Completed: 5}, "old", &t1)},
		{"first report, no entry", nil, []podInfo{pod(0, v1alpha1.ItemCounts{Total: 9, Completed: 2}, "p", &t1)},
			with(v1alpha1.ShardStatus{Index: 1}, 0, v1alpha1.ItemCounts{Total: 9, Completed: 2}, "p", &t1)},
		{"the latest attempt's report replaces the report fields, keeps the controller's",
			with(controllerFields, 0, v1alpha1.ItemCounts{Total: 9, Completed: 5}, "old", &t1),
			[]podInfo{pod(0, v1alpha1.ItemCounts{Total: 9, Completed: 5}, "old", &t1), pod(1, v1alpha1.ItemCounts{Total: 9, Completed: 1}, "new", &t2)},
			with(controllerFields, 1, v1alpha1.ItemCounts{Total: 9, Completed: 1}, "new", &t2)},
		{"an entry of a later attempt (its pod gone) stays",
			with(controllerFields, 2, v1alpha1.ItemCounts{Total: 9, Completed: 8}, "later", &t2),
			[]podInfo{pod(1, v1alpha1.ItemCounts{Total: 9, Completed: 1}, "new", &t1)},
			with(controllerFields, 2, v1alpha1.ItemCounts{Total: 9, Completed: 8}, "later", &t2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before *v1alpha1.ShardStatus
			if tt.entry != nil {
				before = tt.entry.DeepCopy()
			}
			require.Equal(t, tt.want, withProgress(tt.entry, 1, tt.pods))
			require.Equal(t, before, tt.entry, "the entry itself is not changed")
		})
	}
}

func TestParseRunReport(t *testing.T) {
	ann := func(v string) map[string]string { return map[string]string{v1alpha1.AnnotationProgress: v} }
	tests := []struct {
		name        string
		annotations map[string]string
		want        *v1alpha1.RunReport
	}{
		{"none", nil, nil},
		{"a shard's report is no run report", ann(`{"shard":2,"attempt":1,"total":9,"completed":3,"alreadyHandled":1,"failed":0}`), nil},
		{"a run report", ann(`{"reporter":0,"shards":[{"shard":0,"attempt":0,"total":9,"completed":3,"alreadyHandled":0,"failed":0},{"shard":1,"attempt":2,"total":8,"completed":1,"alreadyHandled":0,"failed":1,"message":"m"}]}`),
			&v1alpha1.RunReport{Shards: []v1alpha1.ShardReport{
				{Shard: 0, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 3}},
				{Shard: 1, Attempt: 2, ItemCounts: v1alpha1.ItemCounts{Total: 8, Completed: 1, Failed: 1}, Message: "m"}}}},
		{"a run report without shards", ann(`{"reporter":0,"shards":[]}`), &v1alpha1.RunReport{Shards: []v1alpha1.ShardReport{}}},
		{"shards missing", ann(`{"reporter":0}`), nil},
		{"negative count", ann(`{"reporter":0,"shards":[{"shard":0,"attempt":0,"total":9,"completed":-3,"alreadyHandled":0,"failed":0}]}`), nil},
		{"negative reporter", ann(`{"reporter":-1,"shards":[]}`), nil},
		{"unknown field", ann(`{"reporter":0,"shards":[],"x":1}`), nil},
		{"field given twice", ann(`{"reporter":0,"reporter":1,"shards":[]}`), nil},
		{"not JSON", ann(`processing`), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, parseRunReport(tt.annotations))
		})
	}
}

func TestMergeReports(t *testing.T) {
	t1, t2 := metav1.NewTime(t0), metav1.NewTime(t0.Add(time.Second))
	f := []v1alpha1.FailureSample{{Entity: "e", Occurrence: "o", Error: "x"}}
	r := func(c v1alpha1.ItemCounts, msg string, at *metav1.Time, failures []v1alpha1.FailureSample) *v1alpha1.ShardReport {
		return &v1alpha1.ShardReport{Shard: 1, Attempt: 2, ItemCounts: c, Message: msg, ReportTime: at, Failures: failures}
	}
	tests := []struct {
		name string
		a, b *v1alpha1.ShardReport
		want *v1alpha1.ShardReport
	}{
		{"none", nil, nil, nil},
		{"only one", nil, r(v1alpha1.ItemCounts{Completed: 1}, "m", &t1, nil), r(v1alpha1.ItemCounts{Completed: 1}, "m", &t1, nil)},
		{"the later's message, each count's highest",
			r(v1alpha1.ItemCounts{Total: 9, Completed: 5, Failed: 1}, "pod", &t1, nil),
			r(v1alpha1.ItemCounts{Total: 9, Completed: 4, AlreadyHandled: 2}, "run", &t2, nil),
			r(v1alpha1.ItemCounts{Total: 9, Completed: 5, AlreadyHandled: 2, Failed: 1}, "run", &t2, nil)},
		{"whatever the order",
			r(v1alpha1.ItemCounts{Total: 9, Completed: 4, AlreadyHandled: 2}, "run", &t2, nil),
			r(v1alpha1.ItemCounts{Total: 9, Completed: 5, Failed: 1}, "pod", &t1, nil),
			r(v1alpha1.ItemCounts{Total: 9, Completed: 5, AlreadyHandled: 2, Failed: 1}, "run", &t2, nil)},
		{"the longer failure sample (a run report carries none)",
			r(v1alpha1.ItemCounts{Total: 9, Failed: 1}, "pod", &t1, f),
			r(v1alpha1.ItemCounts{Total: 9, Failed: 1}, "run", &t2, nil),
			r(v1alpha1.ItemCounts{Total: 9, Failed: 1}, "run", &t2, f)},
		{"a report without time is the earlier",
			r(v1alpha1.ItemCounts{Completed: 1}, "untimed", nil, nil),
			r(v1alpha1.ItemCounts{Completed: 1}, "timed", &t1, nil),
			r(v1alpha1.ItemCounts{Completed: 1}, "timed", &t1, nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, mergeReports(tt.a, tt.b))
		})
	}
}

// TestFoldRunReports: the reports a run's reporter carries reach the pods
// of the shards and attempts they name, merged with those pods' own.
func TestFoldRunReports(t *testing.T) {
	t1, t2 := metav1.NewTime(t0), metav1.NewTime(t0.Add(time.Second))
	rep := func(shard, attempt int32, completed int64, msg string, at *metav1.Time) v1alpha1.ShardReport {
		return v1alpha1.ShardReport{Shard: shard, Attempt: attempt, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: completed}, Message: msg, ReportTime: at}
	}
	reporter := podInfo{pod: &corev1.Pod{}, attempt: 0, runReport: &v1alpha1.RunReport{Shards: []v1alpha1.ShardReport{
		rep(0, 0, 3, "s0", &t2), rep(1, 1, 4, "s1", &t2), rep(2, 0, 5, "s2 old attempt", &t2), rep(7, 0, 1, "no such shard", &t2),
	}}}
	// An earlier reporter of the run (it finished, its pod kept).
	earlier := podInfo{pod: &corev1.Pod{}, attempt: 1, runReport: &v1alpha1.RunReport{Shards: []v1alpha1.ShardReport{
		rep(1, 1, 6, "s1 earlier", &t1),
	}}}
	own := rep(0, 0, 2, "own", &t1)
	byShard := [][]podInfo{
		{reporter},
		{{pod: &corev1.Pod{}, attempt: 0}, earlier},
		{{pod: &corev1.Pod{}, attempt: 1}},
		{{pod: &corev1.Pod{}, attempt: 0}},
	}
	byShard[0][0].progress = &own
	foldRunReports(byShard)
	want := func(shard, attempt int32, completed int64, msg string, at *metav1.Time) *v1alpha1.ShardReport {
		r := rep(shard, attempt, completed, msg, at)
		return &r
	}
	require.Equal(t, want(0, 0, 3, "s0", &t2), byShard[0][0].progress, "the later of the run's and the pod's own report")
	require.Nil(t, byShard[1][0].progress, "attempt 0 of shard 1 is not reported on")
	require.Equal(t, want(1, 1, 6, "s1", &t2), byShard[1][1].progress, "two reporters' reports of one attempt merged: the highest count, the later message")
	require.Nil(t, byShard[2][0].progress, "a report of another attempt is not this pod's")
	require.Nil(t, byShard[3][0].progress)
}

// TestLatestReplication: the run's replication is the latest report's that
// says it, whichever kind: a shard's progress, a RunReport, a termination
// message (dated by its pod's finish); reports of workers that do not say
// it (earlier releases, a worker that could not read it) change nothing.
func TestLatestReplication(t *testing.T) {
	async := &v1alpha1.LedgerReplication{SynchronousCommit: "on"}
	sync := &v1alpha1.LedgerReplication{Synchronous: true, Standby: "flushed", SynchronousCommit: "on", SynchronousStandbyNames: "a"}
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: t0.Add(d)} }
	require.Nil(t, latestReplication([][]podInfo{{{progress: &v1alpha1.ShardReport{ReportTime: at(0)}}}}))
	require.Same(t, sync, latestReplication([][]podInfo{
		{{progress: &v1alpha1.ShardReport{ReportTime: at(time.Second), Replication: async}}},
		{{runReport: &v1alpha1.RunReport{ReportTime: at(2 * time.Second), Replication: sync}}},
		{{progress: &v1alpha1.ShardReport{ReportTime: at(3 * time.Second)}}},
	}))
	require.Same(t, async, latestReplication([][]podInfo{
		{{runReport: &v1alpha1.RunReport{ReportTime: at(2 * time.Second), Replication: sync}}},
		{{report: &v1alpha1.ShardReport{Replication: async}, finishedAt: t0.Add(5 * time.Second)}},
	}))
	// The same second (the API's resolution): the termination message,
	// written after every live report of its worker.
	require.Same(t, async, latestReplication([][]podInfo{
		{{runReport: &v1alpha1.RunReport{ReportTime: at(2 * time.Second), Replication: sync}, report: &v1alpha1.ShardReport{Replication: async}, finishedAt: t0.Add(2 * time.Second)}},
	}))
}

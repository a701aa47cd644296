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

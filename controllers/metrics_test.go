package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

func TestRunsMetric(t *testing.T) {
	scheme, err := envtestutil.Scheme()
	require.NoError(t, err)
	run := func(name string, phase v1alpha1.RunPhase) *v1alpha1.ProcessingRun {
		return &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
			Status: v1alpha1.ProcessingRunStatus{Phase: phase}}
	}
	stalled := func(name string, phase v1alpha1.RunPhase, reason string) *v1alpha1.ProcessingRun {
		r := run(name, phase)
		r.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionStalled, Status: metav1.ConditionTrue, Reason: reason}}
		return r
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		run("a", v1alpha1.RunRunning), run("b", v1alpha1.RunRunning), run("c", v1alpha1.RunSucceeded), run("d", ""),
		stalled("e", v1alpha1.RunPending, ReasonSecretNotFound), stalled("f", v1alpha1.RunRunning, ReasonWorkerNotStarting),
		stalled("g", v1alpha1.RunPending, ReasonSecretNotFound), stalled("h", v1alpha1.RunFailed, ReasonBadInput),
	).Build()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(runsCollector{reader: c}))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP runledger_runs ProcessingRuns by phase, as the controller's cache holds them.
# TYPE runledger_runs gauge
runledger_runs{phase="Failed"} 1
runledger_runs{phase="Pending"} 3
runledger_runs{phase="Running"} 3
runledger_runs{phase="Succeeded"} 1
runledger_runs{phase="Suspended"} 0
# HELP runledger_runs_stalled ProcessingRuns that cannot progress without someone acting (Stalled=True, not Failed), by reason, as the controller's cache holds them.
# TYPE runledger_runs_stalled gauge
runledger_runs_stalled{reason="SecretNotFound"} 2
runledger_runs_stalled{reason="WorkerNotStarting"} 1
`), "runledger_runs", "runledger_runs_stalled"))
}

// TestRunItemsMetric: runledger_run_items sums the counts of the runs that
// exist by namespace and verdict; a namespace without runs has no series.
func TestRunItemsMetric(t *testing.T) {
	scheme, err := envtestutil.Scheme()
	require.NoError(t, err)
	run := func(ns, name string, c v1alpha1.ItemCounts) *v1alpha1.ProcessingRun {
		return &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Status: v1alpha1.ProcessingRunStatus{ItemCounts: c}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		run("billing", "june", v1alpha1.ItemCounts{Total: 10, Completed: 6, AlreadyHandled: 1, Failed: 3}),
		run("billing", "july", v1alpha1.ItemCounts{Total: 5, Completed: 2, AlreadyHandled: 3, PayloadChanged: 1}),
		run("mail", "june", v1alpha1.ItemCounts{Total: 1, Completed: 1}),
	).Build()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(runsCollector{reader: c}))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP runledger_run_items `+runItemsHelp+`
# TYPE runledger_run_items gauge
runledger_run_items{namespace="billing",verdict="alreadyHandled"} 4
runledger_run_items{namespace="billing",verdict="completed"} 8
runledger_run_items{namespace="billing",verdict="failed"} 3
runledger_run_items{namespace="billing",verdict="payloadChanged"} 1
runledger_run_items{namespace="mail",verdict="alreadyHandled"} 0
runledger_run_items{namespace="mail",verdict="completed"} 1
runledger_run_items{namespace="mail",verdict="failed"} 0
runledger_run_items{namespace="mail",verdict="payloadChanged"} 0
`), "runledger_run_items"))
}

// durationCount is how many durations runledger_run_duration_seconds has
// observed for a result.
func durationCount(t *testing.T, result string) uint64 {
	t.Helper()
	m := &dto.Metric{}
	require.NoError(t, runDuration.WithLabelValues(result).(prometheus.Histogram).Write(m))
	return m.GetHistogram().GetSampleCount()
}

func TestFinishedRunMetrics(t *testing.T) {
	// A reason no other test uses: the counters are process-wide.
	const reason = "MetricsTestReason"
	done := time.Now()
	st := &v1alpha1.ProcessingRunStatus{Phase: v1alpha1.RunFailed,
		StartTime: &metav1.Time{Time: done.Add(-90 * time.Second)}, CompletionTime: &metav1.Time{Time: done},
		Duration: &metav1.Duration{Duration: 90 * time.Second}}
	before := durationCount(t, "Failed")
	recordFinished(st, reason)
	require.Equal(t, 1.0, testutil.ToFloat64(runsFinished.WithLabelValues("Failed", reason)))
	require.GreaterOrEqual(t, durationCount(t, "Failed"), before+1)
}

func TestItemsMetricCountsWhatStatusWritesAdd(t *testing.T) {
	before := testutil.ToFloat64(itemsTotal.WithLabelValues("completed"))
	recordItems(v1alpha1.ItemCounts{Completed: 5, Failed: 2}, v1alpha1.ItemCounts{Completed: 8, Failed: 1})
	require.Equal(t, before+3, testutil.ToFloat64(itemsTotal.WithLabelValues("completed")))
	failed := testutil.ToFloat64(itemsTotal.WithLabelValues("failed"))
	recordItems(v1alpha1.ItemCounts{Failed: 2}, v1alpha1.ItemCounts{Failed: 1}) // a retry fixed an item: a counter never goes down
	require.Equal(t, failed, testutil.ToFloat64(itemsTotal.WithLabelValues("failed")))
	changed := testutil.ToFloat64(itemsPayloadChanged)
	recordItems(v1alpha1.ItemCounts{AlreadyHandled: 4, PayloadChanged: 1}, v1alpha1.ItemCounts{AlreadyHandled: 9, PayloadChanged: 3})
	require.Equal(t, changed+2, testutil.ToFloat64(itemsPayloadChanged))
}

// TestReplicationMetric: runledger_runs_ledger_replication counts the runs
// of each namespace by what their ledger's server promises of a commit, as
// their SynchronousReplication condition says; a run whose workers have
// not said is not counted.
func TestReplicationMetric(t *testing.T) {
	scheme, err := envtestutil.Scheme()
	require.NoError(t, err)
	run := func(ns, name string, status metav1.ConditionStatus) *v1alpha1.ProcessingRun {
		r := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
		if status != "" {
			r.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionSynchronousReplication, Status: status}}
		}
		return r
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		run("billing", "a", metav1.ConditionFalse), run("billing", "b", metav1.ConditionFalse), run("billing", "c", metav1.ConditionTrue),
		run("mail", "d", metav1.ConditionTrue), run("mail", "e", ""),
	).Build()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(runsCollector{reader: c}))
	n, err := testutil.GatherAndCount(reg, "runledger_runs_ledger_replication")
	require.NoError(t, err)
	require.Equal(t, 3, n, "one series per namespace and replication seen")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "runledger_runs_ledger_replication" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["namespace"]+"/"+labels["replication"]] = m.GetGauge().GetValue()
		}
	}
	require.Equal(t, map[string]float64{"billing/asynchronous": 2, "billing/synchronous": 1, "mail/synchronous": 1}, got)
}

func TestMetricNames(t *testing.T) {
	require.ElementsMatch(t, []string{"runledger_items_total", "runledger_items_payload_changed_total", "runledger_reconcile_errors_total", "runledger_worker_pods_created_total",
		"runledger_shard_attempts_failed_total", "runledger_status_conflicts_total", "runledger_runs_finished_total",
		"runledger_run_duration_seconds", "runledger_runs", "runledger_runs_stalled", "runledger_run_items", "runledger_runs_ledger_replication",
		"runledger_schedule_runs_created_total", "runledger_schedule_missed_ticks_total",
		"runledger_schedule_next_tick_timestamp_seconds", "runledger_schedule_last_success_timestamp_seconds"}, MetricNames())
}

// TestScheduleMetrics: a schedule's gauges follow its status, and a deleted
// schedule's series go.
func TestScheduleMetrics(t *testing.T) {
	sched := &v1alpha1.ProcessingSchedule{ObjectMeta: metav1.ObjectMeta{Namespace: "metrics-ns", Name: "s"}}
	next, ok := time.Unix(1800000000, 0), time.Unix(1700000000, 0)
	recordScheduleMetrics(sched, &v1alpha1.ProcessingScheduleStatus{NextScheduleTime: &metav1.Time{Time: next}, LastSuccessfulTime: &metav1.Time{Time: ok}})
	require.Equal(t, 1800000000.0, testutil.ToFloat64(schedNextTick.WithLabelValues("metrics-ns", "s")))
	require.Equal(t, 1700000000.0, testutil.ToFloat64(schedLastSuccess.WithLabelValues("metrics-ns", "s")))
	schedMissed.WithLabelValues("metrics-ns", "s", string(v1alpha1.MissedSuspended)).Add(3)
	recordScheduleMetrics(sched, &v1alpha1.ProcessingScheduleStatus{})
	require.False(t, schedNextTick.DeleteLabelValues("metrics-ns", "s"), "suspended: no next tick")
	forgetScheduleMetrics("metrics-ns", "s")
	require.Zero(t, schedMissed.DeletePartialMatch(prometheus.Labels{"namespace": "metrics-ns"}), "already gone")
}

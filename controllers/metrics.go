package controllers

import (
	"context"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/runledger/runledger/api/v1alpha1"
)

// runItemsHelp describes runledger_run_items.
const runItemsHelp = "Items of the ProcessingRuns that exist, by namespace and verdict (completed, alreadyHandled, failed; payloadChanged: part of alreadyHandled or failed), as their status counts them and the controller's cache holds them: a namespace's series go with its last run."

// Prometheus metrics, served on the manager's metrics endpoint next to
// controller-runtime's own (reconcile rates and durations, workqueue depth).
var (
	itemsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runledger_items_total",
		Help: "Items processed by ProcessingRuns, by outcome (completed, alreadyHandled, failed), as the controller records them in the runs' status.",
	}, []string{"outcome"})
	itemsPayloadChanged = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "runledger_items_payload_changed_total",
		Help: "Items found already committed by another run with a payload that differs from the committed row's (part of runledger_items_total's alreadyHandled, or of failed with spec.onPayloadChange: Fail), as the controller records them in the runs' status.",
	})
	reconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runledger_reconcile_errors_total",
		Help: "Errors of the ProcessingRun reconciler, by step.",
	}, []string{"step"})
	podsCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "runledger_worker_pods_created_total",
		Help: "Worker pods created, first attempts and retries.",
	})
	attemptsFailed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "runledger_shard_attempts_failed_total",
		Help: "Failed shard attempts observed (each is retried until backoffLimit).",
	})
	statusConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "runledger_status_conflicts_total",
		Help: "Status writes refused because the run changed since the pass read it (a worker's report, or a run created again under its name); the next pass writes.",
	})
	runsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runledger_runs_finished_total",
		Help: "ProcessingRuns that finished, by result (Succeeded, Failed) and reason (Succeeded, BadInput, BackoffLimitExceeded, ProcessorFailed, TooManyFailedItems).",
	}, []string{"result", "reason"})
	runDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "runledger_run_duration_seconds",
		Help:    "How long finished ProcessingRuns took, from their first pod to their outcome, by result.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 16), // 1 s to 9 h
	}, []string{"result"})
	schedRunsCreated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runledger_schedule_runs_created_total",
		Help: "ProcessingRuns created by ProcessingSchedules' ticks (a tick whose run already existed is not counted).",
	}, []string{"namespace", "schedule"})
	schedMissed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runledger_schedule_missed_ticks_total",
		Help: "Ticks of ProcessingSchedules that started no run, by reason (DeadlineExceeded, NotCaughtUp, Suspended, ConcurrencyForbidden).",
	}, []string{"namespace", "schedule", "reason"})
	schedNextTick = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "runledger_schedule_next_tick_timestamp_seconds",
		Help: "When each ProcessingSchedule's next tick is due (Unix time); absent while it is suspended or stalled.",
	}, []string{"namespace", "schedule"})
	schedLastSuccess = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "runledger_schedule_last_success_timestamp_seconds",
		Help: "When the latest succeeded run of each ProcessingSchedule completed (Unix time).",
	}, []string{"namespace", "schedule"})
	runsDesc = prometheus.NewDesc("runledger_runs",
		"ProcessingRuns by phase, as the controller's cache holds them.", []string{"phase"}, nil)
	runItemsDesc    = prometheus.NewDesc("runledger_run_items", runItemsHelp, []string{"namespace", "verdict"}, nil)
	replicationDesc = prometheus.NewDesc("runledger_runs_ledger_replication",
		"ProcessingRuns by namespace and what their ledger's server promises of a commit, as their workers read it at start (the SynchronousReplication condition): synchronous (acknowledged only once a synchronous standby has it) or asynchronous (a failover can lose the latest commits; the counts are proven from the ledger, a processor may get an item again with the same idempotency key); runs whose workers have not said are not counted.",
		[]string{"namespace", "replication"}, nil)
	stalledDesc = prometheus.NewDesc("runledger_runs_stalled",
		"ProcessingRuns that cannot progress without someone acting (Stalled=True, not Failed), by reason, as the controller's cache holds them.",
		[]string{"reason"}, nil)
)

func init() {
	crmetrics.Registry.MustRegister(ownCollectors...)
	for _, r := range []v1alpha1.RunPhase{v1alpha1.RunSucceeded, v1alpha1.RunFailed} {
		runDuration.WithLabelValues(string(r))
	}
	for _, o := range []string{"completed", "alreadyHandled", "failed"} {
		itemsTotal.WithLabelValues(o)
	}
}

// recordItems adds to runledger_items_total what a status write added to a
// run's counts. The controller is the only writer of the totals, so each
// item is counted once per controller process.
func recordItems(before, after v1alpha1.ItemCounts) {
	for _, d := range []struct {
		outcome string
		n       int64
	}{
		{"completed", after.Completed - before.Completed},
		{"alreadyHandled", after.AlreadyHandled - before.AlreadyHandled},
		{"failed", after.Failed - before.Failed},
	} {
		if d.n > 0 {
			itemsTotal.WithLabelValues(d.outcome).Add(float64(d.n))
		}
	}
	if n := after.PayloadChanged - before.PayloadChanged; n > 0 {
		itemsPayloadChanged.Add(float64(n))
	}
}

// ownCollectors are runledger's metrics registered at init.
var ownCollectors = []prometheus.Collector{itemsTotal, itemsPayloadChanged, reconcileErrors, podsCreated, attemptsFailed, statusConflicts,
	runsFinished, runDuration, schedRunsCreated, schedMissed, schedNextTick, schedLastSuccess}

// recordScheduleMetrics sets a schedule's gauges from the status a pass
// computed.
func recordScheduleMetrics(sched *v1alpha1.ProcessingSchedule, st *v1alpha1.ProcessingScheduleStatus) {
	ns, name := sched.Namespace, sched.Name
	if st.NextScheduleTime != nil {
		schedNextTick.WithLabelValues(ns, name).Set(float64(st.NextScheduleTime.Unix()))
	} else {
		schedNextTick.DeleteLabelValues(ns, name)
	}
	if st.LastSuccessfulTime != nil {
		schedLastSuccess.WithLabelValues(ns, name).Set(float64(st.LastSuccessfulTime.Unix()))
	}
}

// forgetScheduleMetrics drops a deleted schedule's series.
func forgetScheduleMetrics(ns, name string) {
	labels := prometheus.Labels{"namespace": ns, "schedule": name}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{schedRunsCreated, schedMissed, schedNextTick, schedLastSuccess} {
		v.DeletePartialMatch(labels)
	}
}

// RuntimeMetricNames are controller-runtime's metrics of the manager that
// the dashboard (config/grafana) reads; TestManagerCommand checks that a
// running manager exports them.
var RuntimeMetricNames = []string{
	"controller_runtime_reconcile_time_seconds",
	"workqueue_depth",
	"workqueue_queue_duration_seconds",
}

// fqName reads a metric's name from its descriptor (prometheus.Desc keeps
// it private and prints it).
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// MetricNames are the names of runledger's own metrics, read from their
// descriptors (the alert rules' test checks that the rules read only these).
func MetricNames() []string {
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		for _, c := range append(ownCollectors, runsCollector{}) {
			c.Describe(ch)
		}
		close(ch)
	}()
	var names []string
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

// recordFinished counts a run that just finished (the pass that wrote its
// outcome; the write is conditional, so one pass per run).
func recordFinished(st *v1alpha1.ProcessingRunStatus, reason string) {
	runsFinished.WithLabelValues(string(st.Phase), reason).Inc()
	if st.Duration != nil {
		runDuration.WithLabelValues(string(st.Phase)).Observe(st.Duration.Seconds())
	}
}

// runsCollector reports runledger_runs from the cache at scrape time, so the
// gauge can never drift from the runs that exist.
type runsCollector struct {
	reader client.Reader
}

// RegisterRunsMetric registers the runledger_runs gauge, read from reader
// (the manager's cache) at each scrape. Call it once per process.
func RegisterRunsMetric(reader client.Reader) error {
	return crmetrics.Registry.Register(runsCollector{reader: reader})
}

func (c runsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- runsDesc
	ch <- stalledDesc
	ch <- runItemsDesc
	ch <- replicationDesc
}

func (c runsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var runs v1alpha1.ProcessingRunList
	if err := c.reader.List(ctx, &runs); err != nil {
		ch <- prometheus.NewInvalidMetric(runsDesc, err)
		return
	}
	byPhase := map[v1alpha1.RunPhase]int{}
	for _, p := range []v1alpha1.RunPhase{v1alpha1.RunPending, v1alpha1.RunRunning, v1alpha1.RunSucceeded, v1alpha1.RunFailed, v1alpha1.RunSuspended} {
		byPhase[p] = 0
	}
	stalled := map[string]int{}
	items := map[string]*v1alpha1.ItemCounts{} // by namespace: the labels are bounded by the runs that exist
	replication := map[[2]string]int{}         // by namespace and synchronous or asynchronous
	for i := range runs.Items {
		st := &runs.Items[i].Status
		ns := runs.Items[i].Namespace
		if items[ns] == nil {
			items[ns] = &v1alpha1.ItemCounts{}
		}
		items[ns].Add(st.ItemCounts)
		p := st.Phase
		if p == "" {
			p = v1alpha1.RunPending
		}
		byPhase[p]++
		if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionSynchronousReplication); c != nil {
			replication[[2]string{ns, replicationLabel(c.Status)}]++
		}
		if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStalled); c != nil &&
			c.Status == metav1.ConditionTrue && p != v1alpha1.RunFailed {
			stalled[c.Reason]++
		}
	}
	for p, n := range byPhase {
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(n), string(p))
	}
	for reason, n := range stalled {
		ch <- prometheus.MustNewConstMetric(stalledDesc, prometheus.GaugeValue, float64(n), reason)
	}
	for k, n := range replication {
		ch <- prometheus.MustNewConstMetric(replicationDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	for ns, c := range items {
		for verdict, n := range map[string]int64{"completed": c.Completed, "alreadyHandled": c.AlreadyHandled, "failed": c.Failed, "payloadChanged": c.PayloadChanged} {
			ch <- prometheus.MustNewConstMetric(runItemsDesc, prometheus.GaugeValue, float64(n), ns, verdict)
		}
	}
}

// replicationLabel is runledger_runs_ledger_replication's label for a
// SynchronousReplication condition's status.
func replicationLabel(s metav1.ConditionStatus) string {
	if s == metav1.ConditionTrue {
		return "synchronous"
	}
	return "asynchronous"
}

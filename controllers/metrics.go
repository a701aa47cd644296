package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/runledger/runledger/api/v1alpha1"
)

// Prometheus metrics, served on the manager's metrics endpoint next to
// controller-runtime's own (reconcile rates and durations, workqueue depth).
var (
	itemsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runledger_items_total",
		Help: "Items processed by ProcessingRuns, by outcome (completed, alreadyHandled, failed), as the controller records them in the runs' status.",
	}, []string{"outcome"})
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
	runsDesc = prometheus.NewDesc("runledger_runs",
		"ProcessingRuns by phase, as the controller's cache holds them.", []string{"phase"}, nil)
)

func init() {
	crmetrics.Registry.MustRegister(itemsTotal, reconcileErrors, podsCreated, attemptsFailed, statusConflicts)
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

func (c runsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- runsDesc }

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
	for i := range runs.Items {
		p := runs.Items[i].Status.Phase
		if p == "" {
			p = v1alpha1.RunPending
		}
		byPhase[p]++
	}
	for p, n := range byPhase {
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(n), string(p))
	}
}

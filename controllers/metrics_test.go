package controllers

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		run("a", v1alpha1.RunRunning), run("b", v1alpha1.RunRunning), run("c", v1alpha1.RunSucceeded), run("d", ""),
	).Build()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(runsCollector{reader: c}))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP runledger_runs ProcessingRuns by phase, as the controller's cache holds them.
# TYPE runledger_runs gauge
runledger_runs{phase="Failed"} 0
runledger_runs{phase="Pending"} 1
runledger_runs{phase="Running"} 2
runledger_runs{phase="Succeeded"} 1
runledger_runs{phase="Suspended"} 0
`), "runledger_runs"))
}

func TestItemsMetricCountsWhatStatusWritesAdd(t *testing.T) {
	before := testutil.ToFloat64(itemsTotal.WithLabelValues("completed"))
	recordItems(v1alpha1.ItemCounts{Completed: 5, Failed: 2}, v1alpha1.ItemCounts{Completed: 8, Failed: 1})
	require.Equal(t, before+3, testutil.ToFloat64(itemsTotal.WithLabelValues("completed")))
	failed := testutil.ToFloat64(itemsTotal.WithLabelValues("failed"))
	recordItems(v1alpha1.ItemCounts{Failed: 2}, v1alpha1.ItemCounts{Failed: 1}) // a retry fixed an item: a counter never goes down
	require.Equal(t, failed, testutil.ToFloat64(itemsTotal.WithLabelValues("failed")))
}

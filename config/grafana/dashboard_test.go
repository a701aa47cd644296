package grafana_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/controllers"
)

type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboard: runledger.json is a dashboard whose every panel has a
// query, each query parses with Prometheus' own parser, and every metric it
// reads is one the manager exports (runledger's, controllers/metrics.go, or
// controller-runtime's that TestManagerCommand finds on a running manager).
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("runledger.json")
	require.NoError(t, err)
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	require.NoError(t, dec.Decode(&d))
	require.Equal(t, "runledger", d.UID)
	require.NotEmpty(t, d.Panels)

	exported := map[string]bool{}
	for _, n := range append(controllers.MetricNames(), controllers.RuntimeMetricNames...) {
		exported[n] = true
	}
	read := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		require.NotEmpty(t, p.Targets, "panel %q has a query", p.Title)
		for _, tg := range p.Targets {
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(tg.Expr)
			require.NoError(t, err, "panel %q %s: %s", p.Title, tg.RefID, tg.Expr)
			var names []string
			parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
				if vs, ok := node.(*parser.VectorSelector); ok {
					names = append(names, vs.Name)
				}
				return nil
			})
			require.NotEmpty(t, names, "panel %q reads a metric", p.Title)
			for _, n := range names {
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && exported[b] {
						base = b
					}
				}
				require.True(t, exported[base], "panel %q reads %s, which the manager does not export (it does: %v)", p.Title, n, exported)
				read[base] = true
			}
		}
	}
	// What an on-call engineer looks at.
	for _, want := range []string{"runledger_runs", "runledger_runs_stalled", "runledger_items_total", "runledger_runs_finished_total",
		"runledger_status_conflicts_total", "runledger_reconcile_errors_total", "controller_runtime_reconcile_time_seconds"} {
		require.True(t, read[want], "the dashboard shows %s", want)
	}
}

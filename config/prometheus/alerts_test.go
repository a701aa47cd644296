package prometheus_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/testtier"
)

// TestAlertRules: prometheusrule.yaml's alerts, as Prometheus evaluates
// them, against the synthetic series of alerts_test.yaml (promtool test
// rules, the pinned promtool: $PROMTOOL, which make test sets, or make
// promtool's bin/promtool-*; not under -short); every alert has a runbook
// in docs/runbooks.
func TestAlertRules(t *testing.T) {
	raw, err := os.ReadFile("prometheusrule.yaml")
	require.NoError(t, err)
	var rule monitoringv1.PrometheusRule
	require.NoError(t, yaml.UnmarshalStrict(raw, &rule))
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			want := "https://github.com/runledger/runledger/blob/main/docs/runbooks/" + r.Alert + ".md"
			require.Equal(t, want, r.Annotations["runbook_url"], "alert %s", r.Alert)
			_, err := os.Stat(filepath.Join(envtestutil.RepoRoot(), "docs", "runbooks", r.Alert+".md"))
			require.NoError(t, err, "alert %s has a runbook", r.Alert)
		}
	}

	testtier.Needs(t, "promtool (make promtool)")
	promtool := os.Getenv("PROMTOOL")
	if promtool == "" {
		matches, _ := filepath.Glob(filepath.Join(envtestutil.RepoRoot(), "bin", "promtool-*"))
		if len(matches) == 0 {
			t.Fatal("no promtool: run make promtool (or make test), or set PROMTOOL")
		}
		promtool = matches[len(matches)-1]
	}

	// promtool reads Prometheus' rule files: the PrometheusRule's groups.
	dir := t.TempDir()
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o600))
	tests, err := os.ReadFile("alerts_test.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o600))
	out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "rules.yaml")).CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = dir
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s", out)
	t.Logf("promtool test rules:\n%s", out)
}

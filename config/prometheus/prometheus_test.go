package prometheus_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/controllers"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/testtier"
)

// TestOverlayBuilds: kubectl kustomize builds config/prometheus; its
// ServiceMonitor and PrometheusRule decode strictly into the Prometheus
// Operator's own types, the ServiceMonitor selects the manager's metrics
// Service by a port it has, and every alert reads metrics the manager
// exports.
func TestOverlayBuilds(t *testing.T) {
	testtier.Needs(t, "kubectl (hack/k8s-bins.sh builds it)")
	kubectl, err := envtestutil.Kubectl()
	require.NoError(t, err)
	dir := filepath.Join(envtestutil.RepoRoot(), "config", "prometheus")
	out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
	require.NoError(t, err, "kubectl kustomize %s: %s", dir, out)

	var sm *monitoringv1.ServiceMonitor
	var rule *monitoringv1.PrometheusRule
	var services []corev1.Service
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var meta struct{ Kind string }
		require.NoError(t, yaml.Unmarshal([]byte(doc), &meta))
		switch meta.Kind {
		case "ServiceMonitor":
			sm = &monitoringv1.ServiceMonitor{}
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), sm))
		case "PrometheusRule":
			rule = &monitoringv1.PrometheusRule{}
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), rule))
		case "Service":
			var svc corev1.Service
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), &svc))
			services = append(services, svc)
		}
	}
	require.NotNil(t, sm, "a ServiceMonitor")
	require.NotNil(t, rule, "a PrometheusRule")

	sel, err := labels.ValidatedSelectorFromSet(sm.Spec.Selector.MatchLabels)
	require.NoError(t, err)
	var selected []corev1.Service
	for _, svc := range services {
		if svc.Namespace == sm.Namespace && sel.Matches(labels.Set(svc.Labels)) {
			selected = append(selected, svc)
		}
	}
	require.Len(t, selected, 1, "the ServiceMonitor selects the metrics Service")
	require.Len(t, sm.Spec.Endpoints, 1)
	ports := map[string]bool{}
	for _, p := range selected[0].Spec.Ports {
		ports[p.Name] = true
	}
	require.True(t, ports[sm.Spec.Endpoints[0].Port], "port %q of %v", sm.Spec.Endpoints[0].Port, ports)

	// Prometheus verifies the manager's certificate: the CA of the Secret
	// cert-manager fills, the Service's name, the Secret served by the manager.
	tls := sm.Spec.Endpoints[0].TLSConfig
	require.NotNil(t, tls)
	require.False(t, tls.InsecureSkipVerify != nil && *tls.InsecureSkipVerify, "no insecureSkipVerify")
	require.Equal(t, "runledger-metrics-cert", tls.CA.Secret.Name)
	require.Equal(t, "ca.crt", tls.CA.Secret.Key)
	require.Equal(t, selected[0].Name+"."+selected[0].Namespace+".svc", *tls.ServerName)
	require.Contains(t, string(out), "secretName: runledger-metrics-cert", "the manager's volume")
	require.Contains(t, string(out), "--metrics-cert-dir=/var/run/runledger/metrics-cert")
	certs, err := exec.Command(kubectl, "kustomize", filepath.Join(envtestutil.RepoRoot(), "config", "metrics-cert")).CombinedOutput()
	require.NoError(t, err, "kubectl kustomize config/metrics-cert: %s", certs)
	require.Contains(t, string(certs), "secretName: runledger-metrics-cert", "cert-manager fills the Secret")
	require.Contains(t, string(certs), "- "+*tls.ServerName+"\n", "for the name Prometheus checks")

	exported := map[string]bool{}
	for _, name := range controllers.MetricNames() {
		exported[name] = true
	}
	metric := regexp.MustCompile(`\brunledger_[a-z_]+\b`)
	alerts := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			expr := r.Expr.String()
			names := metric.FindAllString(expr, -1)
			require.NotEmpty(t, names, "alert %s reads a runledger metric", r.Alert)
			for _, n := range names {
				require.True(t, exported[n], "alert %s reads %s, which the manager does not export (it does: %v)", r.Alert, n, controllers.MetricNames())
			}
			require.Equal(t, strings.Count(expr, "("), strings.Count(expr, ")"), "alert %s: balanced parentheses", r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
		}
	}
	require.True(t, alerts["RunledgerRunFailed"], "an alert for failed runs")
	require.True(t, alerts["RunledgerRunStalled"], "an alert for stalled runs")
}

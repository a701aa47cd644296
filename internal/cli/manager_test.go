package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/version"
)

func TestManagerFlags(t *testing.T) {
	cmd := newManagerCommand()
	for flag, def := range map[string]string{
		"leader-elect":                "true",
		"leader-election-namespace":   "",
		"metrics-bind-address":        ":8443",
		"metrics-secure":              "true",
		"pprof":                       "false",
		"metrics-cert-dir":            "",
		"health-probe-bind-address":   ":8081",
		"worker-image":                "",
		"worker-service-account":      "runledger-worker",
		"retry-backoff":               "10s",
		"retry-backoff-max":           "6m0s",
		"zap-log-level":               "",
		"zap-devel":                   "false",
		"worker-network-policy":       "true",
		"worker-apiserver-ports":      "[443,6443]",
		"worker-database-cidrs":       "[0.0.0.0/0,::/0]",
		"worker-database-ports":       "[5432]",
		"run-max-connections-default": "0",
		"run-max-connections-maximum": "0",
	} {
		f := cmd.Flags().Lookup(flag)
		require.NotNil(t, f, "--%s", flag)
		if flag != "zap-log-level" {
			require.Equal(t, def, f.DefValue, "--%s", flag)
		}
	}
}

func TestManagerRejectsBadFlags(t *testing.T) {
	cmd := newManagerCommand()
	cmd.SetArgs([]string{"--worker-image-pull-policy=Sometimes", "--leader-elect=false"})
	err := cmd.Execute()
	var exit *exitcode.Error
	require.True(t, errors.As(err, &exit), "%v", err)
	require.Equal(t, v1alpha1.ExitBadInput, exit.Code)
	require.Contains(t, err.Error(), "--worker-image-pull-policy")
}

// TestManagerRejectsBadNetworkFlags: an address or port the worker pods'
// NetworkPolicy could not hold is refused before anything starts.
func TestManagerRejectsBadNetworkFlags(t *testing.T) {
	for args, want := range map[string]string{
		"--worker-database-cidrs=10.0.0.5":    `--worker-database-cidrs: "10.0.0.5" is not a CIDR`,
		"--worker-database-ports=0":           "--worker-database-ports: 0 is not a port",
		"--worker-apiserver-ports=70000":      "--worker-apiserver-ports: 70000 is not a port",
		"--worker-database-cidrs=10.0.0.0/33": `"10.0.0.0/33" is not a CIDR`,
		// The connection budget's: each 0 or at least one worker pod's, the
		// default within the maximum.
		"--run-max-connections-default=1":                                   "--run-max-connections-default 1: want 0 (none) or 2 to 262143 connections",
		"--run-max-connections-maximum=-2":                                  "--run-max-connections-maximum -2",
		"--run-max-connections-default=80 --run-max-connections-maximum=64": "--run-max-connections-default 80 is above --run-max-connections-maximum 64",
	} {
		cmd := newManagerCommand()
		cmd.SetArgs(append(strings.Fields(args), "--leader-elect=false"))
		err := cmd.Execute()
		var exit *exitcode.Error
		require.True(t, errors.As(err, &exit), "%s: %v", args, err)
		require.Equal(t, v1alpha1.ExitBadInput, exit.Code, args)
		require.ErrorContains(t, err, want, args)
	}
}

func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(buildInfoCollector(version.Info{Version: "v1.0.0", Commit: "abc", GoVersion: "go1.99.1"})))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP runledger_build_info Always 1; the labels name the running build (version, commit, Go version).
# TYPE runledger_build_info gauge
runledger_build_info{commit="abc",goversion="go1.99.1",version="v1.0.0"} 1
`), "runledger_build_info"))
}

package worker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/worker"
)

// TestTerminationMessageCarriesAFailureSample: the final report carries the
// shard's first failures (key, class, error, each cut to the status'
// bounds), at most v1alpha1.MaxShardFailures, within the kubelet's limit.
func TestTerminationMessageCarriesAFailureSample(t *testing.T) {
	rep := worker.Report{Shard: 1}
	rep.Failed = 5
	for i := range 5 {
		rep.Failures = append(rep.Failures, worker.Failure{Entity: fmt.Sprintf("acct-%d", i), Occurrence: "2026-06",
			Error: "violates foreign key constraint " + strings.Repeat("x", 2000), Class: "23503"})
	}
	path := filepath.Join(t.TempDir(), "termination-log")
	msg := worker.ShardMessage(rep, 100)
	require.NoError(t, worker.WriteTerminationMessage(path, worker.PodEnv{Shard: 1}, rep, msg))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), v1alpha1.MaxTerminationMessageBytes)
	got, err := v1alpha1.ParseShardReport(string(b))
	require.NoError(t, err)
	require.EqualValues(t, 5, got.Failed)
	require.Len(t, got.Failures, v1alpha1.MaxShardFailures)
	for i, f := range got.Failures {
		require.Equal(t, fmt.Sprintf("acct-%d", i), f.Entity)
		require.Equal(t, "23503", f.Class)
		require.LessOrEqual(t, len(f.Error), v1alpha1.MaxFailureSampleBytes)
		require.True(t, strings.HasPrefix(f.Error, "violates foreign key constraint x"))
	}
}

package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

func TestWorkerExitCode(t *testing.T) {
	t.Parallel()
	done := worker.Report{Done: true, ItemCounts: v1alpha1.ItemCounts{Total: 3, Completed: 3}}
	for _, tt := range []struct {
		name string
		rep  worker.Report
		err  error
		// rejected: the database refused the connection.
		rejected bool
		want     int
	}{
		{"done", done, nil, false, v1alpha1.ExitSucceeded},
		{"failed items within maxFailedItems", worker.Report{Done: true, ItemCounts: v1alpha1.ItemCounts{Total: 3, Completed: 2, Failed: 1}}, nil, false, v1alpha1.ExitSucceeded},
		{"too many failed items", worker.Report{Done: true, ItemCounts: v1alpha1.ItemCounts{Total: 3, Completed: 1, Failed: 2}}, nil, false, v1alpha1.ExitFailed},
		{"interrupted", worker.Report{Interrupted: true}, nil, false, v1alpha1.ExitFailed},
		{"database unreachable", worker.Report{Err: errors.New("dial tcp: connection refused")}, nil, false, v1alpha1.ExitFailed},
		{"bad input", worker.Report{}, badInput(errors.New("line 1: entity is empty")), false, v1alpha1.ExitBadInput},
		{"connection rejected", worker.Report{Err: errors.New("password authentication failed")}, nil, true, v1alpha1.ExitBadInput},
		{"shard's lock stayed taken", worker.Report{Err: fmt.Errorf("shard 0 of run ns/r: %w", ledger.ErrShardBusy)}, nil, false, v1alpha1.ExitShardBusy},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, workerExitCode(tt.rep, tt.err, tt.rejected, 1))
		})
	}
}

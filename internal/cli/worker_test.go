package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
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
		want int
	}{
		{"done", done, nil, v1alpha1.ExitSucceeded},
		{"failed items within maxFailedItems", worker.Report{Done: true, ItemCounts: v1alpha1.ItemCounts{Total: 3, Completed: 2, Failed: 1}}, nil, v1alpha1.ExitSucceeded},
		{"too many failed items", worker.Report{Done: true, ItemCounts: v1alpha1.ItemCounts{Total: 3, Completed: 1, Failed: 2}}, nil, v1alpha1.ExitFailed},
		{"interrupted", worker.Report{Interrupted: true}, nil, v1alpha1.ExitFailed},
		{"database unreachable", worker.Report{Err: errors.New("dial tcp: connection refused")}, nil, v1alpha1.ExitFailed},
		{"bad input", worker.Report{}, badInput(errors.New("line 1: entity is empty")), v1alpha1.ExitBadInput},
		{"connection rejected", worker.Report{Err: fmt.Errorf("connecting: %w", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"})}, nil, v1alpha1.ExitBadInput},
		{"a grant revoked while the shard ran", worker.Report{Err: fmt.Errorf("chunk 3: %w", &pgconn.PgError{Code: "42501", Message: "permission denied for function run_effect"})}, nil, v1alpha1.ExitBadInput},
		{"a row refused by row-level security", worker.Report{Err: &pgconn.PgError{Code: "42501", Message: `new row violates row-level security policy for table "eff"`, Routine: "ExecWithCheckOptions"}}, nil, v1alpha1.ExitFailed},
		{"the preparation's exit code is kept", worker.Report{}, &ExitError{Code: v1alpha1.ExitFailed, Err: errors.New("database unreachable")}, v1alpha1.ExitFailed},
		{"bad input in the report beats the preparation's failure", worker.Report{Err: &worker.InputError{Where: "line 1", Field: "entity", Msg: "is empty"}}, &ExitError{Code: v1alpha1.ExitFailed, Err: errors.New("x")}, v1alpha1.ExitBadInput},
		{"shard's lock stayed taken", worker.Report{Err: fmt.Errorf("shard 0 of run ns/r: %w", ledger.ErrShardBusy)}, nil, v1alpha1.ExitShardBusy},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, workerExitCode(tt.rep, tt.err, 1))
		})
	}
}

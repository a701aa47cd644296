package exitcode

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/redact"
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
		{"bad input", worker.Report{}, BadInput(errors.New("line 1: entity is empty")), v1alpha1.ExitBadInput},
		{"connection rejected", worker.Report{Err: fmt.Errorf("connecting: %w", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"})}, nil, v1alpha1.ExitBadInput},
		{"a grant revoked while the shard ran", worker.Report{Err: fmt.Errorf("chunk 3: %w", &pgconn.PgError{Code: "42501", Message: "permission denied for function run_effect"})}, nil, v1alpha1.ExitBadInput},
		{"a row refused by row-level security", worker.Report{Err: &pgconn.PgError{Code: "42501", Message: `new row violates row-level security policy for table "eff"`, Routine: "ExecWithCheckOptions"}}, nil, v1alpha1.ExitFailed},
		{"the preparation's exit code is kept", worker.Report{}, &Error{Code: v1alpha1.ExitFailed, Err: errors.New("database unreachable")}, v1alpha1.ExitFailed},
		{"bad input in the report beats the preparation's failure", worker.Report{Err: &worker.InputError{Where: "line 1", Field: "entity", Msg: "is empty"}}, &Error{Code: v1alpha1.ExitFailed, Err: errors.New("x")}, v1alpha1.ExitBadInput},
		{"shard's lock stayed taken", worker.Report{Err: fmt.Errorf("shard 0 of run ns/r: %w", ledger.ErrShardBusy)}, nil, v1alpha1.ExitShardBusy},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, Worker(tt.rep, tt.err, 1))
		})
	}
}

func TestRedactKeepsTheCode(t *testing.T) {
	t.Parallel()
	secrets := redact.New("host=db password=hunter2")
	err := Redact(BadInput(errors.New("connecting with host=db password=hunter2")), secrets)
	require.NotContains(t, err.Error(), "hunter2")
	var exit *Error
	require.ErrorAs(t, err, &exit)
	require.Equal(t, v1alpha1.ExitBadInput, exit.Code)

	plain := &Error{Code: v1alpha1.ExitFailed, Err: errors.New("no secret here")}
	var same *Error
	require.ErrorAs(t, Redact(plain, secrets), &same)
	require.Same(t, plain, same, "untouched without a secret")
	require.NoError(t, Redact(nil, secrets))
}

// TestForPreparationErrors: what PostgreSQL says while the ledger is
// migrated and the query and effect checked decides the exit code; the
// SQLSTATEs themselves are ledger's to interpret.
func TestForPreparationErrors(t *testing.T) {
	t.Parallel()
	pg := func(code, routine string) error {
		return fmt.Errorf("applying migrations: %w", &pgconn.PgError{Code: code, Routine: routine, Message: "m"})
	}
	for _, tt := range []struct {
		name string
		err  error
		want int
		says string
	}{
		{"permission denied to create the schema", pg("42501", "aclcheck_error"), v1alpha1.ExitBadInput, ""},
		{"undefined table", pg("42P01", ""), v1alpha1.ExitBadInput, ""},
		{"invalid schema name", pg("3F000", ""), v1alpha1.ExitBadInput, ""},
		{"feature not supported", pg("0A000", ""), v1alpha1.ExitBadInput, ""},
		{"bad query", &worker.InputError{Where: "batch.query", Msg: "is empty"}, v1alpha1.ExitBadInput, "batch.query is empty"},
		{"wrong password", pg("28P01", ""), v1alpha1.ExitBadInput, "rejected the connection string's credentials"},
		{"no such database", pg("3D000", ""), v1alpha1.ExitBadInput, "does not exist"},
		{"row refused by row-level security", pg("42501", "ExecWithCheckOptions"), v1alpha1.ExitFailed, ""},
		{"unreachable", fmt.Errorf("migrating the ledger: %w", io.ErrUnexpectedEOF), v1alpha1.ExitFailed, ""},
		{"serialization failure", pg("40001", ""), v1alpha1.ExitFailed, ""},
		{"already decided", &Error{Code: v1alpha1.ExitFailed, Err: pg("42601", "")}, v1alpha1.ExitFailed, ""},
	} {
		var exit *Error
		require.ErrorAs(t, For(tt.err), &exit, tt.name)
		require.Equal(t, tt.want, exit.Code, "%s: For(%v)", tt.name, tt.err)
		require.Contains(t, exit.Error(), tt.says, tt.name)
		require.ErrorContains(t, exit, tt.err.Error(), "%s: the cause is kept", tt.name)
	}
}

package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// multiWrap is a custom error type with its own Unwrap() []error, like the
// wrappers persistence layers add.
type multiWrap struct{ errs []error }

func (m multiWrap) Error() string   { return "persistence layer: several causes" }
func (m multiWrap) Unwrap() []error { return m.errs }

// layer is a custom single wrapper.
type layer struct{ err error }

func (l layer) Error() string { return "repository: " + l.err.Error() }
func (l layer) Unwrap() error { return l.err }

func wrap(err error, times int) error {
	for i := range times {
		err = fmt.Errorf("layer %d: %w", i, err)
	}
	return err
}

// TestIsExpectedBusinessKeyConflict_BuiltErrors checks the classifier's logic on
// errors built in Go. TestIsExpectedBusinessKeyConflict_RealEngine below does
// the same with errors PostgreSQL itself produced.
func TestIsExpectedBusinessKeyConflict_BuiltErrors(t *testing.T) {
	t.Parallel()
	expected := &pgconn.PgError{Code: "23505", ConstraintName: ledger.BusinessKeyIndex, SchemaName: "runledger", TableName: "ledger"}
	otherUnique := &pgconn.PgError{Code: "23505", ConstraintName: "ledger_pkey", SchemaName: "runledger", TableName: "ledger"}
	otherSchema := &pgconn.PgError{Code: "23505", ConstraintName: ledger.BusinessKeyIndex, SchemaName: "billing", TableName: "ledger"}
	fk := &pgconn.PgError{Code: "23503", ConstraintName: "invoices_account_fkey"}
	check := &pgconn.PgError{Code: "23514", ConstraintName: "ledger_state_check"}
	notNull := &pgconn.PgError{Code: "23502", ColumnName: "entity"}
	// The right index name with the wrong SQLSTATE is not the rule's violation.
	wrongCode := &pgconn.PgError{Code: "23P01", ConstraintName: ledger.BusinessKeyIndex, SchemaName: "runledger"}

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"expected conflict, bare", expected, true},
		{"expected conflict, wrapped once", wrap(expected, 1), true},
		{"expected conflict, wrapped three times", wrap(expected, 3), true},
		{"expected conflict inside errors.Join", errors.Join(errors.New("rollback: conn busy"), wrap(expected, 1)), true},
		{"expected conflict behind a custom Unwrap", layer{wrap(expected, 2)}, true},
		{"expected conflict behind a custom Unwrap []error", multiWrap{[]error{io.ErrClosedPipe, layer{expected}}}, true},
		{"another unique index on the same table", wrap(otherUnique, 1), false},
		{"same index name in another schema", otherSchema, false},
		{"foreign-key violation", wrap(fk, 2), false},
		{"check violation", check, false},
		{"not-null violation", notNull, false},
		{"exclusion violation naming the index", wrongCode, false},
		{"bare persistence error", errors.New("persistence: could not save entity"), false},
		{"no rows", pgx.ErrNoRows, false},
		{"context canceled", context.Canceled, false},
		{"wrapped context canceled", fmt.Errorf("committing: %w", context.Canceled), false},
		{"join of other failures", errors.Join(fk, otherUnique, check), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, ledger.IsExpectedBusinessKeyConflict(tt.err),
				"IsExpectedBusinessKeyConflict(%v)", tt.err)
		})
	}
}

// engineError runs sql (expected to fail) and returns PostgreSQL's error.
func engineError(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) error {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.Error(t, err, "statement should have failed: %s", sql)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "want a PostgreSQL error from: %s", sql)
	return err
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, "executing: %s", sql)
}

const directInsert = `INSERT INTO runledger.ledger (entity, occurrence, state, run_namespace, run_name, run_uid, shard, attempt, superseded_at)
VALUES ($1, $2, $3, 'ns', 'direct', 'uid-direct', 0, 0, CASE WHEN $3 = 'superseded' THEN now() END)`

// TestIsExpectedBusinessKeyConflict_RealEngine: every case is an error the real
// PostgreSQL produced; no PgError is built by hand.
func TestIsExpectedBusinessKeyConflict_RealEngine(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, directInsert, "acct-1", "2026-11", "committed")
	// Another unique rule on the very same table.
	mustExec(t, pool, `CREATE UNIQUE INDEX other_payload_uq ON runledger.ledger ((payload->>'ref')) WHERE payload ? 'ref'`)
	mustExec(t, pool, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt, payload)
		VALUES ('acct-2', '2026-11', 'ns', 'r', 'u', 0, 0, '{"ref": "x"}')`)
	// The same index name in another schema, on a look-alike table.
	mustExec(t, pool, `CREATE SCHEMA billing`)
	mustExec(t, pool, `CREATE TABLE billing.ledger (entity text, occurrence text, state text)`)
	mustExec(t, pool, `CREATE UNIQUE INDEX `+ledger.BusinessKeyIndex+` ON billing.ledger (entity, occurrence) WHERE state = 'committed'`)
	mustExec(t, pool, `INSERT INTO billing.ledger VALUES ('a', 'b', 'committed')`)
	// A foreign key.
	mustExec(t, pool, `CREATE TABLE accounts (id text PRIMARY KEY)`)
	mustExec(t, pool, `CREATE TABLE invoices (account text REFERENCES accounts, period text)`)

	expected := engineError(t, pool, directInsert, "acct-1", "2026-11", "committed")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"expected conflict, bare", expected, true},
		{"expected conflict, wrapped once", wrap(expected, 1), true},
		{"expected conflict, wrapped three times", wrap(expected, 3), true},
		{"expected conflict inside errors.Join", errors.Join(errors.New("rollback"), expected), true},
		{"another unique index on the same table", engineError(t, pool,
			`INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt, payload)
			 VALUES ('acct-3', '2026-11', 'ns', 'r', 'u', 0, 0, '{"ref": "x"}')`), false},
		{"primary key of the same table", engineError(t, pool,
			`INSERT INTO runledger.ledger (id, entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
			 OVERRIDING SYSTEM VALUE SELECT id, 'acct-4', 'x', 'ns', 'r', 'u', 0, 0 FROM runledger.ledger LIMIT 1`), false},
		{"same index name in another schema", engineError(t, pool, `INSERT INTO billing.ledger VALUES ('a', 'b', 'committed')`), false},
		{"foreign-key violation", wrap(engineError(t, pool, `INSERT INTO invoices VALUES ('nobody', '2026-11')`), 2), false},
		{"check violation", engineError(t, pool, directInsert, "acct-5", "2026-11", "bogus"), false},
		{"check violation, empty key part", engineError(t, pool, directInsert, "", "2026-11", "committed"), false},
		{"not-null violation", engineError(t, pool, directInsert, nil, "2026-11", "committed"), false},
		{"no rows", func() error {
			var x int
			return pool.QueryRow(context.Background(), `SELECT 1 WHERE false`).Scan(&x)
		}(), false},
		{"context canceled", func() error {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := pool.Exec(ctx, `SELECT 1`)
			return err
		}(), false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, ledger.IsExpectedBusinessKeyConflict(tt.err), "%s: IsExpectedBusinessKeyConflict(%v)", tt.name, tt.err)
	}
	// The expected conflict left exactly one committed row behind.
	require.Equal(t, 1, countRows(t, pool, "acct-1", "2026-11", "committed"))
}

func TestIsRetryable(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code} }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"serialization failure", pg("40001"), true},
		{"deadlock", wrap(pg("40P01"), 2), true},
		{"admin shutdown", pg("57P01"), true},
		{"cannot connect now", pg("57P03"), true},
		{"too many connections", pg("53300"), true},
		{"connection failure class 08", pg("08006"), true},
		{"unexpected EOF", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), true},
		{"business-key conflict", pg("23505"), false},
		{"foreign key", pg("23503"), false},
		{"syntax error", pg("42601"), false},
		{"bare error", errors.New("boom"), false},
		{"context canceled", context.Canceled, false},
		{"deadline exceeded", fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, ledger.IsRetryable(tt.err), "IsRetryable(%v)", tt.err)
		})
	}
}

// TestIsRetryable_RealConnectionLoss: a session killed by the server, and a
// server that is not there, are retryable.
func TestIsRetryable_RealConnectionLoss(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var pid int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	mustExec(t, pool, `SELECT pg_terminate_backend($1)`, pid)
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the terminated session must fail")
	require.True(t, ledger.IsRetryable(err), "a terminated session is retryable: %v", err)

	cfg := pool.Config().ConnConfig.Copy()
	cfg.Host, cfg.Port = "127.0.0.1", 1 // nothing listens there
	_, err = pgx.ConnectConfig(ctx, cfg)
	require.Error(t, err)
	require.True(t, ledger.IsRetryable(err), "a refused connection is retryable: %v", err)
}

// engineErrorAsRole runs sql as role (SET LOCAL ROLE, in a transaction rolled
// back afterwards) and returns PostgreSQL's error.
func engineErrorAsRole(t *testing.T, pool *pgxpool.Pool, role, sql string) error {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL ROLE `+role)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sql)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "want a PostgreSQL error from: %s", sql)
	return err
}

// TestIsStatementLevel: errors that condemn the statement whatever its items
// (every item fails alike, without bisection) against errors that depend on
// the row (isolated item by item). Built errors first, then errors of the real
// engine.
func TestIsStatementLevel(t *testing.T) {
	t.Parallel()
	pg := func(code, routine string) error { return &pgconn.PgError{Code: code, Routine: routine} }
	built := []struct {
		name string
		err  error
		want bool
	}{
		{"syntax error", pg("42601", "scanner_yyerror"), true},
		{"undefined table", wrap(pg("42P01", "parserOpenTable"), 2), true},
		{"permission denied", pg("42501", "aclcheck_error"), true},
		{"row-level security WITH CHECK", wrap(pg("42501", "ExecWithCheckOptions"), 2), false},
		{"feature not supported", pg("0A000", ""), true},
		{"invalid schema name", pg("3F000", ""), true},
		{"read-only transaction", pg("25006", ""), true},
		{"foreign key", pg("23503", "ri_ReportViolation"), false},
		{"malformed json", pg("22P02", ""), false},
		{"bare error", errors.New("boom"), false},
		{"nil", nil, false},
	}
	for _, tt := range built {
		require.Equal(t, tt.want, ledger.IsStatementLevel(tt.err), "built %s: IsStatementLevel(%v)", tt.name, tt.err)
	}

	pool := newPool(t)
	db := pool.Config().ConnConfig.Database
	role := "stmt_" + db[strings.LastIndex(db, "_")+1:] + fmt.Sprint(len(db))
	mustExec(t, pool, fmt.Sprintf(`
CREATE ROLE %[1]s;
CREATE TABLE notes (account text NOT NULL);
ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
CREATE POLICY notes_known ON notes USING (account <> 'hidden') WITH CHECK (account NOT LIKE 'nobody-%%');
GRANT SELECT, INSERT, UPDATE ON notes TO %[1]s;
INSERT INTO notes VALUES ('acct-1'), ('hidden');
CREATE TABLE secrets (a text);
CREATE TABLE accounts (id text PRIMARY KEY);
CREATE TABLE invoices (account text REFERENCES accounts)`, role))
	engine := []struct {
		name string
		err  error
		want bool
	}{
		{"row-level security WITH CHECK on insert", engineErrorAsRole(t, pool, role, `INSERT INTO notes VALUES ('nobody-1')`), false},
		{"row-level security WITH CHECK on update", engineErrorAsRole(t, pool, role, `UPDATE notes SET account = 'nobody-2'`), false},
		{"permission denied for table", engineErrorAsRole(t, pool, role, `INSERT INTO secrets VALUES ('x')`), true},
		{"permission denied to delete", engineErrorAsRole(t, pool, role, `DELETE FROM notes`), true},
		{"syntax error", engineError(t, pool, `INSERT INTO notes VALUE ('x')`), true},
		{"undefined table", engineError(t, pool, `INSERT INTO nope VALUES (1)`), true},
		{"foreign key", engineError(t, pool, `INSERT INTO invoices VALUES ('nobody')`), false},
		{"malformed json", engineError(t, pool, `SELECT '{'::jsonb`), false},
	}
	for _, tt := range engine {
		require.Equal(t, tt.want, ledger.IsStatementLevel(tt.err), "engine %s: IsStatementLevel(%v)", tt.name, tt.err)
	}
}

package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
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
	expected := &pgconn.PgError{Code: "23505", ConstraintName: ledger.BusinessKeyIndex, SchemaName: "runledger", TableName: "ledger",
		Routine: "_bt_check_unique", File: "nbtinsert.c"}
	// What a PL/pgSQL RAISE sets: every field but the routine and file.
	forged := &pgconn.PgError{Code: "23505", ConstraintName: ledger.BusinessKeyIndex, SchemaName: "runledger", TableName: "ledger",
		Routine: "exec_stmt_raise", File: "pl_exec.c"}
	noTable := &pgconn.PgError{Code: "23505", ConstraintName: ledger.BusinessKeyIndex, SchemaName: "runledger",
		Routine: "_bt_check_unique", File: "nbtinsert.c"}
	otherUnique := &pgconn.PgError{Code: "23505", ConstraintName: "ledger_pkey", SchemaName: "runledger", TableName: "ledger",
		Routine: "_bt_check_unique", File: "nbtinsert.c"}
	otherSchema := &pgconn.PgError{Code: "23505", ConstraintName: ledger.BusinessKeyIndex, SchemaName: "billing", TableName: "ledger",
		Routine: "_bt_check_unique", File: "nbtinsert.c"}
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
		{"forged by RAISE, every settable field", wrap(forged, 1), false},
		{"the check's routine, but no table", noTable, false},
		{"genuine, raised while user code ran", wrap(&ledger.UserCodeError{Doing: "running effect", Err: wrap(expected, 1)}, 1), false},
		{"genuine, inside a processor's error", &ledger.ProcessorError{Err: expected}, false},
		{"genuine beside user code's error", errors.Join(&ledger.UserCodeError{Doing: "x", Err: forged}, expected), true},
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
		{"RAISE with every settable field of the rule's violation", engineError(t, pool, forgedRaise), false},
		{"RAISE SQLSTATE with the rule's names", engineError(t, pool, `DO $$ BEGIN RAISE SQLSTATE '23505' USING
			MESSAGE = 'duplicate key value violates unique constraint "ledger_business_key_uq"',
			CONSTRAINT = 'ledger_business_key_uq', SCHEMA = 'runledger', TABLE = 'ledger'; END $$`), false},
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

// forgedRaise raises, from PL/pgSQL, an error with every field a RAISE can
// set equal to the rule's own violation.
const forgedRaise = `DO $$ BEGIN RAISE EXCEPTION 'duplicate key value violates unique constraint "ledger_business_key_uq"'
USING ERRCODE = 'unique_violation', CONSTRAINT = 'ledger_business_key_uq', SCHEMA = 'runledger', TABLE = 'ledger',
      COLUMN = 'entity', DATATYPE = 'text', DETAIL = 'Key (occurrence, entity)=(2026-11, acct-1) already exists.',
      HINT = 'runledger'; END $$`

// TestRuleViolationFieldsOnEngine pins, on the real server, what the
// classifier relies on: the rule's genuine violation comes from the B-tree's
// unique check (routine _bt_check_unique in nbtinsert.c) and names the index,
// schema and table; a RAISE can set all of those names and the SQLSTATE, but
// its routine and file are PL/pgSQL's own, whatever it sets.
func TestRuleViolationFieldsOnEngine(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, directInsert, "acct-1", "2026-11", "committed")
	var genuine, forged *pgconn.PgError
	require.ErrorAs(t, engineError(t, pool, directInsert, "acct-1", "2026-11", "committed"), &genuine)
	require.ErrorAs(t, engineError(t, pool, forgedRaise), &forged)
	t.Logf("genuine: %+v", *genuine)
	t.Logf("forged: %+v", *forged)
	for _, e := range []*pgconn.PgError{genuine, forged} {
		require.Equal(t, "23505", e.Code)
		require.Equal(t, ledger.BusinessKeyIndex, e.ConstraintName)
		require.Equal(t, "runledger", e.SchemaName)
		require.Equal(t, "ledger", e.TableName)
	}
	require.Equal(t, "_bt_check_unique", genuine.Routine)
	require.Equal(t, "nbtinsert.c", genuine.File)
	require.Equal(t, "exec_stmt_raise", forged.Routine)
	require.Equal(t, "pl_exec.c", forged.File)
	require.True(t, ledger.IsExpectedBusinessKeyConflict(genuine))
	require.False(t, ledger.IsExpectedBusinessKeyConflict(forged))
}

// TestIsAppendOnlyViolation: the append-only trigger's refusal, as the real
// engine reports it, and nothing else; it is an item's failure, never
// "already handled", retryable or statement-level.
func TestIsAppendOnlyViolation(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, directInsert, "acct-1", "2026-11", "committed")
	mustExec(t, pool, `CREATE TABLE accounts (id text PRIMARY KEY); CREATE TABLE invoices (account text REFERENCES accounts ON DELETE RESTRICT);
INSERT INTO accounts VALUES ('a'); INSERT INTO invoices VALUES ('a')`)
	refused := engineError(t, pool, `DELETE FROM runledger.ledger`)
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"DELETE", refused, true},
		{"DELETE, wrapped", wrap(refused, 3), true},
		{"UPDATE of the key", engineError(t, pool, `UPDATE runledger.ledger SET entity = 'x'`), true},
		{"TRUNCATE", engineError(t, pool, `TRUNCATE runledger.ledger`), true},
		{"another restrict violation", engineError(t, pool, `DELETE FROM accounts`), false},
		{"the rule's name in another schema", &pgconn.PgError{Code: "23001", ConstraintName: ledger.AppendOnlyRule, SchemaName: "billing"}, false},
		{"business-key conflict", engineError(t, pool, directInsert, "acct-1", "2026-11", "committed"), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, ledger.IsAppendOnlyViolation(tt.err), "%s: IsAppendOnlyViolation(%v)", tt.name, tt.err)
		if tt.want {
			require.False(t, ledger.IsExpectedBusinessKeyConflict(tt.err), tt.name)
			require.False(t, ledger.IsRetryable(tt.err), tt.name)
			require.False(t, ledger.IsStatementLevel(tt.err), tt.name)
			require.False(t, ledger.IsConfigurationError(tt.err), tt.name)
		}
	}
	require.Equal(t, 1, countRows(t, pool, "acct-1", "2026-11", "committed"), "the row is still there")
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
		{"lock timeout", wrap(pg("55P03"), 2), true},
		{"statement timeout", pg("57014"), true},
		{"read-only session", wrap(pg("25006"), 2), true},
		{"standby refusing READ WRITE", &pgconn.PgError{Code: "0A000", Routine: "call_bool_check_hook", File: "guc.c"}, true},
		{"business-key conflict", pg("23505"), false},
		{"append-only ledger", &pgconn.PgError{Code: "23001", ConstraintName: ledger.AppendOnlyRule}, false},
		{"foreign key", pg("23503"), false},
		{"syntax error", pg("42601"), false},
		{"row-level security", pg("42501"), false},
		{"wrong password", wrap(pg("28P01"), 2), false},
		{"role may not log in", pg("28000"), false},
		{"no such database", pg("3D000"), false},
		{"wrong password beside a connection failure", errors.Join(pg("08006"), pg("28P01")), false},
		{"bare error", errors.New("boom"), false},
		{"context canceled", context.Canceled, false},
		{"wrapped context canceled", fmt.Errorf("x: %w", context.Canceled), false},
		// An expired deadline may be pgx's connect_timeout; whether the
		// caller's own ended is its context's to say (worker.Backoff.Do).
		{"deadline exceeded, the caller's context decides", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, ledger.IsRetryable(tt.err), "IsRetryable(%v)", tt.err)
		})
	}
}

// TestIsReadOnlySession: a session that may not write (25006, or a standby
// refusing a BEGIN's READ WRITE) is retryable and never the items' failure
// nor a configuration error; what user code raised is not read (an effect
// that made its own transaction read-only fails its items, statement-level).
func TestIsReadOnlySession(t *testing.T) {
	t.Parallel()
	readOnly := &pgconn.PgError{Code: "25006", Message: "cannot execute INSERT in a read-only transaction"}
	inRecovery := &pgconn.PgError{Code: "0A000", Message: "cannot set transaction read-write mode during recovery",
		Routine: "call_bool_check_hook", File: "guc.c"}
	tests := []struct {
		name                           string
		err                            error
		readOnly, retryable, statement bool
	}{
		{"25006", readOnly, true, true, true},
		{"25006, wrapped", wrap(readOnly, 3), true, true, true},
		{"25006 in a custom wrapper", layer{readOnly}, true, true, true},
		{"25006 inside errors.Join", errors.Join(errors.New("rollback: conn closed"), readOnly), true, true, true},
		{"standby refusing READ WRITE", fmt.Errorf("beginning transaction: %w", inRecovery), true, true, false},
		{"25006 raised by an effect", &ledger.UserCodeError{Doing: "running effect", Err: readOnly}, false, false, true},
		{"another 0A000", &pgconn.PgError{Code: "0A000", Routine: "transformLockingClause"}, false, false, true},
		{"another class 25", &pgconn.PgError{Code: "25001"}, false, false, true},
		{"bare error", errors.New("cannot execute INSERT in a read-only transaction"), false, false, false},
		{"nil", nil, false, false, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.readOnly, ledger.IsReadOnlySession(tt.err), "%s: IsReadOnlySession(%v)", tt.name, tt.err)
		require.Equal(t, tt.retryable, ledger.IsRetryable(tt.err), "%s: IsRetryable(%v)", tt.name, tt.err)
		require.Equal(t, tt.statement, ledger.IsStatementLevel(tt.err), "%s: IsStatementLevel(%v)", tt.name, tt.err)
		if tt.readOnly {
			require.False(t, ledger.IsConfigurationError(tt.err), "%s: the server, not the statement", tt.name)
			_, refused := ledger.RefusedStatement(tt.err)
			require.False(t, refused, "%s: not a refusal of the statement", tt.name)
		}
	}
}

// TestReadOnlySessionLeavesThePool: a session that met 25006 (here the
// database's default_transaction_read_only, as a standby's sessions) is
// closed, not given back to the pool: once the server may write again, the
// pool's next statement runs on a new session and succeeds. A standby's
// refusal of READ WRITE comes from the same check of a bool setting as
// default_with_oids' (call_bool_check_hook in guc.c), whose fields are
// pinned here on the real server.
func TestReadOnlySessionLeavesThePool(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "sets default_transaction_read_only on the database, which the pooler's server sessions keep")
	ctx := context.Background()
	dsn := newPool(t).Config().ConnString()
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	_, err = admin.Exec(ctx, `CREATE TABLE notes (n int)`)
	require.NoError(t, err)
	db := pgx.Identifier{admin.Config().Database}.Sanitize()
	_, err = admin.Exec(ctx, `ALTER DATABASE `+db+` SET default_transaction_read_only = on`)
	require.NoError(t, err)

	pool, err := ledger.Open(ctx, dsn, 1) // one session: the next statement gets it back, if it is kept
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `INSERT INTO public.notes VALUES (1)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "25006", pgErr.Code, "a session of a read-only database: %v", err)
	require.True(t, ledger.IsReadOnlySession(err))
	require.True(t, ledger.IsRetryable(err))

	_, err = admin.Exec(ctx, `ALTER DATABASE `+db+` RESET default_transaction_read_only`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO public.notes VALUES (2)`)
	require.NoError(t, err, "the read-only session left the pool; a new one may write")

	_, err = pool.Exec(ctx, `SET default_with_oids = on`)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, []string{"0A000", "call_bool_check_hook", "guc.c"}, []string{pgErr.Code, pgErr.Routine, pgErr.File},
		"a bool setting's check refusing with 0A000, as a standby refuses READ WRITE")
}

// TestIsRetryable_RealConnectionLoss: a session killed by the server, and a
// server that is not there, are retryable.
func TestIsRetryable_RealConnectionLoss(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "terminates its own backend")
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

// engineErrorIn runs setup then sql (expected to fail) in one transaction,
// rolled back afterwards, and returns PostgreSQL's error: for SET LOCAL
// settings that must not outlive the statement.
func engineErrorIn(t *testing.T, pool *pgxpool.Pool, setup []string, sql string) error {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range setup {
		_, err = tx.Exec(ctx, s)
		require.NoError(t, err, "executing: %s", s)
	}
	_, err = tx.Exec(ctx, sql)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "want a PostgreSQL error from: %s", sql)
	return err
}

func engineErrorAsRole(t *testing.T, pool *pgxpool.Pool, role, sql string) error {
	t.Helper()
	return engineErrorIn(t, pool, []string{`SET LOCAL ROLE ` + role}, sql)
}

// TestStatementLevelAndConfigurationErrors: IsStatementLevel (the error
// condemns the statement whatever its items: every item fails alike, without
// bisection) and IsConfigurationError (only a change of the query, the effect
// or the role's grants can cure it: exit code 2 in the CLI), on one table.
// A statement-level error is a configuration error or a transaction-state
// error (class 25); a row refused by a row-level security policy is neither.
// Built errors first, then errors of the real engine.
func TestStatementLevelAndConfigurationErrors(t *testing.T) {
	t.Parallel()
	pg := func(code, routine string) error { return &pgconn.PgError{Code: code, Routine: routine} }
	type row struct {
		name                   string
		err                    error
		statementLevel, config bool
	}
	check := func(kind string, rows []row) {
		t.Helper()
		for _, tt := range rows {
			require.Equal(t, tt.statementLevel, ledger.IsStatementLevel(tt.err), "%s %s: IsStatementLevel(%v)", kind, tt.name, tt.err)
			require.Equal(t, tt.config, ledger.IsConfigurationError(tt.err), "%s %s: IsConfigurationError(%v)", kind, tt.name, tt.err)
		}
	}
	check("built", []row{
		{"syntax error", pg("42601", "scanner_yyerror"), true, true},
		{"undefined table, wrapped", wrap(pg("42P01", "parserOpenTable"), 2), true, true},
		{"undefined column in a custom wrapper", layer{pg("42703", "")}, true, true},
		{"permission denied", pg("42501", "aclcheck_error"), true, true},
		{"inside a join", errors.Join(io.EOF, pg("42883", "")), true, true},
		{"row-level security WITH CHECK", wrap(pg("42501", "ExecWithCheckOptions"), 2), false, false},
		{"feature not supported", pg("0A000", ""), true, true},
		{"invalid schema name", multiWrap{[]error{errors.New("x"), pg("3F000", "")}}, true, true},
		{"read-only transaction", pg("25006", ""), true, false},
		{"foreign key", pg("23503", "ri_ReportViolation"), false, false},
		{"malformed json", pg("22P02", ""), false, false},
		{"wrong password", pg("28P01", ""), false, false},
		{"no such database", pg("3D000", ""), false, false},
		{"statement_timeout", pg("57014", ""), false, false},
		{"not a SQLSTATE", pg("42", ""), false, false},
		{"bare error mentioning 42601", errors.New("SQLSTATE 42601"), false, false},
		{"nil", nil, false, false},
	})

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
	missingSchema := engineError(t, pool, `CREATE TABLE nope.t (a int)`)
	lockedAggregate := engineError(t, pool, `SELECT count(*) FROM notes FOR UPDATE`)
	check("engine", []row{
		{"syntax error", engineError(t, pool, `INSERT INTO notes VALUE ('x')`), true, true},
		{"undefined table", engineError(t, pool, `INSERT INTO nope VALUES (1)`), true, true},
		{"undefined column", engineError(t, pool, `SELECT nope FROM notes`), true, true},
		{"undefined function", engineError(t, pool, `SELECT nope(1)`), true, true},
		{"permission denied for table", engineErrorAsRole(t, pool, role, `INSERT INTO secrets VALUES ('x')`), true, true},
		{"permission denied to delete", engineErrorAsRole(t, pool, role, `DELETE FROM notes`), true, true},
		{"invalid schema name", missingSchema, true, true},
		{"feature not supported", lockedAggregate, true, true},
		{"row-level security WITH CHECK on insert", engineErrorAsRole(t, pool, role, `INSERT INTO notes VALUES ('nobody-1')`), false, false},
		{"row-level security WITH CHECK on update", engineErrorAsRole(t, pool, role, `UPDATE notes SET account = 'nobody-2'`), false, false},
		{"read-only transaction", engineErrorIn(t, pool, []string{`SET TRANSACTION READ ONLY`}, `INSERT INTO notes VALUES ('a')`), true, false},
		{"foreign key", engineError(t, pool, `INSERT INTO invoices VALUES ('nobody')`), false, false},
		{"malformed json", engineError(t, pool, `SELECT '{'::jsonb`), false, false},
		{"division by zero", engineError(t, pool, `SELECT 1/0`), false, false},
		{"statement_timeout", engineErrorIn(t, pool, []string{`SET LOCAL statement_timeout = '50ms'`}, `SELECT pg_sleep(10)`), false, false},
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, missingSchema, &pgErr)
	require.Equal(t, "3F000", pgErr.Code, "a missing schema's SQLSTATE")
	require.ErrorAs(t, lockedAggregate, &pgErr)
	require.Equal(t, "0A000", pgErr.Code, "FOR UPDATE with an aggregate's SQLSTATE")
}

// TestRefusedStatement: the server's own error comes back for a statement it
// refused for good, whatever the class; nothing for an error after which the
// statement may be fine (retryable, the end of a context) or one without a
// PostgreSQL cause.
func TestRefusedStatement(t *testing.T) {
	t.Parallel()
	pg := func(code string) *pgconn.PgError { return &pgconn.PgError{Code: code, Message: "m"} }
	syntax, divide := pg("42601"), pg("22012")
	tests := []struct {
		name string
		err  error
		want *pgconn.PgError // nil: not refused
	}{
		{"syntax error", wrap(syntax, 2), syntax},
		{"division by zero", layer{divide}, divide},
		{"serialization failure", pg("40001"), nil},
		{"statement_timeout", wrap(pg("57014"), 1), nil},
		{"connection lost", errors.Join(io.EOF, pg("08006")), nil},
		{"the caller cancelled", errors.Join(context.Canceled, pg("42601")), nil},
		{"the caller's deadline", errors.Join(context.DeadlineExceeded, pg("42601")), nil},
		{"bare error", errors.New("syntax error"), nil},
		{"nil", nil, nil},
	}
	for _, tt := range tests {
		got, ok := ledger.RefusedStatement(tt.err)
		require.Equal(t, tt.want != nil, ok, "%s: RefusedStatement(%v)", tt.name, tt.err)
		require.Same(t, tt.want, got, tt.name)
	}

	pool := newPool(t)
	got, ok := ledger.RefusedStatement(engineError(t, pool, `SELECT * FROM nope`))
	require.True(t, ok, "a missing table is refused")
	require.Equal(t, "42P01", got.Code)
	require.Contains(t, got.Message, `relation "nope" does not exist`)
	_, ok = ledger.RefusedStatement(engineErrorIn(t, pool, []string{`SET LOCAL statement_timeout = '50ms'`}, `SELECT pg_sleep(10)`))
	require.False(t, ok, "a statement_timeout is not a refusal")
}

// TestConnectionRejected_BuiltErrors: credentials (class 28) and a missing
// database (3D000) are rejections, each with its own words; nothing else is.
func TestConnectionRejected_BuiltErrors(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "m"} }
	// PgBouncer's refusals, as Debian's 1.18 sends them (TestConnectionRejected_RealPgBouncer).
	bouncer := func(severity, msg string) error {
		return &pgconn.PgError{Code: "08P01", Severity: severity, Message: msg}
	}
	const creds, nodb = "rejected the connection string's credentials", "database named in the connection string does not exist"
	const poolerNoDB = "the connection pooler knows no database of the name in the connection string"
	tests := []struct {
		name string
		err  error
		want string // "": not a rejection
	}{
		{"wrong password", wrap(pg("28P01"), 3), creds},
		{"invalid authorization", pg("28000"), creds},
		{"no such database", layer{pg("3D000")}, nodb},
		{"inside a join", errors.Join(io.EOF, pg("3D000")), nodb},
		{"too many connections", pg("53300"), ""},
		{"connection failure", pg("08006"), ""},
		{"permission denied", pg("42501"), ""},
		{"invalid schema", pg("3F000"), ""},
		{"bare error", errors.New("password authentication failed"), ""},
		{"PgBouncer, md5", wrap(bouncer("FATAL", "password authentication failed"), 2), creds},
		{"PgBouncer, scram", bouncer("FATAL", "SASL authentication failed"), creds},
		{"PgBouncer, no such database", bouncer("FATAL", "no such database: billing"), poolerNoDB},
		{"PgBouncer, another protocol violation", bouncer("FATAL", "server conn crashed?"), ""},
		{"08P01 not fatal", bouncer("ERROR", "password authentication failed"), ""},
		{"08P01 with more words", bouncer("FATAL", "password authentication failed, and more"), ""},
		{"nil", nil, ""},
	}
	for _, tt := range tests {
		why, rejected := ledger.ConnectionRejected(tt.err)
		require.Equal(t, tt.want != "", rejected, "%s: ConnectionRejected(%v)", tt.name, tt.err)
		require.Contains(t, why, tt.want, tt.name)
		if rejected {
			require.False(t, ledger.IsRetryable(tt.err), "%s: a rejection is never retried", tt.name)
		}
	}
}

// TestClassifiers_RealConnectionsAndTimeouts: errors of the real engine and
// of real connections. A timeout that is not the caller's (connect_timeout
// against a server that accepts TCP and never answers, lock_timeout,
// statement_timeout) is retryable; a connection the server rejects for good
// (wrong password, role that may not log in, unknown role, missing database)
// is not, and says why; the caller's own cancel is final.
func TestClassifiers_RealConnectionsAndTimeouts(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "logs in with wrong passwords, which the test PgBouncer (auth_type trust) passes on as its own login's failure")
	pool := newPool(t)
	ctx := context.Background()
	dsn := pool.Config().ConnConfig.ConnString()
	db := pool.Config().ConnConfig.Database
	suffix := db[strings.LastIndex(db, "_")+1:] + fmt.Sprint(len(db))
	mustExec(t, pool, `CREATE ROLE nologin_`+suffix+` NOLOGIN; CREATE TABLE held (id int); INSERT INTO held VALUES (1)`)
	connect := func(ctx context.Context, dsn string) error {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			_ = conn.Close(ctx)
		}
		return err
	}
	cancelledAfter := func(d time.Duration) context.Context {
		ctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(d, cancel)
		t.Cleanup(cancel)
		return ctx
	}
	silent := pgtest.SilentServer(t)
	silentHost, silentPort, _ := strings.Cut(silent, ":")
	silentDSN := fmt.Sprintf("host=%s port=%s user=app dbname=app sslmode=disable connect_timeout=", silentHost, silentPort)

	// A lock another session holds.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `LOCK TABLE held IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	const creds, nodb = "rejected the connection string's credentials", "database named in the connection string does not exist"
	tests := []struct {
		name      string
		err       error
		retryable bool
		rejected  string // "": not a rejection
	}{
		{"connect_timeout against a server that never answers", connect(ctx, silentDSN+"1"), true, ""},
		{"lock_timeout", engineErrorIn(t, pool, []string{`SET LOCAL lock_timeout = '50ms'`}, `SELECT * FROM held`), true, ""},
		{"statement_timeout", engineErrorIn(t, pool, []string{`SET LOCAL statement_timeout = '50ms'`}, `SELECT pg_sleep(10)`), true, ""},
		{"wrong password", connect(ctx, pgtest.PasswordDSN(t, dsn, "not-the-password")), false, creds},
		{"role that may not log in", connect(ctx, strings.Replace(dsn, "user=postgres", "user=nologin_"+suffix, 1)), false, creds},
		{"unknown role", connect(ctx, strings.Replace(dsn, "user=postgres", "user=nobody_"+suffix, 1)), false, creds},
		{"no such database", connect(ctx, strings.Replace(dsn, "dbname="+db, "dbname=nope_"+db, 1)), false, nodb},
		{"the caller cancels a connection that hangs", connect(cancelledAfter(100*time.Millisecond), silentDSN+"30"), false, ""},
		{"the caller cancels a query", func() error {
			_, err := pool.Exec(cancelledAfter(100*time.Millisecond), `SELECT pg_sleep(10)`)
			return err
		}(), false, ""},
	}
	for _, tt := range tests {
		require.Error(t, tt.err, tt.name)
		require.Equal(t, tt.retryable, ledger.IsRetryable(tt.err), "%s: IsRetryable(%v)", tt.name, tt.err)
		why, rejected := ledger.ConnectionRejected(tt.err)
		require.Equal(t, tt.rejected != "", rejected, "%s: ConnectionRejected(%v)", tt.name, tt.err)
		require.Contains(t, why, tt.rejected, tt.name)
	}
	var pgErr *pgconn.PgError
	require.ErrorAs(t, tests[1].err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "lock_timeout's SQLSTATE")
	require.ErrorAs(t, tests[2].err, &pgErr)
	require.Equal(t, "57014", pgErr.Code, "statement_timeout's SQLSTATE")
	require.ErrorAs(t, tests[3].err, &pgErr)
	require.Equal(t, "28P01", pgErr.Code, "a wrong password's SQLSTATE")
	require.NotContains(t, tests[3].err.Error(), "not-the-password", "the error does not echo the password")
	require.NoError(t, connect(ctx, pgtest.PasswordDSN(t, dsn, pgtest.PasswordUserPassword)), "the right password is accepted")
}

// TestConnectionRejected_RealPgBouncer: a real PgBouncer that checks
// passwords itself (md5, scram-sha-256) refuses a wrong password and an
// unknown database with FATAL 08P01, the class of a lost connection; those
// refusals are rejections (never retried: exit code 2, not a retry until
// --retry-timeout), while the right password gets through.
func TestConnectionRejected_RealPgBouncer(t *testing.T) {
	t.Parallel()
	c := pgtest.Server(t)
	for _, auth := range []string{"md5", "scram-sha-256"} {
		t.Run(auth, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b, err := pgtest.StartPgBouncer(ctx, c, pgtest.BouncerPasswords(auth, map[string]string{"postgres": "right"}))
			require.NoError(t, err)
			t.Cleanup(func() { _ = b.Stop() })
			dsn := func(password, db string) string {
				return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres password=%s dbname=%s sslmode=disable", b.Port(), password, db)
			}
			conn, err := pgconn.Connect(ctx, dsn("right", "postgres"))
			require.NoError(t, err, "the right password gets through")
			require.NoError(t, conn.Close(ctx))

			for _, tc := range []struct{ dsn, why string }{
				{dsn("wrong", "postgres"), "rejected the connection string's credentials"},
				{dsn("right", "nosuchdb"), "knows no database of the name"},
			} {
				_, err := pgconn.Connect(ctx, tc.dsn)
				require.Error(t, err)
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				require.Equal(t, "08P01", pgErr.Code, "PgBouncer's own refusal: %v", err)
				why, rejected := ledger.ConnectionRejected(err)
				require.True(t, rejected, "%v", err)
				require.Contains(t, why, tc.why)
				require.False(t, ledger.IsRetryable(err), "a rejection is never retried: %v", err)
			}
		})
	}
}

package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// poolWith opens another pool on the database of pool whose sessions have
// the given settings (e.g. lock_timeout), as a DBA would set them for the
// application's role.
func poolWith(t *testing.T, pool *pgxpool.Pool, settings map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().ConnConfig.Copy()
	dsn := cfg.ConnString()
	for k, v := range settings {
		dsn += " " + k + "=" + v
	}
	return pgtest.Pool(t, dsn)
}

// TestCommitChunk_LockTimeoutIsRetryable: the effect waits for a row lock
// another session holds until lock_timeout (55P03). That is no fault of any
// item: the chunk is not bisected into Failed items but returned as a
// retryable error, with nothing committed; once the lock is released, the
// same chunk commits, each item and its effect once.
func TestCommitChunk_LockTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "gives the session its timeouts as startup parameters, which PgBouncer refuses")
	ctx := context.Background()
	admin := newPool(t)
	mustExec(t, admin, `
CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL);
INSERT INTO accounts SELECT 'acct-' || i, 0 FROM generate_series(0, 19) i;
CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY)`)
	s := ledger.NewStore(poolWith(t, admin, map[string]string{"lock_timeout": "100"}))
	effect := `UPDATE accounts SET balance = balance + 1 FROM claimed WHERE accounts.id = claimed.payload->>'account'`
	chunk := noteItems(20)

	holder, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT * FROM accounts WHERE id = 'acct-13' FOR UPDATE`)
	require.NoError(t, err)

	res, err := s.CommitChunk(ctx, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: effect})
	require.Error(t, err, "the chunk waited too long for a lock: no item is at fault (results: %v)", res)
	require.Nil(t, res)
	require.True(t, ledger.IsRetryable(err), "a lock timeout is retryable: %v", err)
	require.ErrorContains(t, err, "55P03")
	require.Zero(t, scalar[int64](t, admin, `SELECT count(*) FROM runledger.ledger`), "nothing of the chunk committed")

	require.NoError(t, holder.Rollback(ctx))
	require.Equal(t, tally{completed: 20}, count(commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: effect})))
	requireOneCommittedPerKey(t, admin, 20)
	require.EqualValues(t, 20, scalar[int64](t, admin, `SELECT sum(balance) FROM accounts`), "the effect ran once per item")
}

// TestCommitChunk_StatementTimeoutIsRetryable: the same for an effect that
// runs past statement_timeout (57014) while its context is alive.
func TestCommitChunk_StatementTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "gives the session its timeouts as startup parameters, which PgBouncer refuses")
	ctx := context.Background()
	admin := newPool(t)
	mustExec(t, admin, `
CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY);
CREATE TABLE knobs (slow bool NOT NULL);
INSERT INTO knobs VALUES (true);
CREATE FUNCTION pace() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT slow FROM knobs) THEN PERFORM pg_sleep(5); END IF;
    RETURN true;
END $$`)
	s := ledger.NewStore(poolWith(t, admin, map[string]string{"statement_timeout": "200"}))
	effect := noteEffect + ` WHERE pace()`
	chunk := noteItems(10)

	res, err := s.CommitChunk(ctx, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: effect})
	require.Error(t, err, "the effect ran too long: no item is at fault (results: %v)", res)
	require.Nil(t, res)
	require.True(t, ledger.IsRetryable(err), "a statement timeout is retryable: %v", err)
	require.ErrorContains(t, err, "57014")
	require.Zero(t, scalar[int64](t, admin, `SELECT count(*) FROM runledger.ledger`), "nothing of the chunk committed")

	mustExec(t, admin, `UPDATE knobs SET slow = false`)
	require.Equal(t, tally{completed: 10}, count(commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: effect})))
	requireOneCommittedPerKey(t, admin, 10)
	require.EqualValues(t, 10, scalar[int64](t, admin, `SELECT count(*) FROM notes`))
}

// TestCommitChunk_RunTimeoutsBoundTheEffect: the run's own bounds
// (ChunkOptions.EffectTimeout, LockTimeout) apply to the effect on a session
// that has none: an effect sleeping past its timeout, or waiting for a lock
// held elsewhere past its lock timeout, fails the chunk as retryable with
// nothing committed, and the retried chunk commits once the way is clear.
// The bounds hold for the effect only: the session keeps its own values.
func TestCommitChunk_RunTimeoutsBoundTheEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newPool(t)
	mustExec(t, admin, `
CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL);
INSERT INTO accounts SELECT 'acct-' || i, 0 FROM generate_series(0, 19) i;
CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY);
CREATE TABLE knobs (slow bool NOT NULL);
INSERT INTO knobs VALUES (true);
CREATE FUNCTION pace() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT slow FROM knobs) THEN PERFORM pg_sleep(30); END IF;
    RETURN true;
END $$`)
	one := poolWith(t, admin, map[string]string{"pool_max_conns": "1"})
	s := ledger.NewStore(one)

	// The client-side bound (NetworkTimeout) is far: the server's answers,
	// the timeouts' errors, come first and keep their meaning.
	sleepy := ledger.ChunkOptions{Effect: noteEffect + ` WHERE pace()`, EffectTimeout: 200 * time.Millisecond, NetworkTimeout: 10 * time.Second}
	start := time.Now()
	res, err := s.CommitChunk(ctx, runNamed("run-a"), noteItems(10), sleepy)
	require.Error(t, err, "the effect ran too long (results: %v)", res)
	require.Less(t, time.Since(start), 10*time.Second, "stopped by its timeout, not by the sleep's end")
	require.True(t, ledger.IsRetryable(err), "a statement timeout is retryable: %v", err)
	require.ErrorContains(t, err, "57014")
	require.NotErrorIs(t, err, ledger.ErrNoAnswer)
	require.Zero(t, scalar[int64](t, admin, `SELECT count(*) FROM runledger.ledger`), "nothing of the chunk committed")
	require.Equal(t, "0", scalar[string](t, one, `SHOW statement_timeout`), "the session keeps its own statement_timeout")

	blocked := ledger.ChunkOptions{Effect: `UPDATE accounts SET balance = balance + 1 FROM claimed WHERE accounts.id = claimed.payload->>'account'`,
		LockTimeout: 100 * time.Millisecond, EffectTimeout: 10 * time.Second, NetworkTimeout: 10 * time.Second}
	holder, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT * FROM accounts WHERE id = 'acct-13' FOR UPDATE`)
	require.NoError(t, err)
	res, err = s.CommitChunk(ctx, runNamed("run-b"), noteItems(20), blocked)
	require.Error(t, err, "the effect waited too long for a lock (results: %v)", res)
	require.True(t, ledger.IsRetryable(err), "a lock timeout is retryable: %v", err)
	require.ErrorContains(t, err, "55P03")
	require.NotErrorIs(t, err, ledger.ErrNoAnswer)
	require.NotErrorIs(t, err, context.Canceled)
	require.Zero(t, scalar[int64](t, admin, `SELECT count(*) FROM runledger.ledger`), "nothing of the chunk committed")
	require.Equal(t, "0", scalar[string](t, one, `SHOW lock_timeout`), "the session keeps its own lock_timeout")

	require.NoError(t, holder.Rollback(ctx))
	mustExec(t, admin, `UPDATE knobs SET slow = false`)
	require.Equal(t, tally{completed: 10}, count(commit(t, s, runNamed("run-a"), noteItems(10), sleepy)))
	require.Equal(t, tally{completed: 10, sameRun: 10}, count(commit(t, s, runNamed("run-a"), noteItems(10), sleepy)))
	require.Equal(t, tally{completed: 10, already: 10}, count(commit(t, s, runNamed("run-b"), noteItems(20), blocked)))
	requireOneCommittedPerKey(t, admin, 20)
	require.EqualValues(t, 10, scalar[int64](t, admin, `SELECT sum(balance) FROM accounts`), "the effect ran once per newly claimed item")
}

package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// holdKeys opens a transaction on pool that inserts a committed row for each
// key and never commits: a claim held by a stopped process whose connection
// stays up. Its row locks last until the returned release (a rollback).
func holdKeys(t *testing.T, pool *pgxpool.Pool, its []ledger.Item) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	for _, it := range its {
		_, err := tx.Exec(ctx, `INSERT INTO runledger.ledger (entity, occurrence, state, run_namespace, run_name, run_uid, shard, attempt)
VALUES ($1, $2, 'committed', 'ns', 'stopped', 'uid-stopped', 0, 0)`, it.Entity, it.Occurrence)
		require.NoError(t, err)
	}
	return rollbackOnce(t, tx)
}

// rollbackOnce returns release, which rolls tx back, and rolls it back at
// the test's end if release was not called. Once, whoever comes first: a
// release still waiting for the ROLLBACK's answer when the test ends (the
// server released the locks, the test's claim went through and it ended)
// would otherwise race the cleanup's on the one connection, which pgx then
// closes ("conn closed").
func rollbackOnce(t *testing.T, tx pgx.Tx) (release func()) {
	var once sync.Once
	// Called from a goroutine of the test too: assert, not require.
	release = func() {
		once.Do(func() {
			assert.NoError(t, tx.Rollback(context.Background()), "the holder's transaction was still open")
		})
	}
	t.Cleanup(func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) })
	return release
}

// requireBoundedFailure calls CommitChunk once and checks that it came back
// within about bound, retryably with the given SQLSTATE, having committed
// nothing (beyond want committed rows already there).
func requireBoundedFailure(t *testing.T, s *ledger.Store, admin *pgxpool.Pool, run ledger.Run, chunk []ledger.Item, opts ledger.ChunkOptions, bound time.Duration, sqlstate string, want int64) {
	t.Helper()
	// A wait with no bound would block until this context ends: the test
	// then fails instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	res, err := s.CommitChunk(ctx, run, chunk, opts)
	took := time.Since(start)
	require.NoError(t, ctx.Err(), "CommitChunk waited past the bound of %s until the test gave up (%s): no bound held", bound, took)
	require.Error(t, err, "the chunk waited for a lock held by a stopped claim (results: %v)", res)
	require.Nil(t, res)
	require.True(t, ledger.IsRetryable(err), "a bounded wait is retryable: %v", err)
	require.ErrorContains(t, err, sqlstate)
	require.GreaterOrEqual(t, took, bound, "it waited for the lock first")
	require.Less(t, took, bound+3*time.Second, "the wait never exceeds the bound (by more than a round trip or two)")
	require.Equal(t, want, scalar[int64](t, admin, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed' AND run_uid <> 'uid-stopped'`), "nothing of the chunk committed")
}

// commitRetrying retries CommitChunk on retryable errors, like the worker, for
// up to a minute; it returns the results and the number of tries.
func commitRetrying(t *testing.T, s *ledger.Store, run ledger.Run, chunk []ledger.Item, opts ledger.ChunkOptions) ([]ledger.Result, int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := s.CommitChunk(ctx, run, chunk, opts)
		cancel()
		if err == nil {
			return res, try
		}
		require.True(t, ledger.IsRetryable(err), "CommitChunk: %v", err)
		require.True(t, time.Now().Before(deadline), "still failing after a minute: %v", err)
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCommitChunk_ClaimWaitIsBounded: a claim whose key another transaction
// holds (inserted, never committed: a stopped process whose connection stays
// up) waits at most the run's lock timeout, with or without an effect, with a
// processor, in Skip and Supersede mode; the chunk fails retryably (55P03)
// with nothing committed, is retried, and completes, each item and its effect
// once, as soon as the holder goes.
func TestCommitChunk_ClaimWaitIsBounded(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	for _, tc := range []struct {
		name      string
		effect    bool
		processor bool
		supersede bool
	}{
		{name: "plain"},
		{name: "effect", effect: true},
		{name: "processor", processor: true},
		{name: "supersede effect", effect: true, supersede: true},
		{name: "supersede processor", processor: true, supersede: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			admin := newPool(t)
			mustExec(t, admin, `CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY)`)
			s := ledger.NewStore(admin)
			chunk := noteItems(10)
			opts := ledger.ChunkOptions{LockTimeout: bound, EffectTimeout: 10 * time.Second, NetworkTimeout: 10 * time.Second}
			p := &funcProcessor{}
			if tc.effect {
				opts.Effect = noteEffect
			}
			if tc.processor {
				opts.Processor = p
			}
			var before int64
			if tc.supersede {
				// Another run committed every key: the claim supersedes
				// its rows first, then inserts.
				commit(t, s, runNamed("earlier"), chunk, ledger.ChunkOptions{})
				opts.OnExisting = ledger.Supersede
				before = 10
			}
			var release func()
			if tc.supersede {
				// The stopped claim superseded (row-locked) key 7's
				// committed row and never committed.
				release = holdSupersede(t, admin, chunk[7])
			} else {
				release = holdKeys(t, admin, chunk[7:8])
			}
			requireBoundedFailure(t, s, admin, runNamed("a"), chunk, opts, bound, "55P03", before)
			require.Empty(t, p.sentKeys(), "the processor was not called")

			released := make(chan struct{})
			go func() {
				defer close(released)
				time.Sleep(time.Second)
				release()
			}()
			res, tries := commitRetrying(t, s, runNamed("a"), chunk, opts)
			<-released // its assertion belongs to this test
			require.Greater(t, tries, 1, "retried while the holder stayed")
			want := tally{completed: 10}
			if tc.supersede {
				want.superseded = 10
			}
			require.Equal(t, want, count(res))
			requireOneCommittedPerKey(t, admin, 10)
			if tc.effect {
				require.EqualValues(t, 10, scalar[int64](t, admin, `SELECT count(*) FROM notes`), "the effect ran once per item")
			}
			if tc.processor {
				require.Len(t, p.sentKeys(), 10, "each item was sent once")
			}
		})
	}
}

// holdSupersede opens a transaction that supersedes the committed row of it
// and never commits: it holds the row's lock.
func holdSupersede(t *testing.T, pool *pgxpool.Pool, it ledger.Item) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM runledger.ledger WHERE entity = $1 AND occurrence = $2 AND state = 'committed' FOR UPDATE`, it.Entity, it.Occurrence)
	require.NoError(t, err)
	return rollbackOnce(t, tx)
}

// TestCommitChunk_BoundsOutliveTheEffect: the session reset after the effect
// (RESET ALL, which also drops the effect's SET LOCAL bounds) leaves the rest
// of the transaction bounded: a deferred check of the effect, fired right
// after it, that waits for a row lock held elsewhere fails the chunk within
// the run's lock timeout, and a statement of the ledger after the reset runs
// under the run's bounds.
func TestCommitChunk_BoundsOutliveTheEffect(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	admin := newPool(t)
	mustExec(t, admin, `
CREATE TABLE accounts (id text PRIMARY KEY);
INSERT INTO accounts VALUES ('gate');
CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY);
CREATE TABLE seen (lock_timeout text, statement_timeout text);
CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO seen VALUES (current_setting('lock_timeout'), current_setting('statement_timeout'));
    PERFORM 1 FROM accounts WHERE id = 'gate' FOR UPDATE;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER gate AFTER INSERT ON notes DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION gate()`)
	s := ledger.NewStore(admin)
	opts := ledger.ChunkOptions{Effect: noteEffect, LockTimeout: bound, EffectTimeout: 10 * time.Second, NetworkTimeout: 10 * time.Second}

	ctx := context.Background()
	holder, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM accounts WHERE id = 'gate' FOR UPDATE`)
	require.NoError(t, err)
	requireBoundedFailure(t, s, admin, runNamed("a"), noteItems(3), opts, bound, "55P03", 0)

	require.NoError(t, holder.Rollback(ctx))
	require.Equal(t, tally{completed: 3}, count(commit(t, s, runNamed("a"), noteItems(3), opts)))
	rows, err := admin.Query(ctx, `SELECT DISTINCT lock_timeout, statement_timeout FROM seen`)
	require.NoError(t, err)
	seen, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Lock, Statement string }])
	require.NoError(t, err)
	require.Equal(t, []struct{ Lock, Statement string }{{fmt.Sprintf("%dms", bound.Milliseconds()), "10s"}}, seen,
		"the deferred checks after the effect ran under the run's bounds")
}

// TestFixBatch_WaitsAreBounded: fixing a run's batch waits for another
// materialiser of the same run (the batch lock) at most the query's bound
// plus its lock bound, and a static batch's header insert waits for a
// concurrent one of the same header at most the Store's lock bound: held by
// a stopped process whose connection stays up, either fails retryably
// (55P03) instead of waiting for ever, and works once the holder goes. The
// holder takes the batch lock as a session's, as releases before the lock
// became the materialising transaction's did: the two wait for each other.
func TestFixBatch_WaitsAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newPool(t)
	mustExec(t, admin, batchSource)
	s := ledger.NewStore(admin).WithBounds(10*time.Second, 200*time.Millisecond)

	t.Run("query", func(t *testing.T) {
		holder, err := directPool(t, admin).Acquire(ctx)
		require.NoError(t, err)
		defer holder.Release()
		_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('runledger.batch/' || $1, 0))`, "q")
		require.NoError(t, err)
		q := batchQuery()
		q.Timeout, q.LockTimeout = 200*time.Millisecond, 200*time.Millisecond
		bounded, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		start := time.Now()
		_, err = s.FixQueryBatch(bounded, runNamed("q"), q)
		require.NoError(t, bounded.Err(), "the wait for the batch lock had no bound")
		require.Error(t, err)
		require.True(t, ledger.IsRetryable(err), "%v", err)
		require.ErrorContains(t, err, "55P03")
		require.Less(t, time.Since(start), 5*time.Second)

		_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		require.NoError(t, err)
		h, err := s.FixQueryBatch(ctx, runNamed("q"), q)
		require.NoError(t, err)
		require.EqualValues(t, 1000, h.Items)
	})

	t.Run("static", func(t *testing.T) {
		holder, err := admin.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(ctx) }()
		_, err = holder.Exec(ctx, `INSERT INTO runledger.batch_run (run_uid, run_namespace, run_name, source, shards, items, digest)
VALUES ('st', 'default', 'run-st', 'static', 1, 3, 'digest')`)
		require.NoError(t, err)
		bounded, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err = s.FixStaticBatch(bounded, runNamed("st"), 1, 3, "digest")
		require.NoError(t, bounded.Err(), "the header insert waited without a bound")
		require.True(t, ledger.IsRetryable(err), "%v", err)
		require.ErrorContains(t, err, "55P03")

		require.NoError(t, holder.Rollback(ctx))
		h, err := s.FixStaticBatch(ctx, runNamed("st"), 1, 3, "digest")
		require.NoError(t, err)
		require.EqualValues(t, 3, h.Items)
	})
}

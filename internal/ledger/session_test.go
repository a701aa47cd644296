package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestCommitChunk_EffectSettingsDoNotOutliveTheChunk: an effect that changes
// session settings, by SET or set_config(..., false), changes them for its
// own statements only: the ledger's statements after it, the next chunk's
// effect and the next user of the pooled connection see the session's own
// values again.
func TestCommitChunk_EffectSettingsDoNotOutliveTheChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newPool(t)
	mustExec(t, admin, `
CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY, search_path text, read_only text, timeout text)`)
	one := poolWith(t, admin, map[string]string{"pool_max_conns": "1"}) // every chunk on the same session
	s := ledger.NewStore(one)
	record := `INSERT INTO public.notes SELECT payload->>'account', occurrence,
    current_setting('search_path'), current_setting('default_transaction_read_only'), current_setting('statement_timeout') FROM claimed`
	for i, effect := range []string{
		record + `; SET search_path TO nowhere; SET default_transaction_read_only = on; SET statement_timeout = 1`,
		record + `; SELECT set_config('search_path', 'nowhere', false), set_config('default_transaction_read_only', 'on', false)`,
		record + `; SET LOCAL search_path TO nowhere; SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY`,
	} {
		chunk := noteItems(10)[i*3 : i*3+3]
		require.Equal(t, tally{completed: 3}, count(commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: effect})), "effect %d", i)
		var path, readOnly, timeout string
		require.NoError(t, one.QueryRow(ctx, `SELECT current_setting('search_path'), current_setting('default_transaction_read_only'), current_setting('statement_timeout')`).Scan(&path, &readOnly, &timeout))
		require.Equal(t, []string{`"$user", public`, "off", "0"}, []string{path, readOnly, timeout}, "effect %d: the session's settings after the chunk", i)
	}
	var distinct int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(DISTINCT (search_path, read_only, timeout)) FROM notes`).Scan(&distinct))
	require.Equal(t, 1, distinct, "every effect started from the same settings")
	require.Equal(t, `"$user", public`, scalar[string](t, admin, `SELECT min(search_path) FROM notes`))
	requireOneCommittedPerKey(t, admin, 9)
}

// TestCommitChunk_EffectCannotSwitchRole: the effect runs as the effect
// role, and cannot switch back to the worker's login (SET ROLE, RESET ROLE,
// set_config('role', ...), SET SESSION AUTHORIZATION are refused inside the
// sandbox): the chunk's items fail with PostgreSQL's error, nothing of it
// commits, and the next chunk's effect runs as the effect role again while
// the ledger's statements run as the login. On the old code the effect ran
// as the login, which could write the ledger, and RESET ROLE undid any SET
// ROLE of the operator's.
func TestCommitChunk_EffectCannotSwitchRole(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	mustExec(t, owner, `CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY, who text)`)
	worker, role := workerRole(t, owner)
	one := poolWith(t, worker, map[string]string{"pool_max_conns": "1"})
	s := ledger.NewStore(one)
	record := `INSERT INTO notes SELECT payload->>'account', occurrence, current_user FROM claimed; `
	chunk := noteItems(12)
	for i, escape := range []string{
		`RESET ROLE`,
		`SET ROLE ` + role,
		`SELECT set_config('role', '` + role + `', false)`,
		`SET SESSION AUTHORIZATION ` + role,
		`RESET SESSION AUTHORIZATION`,
	} {
		res := commit(t, s, runNamed("run-a"), chunk[i:i+1], ledger.ChunkOptions{Effect: record + escape})
		require.Equal(t, tally{failed: 1}, count(res), "%s", escape)
		require.ErrorContains(t, res[0].Err, "within security-definer function", "%s", escape)
	}
	require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM notes`), "nothing of a failed chunk commits")
	require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`))

	require.Equal(t, tally{completed: 3}, count(commit(t, s, runNamed("run-a"), chunk[6:9], ledger.ChunkOptions{Effect: record + `SELECT 1`})))
	require.Equal(t, role, scalar[string](t, one, `SELECT current_user`))
	require.Equal(t, pgtest.EffectRole, scalar[string](t, owner, `SELECT string_agg(DISTINCT who, ',') FROM notes`), "every effect ran as the effect role")
	requireOneCommittedPerKey(t, owner, 3)
}

// TestCommitChunk_EffectMayNotEndTheTransaction: COMMIT, ROLLBACK or a
// savepoint in an effect is refused before it takes effect: every item
// fails with a clear error, and neither the ledger nor the effect's table
// holds anything of the chunk (a COMMIT would have committed the claim
// without the rest of the effect; a ROLLBACK would have dropped the claim
// and let the rest of the effect commit on its own).
func TestCommitChunk_EffectMayNotEndTheTransaction(t *testing.T) {
	t.Parallel()
	admin := newPool(t)
	mustExec(t, admin, `CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY);
CREATE PROCEDURE commits() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$`)
	s := ledger.NewStore(admin)
	for _, effect := range []string{
		noteEffect + `; COMMIT; SELECT 1`,
		`ROLLBACK; ` + noteEffect,
		`COMMIT AND CHAIN; ` + noteEffect,
		`SAVEPOINT x; ` + noteEffect + `; RELEASE SAVEPOINT x`,
		noteEffect + `; END`,
		noteEffect + `; CALL commits()`,
		noteEffect + `; DO $$ BEGIN ROLLBACK; END $$`,
	} {
		res := commit(t, s, runNamed("run-a"), noteItems(5), ledger.ChunkOptions{Effect: effect})
		require.Equal(t, tally{failed: 5}, count(res), "effect %q", effect)
		for _, r := range res {
			require.ErrorContains(t, r.Err, "the effect may not end the ledger's transaction or open a savepoint (COMMIT, ROLLBACK, SAVEPOINT)", "effect %q", effect)
			require.True(t, ledger.IsConfigurationError(r.Err), "bad input, never retried: %v", r.Err)
		}
		require.Zero(t, scalar[int64](t, admin, `SELECT count(*) FROM runledger.ledger`), "effect %q: nothing claimed", effect)
		require.Zero(t, scalar[int64](t, admin, `SELECT count(*) FROM notes`), "effect %q: nothing of the effect", effect)
	}
	// The same effect without the transaction control commits as usual.
	require.Equal(t, tally{completed: 5}, count(commit(t, s, runNamed("run-a"), noteItems(5), ledger.ChunkOptions{Effect: noteEffect})))
}

// TestFixQueryBatch_QuerySettingsDoNotOutliveIt: a batch query that sets
// session settings through set_config(..., false) sets them for itself only:
// the next user of the pooled connection sees the session's own values.
func TestFixQueryBatch_QuerySettingsDoNotOutliveIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newPool(t)
	mustExec(t, admin, batchSource)
	one := poolWith(t, admin, map[string]string{"pool_max_conns": "1"})
	q := batchQuery()
	q.SQL = `SELECT entity, occurrence, payload FROM src WHERE set_config('search_path', 'nowhere', false) <> '' AND set_config('default_transaction_read_only', 'on', false) <> ''`
	h, err := ledger.NewStore(one).FixQueryBatch(ctx, runNamed("q"), q)
	require.NoError(t, err)
	require.EqualValues(t, 1000, h.Items)
	var path, readOnly string
	require.NoError(t, one.QueryRow(ctx, `SELECT current_setting('search_path'), current_setting('default_transaction_read_only')`).Scan(&path, &readOnly))
	require.Equal(t, []string{`"$user", public`, "off"}, []string{path, readOnly})
}

// TestFixQueryBatch_TimeoutIsRetryable: a query that runs past its timeout,
// or waits for a lock past its lock timeout, fails retryably with nothing
// written; the same query within its bounds fixes the batch.
func TestFixQueryBatch_TimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	s := ledger.NewStore(pool)

	slow := batchQuery()
	slow.SQL = `SELECT entity, occurrence, payload FROM src WHERE pg_sleep(0.01)::text IS NOT NULL`
	slow.Timeout = 300 * time.Millisecond
	_, err := s.FixQueryBatch(ctx, runNamed("slow"), slow)
	require.Error(t, err)
	require.True(t, ledger.IsRetryable(err), "a statement timeout is retryable: %v", err)
	require.ErrorContains(t, err, "57014")

	locked := batchQuery()
	locked.SQL = `SELECT entity, occurrence, payload FROM src FOR SHARE`
	locked.LockTimeout = 100 * time.Millisecond
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `LOCK TABLE src IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	_, err = s.FixQueryBatch(ctx, runNamed("locked"), locked)
	require.Error(t, err)
	require.True(t, ledger.IsRetryable(err), "a lock timeout is retryable: %v", err)
	require.ErrorContains(t, err, "55P03")
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.batch_run`), "nothing written")

	require.NoError(t, holder.Rollback(ctx))
	h, err := s.FixQueryBatch(ctx, runNamed("locked"), locked)
	require.NoError(t, err)
	require.EqualValues(t, 1000, h.Items)
}

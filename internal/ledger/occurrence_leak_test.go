package ledger_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestOccurrenceDoesNotLeakToTheNextRun: a query batch's occurrence is a
// setting of its own transaction only. A run without an occurrence whose
// query names runledger.occurrence is refused by its text, on any session.
// Directly to PostgreSQL, on a pool of one session (so the next run gets
// the first one's backend), a query that reads the setting in a function
// is refused too, as on a fresh session, instead of reading ” (PostgreSQL
// keeps a custom setting's placeholder, empty, in the session once it was
// set, even transaction-locally), and so is any run without an occurrence
// on a session that defines the setting otherwise. (Behind a pooler the
// server connection may keep a placeholder: only the text is refused.)
func TestOccurrenceDoesNotLeakToTheNextRun(t *testing.T) {
	t.Parallel()
	base := newPool(t)
	mustExec(t, base, `CREATE TABLE occsrc (entity text); INSERT INTO occsrc VALUES ('a1'), ('a2');
CREATE FUNCTION occ() RETURNS text LANGUAGE sql AS $$ SELECT current_setting('runledger.occurrence') $$;`)
	pool, err := ledger.Open(context.Background(), base.Config().ConnString(), 1)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	const sql = `SELECT entity, current_setting('RunLedger.Occurrence') AS occurrence FROM occsrc`
	q := ledger.BatchQuery{SQL: sql, Shards: 1, Occurrence: "2026-10"}

	_, err = s.DescribeBatchQuery(ctx, sql, 1, "2026-10")
	require.NoError(t, err)
	h, err := s.FixQueryBatch(ctx, runNamed("occ-set"), q)
	require.NoError(t, err)
	require.EqualValues(t, 2, h.Items)

	_, err = s.DescribeBatchQuery(ctx, sql, 1, "")
	require.ErrorIs(t, err, ledger.ErrNoOccurrence, "the query names the setting")
	q.Occurrence = ""
	h, err = s.FixQueryBatch(ctx, runNamed("occ-none"), q)
	require.ErrorIs(t, err, ledger.ErrBatchQuery)
	require.ErrorIs(t, err, ledger.ErrNoOccurrence)
	require.Nil(t, h)
	require.Zero(t, scalar[int64](t, base, `SELECT count(*) FROM runledger.batch_run WHERE run_uid = 'occ-none'`), "nothing fixed")
	if pgtest.ThroughPooler() {
		return
	}

	q.SQL = `SELECT entity, occ() AS occurrence FROM occsrc`
	_, err = s.DescribeBatchQuery(ctx, q.SQL, 1, "")
	require.NoError(t, err, "describing prepares the query, it does not run it")
	h, err = s.FixQueryBatch(ctx, runNamed("occ-none"), q)
	require.ErrorContains(t, err, `unrecognized configuration parameter "runledger.occurrence"`, "fixing a run without an occurrence")
	require.Nil(t, h)
	require.Zero(t, scalar[int64](t, base, `SELECT count(*) FROM runledger.batch_run WHERE run_uid = 'occ-none'`), "nothing fixed")

	// A session defining the setting by other means (a user's SET): a run
	// without an occurrence is refused.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT set_config('runledger.occurrence', 'stale', false)`)
	require.NoError(t, err)
	conn.Release()
	_, err = s.FixQueryBatch(ctx, runNamed("occ-none"), q)
	require.ErrorContains(t, err, `the session already defines runledger.occurrence`)
	require.Zero(t, scalar[int64](t, base, `SELECT count(*) FROM runledger.batch_run WHERE run_uid = 'occ-none'`), "nothing fixed")
}

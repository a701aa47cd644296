package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestOccurrenceDoesNotLeakToTheNextRun: a query batch's occurrence is a
// setting of its own transaction only. On a pool of one session (so the
// second run gets the first one's backend), a later run without an
// occurrence whose query reads current_setting('runledger.occurrence') is
// refused, as on a fresh session, instead of reading ” (PostgreSQL keeps a
// custom setting's placeholder, empty, in the session once it was set, even
// transaction-locally). A session that defines the setting otherwise is
// refused for a run without an occurrence.
func TestOccurrenceDoesNotLeakToTheNextRun(t *testing.T) {
	t.Parallel()
	base := newPool(t)
	mustExec(t, base, `CREATE TABLE occsrc (entity text); INSERT INTO occsrc VALUES ('a1'), ('a2');`)
	cfg, err := pgxpool.ParseConfig(base.Config().ConnString())
	require.NoError(t, err)
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	const sql = `SELECT entity, current_setting('runledger.occurrence') AS occurrence FROM occsrc`
	q := ledger.BatchQuery{SQL: sql, Shards: 1, Occurrence: "2026-10"}

	_, err = s.DescribeBatchQuery(ctx, sql, 1, "2026-10")
	require.NoError(t, err)
	h, err := s.FixQueryBatch(ctx, runNamed("occ-set"), q)
	require.NoError(t, err)
	require.EqualValues(t, 2, h.Items)

	_, err = s.DescribeBatchQuery(ctx, sql, 1, "")
	require.NoError(t, err, "describing prepares the query, it does not run it")
	q.Occurrence = ""
	h, err = s.FixQueryBatch(ctx, runNamed("occ-none"), q)
	require.ErrorContains(t, err, `unrecognized configuration parameter "runledger.occurrence"`, "fixing a run without an occurrence")
	require.Nil(t, h)
	require.Zero(t, scalar[int64](t, base, `SELECT count(*) FROM runledger.batch_run WHERE run_uid = 'occ-none'`), "nothing fixed")

	// A session defining the setting by other means (a pooler's shared
	// backend, a user's SET): a run without an occurrence is refused.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT set_config('runledger.occurrence', 'stale', false)`)
	require.NoError(t, err)
	conn.Release()
	_, err = s.FixQueryBatch(ctx, runNamed("occ-none"), q)
	require.ErrorContains(t, err, `the session already defines runledger.occurrence`)
	require.Zero(t, scalar[int64](t, base, `SELECT count(*) FROM runledger.batch_run WHERE run_uid = 'occ-none'`), "nothing fixed")
}

package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestFixQueryBatch_QueryCannotHideItsWrites: a batch query runs as the
// worker's login, which may insert into the ledger; only the write check
// stands between it and forged rows. A function the query calls that first
// creates a temporary table named like the statistics view the check reads
// (pg_temp is searched before pg_catalog unless the path names it) and then
// inserts committed ledger rows under an invented run is still caught: the
// batch is refused, nothing is forged, and a later run commits those keys.
// On the old code the check read the empty temporary table, the forged rows
// committed with the batch, and the keys were "already handled".
func TestFixQueryBatch_QueryCannotHideItsWrites(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	mustExec(t, owner, batchSource+`
CREATE FUNCTION hide() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('pg_temp.pg_stat_xact_all_tables') IS NULL THEN -- once per query, not per row
        CREATE TEMP TABLE pg_stat_xact_all_tables (relid oid, schemaname name, relname name,
            n_tup_ins bigint, n_tup_upd bigint, n_tup_del bigint);
        `+forgeLater+`;
    END IF;
    RETURN 1;
END $$;
GRANT SELECT ON src TO PUBLIC`)
	for _, p := range []*pgxpool.Pool{worker, owner} {
		s := ledger.NewStore(p)
		q := batchQuery()
		q.SQL = `SELECT entity, occurrence, payload FROM src WHERE hide() = 1`
		_, err := s.FixQueryBatch(context.Background(), runNamed("hider"), q)
		require.ErrorIs(t, err, ledger.ErrBatchQuery)
		var w *ledger.ForeignWriteError
		require.ErrorAs(t, err, &w)
		require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'invented'`), "nothing forged")
		require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.batch_run`), "no batch")
	}
	later := commit(t, ledger.NewStore(worker), runNamed("honest"), items("later", 0, 4), ledger.ChunkOptions{})
	require.Equal(t, tally{completed: 4}, count(later), "the later keys are completed by the run that processes them")
}

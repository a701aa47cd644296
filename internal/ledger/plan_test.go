package ledger_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestKeyLookupsProbeTheRuleIndex: the statements that look up committed rows
// by key (the fast path's lookup, the attribution of skipped keys and the
// preload, supersede) must probe the rule's index once per key, whatever the
// planner believes about the ledger: a plan that scans the ledger per chunk
// costs as much as the table is large, and one that scans it per key (chosen
// for an empty ledger) is quadratic while concurrent writers fill it.
func TestKeyLookupsProbeTheRuleIndex(t *testing.T) {
	t.Parallel()
	// A chunk's worth of keys: half held in the populated ledger, half not.
	var entities, occurrences, payloads []string
	for i := 1; i <= 12000; i += 2 {
		entities = append(entities, fmt.Sprintf("acct-%d", i%1000))
		occurrences = append(occurrences, fmt.Sprintf("occ-%d", i*5))
		payloads = append(payloads, `{"amount": 1}`)
	}
	run := []any{"default", "run", "run-uid", 0, 0}
	statements := []struct {
		name string
		sql  string
		args []any
	}{
		{"claim", ledger.SQLClaim, append([]any{entities, occurrences, payloads}, run...)},
		{"holders", ledger.SQLHolders, []any{entities, occurrences}},
		{"supersede", ledger.SQLSupersede, []any{entities, occurrences, "other-run"}},
		{"holders, supersede", ledger.SQLHoldersSupersede, []any{entities, occurrences, "other-run"}},
	}
	for _, ledgerRows := range []int{0, 60000} {
		t.Run(fmt.Sprintf("ledger of %d rows", ledgerRows), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := newPool(t)
			_, err := pool.Exec(ctx, `
INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
SELECT 'acct-' || (i % 1000), 'occ-' || i, 'default', 'big', 'big-run', 0, 0
FROM generate_series(1, $1) AS i`, ledgerRows)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `VACUUM ANALYZE runledger.ledger`)
			require.NoError(t, err)

			for _, st := range statements {
				t.Run(st.name, func(t *testing.T) {
					// As the insert path runs them: in a transaction that
					// leaves the planner no sequential scan.
					tx, err := pool.Begin(ctx)
					require.NoError(t, err)
					defer func() { _ = tx.Rollback(ctx) }()
					_, err = tx.Exec(ctx, ledger.SQLIndexProbesOnly)
					require.NoError(t, err)
					rows, err := tx.Query(ctx, "EXPLAIN "+st.sql, st.args...)
					require.NoError(t, err)
					lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
					require.NoError(t, err)
					plan := strings.Join(lines, "\n")
					require.NotContains(t, plan, "Seq Scan on ledger", "the lookup must not scan the ledger:\n%s", plan)
					require.NotContains(t, plan, "hashed SubPlan", "the lookup must probe per key, not hash a whole run:\n%s", plan)
					require.Contains(t, plan, "Index Scan using "+ledger.BusinessKeyIndex,
						"the lookup must probe the rule's index per key:\n%s", plan)
					if strings.Contains(st.name, "supersede") {
						require.Contains(t, plan, "using ledger_retired_pkey",
							"the run's retired rows of a key are one probe of (run_uid, occurrence, entity):\n%s", plan)
					}
				})
			}
		})
	}
}

// TestFixQueryBatch_SortsNothing: materialising a batch packs the query's
// rows into blocks as the query returns them, hashing the blocks, with no
// sort. One backend sorting every shard's rows by key was most of an
// already-handled run; each shard's reader sorts its own part instead
// (TestBatchCursor_SortsItsShardOnly). Sorting the rows by block to pack
// them cost more than the per-row inserts the packing saved.
func TestFixQueryBatch_SortsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	// The planner's statistics on the query's columns must not change the
	// plan: a key of many distinct values, analysed.
	mustExec(t, pool, batchSource+`
INSERT INTO src (entity, occurrence) SELECT 'k' || i, 'o' || i FROM generate_series(1, 50000) i;
ANALYZE src;`)
	q := batchQuery()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, ledger.SQLBatchWorkMem) // as the batch is written
	require.NoError(t, err)
	rows, err := tx.Query(ctx, "EXPLAIN "+ledger.SQLFixQueryBatch(q.SQL, q.HasPayload, q.Shards, q.ShardOf), "uid", "default", "run-uid", q.Shards, "")
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.NotContains(t, plan, "Sort", "the batch's rows are written unsorted:\n%s", plan)
	require.Contains(t, plan, "HashAggregate", "packed into blocks by hashing:\n%s", plan)
}

// TestBatchCursor_SortsItsShardOnly: a shard's reader sorts its own items
// (of its blocks, the shard's range of the primary key) beneath the holder
// probes, so it probes the rule's index for the items it fetches only, never
// for the items a reopened cursor skips.
func TestBatchCursor_SortsItsShardOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	h, err := ledger.NewStore(pool).FixQueryBatch(ctx, runNamed("uid"), batchQuery())
	require.NoError(t, err)
	mustExec(t, pool, `ANALYZE runledger.batch`)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// As the cursor runs: sequential scans off, and no parallel plan (a
	// cursor never gets one).
	_, err = tx.Exec(ctx, ledger.SQLIndexProbesOnly+`; SET LOCAL max_parallel_workers_per_gather = 0`)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, "EXPLAIN "+ledger.SQLBatchCursor, h.ID, 1, 10)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.True(t, strings.HasPrefix(plan, "Nested Loop Left Join"), "the probes are the top node, above the sort and the offset:\n%s", plan)
	require.Equal(t, 1, strings.Count(plan, "Sort Key:"), "one sort:\n%s", plan)
	require.Contains(t, plan, "Index Cond: ((batch_id = '"+strconv.FormatInt(h.ID, 10)+"'::bigint) AND (shard = 1))", "of the shard's blocks only:\n%s", plan)
	require.NotContains(t, plan, "Filter", "reading no other shard's:\n%s", plan)
	require.Contains(t, plan, "Index Scan using "+ledger.BusinessKeyIndex, "probing the rule's index:\n%s", plan)
}

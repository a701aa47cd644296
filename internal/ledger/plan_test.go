package ledger_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestInsertPathPlansAreOChunk: every statement of the insert path costs
// O(chunk) whatever the planner believes about the ledger: the statements
// that look up committed rows by key (the fast path's lookup, with and
// without the effect's copy, the attribution of skipped keys and the
// preload, supersede) probe the rule's index once per key, and the arbiter
// path's insert reads the ledger only through its arbiter index, never by a
// scan or a join over the table; the insert of a chunk expected fresh reads
// nothing of it (its unique check aside). A plan that scans the ledger per chunk costs
// as much as the table is large; one that scans it per key (chosen for an
// empty ledger) is quadratic while concurrent writers fill it. The ledger as
// the planner may see it: fresh (never analysed, empty or filled since),
// analysed, and grown 100x since its last ANALYZE (autovacuum off), with
// the statistics of a skewed ledger (one entity) that no longer hold.
// (The take-back runs inside ledger_take_back, whose DELETE probes the same
// index by key: the processor's path; the post-effect claims check of the
// old code is gone, see docs/insert-path.md.)
func TestInsertPathPlansAreOChunk(t *testing.T) {
	t.Parallel()
	// A chunk's worth of keys: half held in the populated ledger, half not.
	var entities, occurrences, payloads []string
	var copies []*string // a key's later copies, now and then
	for i := 1; i <= 12000; i += 2 {
		entities = append(entities, fmt.Sprintf("acct-%d", i%1000))
		occurrences = append(occurrences, fmt.Sprintf("occ-%d", i*5))
		payloads = append(payloads, `{"amount": 1}`)
		var c *string
		if i%7 == 0 {
			c = new(`{"{\"amount\": 2}",NULL}`)
		}
		copies = append(copies, c)
	}
	run := []any{"default", "run", "run-uid", 0, 0}
	statements := []struct {
		name   string
		sql    string
		args   []any
		lookup bool // probes the rule's index per key
		plain  bool // neither looks up nor arbitrates: the insert's own unique check only
	}{
		{"claim", ledger.SQLClaim, append([]any{entities, occurrences, payloads}, run...), true, false},
		{"claim with effect", ledger.SQLClaimEffect, append([]any{entities, occurrences, payloads}, run...), true, false},
		{"claim comparing copies", ledger.SQLClaimCopies, append(append([]any{entities, occurrences, payloads}, run...), copies), true, false},
		{"claim comparing copies with effect", ledger.SQLClaimCopiesEffect, append(append([]any{entities, occurrences, payloads}, run...), copies), true, false},
		{"insert (arbiter)", ledger.SQLInsert, append([]any{entities, occurrences, payloads}, run...), false, false},
		{"insert (arbiter) with effect", ledger.SQLInsertEffect, append([]any{entities, occurrences, payloads}, run...), false, false},
		{"insert (expected fresh)", ledger.SQLInsertFresh, append([]any{entities, occurrences, payloads}, run...), false, true},
		{"insert (expected fresh) with effect", ledger.SQLInsertFreshEffect, append([]any{entities, occurrences, payloads}, run...), false, true},
		{"holders", ledger.SQLHolders, []any{entities, occurrences, "run-uid"}, true, false},
		{"holders with payloads", ledger.SQLHoldersPayload, []any{entities, occurrences, payloads, "run-uid"}, true, false},
		{"holders with payloads and copies", ledger.SQLHoldersCopies, []any{entities, occurrences, payloads, "run-uid", copies}, true, false},
		{"preload with payloads", ledger.SQLPreload, []any{entities, occurrences, payloads, "run-uid"}, true, false},
		{"supersede", ledger.SQLSupersede, []any{entities, occurrences, "other-run"}, true, false},
	}
	fill := func(from, to int, entity string) string {
		return fmt.Sprintf(`INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
SELECT %s, 'occ-' || i, 'default', 'big', 'big-run', 0, 0 FROM generate_series(%d, %d) AS i`, entity, from, to)
	}
	const noAutovacuum = `ALTER TABLE runledger.ledger SET (autovacuum_enabled = off)`
	spread := `'acct-' || (i % 1000)`
	for _, state := range []struct {
		name string
		sql  []string
	}{
		{"fresh, empty", nil},
		{"fresh, 60000 rows never analysed", []string{noAutovacuum, fill(1, 60000, spread)}},
		{"analysed, 60000 rows", []string{fill(1, 60000, spread), `VACUUM ANALYZE runledger.ledger`}},
		{"grown 100x since ANALYZE", []string{noAutovacuum, fill(1, 600, spread), `VACUUM ANALYZE runledger.ledger`, fill(601, 60600, spread)}},
		{"stale statistics (analysed skewed, then spread)", []string{noAutovacuum, fill(100001, 106000, `'acct-1'`), `VACUUM ANALYZE runledger.ledger`, fill(1, 60000, spread)}},
	} {
		t.Run(state.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := newPool(t)
			for _, q := range state.sql {
				mustExec(t, pool, q)
			}
			for _, st := range statements {
				t.Run(st.name, func(t *testing.T) {
					// As the insert path runs them: in a transaction that
					// leaves the planner no sequential scan, with the table
					// "claimed" of an effect's.
					tx, err := pool.Begin(ctx)
					require.NoError(t, err)
					defer func() { _ = tx.Rollback(ctx) }()
					_, err = tx.Exec(ctx, ledger.SQLIndexProbesOnly+"; "+ledger.SQLPinnedSearchPath+"; "+ledger.SQLCreateClaimed)
					require.NoError(t, err)
					rows, err := tx.Query(ctx, "EXPLAIN "+st.sql, st.args...)
					require.NoError(t, err)
					lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
					require.NoError(t, err)
					plan := strings.Join(lines, "\n")
					for _, scan := range []string{"Seq Scan on ledger", "Bitmap Heap Scan on ledger", "Hash Join", "Merge Join"} {
						require.NotContains(t, plan, scan, "no scan of the ledger, no join over it:\n%s", plan)
					}
					probes := strings.Count(plan, "Index Scan using "+ledger.BusinessKeyIndex)
					switch {
					case st.lookup:
						require.Positive(t, probes, "the lookup probes the rule's index per key:\n%s", plan)
					case st.plain:
						require.Zero(t, probes, "no lookup:\n%s", plan)
						require.NotContains(t, plan, "Conflict Arbiter", "no arbiter: a held key fails the insert:\n%s", plan)
						require.NotRegexp(t, `Scan (using \w+ )?on ledger `, plan, "the ledger is not read:\n%s", plan)
					default:
						require.Contains(t, plan, "Conflict Arbiter Indexes: "+ledger.BusinessKeyIndex, "the insert's arbiter is the rule:\n%s", plan)
					}
					// Every probe is by key (an Index Cond), never a walk of the whole index.
					byKeys := probes
					if strings.Contains(st.name, "supersede") {
						byKeys++ // the retired row's key history, counted for the new row's generation
						require.Regexp(t, `Index Only Scan using ledger_retired_key_idx on ledger_retired g .*\n\s+Index Cond: \(\(occurrence = l\.occurrence\) AND \(entity = l\.entity\)\)`, plan,
							"a superseded key's retired rows are counted by one probe of its key:\n%s", plan)
					}
					require.Len(t, byKey.FindAllString(plan, -1), byKeys, "each probe by key:\n%s", plan)
					require.Equal(t, strings.Count(plan, "Index Scan using")+strings.Count(plan, "Index Only Scan using"), strings.Count(plan, "Index Cond:"),
						"every index scan has its condition:\n%s", plan)
					require.NotContains(t, plan, "hashed SubPlan", "the lookup must probe per key, not hash a whole run:\n%s", plan)
					if strings.Contains(st.name, "supersede") {
						require.Regexp(t, `using ledger_retired_(pkey|key_idx) on ledger_retired \w+ .*\n\s+Index Cond: .*run_uid = `, plan,
							"the run's retired rows of a key are one probe of (run_uid, occurrence, entity):\n%s", plan)
					}
				})
			}
		})
	}
}

// TestShardProofPlanIsPerKey: the shard's proof (ProveShard, issue #44)
// costs one probe of the rule's index per key of the shard, whatever the
// planner believes. Right after a run wrote its rows no statistics know
// its run_uid: a join of the shard's keys with the run's rows (and with its
// failure records) was planned as a nested loop over all of them for every
// key, quadratic: 10,000 keys took 12 s, 100,000 would take 20 minutes.
func TestShardProofPlanIsPerKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	for _, q := range []string{
		`ALTER TABLE runledger.ledger SET (autovacuum_enabled = off)`,
		`ALTER TABLE runledger.item_failure SET (autovacuum_enabled = off)`,
		`CREATE TABLE src AS SELECT 'e' || i AS entity, 'o' AS occurrence FROM generate_series(1, 6000) AS i`,
	} {
		mustExec(t, pool, q)
	}
	s := ledger.NewStore(pool)
	run := runNamed("proof-plan")
	_, err := s.FixQueryBatch(ctx, run, ledger.BatchQuery{SQL: `SELECT entity, occurrence FROM src`, Shards: 1,
		ShardOf: func(string, string) string { return "0" }})
	require.NoError(t, err)
	// The run's rows as its chunks commit them, a failure record for the rest.
	mustExec(t, pool, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
SELECT entity, occurrence, 'default', 'run-proof-plan', 'proof-plan', 0, 0 FROM src WHERE right(entity, 1) <> '7'`)
	mustExec(t, pool, `INSERT INTO runledger.item_failure (run_uid, entity, occurrence, run_namespace, run_name, shard, attempt, pass, chunk, items, class, error)
SELECT 'proof-plan', entity, occurrence, 'default', 'run-proof-plan', 0, 0, 'p', 0, 1, '23514', 'refused' FROM src WHERE right(entity, 1) = '7'`)

	p, err := s.ProveShard(ctx, "proof-plan", 0, true, nil, nil)
	require.NoError(t, err)
	require.True(t, p.Proven(), "%+v", p)
	require.Equal(t, [4]int64{6000, 5400, 0, 600}, [4]int64{p.Total, p.Completed, p.AlreadyHandled, p.Failed})

	tx, err := pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: ledger.SQLBeginPinnedSnap})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, "EXPLAIN "+ledger.SQLProveKeptShard, "proof-plan", 0)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	for _, scan := range []string{"Seq Scan on ledger", "Bitmap Heap Scan on ledger", "ledger_run_shard_idx", "Join Filter", "Hash Join", "Merge Join"} {
		require.NotContains(t, plan, scan, "no join over the run's rows or records:\n%s", plan)
	}
	require.Equal(t, 1, strings.Count(plan, "Index Scan using "+ledger.BusinessKeyIndex), plan)
	require.Regexp(t, "Index Scan using "+ledger.BusinessKeyIndex+` on ledger \w+ .*\n\s+`+byKey.String(), plan,
		"one probe of the rule's index by key:\n%s", plan)

	// The counted proof's count of the shard's rows reads that shard's rows
	// only (O(shard), not the run's every shard).
	rows, err = tx.Query(ctx, "EXPLAIN "+ledger.SQLShardOwnRows, "proof-plan", 0)
	require.NoError(t, err)
	lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan = strings.Join(lines, "\n")
	require.Regexp(t, `Index (Only )?Scan using ledger_run_shard_idx on ledger \w+ .*\n\s+Index Cond: \(\(run_uid = .*\) AND \(shard = .*\)\)`, plan,
		"the shard's rows by (run_uid, shard):\n%s", plan)

	// What a shard that stopped reports of the ledger reads that shard's
	// rows and batch only, under the run's identity.
	rows, err = tx.Query(ctx, "EXPLAIN "+ledger.SQLHeldOfShard, "proof-plan", 0, "default", "run-proof-plan")
	require.NoError(t, err)
	lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan = strings.Join(lines, "\n")
	require.Regexp(t, `Index Scan using ledger_run_shard_idx on ledger \w+ .*\n\s+Index Cond: \(\(run_uid = .*\) AND \(shard = .*\)\)`, plan,
		"the shard's rows by (run_uid, shard):\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on ledger", plan)
	held, err := s.HeldOfShard(ctx, run)
	require.NoError(t, err)
	require.Equal(t, ledger.ShardHeld{Rows: 5400, BatchItems: 6000}, held)
	copied := run
	copied.Namespace = "elsewhere"
	held, err = s.HeldOfShard(ctx, copied)
	require.NoError(t, err)
	require.Zero(t, held, "a run given another's uid holds nothing of it")
}

// byKey is the condition of a probe of the rule's index by one key.
var byKey = regexp.MustCompile(`Index Cond: \(\(occurrence = \w+\.occurrence\) AND \(entity = \w+\.entity\)\)`)

// TestFixQueryBatch_SortsNothing: materialising a batch packs the query's
// rows into blocks as the query returns them, hashing the blocks, with no
// sort. One backend sorting every shard's rows by key was most of an
// already-handled run; each shard's reader sorts its own part instead
// (TestBatchReader_SortsItsShardOnly). Sorting the rows by block to pack
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

// TestBatchReader_SortsItsShardOnly: a shard's reader sorts its own items
// (of its blocks, the shard's range of the primary key) once into its sorted
// copy; a fetch reads the copy's blocks of its positions only, probes the
// rule's index for the items it returns only, above the fetch's limit, and
// the fetch that looks nothing up touches the ledger not at all.
func TestBatchReader_SortsItsShardOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	h, err := ledger.NewStore(pool).FixQueryBatch(ctx, runNamed("uid"), batchQuery())
	require.NoError(t, err)
	mustExec(t, pool, `ANALYZE runledger.batch`)
	explain := func(t *testing.T, sql string, args ...any) string {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		// As the reader runs: sequential scans off (and an effect's table
		// "claimed", as a chunk's transaction has it).
		_, err = tx.Exec(ctx, ledger.SQLIndexProbesOnly+"; "+ledger.SQLCreateClaimed)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	id := strconv.FormatInt(h.ID, 10)

	plan := explain(t, ledger.SQLSortShard, h.ID, 1)
	require.Equal(t, 1, strings.Count(plan, "Sort Key:"), "one sort:\n%s", plan)
	require.Contains(t, plan, "Index Cond: ((batch_id = '"+id+"'::bigint) AND (shard = 1))", "of the shard's blocks only:\n%s", plan)
	require.Contains(t, plan, "HashAggregate", "packed into blocks by hashing, no second sort:\n%s", plan)

	plan = explain(t, ledger.SQLFetchSortedProbe, h.ID, 1, int64(2000), 1000, "uid", false)
	require.True(t, strings.HasPrefix(plan, "Nested Loop Left Join"), "the probes are the top node, above the fetch's limit:\n%s", plan)
	require.Equal(t, 1, strings.Count(plan, "Sort Key:"), "one sort, of the fetch's rows:\n%s", plan)
	require.Contains(t, plan, "Index Cond: ((batch_id = '"+id+"'::bigint) AND (shard = 1) AND (block >= ", "the blocks of the fetch's positions only:\n%s", plan)
	require.Regexp(t, `One-Time Filter: \(\(l\.run_uid <> 'uid'::text\) AND \$\d+\)`, plan,
		"the probe of the run's retired keys is gated by the holder and by the run having any (once per statement):\n%s", plan)
	require.Contains(t, plan, "Index Only Scan using ledger_retired_pkey on ledger_retired rr", "whether the run has any: its primary key's range")
	require.Contains(t, plan, "Index Scan using "+ledger.BusinessKeyIndex, "probing the rule's index:\n%s", plan)

	plan = explain(t, ledger.SQLFetchSortedPlain, h.ID, 1, int64(2000), 1000)
	require.NotContains(t, plan, "ledger", "no lookup:\n%s", plan)
	require.Contains(t, plan, "(block >= ", "the blocks of the fetch's positions only:\n%s", plan)

	// A shard read in place: its order read off its blocks, with no sort;
	// a fetch reads the blocks of its positions, one range of the primary
	// key, and probes per row as above.
	plan = explain(t, ledger.SQLBatchOrder, h.ID, 1)
	require.NotContains(t, plan, "Sort", "the blocks in the primary key's order, each one's items compared in place:\n%s", plan)
	require.Contains(t, plan, "Index Cond: ((batch_id = '"+id+"'::bigint) AND (shard = 1))", "of the shard's blocks only:\n%s", plan)
	blocks, starts := []int64{2, 4, 6}, []int64{300, 600, 900}
	plan = explain(t, ledger.SQLFetchInPlaceProbe, h.ID, 1, int64(500), 1000, blocks, starts, "uid", false)
	require.Equal(t, 1, strings.Count(plan, "Sort Key:"), "one sort, of the fetch's rows:\n%s", plan)
	require.Contains(t, plan, "Index Cond: ((batch_id = '"+id+"'::bigint) AND (shard = 1) AND (block >= ", "the blocks of the fetch's positions only:\n%s", plan)
	require.NotContains(t, plan, "Hash", "no block read but the fetch's:\n%s", plan)
	require.Contains(t, plan, "Index Scan using "+ledger.BusinessKeyIndex, "probing the rule's index:\n%s", plan)
	plan = explain(t, ledger.SQLFetchInPlacePlain, h.ID, 1, int64(500), 1000, blocks, starts)
	require.NotContains(t, plan, "ledger", "no lookup:\n%s", plan)
	require.Contains(t, plan, "(block >= ", "the blocks of the fetch's positions only:\n%s", plan)

	// The claims of a fresh range on the server: the blocks of its
	// positions, and the ledger only written (its unique check aside), by a
	// plain insert with no arbiter.
	run := []any{"default", "run-uid", "uid", 1, 0, 1024, 1 << 20}
	for name, plan := range map[string]string{
		"sorted":                explain(t, ledger.SQLClaimFreshSorted, append([]any{h.ID, 1, int64(2000), 1000}, run...)...),
		"in place":              explain(t, ledger.SQLClaimFreshInPlace, append([]any{h.ID, 1, int64(500), 1000, blocks, starts}, run...)...),
		"sorted, with effect":   explain(t, ledger.SQLClaimFreshSortedEffect, append([]any{h.ID, 1, int64(2000), 1000}, run...)...),
		"in place, with effect": explain(t, ledger.SQLClaimFreshInPlaceEffect, append([]any{h.ID, 1, int64(500), 1000, blocks, starts}, run...)...),
	} {
		require.Contains(t, plan, "Index Cond: ((batch_id = '"+id+"'::bigint) AND (shard = 1) AND (block >= ", "%s: the blocks of the range only:\n%s", name, plan)
		require.Contains(t, plan, "Insert on ledger", "%s:\n%s", name, plan)
		require.NotRegexp(t, `Scan (using \w+ )?on ledger `, plan, "%s: the ledger is not read:\n%s", name, plan)
		require.NotContains(t, plan, "Conflict Arbiter", "%s: no arbiter: a held key fails the insert:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan", "%s:\n%s", name, plan)
	}
}

// TestKeyReadsProbeIndexes: runledger key reads a key's rows, superseded ones
// included, and the runs that retired it, by a probe of an index each, never
// a scan of the ledger or of ledger_retired, which on a large ledger the
// statement timeout would cut; and a static run's already handled items
// (runledger items -f) probe the rule's index per key.
func TestKeyReadsProbeIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	// 60,000 keys, a third of them superseded once (by an owner's insert of
	// the history: the append-only trigger guards updates).
	mustExec(t, pool, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
SELECT 'acct-' || (i % 1000), 'occ-' || i, 'default', 'big', 'big-run', 0, 0 FROM generate_series(1, 60000) AS i`)
	mustExec(t, pool, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt, state, superseded_at)
SELECT 'acct-' || (i % 1000), 'occ-' || i, 'default', 'old', 'old-run', 0, 0, 'superseded', now() FROM generate_series(1, 60000, 3) AS i`)
	mustExec(t, pool, `INSERT INTO runledger.ledger_retired (run_uid, occurrence, entity)
SELECT 'old-run', 'occ-' || i, 'acct-' || (i % 1000) FROM generate_series(1, 60000, 3) AS i`)
	mustExec(t, pool, `VACUUM ANALYZE runledger.ledger`)
	mustExec(t, pool, `VACUUM ANALYZE runledger.ledger_retired`)
	for _, st := range []struct {
		name, sql string
		args      []any
		index     []string
	}{
		{"key rows", ledger.SQLKeyRows, []any{"acct-4", "occ-4"}, []string{ledger.BusinessKeyIndex, "ledger_superseded_key_idx"}},
		{"key retired", ledger.SQLKeyRetired, []any{"acct-4", "occ-4"}, []string{"ledger_retired_key_idx"}},
		{"static already handled", ledger.SQLStaticHandled, []any{"run-uid", []string{"acct-4", "acct-5"}, []string{"occ-4", "occ-5"}, []*string{nil, nil}}, []string{ledger.BusinessKeyIndex}},
	} {
		t.Run(st.name, func(t *testing.T) {
			rows, err := pool.Query(ctx, "EXPLAIN "+st.sql, st.args...)
			require.NoError(t, err)
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			plan := strings.Join(lines, "\n")
			for _, scan := range []string{"Seq Scan on ledger", "Seq Scan on ledger_retired", "Bitmap Heap Scan on ledger"} {
				require.NotContains(t, plan, scan, "no scan:\n%s", plan)
			}
			for _, idx := range st.index {
				require.Regexp(t, `Index (Only )?Scan using `+idx, plan)
			}
		})
	}
}

package ledger_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// batchQuery is a query over table src split into 3 shards by entity's last
// digit (the ledger takes any shard function as SQL).
func batchQuery() ledger.BatchQuery {
	return ledger.BatchQuery{SQL: `SELECT entity, occurrence, payload FROM src WHERE NOT done`, HasPayload: true, Shards: 3,
		ShardOf: func(e, o string) string { return "(right(" + e + ", 1)::int % 3)" }}
}

const batchSource = `CREATE TABLE src (entity text, occurrence text, payload jsonb, done bool NOT NULL DEFAULT false);
INSERT INTO src (entity, occurrence, payload) SELECT 'e' || i, 'o', jsonb_build_object('i', i) FROM generate_series(1, 1000) i;`

// TestFixQueryBatch_OnceWhenShardsStartTogether: four shards fix the batch
// at once; it is written once, and later calls return it as it was even
// though the query now returns nothing.
func TestFixQueryBatch_OnceWhenShardsStartTogether(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	s := ledger.NewStore(pool)
	run := runNamed("fix-once")
	headers := make([]*ledger.BatchHeader, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range headers {
		wg.Go(func() { headers[i], errs[i] = s.FixQueryBatch(context.Background(), run, batchQuery()) })
	}
	wg.Wait()
	for i := range headers {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, headers[0], headers[i], "caller %d sees the same header", i)
	}
	require.Equal(t, ledger.BatchSourceQuery, headers[0].Source)
	require.Equal(t, 3, headers[0].Shards)
	require.EqualValues(t, 1000, headers[0].Items)
	require.Nil(t, headers[0].Pruned)
	require.EqualValues(t, 1000, scalar[int64](t, pool, `SELECT sum(cardinality(seqs)) FROM runledger.batch WHERE batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = 'fix-once')`), "written once")
	require.EqualValues(t, 1000, scalar[int64](t, pool, `SELECT count(DISTINCT seq) FROM runledger.batch, unnest(seqs) AS seq WHERE batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = 'fix-once')`))

	mustExec(t, pool, `UPDATE src SET done = true`)
	h, err := s.FixQueryBatch(context.Background(), run, batchQuery())
	require.NoError(t, err)
	require.Equal(t, headers[0], h)
	var total int64
	for shard := range 3 {
		n, err := s.BatchShardSize(context.Background(), h, shard)
		require.NoError(t, err)
		total += n
	}
	require.EqualValues(t, 1000, total, "the batch is what the query returned the first time")
}

// readShard reads shard of batch h from position skip, in fetches of 7
// that look each key up, and checks that every fetch comes with the run's
// header.
func readShard(t *testing.T, s *ledger.Store, h *ledger.BatchHeader, runUID string, shard int, skip int64) []ledger.BatchRow {
	t.Helper()
	r, err := s.OpenBatch(context.Background(), h, runUID, shard, true)
	require.NoError(t, err)
	got := []ledger.BatchRow{}
	for pos := skip; ; {
		page, now, err := r.Fetch(context.Background(), pos, 7, true)
		require.NoError(t, err)
		require.Equal(t, h, now, "the header as it is now")
		for _, row := range page {
			require.True(t, row.LookedUp)
		}
		got = append(got, page...)
		pos += int64(len(page))
		if len(page) < 7 {
			return got
		}
	}
}

// keyBefore: a sorts before b in a shard's key order (the rule's column
// order, occurrence then entity, byte order, a NULL key part first, ties by
// seq).
func keyBefore(a, b ledger.BatchRow) bool {
	for _, p := range [][2]*string{{a.Occurrence, b.Occurrence}, {a.Entity, b.Entity}} {
		switch x, y := p[0], p[1]; {
		case x == nil && y != nil:
			return true
		case x != nil && y == nil:
			return false
		case x != nil && *x != *y:
			return *x < *y
		}
	}
	return a.Seq < b.Seq
}

// TestBatchCursor_KeyOrderWithHolders: a shard reads its rows through a
// cursor in key order (occurrence then entity, byte order, NULL key parts
// first, repeats adjacent),
// each row once with its row number in the query's output and the run
// holding its key; a cursor reopened after n rows reads exactly the rest.
func TestBatchCursor_KeyOrderWithHolders(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	// A repeat (rows 1001 and 3), a NULL key part (row 1002), and keys that
	// byte order and a linguistic collation sort differently.
	mustExec(t, pool, `INSERT INTO src (entity, occurrence) VALUES ('e3', 'o'), (NULL, 'o'), ('E9', 'o'), ('e-9', 'o'), ('e_9', 'o'), ('e9', 'O')`)
	s := ledger.NewStore(pool)
	run := runNamed("read")
	h, err := s.FixQueryBatch(context.Background(), run, batchQuery())
	require.NoError(t, err)
	commit(t, s, run, []ledger.Item{{Key: ledger.Key{Entity: "e3", Occurrence: "o"}}}, ledger.ChunkOptions{})
	commit(t, s, runNamed("other"), []ledger.Item{{Key: ledger.Key{Entity: "e6", Occurrence: "o"}}}, ledger.ChunkOptions{})

	seqs := map[int64]bool{}
	for shard := range 3 {
		size, err := s.BatchShardSize(context.Background(), h, shard)
		require.NoError(t, err)
		got := readShard(t, s, h, run.UID, shard, 0)
		require.EqualValues(t, size, len(got), "shard %d: every row once", shard)
		var e3 []int
		for i, r := range got {
			require.False(t, seqs[r.Seq], "seq %d read twice", r.Seq)
			seqs[r.Seq] = true
			if i > 0 {
				require.True(t, keyBefore(got[i-1], r), "shard %d: key order at %d: %+v then %+v", shard, i, got[i-1], r)
			}
			switch {
			case r.Entity == nil:
				require.Zero(t, shard, "a NULL key part goes to shard 0")
				for _, before := range got[:i] {
					require.Less(t, *before.Occurrence, *r.Occurrence, "and sorts first among its occurrence's keys")
				}
				require.EqualValues(t, 1002, r.Seq, "its row number in the query's output")
				require.Equal(t, ledger.HolderNone, r.Holder)
			case *r.Entity == "e3":
				require.Equal(t, ledger.HolderSameRun, r.Holder)
				e3 = append(e3, i)
			case *r.Entity == "e6":
				require.Equal(t, ledger.HolderOtherRun, r.Holder)
			default:
				require.Equal(t, ledger.HolderNone, r.Holder)
			}
		}
		if len(e3) > 0 {
			require.Len(t, e3, 2, "both copies of e3 in one shard")
			require.Equal(t, e3[0]+1, e3[1], "repeats are adjacent")
			require.EqualValues(t, []int64{3, 1001}, []int64{got[e3[0]].Seq, got[e3[1]].Seq}, "in query order")
		}
		for _, skip := range []int{1, 7, len(got) / 2, len(got)} {
			require.Equal(t, got[skip:], readShard(t, s, h, run.UID, shard, int64(skip)), "shard %d: reopened after %d rows", shard, skip)
		}
	}
	require.Len(t, seqs, 1006, "every row of the batch")
	for seq := int64(1); seq <= 1006; seq++ {
		require.True(t, seqs[seq], "seq %d: seq is the row number in the query's output", seq)
	}
}

// TestBatchReader_SeesAPrune: every fetch says what the run's header is
// now: a prune since shows there (and took the shard's sorted copy with the
// batch, which is not sorted again from a pruned batch).
func TestBatchReader_SeesAPrune(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	h, err := s.FixQueryBatch(ctx, runNamed("pruned"), batchQuery())
	require.NoError(t, err)
	r, err := s.OpenBatch(ctx, h, "pruned", 0, true)
	require.NoError(t, err)
	first, now, err := r.Fetch(ctx, 0, 10, false)
	require.NoError(t, err)
	require.Len(t, first, 10)
	require.Nil(t, now.Pruned)

	p, err := s.PruneBatches(ctx, time.Now().Add(time.Hour))
	n, rows := p.Batches, p.Items
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 1000, rows)
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted`), "the sorted copies went with the batch")
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted_shard`))
	next, now, err := r.Fetch(ctx, 10, 10, false)
	require.NoError(t, err)
	require.NotNil(t, now.Pruned, "the header says pruned")
	require.Empty(t, next, "nothing is left to read, and nothing was sorted again")
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted_shard`))

	mustExec(t, pool, `DELETE FROM runledger.batch_run`)
	_, now, err = r.Fetch(ctx, 10, 10, false)
	require.NoError(t, err)
	require.Nil(t, now, "no header: deleted by hand")
}

// TestBatchReader_CopyLost: a shard's sorted copy lost between two fetches
// (a crash empties unlogged tables; here the copy is deleted as one) is
// sorted again and read on at the position reached: the rows are exactly
// those of a read without the loss. A copy read to the end and discarded
// leaves nothing behind.
func TestBatchReader_CopyLost(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	run := runNamed("lost")
	h, err := s.FixQueryBatch(ctx, run, batchQuery())
	require.NoError(t, err)
	want := readShard(t, s, h, run.UID, 1, 0)

	r, err := s.OpenBatch(ctx, h, run.UID, 1, true)
	require.NoError(t, err)
	var got []ledger.BatchRow
	for pos := int64(0); ; {
		page, _, err := r.Fetch(ctx, pos, 50, true)
		require.NoError(t, err)
		got = append(got, page...)
		pos += int64(len(page))
		if len(page) < 50 {
			break
		}
		if len(got) == 100 || len(got) == 200 {
			mustExec(t, pool, `TRUNCATE runledger.batch_sorted, runledger.batch_sorted_shard`)
		}
	}
	require.Equal(t, want, got)
	require.NoError(t, r.Discard(ctx))
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted WHERE shard = 1`))
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted_shard WHERE shard = 1`))
}

// TestBatchReader_LookupOrNot: a fetch that looks its keys up gives each
// row its holder as of the fetch; one that does not gives none (the claim
// will look them up), and reads the same rows.
func TestBatchReader_LookupOrNot(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	run := runNamed("looks")
	h, err := s.FixQueryBatch(ctx, run, batchQuery())
	require.NoError(t, err)
	r, err := s.OpenBatch(ctx, h, run.UID, 0, true)
	require.NoError(t, err)
	plain, _, err := r.Fetch(ctx, 0, 20, false)
	require.NoError(t, err)
	require.Len(t, plain, 20)
	// Half of them committed by another run, one by this run.
	var held []ledger.Item
	for i, row := range plain {
		if i%2 == 0 {
			held = append(held, ledger.Item{Key: ledger.Key{Entity: *row.Entity, Occurrence: *row.Occurrence}, Payload: row.Payload})
		}
	}
	commit(t, s, runNamed("other"), held, ledger.ChunkOptions{})
	commit(t, s, run, []ledger.Item{{Key: ledger.Key{Entity: *plain[1].Entity, Occurrence: *plain[1].Occurrence}}}, ledger.ChunkOptions{})

	looked, _, err := r.Fetch(ctx, 0, 20, true)
	require.NoError(t, err)
	// Without the held rows' payloads (a run that is not Supersede): the
	// rows the lookup settles come without theirs.
	lean, err := s.OpenBatch(ctx, h, run.UID, 0, false)
	require.NoError(t, err)
	settledless, _, err := lean.Fetch(ctx, 0, 20, true)
	require.NoError(t, err)
	for i := range settledless {
		require.Equal(t, looked[i].Holder, settledless[i].Holder)
		if looked[i].Holder == ledger.HolderNone {
			require.Equal(t, looked[i].Payload, settledless[i].Payload, "row %d: not settled, its payload comes", i)
		} else {
			require.Nil(t, settledless[i].Payload, "row %d: settled (held, its payload the committed row's), no payload", i)
		}
	}
	again, _, err := r.Fetch(ctx, 0, 20, false)
	require.NoError(t, err)
	for i := range plain {
		require.False(t, plain[i].LookedUp)
		require.Equal(t, plain[i], again[i], "row %d: a plain fetch reads the same row, looked nothing up", i)
		require.True(t, looked[i].LookedUp)
		require.Equal(t, plain[i].Seq, looked[i].Seq)
		want := ledger.HolderNone
		switch {
		case i%2 == 0:
			want = ledger.HolderOtherRun
		case i == 1:
			want = ledger.HolderSameRun
		}
		require.Equal(t, want, looked[i].Holder, "row %d", i)
	}
}

// TestFixQueryBatch_QueryCannotWrite: a query whose function writes (rows,
// or DDL) has its transaction rolled back: nothing is deleted or created, no
// batch is written, and the error names the table.
func TestFixQueryBatch_QueryCannotWrite(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, batchSource+`
CREATE FUNCTION zap() RETURNS int LANGUAGE sql AS $$ DELETE FROM src; SELECT 1 $$;
CREATE FUNCTION mk() RETURNS int LANGUAGE plpgsql AS $$ BEGIN CREATE TABLE IF NOT EXISTS made (x int); RETURN 1; END $$;`)
	s := ledger.NewStore(pool)
	for fn, table := range map[string]string{"zap()": "public.src (0 rows inserted, 0 updated, 1000 deleted)", "mk()": "pg_catalog.pg_"} {
		q := batchQuery()
		q.SQL = `SELECT entity, occurrence, payload, ` + fn + ` FROM src`
		_, err := s.FixQueryBatch(context.Background(), runNamed("w"), q)
		require.ErrorIs(t, err, ledger.ErrBatchQuery, fn)
		var w *ledger.ForeignWriteError
		require.ErrorAs(t, err, &w, fn)
		require.ErrorContains(t, err, "the batch's query wrote to "+table, fn)
	}
	require.EqualValues(t, 1000, scalar[int64](t, pool, `SELECT count(*) FROM src`), "nothing deleted")
	require.False(t, scalar[bool](t, pool, `SELECT to_regclass('made') IS NOT NULL`), "nothing created")
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.batch_run`), "no header")
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.batch`))
}

// TestPruneBatches: the rows of batches older than the cutoff go, their
// headers stay as tombstones, and a pruned batch is never materialised again.
func TestPruneBatches(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	for _, uid := range []string{"old", "new"} {
		_, err := s.FixQueryBatch(ctx, runNamed(uid), batchQuery())
		require.NoError(t, err)
	}
	_, err := s.FixStaticBatch(ctx, runNamed("old-static"), 1, 3, "digest")
	require.NoError(t, err)
	mustExec(t, pool, `UPDATE runledger.batch_run SET created_at = now() - interval '2 days' WHERE run_uid IN ('old', 'old-static')`)

	p, err := s.PruneBatches(ctx, time.Now().Add(-24*time.Hour))
	batches, rows := p.Batches, p.Items
	require.NoError(t, err)
	require.EqualValues(t, 2, batches)
	require.EqualValues(t, 1000, rows)
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.batch WHERE batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = 'old')`))
	require.EqualValues(t, 1000, scalar[int64](t, pool, `SELECT sum(cardinality(seqs)) FROM runledger.batch WHERE batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = 'new')`), "a newer batch is kept")

	h, err := s.FixQueryBatch(ctx, runNamed("old"), batchQuery())
	require.NoError(t, err)
	require.NotNil(t, h.Pruned, "the tombstone says pruned")
	require.EqualValues(t, 1000, h.Items, "and what the batch was")
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.batch WHERE batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = 'old')`), "not materialised again")

	p, err = s.PruneBatches(ctx, time.Now().Add(-24*time.Hour))
	batches, rows = p.Batches, p.Items
	require.NoError(t, err)
	require.Zero(t, batches, "pruning again finds nothing")
	require.Zero(t, rows)
}

// TestFixQueryBatch_BlocksBounded: the batch is packed in blocks, each of
// one shard's items among 4000 consecutive seqs, and an item of more than
// 16 KiB of text is a block of its own, so that large payloads never build an
// array near PostgreSQL's 1 GB limit on a value; reading the shard gives
// every item back whole.
func TestFixQueryBatch_BlocksBounded(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	// 9,000 small rows, then 40 payloads of 1 MiB (40 MiB in all).
	mustExec(t, pool, `CREATE TABLE big AS
SELECT i, 'e' || i AS entity, 'o' AS occurrence, CASE WHEN i > 9000 THEN repeat('x', 1 << 20) ELSE 'p' || i END AS payload
FROM generate_series(1, 9040) i`)
	s := ledger.NewStore(pool)
	q := ledger.BatchQuery{SQL: `SELECT entity, occurrence, payload FROM big ORDER BY i`, HasPayload: true, Shards: 1,
		ShardOf: func(string, string) string { return "0" }}
	h, err := s.FixQueryBatch(context.Background(), runNamed("big"), q)
	require.NoError(t, err)
	require.EqualValues(t, 9040, h.Items)

	type block struct {
		Items, MinSeq, MaxSeq, Bytes int64
	}
	rows, err := pool.Query(context.Background(), `
SELECT cardinality(seqs), (SELECT min(s) FROM unnest(seqs) s), (SELECT max(s) FROM unnest(seqs) s),
       (SELECT coalesce(sum(octet_length(p)), 0) FROM unnest(payloads) p)
FROM runledger.batch WHERE batch_id = $1 ORDER BY block`, h.ID)
	require.NoError(t, err)
	blocks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[block])
	require.NoError(t, err)
	var items, small int64
	for i, b := range blocks {
		items += b.Items
		if b.MaxSeq > 9000 {
			require.EqualValues(t, 1, b.Items, "block %d: a large item is a block of its own", i)
			require.EqualValues(t, 1<<20, b.Bytes)
			continue
		}
		small++
		require.Equal(t, b.MinSeq/4000, b.MaxSeq/4000, "block %d: seqs %d..%d, within one range of 4000 seqs", i, b.MinSeq, b.MaxSeq)
	}
	require.EqualValues(t, 9040, items)
	require.EqualValues(t, 3, small, "9,000 small items in blocks of 4000 seqs: %+v", blocks)
	require.Len(t, blocks, 43)

	got := readShard(t, s, h, "big", 0, 0)
	require.Len(t, got, 9040)
	seen := map[int64]bool{}
	for _, r := range got {
		require.False(t, seen[r.Seq], "seq %d read twice", r.Seq)
		seen[r.Seq] = true
		require.Equal(t, "e"+strconv.FormatInt(r.Seq, 10), *r.Entity, "its key")
		if r.Seq > 9000 {
			require.Len(t, r.Payload, 1<<20, "seq %d: its payload whole", r.Seq)
		} else {
			require.Equal(t, "p"+strconv.FormatInt(r.Seq, 10), string(r.Payload))
		}
	}
}

// TestPruneBatches_LeavesRunsInFlight: a run one of whose shards is held (a
// worker holds its lease, or a worker of a release before the lease its
// session lock) is not pruned: the other old batches are, and the error
// names the run in flight. Once its shard is over, the next prune prunes
// it, and leaves no lease behind.
func TestPruneBatches_LeavesRunsInFlight(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	q := batchQuery()
	q.Shards = 3
	for _, uid := range []string{"over", "busy"} {
		_, err := s.FixQueryBatch(ctx, runNamed(uid), q)
		require.NoError(t, err)
	}
	mustExec(t, pool, `UPDATE runledger.batch_run SET created_at = now() - interval '2 days'`)
	worker := s.ShardLease("busy", 2)
	require.NoError(t, worker.Acquire(ctx, time.Second, nil))

	p, err := s.PruneBatches(ctx, time.Now().Add(-24*time.Hour))
	batches, rows := p.Batches, p.Items
	var inFlight *ledger.RunsInFlightError
	require.ErrorAs(t, err, &inFlight)
	require.Equal(t, []string{"default/run-busy (busy)"}, inFlight.Runs)
	require.ErrorContains(t, err, "1 runs in flight left unpruned")
	require.EqualValues(t, 1, batches, "the run that is over is pruned")
	require.EqualValues(t, 1000, rows)
	h, err := s.BatchHeader(ctx, "busy")
	require.NoError(t, err)
	require.Nil(t, h.Pruned, "the run in flight is not")
	require.EqualValues(t, 1000, scalar[int64](t, pool, `SELECT sum(cardinality(seqs)) FROM runledger.batch WHERE batch_id = $1`, h.ID), "its rows are all there")

	// The shard goes on: its lease is still its own.
	require.NoError(t, worker.Check(ctx))
	worker.Release()
	// An earlier release's worker, by its session lock.
	old, err := directPool(t, pool).Acquire(ctx)
	require.NoError(t, err)
	defer old.Release()
	_, err = old.Exec(ctx, `SELECT pg_advisory_lock($1)`, ledger.ShardLockKey("busy", 1))
	require.NoError(t, err)
	_, err = s.PruneBatches(ctx, time.Now().Add(-24*time.Hour))
	require.ErrorAs(t, err, &inFlight)
	_, err = old.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	p, err = s.PruneBatches(ctx, time.Now().Add(-24*time.Hour))
	batches, rows = p.Batches, p.Items
	require.NoError(t, err)
	require.EqualValues(t, 1, batches)
	require.EqualValues(t, 1000, rows)
	h, err = s.BatchHeader(ctx, "busy")
	require.NoError(t, err)
	require.NotNil(t, h.Pruned)
	// The prune's leases went with the run's.
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.shard_lease WHERE run_uid = 'busy'`))
	again := s.ShardLease("busy", 2)
	require.NoError(t, again.Acquire(ctx, time.Second, nil))
	again.Release()
}

// TestOpenBatch_SortOutlivingItsBound: a sort that outlives the statement
// bound fails retryably and leaves no copy (its one statement wrote
// nothing); the next open sorts the shard.
func TestOpenBatch_SortOutlivingItsBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	mustExec(t, pool, `CREATE TABLE src (entity text, occurrence text, payload jsonb, done bool NOT NULL DEFAULT false);
INSERT INTO src (entity, occurrence) SELECT 'e' || i, 'o' FROM generate_series(1, 60000) i`)
	s := ledger.NewStore(pool)
	run := runNamed("slow")
	h, err := s.FixQueryBatch(ctx, run, batchQuery())
	require.NoError(t, err)

	_, err = s.WithBounds(time.Millisecond, 0).OpenBatch(ctx, h, run.UID, 0, true)
	require.Error(t, err, "20,000 rows are not sorted within 1ms")
	require.True(t, ledger.IsRetryable(err), "%v", err)
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted`), "nothing of the sort is left")
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted_shard`))

	r, err := s.OpenBatch(ctx, h, run.UID, 0, true)
	require.NoError(t, err)
	rows, _, err := r.Fetch(ctx, 0, 5, true)
	require.NoError(t, err)
	require.Len(t, rows, 5)
}

// TestBatchReader_RowsAsTheQueryGaveThem: a fetch gives each row's key parts
// and payload exactly as the query returned them, with or without lookups:
// a NULL key part or payload as nil, an empty payload as empty (not none),
// bytes beyond ASCII as they were; and each payload is its own (appending
// to one never writes over the next).
func TestBatchReader_RowsAsTheQueryGaveThem(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, `CREATE TABLE odd (i int, entity text, occurrence text, payload text);
INSERT INTO odd VALUES (1, 'a', 'o', 'p1'), (2, NULL, 'o', 'p2'), (3, 'c', NULL, ''), (4, 'd', 'o', NULL),
  (5, 'é€😀', 'ö', '{"x": "ü"}'), (6, 'f', 'o', repeat('y', 100000)), (7, '', '', 'p7')`)
	s := ledger.NewStore(pool)
	q := ledger.BatchQuery{SQL: `SELECT entity, occurrence, payload FROM odd ORDER BY i`, HasPayload: true, Shards: 1,
		ShardOf: func(string, string) string { return "0" }}
	run := runNamed("odd")
	h, err := s.FixQueryBatch(context.Background(), run, q)
	require.NoError(t, err)
	str := func(s string) *string { return &s }
	want := map[int64]ledger.BatchRow{
		1: {Seq: 1, Entity: str("a"), Occurrence: str("o"), Payload: []byte("p1")},
		2: {Seq: 2, Occurrence: str("o"), Payload: []byte("p2")},
		3: {Seq: 3, Entity: str("c"), Payload: []byte{}},
		4: {Seq: 4, Entity: str("d"), Occurrence: str("o")},
		5: {Seq: 5, Entity: str("é€😀"), Occurrence: str("ö"), Payload: []byte(`{"x": "ü"}`)},
		6: {Seq: 6, Entity: str("f"), Occurrence: str("o"), Payload: []byte(strings.Repeat("y", 100000))},
		7: {Seq: 7, Entity: str(""), Occurrence: str(""), Payload: []byte("p7")},
	}
	r, err := s.OpenBatch(context.Background(), h, run.UID, 0, true)
	require.NoError(t, err)
	for _, lookup := range []bool{false, true} {
		rows, _, err := r.Fetch(context.Background(), 0, 10, lookup)
		require.NoError(t, err)
		require.Len(t, rows, len(want))
		for i, row := range rows {
			w := want[row.Seq]
			w.LookedUp = lookup
			require.Equal(t, w, row, "row %d (lookup %v)", i, lookup)
			if row.Payload == nil {
				require.Nil(t, w.Payload, "seq %d: NULL, not empty", row.Seq)
			} else {
				require.NotNil(t, w.Payload, "seq %d: a payload, not NULL", row.Seq)
			}
		}
		for i := range rows {
			_ = append(rows[i].Payload, "!!!!"...)
		}
		for _, row := range rows {
			require.Equal(t, want[row.Seq].Payload, row.Payload, "seq %d: an append to another row's payload wrote over it", row.Seq)
		}
	}
}

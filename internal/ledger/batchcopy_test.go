package ledger_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// batchItem is one item of a fixed batch as its blocks hold it.
type batchItem struct {
	Seq                int64
	Shard              int
	Entity, Occurrence *string
	Payload            *string
}

// batchItems reads every item of run uid's batch, by seq, and checks that
// each block holds one shard's items in ascending seqs.
func batchItems(t *testing.T, pool *pgxpool.Pool, uid string) []batchItem {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT u.s, b.shard, u.e, u.o, u.p, b.seqs = ARRAY(SELECT x FROM unnest(b.seqs) AS x ORDER BY x)
FROM runledger.batch AS b, unnest(b.seqs, b.entities, b.occurrences, b.payloads) AS u(s, e, o, p)
WHERE b.batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = $1)
ORDER BY u.s`, uid)
	require.NoError(t, err)
	var out []batchItem
	for rows.Next() {
		var it batchItem
		var ascending bool
		require.NoError(t, rows.Scan(&it.Seq, &it.Shard, &it.Entity, &it.Occurrence, &it.Payload, &ascending))
		require.True(t, ascending, "seq %d: its block's seqs ascend", it.Seq)
		out = append(out, it)
	}
	require.NoError(t, rows.Err())
	return out
}

// randomText is a key part or payload text of up to n bytes: ASCII,
// Latin-1, CJK and emoji, spaces, empty.
func randomText(r *rand.Rand, n int) string {
	alphabet := []string{"a", "Z", "0", " ", "-", "é", "ß", "中", "😀", "\t", "'", `"`, `\`}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

// TestQueryBatchCopiedAsOneStatementWritesIt: a query's batch copied from
// the query's session (the default, straight to PostgreSQL) holds exactly
// the items, seqs and shards that one statement fixing it on the server
// gives (the way behind a pooler), over random rows: NULL key parts (shard
// 0), empty and non-ASCII text, NULL and large payloads (an item over
// 16 KiB is a block of its own, a window of blocks closes at 4 MiB), any
// shard count. So Go's shard function is the server's, byte for byte.
func TestQueryBatchCopiedAsOneStatementWritesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	mustExec(t, pool, `CREATE TABLE src (id int PRIMARY KEY, entity text, occurrence text, payload jsonb)`)
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 1))
	for round := range 4 {
		mustExec(t, pool, `TRUNCATE src`)
		n := 1 + r.IntN(9000)
		ids := make([]int32, n)
		entities, occurrences, payloads := make([]*string, n), make([]*string, n), make([]*string, n)
		for i := range n {
			ids[i] = int32(i)
			e, o := randomText(r, r.IntN(12)), randomText(r, r.IntN(12))
			entities[i], occurrences[i] = &e, &o
			switch r.IntN(50) {
			case 0:
				entities[i] = nil
			case 1:
				occurrences[i] = nil
			}
			var p string
			switch k := r.IntN(40); {
			case k == 0:
				continue // no payload
			case k == 1:
				p = fmt.Sprintf(`{"big": %q}`, randomText(r, 17<<10)) // a block of its own
			case k < 6:
				p = fmt.Sprintf(`{"wide": %q}`, randomText(r, 12<<10)) // fills a 4 MiB window early
			default:
				p = fmt.Sprintf(`{"i": %d, "s": %q}`, i, randomText(r, 8))
			}
			payloads[i] = &p
		}
		_, err := pool.Exec(ctx, `INSERT INTO src SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::jsonb[])`, ids, entities, occurrences, payloads)
		require.NoError(t, err)
		shards := 1 + r.IntN(7)
		q := ledger.BatchQuery{SQL: `SELECT entity, occurrence, payload FROM src ORDER BY id`, HasPayload: true, Shards: shards, Copy: true}
		copied, statement := runNamed(fmt.Sprintf("copied-%d", round)), runNamed(fmt.Sprintf("statement-%d", round))
		hc, err := s.FixQueryBatch(ctx, copied, q)
		require.NoError(t, err)
		q.ShardOf = ledger.StatementShardOf(shards)
		hs, err := s.FixQueryBatch(ctx, statement, q)
		require.NoError(t, err)

		require.EqualValues(t, n, hc.Items, "seed %d round %d: the copied header's count", seed, round)
		require.Equal(t, hs.Items, hc.Items)
		require.Equal(t, ledger.BatchSourceQuery, hc.Source)
		got, want := batchItems(t, pool, copied.UID), batchItems(t, pool, statement.UID)
		require.Len(t, got, n)
		for i := range want {
			require.Equal(t, want[i], got[i], "seed %d round %d (%d shards): item %d", seed, round, shards, i)
		}
		for shard := range shards {
			a, err := s.BatchShardSize(ctx, hc, shard)
			require.NoError(t, err)
			b, err := s.BatchShardSize(ctx, hs, shard)
			require.NoError(t, err)
			require.Equal(t, b, a, "shard %d's size", shard)
		}
	}
}

// blockOf4000 is the block of item 4000 of run uid's batch: 0 where the
// batch was copied (a window of blocks holds items 1-4000), 2 where one
// statement fixed it (a window holds seqs 0-3999 by seq / 4000).
func blockOf4000(t *testing.T, pool *pgxpool.Pool, uid string) int64 {
	t.Helper()
	return scalar[int64](t, pool, `SELECT block FROM runledger.batch WHERE batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = $1) AND 4000 = ANY (seqs)`, uid)
}

// TestQueryBatchCopyWithoutASecondConnection: where the pool has no second
// connection to copy the batch with (a pool of one; the other connection
// busy past copySessionWait), or behind a pooler, one statement fixes it
// on the query's session, the same items.
func TestQueryBatchCopyWithoutASecondConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := newPool(t)
	mustExec(t, owner, `CREATE TABLE src (entity text, occurrence text, payload jsonb);
INSERT INTO src SELECT 'e' || i, 'o', jsonb_build_object('i', i) FROM generate_series(1, 5000) i`)
	q := ledger.BatchQuery{SQL: `SELECT entity, occurrence, payload FROM src`, HasPayload: true, Shards: 3, Copy: true}
	for _, tc := range []struct {
		name  string
		conns int32
		busy  bool
		block int64
	}{
		{"copied", 2, false, 0},
		{"a pool of one", 1, false, 2},
		{"the second connection busy", 2, true, 2},
	} {
		if pgtest.ThroughPooler() {
			tc.block = 2 // behind a pooler one statement fixes every batch
		}
		pool, err := ledger.Open(ctx, owner.Config().ConnString(), tc.conns, ledger.KeepSearchPath())
		require.NoError(t, err)
		var held *pgxpool.Conn
		if tc.busy {
			held, err = pool.Acquire(ctx)
			require.NoError(t, err)
		}
		run := runNamed(strings.ReplaceAll(tc.name, " ", "-"))
		h, err := ledger.NewStore(pool).FixQueryBatch(ctx, run, q)
		if held != nil {
			held.Release()
		}
		pool.Close()
		require.NoError(t, err, tc.name)
		require.EqualValues(t, 5000, h.Items, tc.name)
		require.EqualValues(t, 5000, scalar[int64](t, owner, `SELECT count(DISTINCT seq) FROM runledger.batch, unnest(seqs) AS seq WHERE batch_id = $1`, h.ID), tc.name)
		require.Equal(t, tc.block, blockOf4000(t, owner, run.UID), "%s: the block of item 4000 says who wrote the batch", tc.name)
	}
}

package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// srcRow is a row of the in-place tests' source table, in query order.
type srcRow struct {
	entity, occurrence *string
	payload            string
}

func str(s string) *string { return &s }

// inOrderRows returns n rows in key order (occurrence, then entity, byte
// order), a key repeated now and then right after its first copy.
func inOrderRows(rng *rand.Rand, n int) []srcRow {
	rows := make([]srcRow, 0, n)
	occ := 0
	for len(rows) < n {
		occ += 1 + rng.IntN(3)
		for e := 0; e < 1+rng.IntN(4) && len(rows) < n; e++ {
			// "Z" sorts before "a" in byte order, not in most locales'.
			ent := []string{"Z-0", "Z-1", "a-0", "a-1"}[e]
			copies := 1
			if rng.IntN(20) == 0 {
				copies = 2
			}
			for range copies {
				rows = append(rows, srcRow{entity: str(ent), occurrence: str(fmt.Sprintf("o-%07d", occ)), payload: fmt.Sprintf(`{"n": %d}`, len(rows))})
			}
		}
	}
	return rows[:n]
}

// TestBatchReader_InPlace: a shard whose items lie in key order in the batch
// (a query that returns its rows in the rule's order) is read where it lies,
// with no sorted copy, and gives exactly what its sorted copy gives: the same
// rows at the same positions, whatever the fetches' ranges, with the same
// holders. A shard out of order anywhere (two items of one block, the last
// of a block and the first of the next, a NULL key part, a repeat apart from
// its first copy, a large item's block of its own out of place) is sorted.
// Randomised: each kind over several seeds.
func TestBatchReader_InPlace(t *testing.T) {
	t.Parallel()
	swap := func(rows []srcRow, i int) { rows[i], rows[i+1] = rows[i+1], rows[i] }
	big := `{"big": "` + strings.Repeat("x", 17<<10) + `"}`
	for _, c := range []struct {
		name    string
		icu     bool // the database collated by ICU's "en", where "a" sorts before "Z"
		shards  int
		n       int
		mutate  func(rng *rand.Rand, rows []srcRow)
		inPlace bool
	}{
		{name: "in order", shards: 1, n: 9000, inPlace: true},
		{name: "in order, two shards", shards: 2, n: 9000, inPlace: true},
		{name: "in byte order, in a database collated otherwise", icu: true, shards: 1, n: 5000, inPlace: true},
		{name: "a large item last", shards: 1, n: 5000, inPlace: true,
			mutate: func(_ *rand.Rand, rows []srcRow) { rows[len(rows)-1].payload = big }},
		{name: "two items of a block swapped", shards: 1, n: 9000,
			mutate: func(rng *rand.Rand, rows []srcRow) { swap(rows, 4100+rng.IntN(3000)) }},
		{name: "the last item of a block and the first of the next swapped", shards: 1, n: 9000,
			// seq is the row number from 1; block 0 holds seqs 1 to 3999.
			mutate: func(_ *rand.Rand, rows []srcRow) { swap(rows, 3998) }},
		{name: "a NULL key part", shards: 1, n: 6000,
			mutate: func(rng *rand.Rand, rows []srcRow) { rows[rng.IntN(len(rows))].entity = nil }},
		{name: "a repeat apart from its first copy", shards: 1, n: 6000,
			mutate: func(rng *rand.Rand, rows []srcRow) {
				i := rng.IntN(len(rows) - 10)
				rows[i+5].entity, rows[i+5].occurrence = rows[i].entity, rows[i].occurrence
			}},
		{name: "a large item inside", shards: 1, n: 5000,
			mutate: func(rng *rand.Rand, rows []srcRow) { rows[rng.IntN(len(rows)-1)].payload = big }},
		{name: "shuffled, three shards", shards: 3, n: 6000,
			mutate: func(rng *rand.Rand, rows []srcRow) { rng.Shuffle(len(rows), func(i, j int) { swap(rows, min(i, j)) }) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for seed := range uint64(3) {
				rng := rand.New(rand.NewPCG(seed, 27))
				rows := inOrderRows(rng, c.n)
				if c.mutate != nil {
					c.mutate(rng, rows)
				}
				var pool *pgxpool.Pool
				if c.icu {
					pool = pgtest.Pool(t, pgtest.NewICUDatabase(t, "en"))
				} else {
					pool = newPool(t)
				}
				checkInPlace(t, pool, rng, rows, c.shards, c.inPlace)
			}
		})
	}
}

// checkInPlace fixes rows as a batch of shards shards, commits some of its
// keys (by the run itself and by another), and reads every shard both ways.
func checkInPlace(t *testing.T, pool *pgxpool.Pool, rng *rand.Rand, rows []srcRow, shards int, inPlace bool) {
	t.Helper()
	ctx := context.Background()
	mustExec(t, pool, `CREATE TABLE src (id integer PRIMARY KEY, entity text, occurrence text, payload jsonb)`)
	ids := make([]int32, len(rows))
	ents, occs, pays := make([]*string, len(rows)), make([]*string, len(rows)), make([]string, len(rows))
	for i, r := range rows {
		ids[i], ents[i], occs[i], pays[i] = int32(i), r.entity, r.occurrence, r.payload
	}
	mustExec(t, pool, `INSERT INTO src SELECT * FROM unnest($1::integer[], $2::text[], $3::text[], $4::jsonb[])`, ids, ents, occs, pays)
	s := ledger.NewStore(pool)
	run := runNamed(fmt.Sprintf("in-place-%d", rng.Uint64()))
	h, err := s.FixQueryBatch(ctx, run, ledger.BatchQuery{SQL: `SELECT entity, occurrence, payload FROM src ORDER BY id`, HasPayload: true, Shards: shards,
		ShardOf: func(e, o string) string {
			return "(length(" + e + ") + length(" + o + ") + ascii(right(" + o + ", 1))) % " + fmt.Sprint(shards)
		}})
	require.NoError(t, err)
	var mine, others []ledger.Item
	for _, r := range rows {
		if r.entity == nil || r.occurrence == nil || rng.IntN(4) != 0 {
			continue
		}
		it := ledger.Item{Key: ledger.Key{Entity: *r.entity, Occurrence: *r.occurrence}, Payload: json.RawMessage(r.payload)}
		if rng.IntN(2) == 0 {
			mine = append(mine, it)
		} else {
			others = append(others, it)
		}
	}
	// CommitChunk sorts a chunk and keeps the first copy of each key itself.
	commit(t, s, run, mine, ledger.ChunkOptions{})
	commit(t, s, runNamed("another"), others, ledger.ChunkOptions{})

	placed := 0
	for shard := range shards {
		r, err := s.OpenBatch(ctx, h, run.UID, shard, false)
		require.NoError(t, err)
		if r.InPlace() {
			placed++
			require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted_shard WHERE shard = $1`, shard), "shard %d: no copy written", shard)
		}
		sorted, err := s.OpenSortedBatchForTest(ctx, h, run.UID, shard, false)
		require.NoError(t, err)
		size, err := s.BatchShardSize(ctx, h, shard)
		require.NoError(t, err)
		for range 12 {
			pos, n, lookup := rng.Int64N(size+10), 1+rng.IntN(3000), rng.IntN(2) == 0
			got, _, err := r.Fetch(ctx, pos, n, lookup)
			require.NoError(t, err)
			want, _, err := sorted.Fetch(ctx, pos, n, lookup)
			require.NoError(t, err)
			require.Equal(t, want, got, "shard %d, %d rows from %d (lookup %v)", shard, n, pos, lookup)
			require.Len(t, got, int(max(min(int64(n), size-pos), 0)))
		}
		require.NoError(t, sorted.Discard(ctx))
	}
	if inPlace {
		require.Equal(t, shards, placed, "every shard is read in place")
	} else {
		require.Less(t, placed, shards, "a shard out of order is sorted")
	}
}

// TestBatchReader_InPlaceSeesAPrune: a shard read in place learns of a
// prune as one read from its copy does: the fetch's header says pruned, and
// nothing is read from the deleted blocks.
func TestBatchReader_InPlaceSeesAPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	mustExec(t, pool, `CREATE TABLE src AS SELECT 'e' AS entity, 'o-' || lpad(i::text, 6, '0') AS occurrence, NULL::jsonb AS payload FROM generate_series(1, 5000) AS i`)
	s := ledger.NewStore(pool)
	run := runNamed("in-place-pruned")
	h, err := s.FixQueryBatch(ctx, run, ledger.BatchQuery{SQL: `SELECT entity, occurrence FROM src ORDER BY occurrence`, Shards: 1,
		ShardOf: func(string, string) string { return "0" }})
	require.NoError(t, err)
	r, err := s.OpenBatch(ctx, h, run.UID, 0, false)
	require.NoError(t, err)
	require.True(t, r.InPlace())
	first, now, err := r.Fetch(ctx, 0, 100, true)
	require.NoError(t, err)
	require.Len(t, first, 100)
	require.Nil(t, now.Pruned)

	p, err := s.PruneBatches(ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 1, p.Batches)
	next, now, err := r.Fetch(ctx, 100, 100, true)
	require.NoError(t, err)
	require.NotNil(t, now.Pruned, "the header says pruned")
	require.Empty(t, next, "nothing is left to read")
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.batch_sorted_shard`), "and nothing was sorted")
}

package ledger_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// shardGolden pins ShardOf: hashtextextended(entity, hashtextextended(
// occurrence, seed)) with the top bit cleared, mod n. PostgreSQL itself is the
// oracle: TestShardSQLMatchesGo computes the same values on the server. If
// this test fails, the function changed and every running or resumed run
// would split its keys differently: do not update the values, restore the
// function.
var shardGolden = []struct {
	entity, occurrence string
	shards             map[int]int // n -> shard
}{
	{"acct-1", "2024-06", map[int]int{1: 0, 2: 0, 3: 1, 4: 0, 7: 5, 256: 120}},
	{"acct-2", "2024-06", map[int]int{1: 0, 2: 0, 3: 0, 4: 0, 7: 2, 256: 4}},
	{"a", "bc", map[int]int{1: 0, 2: 0, 3: 1, 4: 2, 7: 2, 256: 106}},
	{"ab", "c", map[int]int{1: 0, 2: 0, 3: 0, 4: 2, 7: 6, 256: 54}},
	{"Ünïcødé", "🙂", map[int]int{1: 0, 2: 0, 3: 0, 4: 0, 7: 5, 256: 92}},
	{"x", "y", map[int]int{1: 0, 2: 1, 3: 1, 4: 1, 7: 4, 256: 21}},
	{"customer-000042", "invoice-2024-01", map[int]int{1: 0, 2: 0, 3: 2, 4: 0, 7: 3, 256: 196}},
}

func TestShardOfGolden(t *testing.T) {
	t.Parallel()
	for _, g := range shardGolden {
		for n, want := range g.shards {
			got := ledger.ShardOf(ledger.Key{Entity: g.entity, Occurrence: g.occurrence}, n)
			require.Equal(t, want, got, "ShardOf(%q, %q, %d)", g.entity, g.occurrence, n)
		}
	}
}

func TestShardOfSpreadsKeys(t *testing.T) {
	t.Parallel()
	const n, keys = 4, 40000
	counts := make([]int, n)
	for i := range keys {
		counts[ledger.ShardOf(ledger.Key{Entity: fmt.Sprintf("acct-%d", i), Occurrence: "2024-06"}, n)]++
	}
	for s, c := range counts {
		require.InDelta(t, keys/n, c, keys/n*0.05, "shard %d holds %d of %d keys: the hash does not spread", s, c, keys)
	}
}

// TestShardSQLMatchesGo: the SQL filter of query sources computes exactly
// ShardOf, for the golden keys and for many generated ones, on the real
// server.
func TestShardSQLMatchesGo(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	var entities, occurrences []string
	for _, g := range shardGolden {
		entities, occurrences = append(entities, g.entity), append(occurrences, g.occurrence)
	}
	for i := range 3000 {
		// Lengths from 1 to ~60 bytes: every tail length of lookup3's 12-byte blocks.
		entities = append(entities, fmt.Sprintf("entity-%d-é%s", i, strings.Repeat("x", i%37)))
		occurrences = append(occurrences, fmt.Sprintf("%d%s", i*7919, strings.Repeat("ø", i%13)))
	}
	for _, n := range []int{1, 2, 3, 4, 7, 16, 255, 256} {
		rows, err := pool.Query(ctx, "SELECT e, o, "+ledger.ShardSQLForTest("e", "o", n)+" FROM unnest($1::text[], $2::text[]) AS k(e, o)", entities, occurrences)
		require.NoError(t, err, "running the shard expression for n=%d", n)
		checked := 0
		for rows.Next() {
			var e, o string
			var got int64
			require.NoError(t, rows.Scan(&e, &o, &got))
			require.Equal(t, ledger.ShardOf(ledger.Key{Entity: e, Occurrence: o}, n), int(got), "SQL and Go disagree on (%q, %q) for n=%d", e, o, n)
			checked++
		}
		require.NoError(t, rows.Err())
		require.Equal(t, len(entities), checked, "every key checked for n=%d", n)
	}
}

// TestHashMatchesPostgreSQL: the Go port of hash_bytes_extended gives
// hashtextextended's value for random byte strings of every length from 0 to
// 100 and random seeds (zero included), on the real server.
func TestHashMatchesPostgreSQL(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	rng := rand.New(rand.NewPCG(1, 2))
	var texts []string
	var seeds []int64
	for n := range 101 {
		for range 5 {
			b := make([]rune, 0, n)
			for len(string(b)) < n {
				b = append(b, rune(1+rng.IntN(0x2FF))) // ASCII and 2-byte UTF-8, never NUL
			}
			texts = append(texts, string(b))
			seeds = append(seeds, int64(rng.Uint64()))
		}
	}
	seeds[0], seeds[7] = 0, -1
	rows, err := pool.Query(context.Background(),
		`SELECT t, s, hashtextextended(t COLLATE "C", s) FROM unnest($1::text[], $2::bigint[]) AS x(t, s)`, texts, seeds)
	require.NoError(t, err)
	checked := 0
	for rows.Next() {
		var text string
		var seed, want int64
		require.NoError(t, rows.Scan(&text, &seed, &want))
		require.Equal(t, uint64(want), ledger.HashBytesExtendedForTest([]byte(text), uint64(seed)), "hash of %q (%d bytes) with seed %d", text, len(text), seed)
		checked++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(texts), checked)
}

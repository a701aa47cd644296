package ledger_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
)

// freshBatch fixes a one-shard batch of run over table src (entity,
// occurrence, payload: text columns, so that any text can be planted) and
// opens its reader.
func freshBatch(t *testing.T, pool *pgxpool.Pool, run ledger.Run, order string) *ledger.BatchReader {
	t.Helper()
	ctx := context.Background()
	s := ledger.NewStore(pool)
	h, err := s.FixQueryBatch(ctx, run, ledger.BatchQuery{SQL: `SELECT entity, occurrence, payload FROM src ORDER BY ` + order, HasPayload: true, Shards: 1,
		ShardOf: func(string, string) string { return "0" }})
	require.NoError(t, err)
	r, err := s.OpenBatch(ctx, h, run.UID, 0, false)
	require.NoError(t, err)
	return r
}

// TestClaimFresh_WholeRangeOrNothing: the server claims a range of a
// shard's batch whole, each item Completed as the run's committed row with
// its payload, or commits nothing of it: when a key of it is held by
// another run, repeated within it, or an item would not pass (then it says
// so, and the worker claims the range itself). Read in place (the batch in
// key order) and from a sorted copy alike.
func TestClaimFresh_WholeRangeOrNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, order string }{{"in place", "occurrence, entity"}, {"sorted copy", "entity DESC"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := newPool(t)
			mustExec(t, pool, `CREATE TABLE src (entity text, occurrence text, payload text);
INSERT INTO src SELECT 'e' || lpad(i::text, 4, '0'), 'o', jsonb_build_object('i', i)::text FROM generate_series(0, 99) i`)
			// A repeat of e0030 in 30..39, a payload not as jsonb prints it
			// in 50..59.
			mustExec(t, pool, `INSERT INTO src VALUES ('e0030', 'o', '{"i": 30}'); UPDATE src SET payload = '{"i":55}' WHERE entity = 'e0055'`)
			s := ledger.NewStore(pool)
			run := runNamed("fresh-" + strings.ReplaceAll(tc.name, " ", "-"))
			r := freshBatch(t, pool, run, tc.order)
			require.Equal(t, tc.name == "in place", r.InPlace())
			claim := func(pos int64, n int) ledger.FreshRange {
				t.Helper()
				got, err := r.ClaimFresh(ctx, run, pos, n, v1alpha1.MaxKeyPartBytes, batchitem.DefaultMaxPayloadBytes, ledger.ChunkOptions{})
				require.NoError(t, err)
				return got
			}
			rows := func() int64 {
				return scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, run.UID)
			}

			// Positions 0..9 of 101, in key order: e0000..e0009.
			got := claim(0, 10)
			require.Equal(t, ledger.FreshRange{Claimed: true, Last: ledger.Key{Entity: "e0009", Occurrence: "o"}}, got)
			require.EqualValues(t, 10, rows())
			require.Equal(t, `{"i": 7}`, scalar[string](t, pool, `SELECT payload::text FROM runledger.ledger WHERE run_uid = $1 AND entity = 'e0007' AND state = 'committed'`, run.UID))
			require.EqualValues(t, 1, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND entity = 'e0007' AND shard = $2 AND attempt = $3 AND run_name = $4`,
				run.UID, run.Shard, run.Attempt, run.Name))

			// Held by another run: nothing of the range.
			commit(t, s, runNamed("other"), []ledger.Item{{Key: ledger.Key{Entity: "e0015", Occurrence: "o"}}}, ledger.ChunkOptions{})
			require.Equal(t, ledger.FreshRange{Held: true}, claim(10, 10))
			// Held by the run itself (a claim whose COMMIT lost its answer, sent again).
			require.Equal(t, ledger.FreshRange{Held: true}, claim(5, 10))
			// A key twice in the range (e0030 at positions 30 and 31).
			require.Equal(t, ledger.FreshRange{Held: true}, claim(25, 10))
			require.EqualValues(t, 10, rows(), "nothing of a held range")

			// A payload the server would not claim: refused, nothing of it.
			require.Equal(t, ledger.FreshRange{Refused: true}, claim(51, 10))
			// The range's end past the shard's: refused, nothing of it.
			require.Equal(t, ledger.FreshRange{Refused: true}, claim(95, 10))
			require.EqualValues(t, 10, rows())

			// A batch pruned by hand under the shard (its rows or sorted copy
			// still there): refused, and the worker's fetch says what went.
			mustExec(t, pool, `UPDATE runledger.batch_run SET pruned_at = now() WHERE run_uid = $1`, run.UID)
			require.Equal(t, ledger.FreshRange{Refused: true}, claim(61, 40))
			mustExec(t, pool, `UPDATE runledger.batch_run SET pruned_at = NULL WHERE run_uid = $1`, run.UID)

			got = claim(61, 40)
			require.Equal(t, ledger.FreshRange{Claimed: true, Last: ledger.Key{Entity: "e0099", Occurrence: "o"}}, got)
			require.EqualValues(t, 50, rows())
		})
	}
}

// TestClaimFresh_NeverTakesWhatTheWorkerRefuses: randomized. Every item the
// server claims passes the worker's own checks of a fetched row (its key
// parts, its payload's size and strict JSON: rowEntry in internal/worker),
// so a chunk claimed on the server commits no item a worker would have
// Failed; the rows committed are exactly the items claimed, with their
// payloads; and the check is not vacuous: an item of plain ASCII keys and a
// payload as jsonb prints it is claimed.
func TestClaimFresh_NeverTakesWhatTheWorkerRefuses(t *testing.T) {
	t.Parallel()
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	const maxPayload = 40
	limits := batchitem.Limits{MaxPayloadBytes: maxPayload}
	keyParts := []string{"a", "acct-7", " x ", "\t", " ", "\u00a0", "\u3000", "\u00a0a", "ключ", "é", "x\u200by",
		strings.Repeat("k", v1alpha1.MaxKeyPartBytes), strings.Repeat("k", v1alpha1.MaxKeyPartBytes+1),
		strings.Repeat("é", v1alpha1.MaxKeyPartBytes/2), strings.Repeat("é", v1alpha1.MaxKeyPartBytes/2) + "a", "\x7f", "~", "!"}
	payloads := []string{`{"a": 1}`, `{"a":1}`, `{"a": 1, "a": 2}`, `{"a": 1, "b": 2}`, `{`, `"\ud800"`, `"\u00e9"`, `"é"`, `[1, 2]`, `1`, `1.0`, `1e2`,
		`null`, `"\u0000"`, `{"b": 1, "a": 2}`, `{"a": 2, "b": 1}`, `{"a": "` + strings.Repeat("x", maxPayload-9) + `"}`,
		`{"a": "` + strings.Repeat("x", maxPayload-8) + `"}`, `true`, ` 1`, `{"a": [1, {"b": null}]}`, `"\t"`, `"\\t"`}
	pick := func() *string {
		if rng.IntN(12) == 0 {
			return nil
		}
		return &keyParts[rng.IntN(len(keyParts))]
	}
	const n = 400
	type item struct{ e, o, p *string }
	items := make([]item, n)
	ctx := context.Background()
	pool := newPool(t)
	mustExec(t, pool, `CREATE TABLE src (entity text, occurrence text, payload text)`)
	for i := range items {
		it := item{e: pick(), o: pick()}
		if it.o != nil && rng.IntN(2) == 0 { // mostly distinct keys
			it.o = new(*it.o + fmt.Sprint(i))
		}
		if rng.IntN(6) != 0 {
			it.p = &payloads[rng.IntN(len(payloads))]
		}
		items[i] = it
		mustExec(t, pool, `INSERT INTO src VALUES ($1, $2, $3)`, it.e, it.o, it.p)
	}
	run := runNamed("fresh-random")
	r := freshBatch(t, pool, run, "random()")
	batch, _, err := r.Fetch(ctx, 0, n, false)
	require.NoError(t, err)
	require.Len(t, batch, n)

	claimed, repeats := map[ledger.Key]string{}, 0
	for pos, row := range batch {
		got, err := r.ClaimFresh(ctx, run, int64(pos), 1, v1alpha1.MaxKeyPartBytes, maxPayload, ledger.ChunkOptions{})
		require.NoError(t, err, "position %d", pos)
		e, o, p := row.Entity, row.Occurrence, row.Payload
		workerTakes := e != nil && o != nil && v1alpha1.KeyPartProblem(*e) == "" && v1alpha1.KeyPartProblem(*o) == "" && batchitem.CheckPayload(p, limits) == ""
		if got.Claimed {
			require.True(t, workerTakes, "position %d: the server claimed an item the worker would fail: %q %q %q", pos, deref(e), deref(o), p)
			k := ledger.Key{Entity: *e, Occurrence: *o}
			require.Equal(t, k, got.Last)
			_, twice := claimed[k]
			require.False(t, twice, "a key claimed twice")
			claimed[k] = string(p)
			continue
		}
		require.False(t, got.Claimed && got.Held)
		ascii := func(s *string) bool {
			return s != nil && len(*s) <= v1alpha1.MaxKeyPartBytes && strings.ContainsFunc(*s, func(c rune) bool { return c > ' ' && c < 0x7f }) && !strings.ContainsFunc(*s, func(c rune) bool { return c >= 0x80 })
		}
		// (jsonb refuses the one valid JSON escape \u0000; any other payload
		// the worker takes is JSON the server reads.)
		canonical := func() bool {
			return p == nil || !strings.Contains(string(p), `\u0000`) && scalar[bool](t, pool, `SELECT $1::pg_catalog.text::jsonb::text = $1::pg_catalog.text`, string(p))
		}
		if workerTakes && ascii(e) && ascii(o) && canonical() {
			repeats++
			_, twice := claimed[ledger.Key{Entity: *e, Occurrence: *o}]
			require.True(t, got.Held && twice, "position %d: a plain item not claimed, and not a repeat: %q %q %q (%+v)", pos, *e, *o, p, got)
		}
	}
	require.NotEmpty(t, claimed, "some items are claimed")
	t.Logf("%d of %d items claimed on the server; %d more would pass but repeat a key claimed", len(claimed), n, repeats)

	rows, err := pool.Query(ctx, `SELECT entity, occurrence, coalesce(payload::text, '') FROM runledger.ledger WHERE run_uid = $1`, run.UID)
	require.NoError(t, err)
	inLedger := map[ledger.Key]string{}
	for rows.Next() {
		var k ledger.Key
		var p string
		require.NoError(t, rows.Scan(&k.Entity, &k.Occurrence, &p))
		inLedger[k] = p
	}
	require.NoError(t, rows.Err())
	require.Equal(t, claimed, inLedger, "the ledger holds exactly the items claimed, with their payloads")
}

func deref(s *string) string {
	if s == nil {
		return "<NULL>"
	}
	return *s
}

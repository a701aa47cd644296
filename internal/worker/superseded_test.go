package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

// TestOwnRowsSupersededSinceCountAsCompleted: a Skip run commits its batch;
// a Supersede run then takes over some of its keys; the first run's shards
// start again (a later attempt: a pod replaced, a processor crashed). The
// keys it committed are still its own work, even though another run's row
// holds them now: they count as completed, so that completed equals the
// ledger's rows of the run, and nothing is claimed or written again. (The
// soak found it: a processor run reported 370 completed and 54 already
// handled, with 378 ledger rows of its own, 8 of them superseded since.)
//
// Randomized over the batch's keys, which of them a third run held before
// (already handled, rightly), which the Supersede run takes over, the
// sources (static: the preload; query: the batch's cursor) and the shards.
func TestOwnRowsSupersededSinceCountAsCompleted(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for i, kind := range []string{"static", "query"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			f := newFixture(t)
			ctx := context.Background()
			n := 150 + rng.IntN(200)
			items := keyItems("acct", n)
			var before, takenOver []ledger.Item
			for _, it := range items {
				switch rng.IntN(5) {
				case 0:
					before = append(before, it)
				case 1, 2:
					takenOver = append(takenOver, it)
				}
			}
			_, err := f.store.CommitChunk(ctx, run("uid-before"), before, ledger.ChunkOptions{})
			require.NoError(t, err)

			source := func() worker.Source {
				if kind == "static" {
					return worker.NewStaticSource("items", items)
				}
				q := worker.NewQuerySource(`SELECT entity, occurrence, payload FROM src`)
				require.NoError(t, q.Check(ctx, f.store))
				return q
			}
			if kind == "query" {
				mustExec(t, f.pool, `CREATE TABLE src (entity text, occurrence text, payload jsonb)`)
				for _, it := range items {
					mustExec(t, f.pool, `INSERT INTO src VALUES ($1, $2, $3)`, it.Entity, it.Occurrence, string(it.Payload))
				}
			}
			shards := 1 + rng.IntN(3)
			first := worker.ShardConfig{Run: run("uid-skip"), Shards: shards, Source: source(), ChunkSize: 1 + rng.IntN(40)}
			_, sum := runShards(t, f, first)
			want := v1alpha1.ItemCounts{Total: int64(n), Completed: int64(n - len(before)), AlreadyHandled: int64(len(before))}
			require.Equal(t, want, sum)

			// The Supersede run takes over some keys, among them some the
			// third run held before (that row is superseded, not the
			// Skip run's).
			v2 := make([]ledger.Item, len(takenOver))
			for i, it := range takenOver {
				v2[i] = ledger.Item{Key: it.Key, Payload: fmt.Appendf(nil, `{"amount": %d}`, 1000+i)}
			}
			_, err = f.store.CommitChunk(ctx, run("uid-supersede"), v2, ledger.ChunkOptions{OnExisting: ledger.Supersede})
			require.NoError(t, err)
			writes := f.ledgerWrites(t)

			again := first
			again.Run.Attempt = 1
			again.Source = source()
			again.ChunkSize = 1 + rng.IntN(40)
			_, sum = runShards(t, f, again)
			want.PayloadChanged = 0 // the third run's keys the Supersede run took over, with another payload
			for _, it := range before {
				if slices.ContainsFunc(takenOver, func(o ledger.Item) bool { return o.Key == it.Key }) {
					want.PayloadChanged++
				}
			}
			require.Equal(t, want, sum, "the Skip run's own rows, superseded since, still count as completed; the third run's as already handled")
			require.EqualValues(t, sum.Completed, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'uid-skip'`),
				"completed equals the ledger's rows of the run")
			require.Equal(t, writes, f.ledgerWrites(t), "the later attempt claimed and wrote nothing")

			// Asked for the run's items, the ledger says the same: each key
			// once, the run's own rows completed (superseded since, some),
			// the third run's already handled.
			recs, err := f.store.FindRuns(ctx, again.Run.Namespace, again.Run.Name)
			require.NoError(t, err)
			require.Len(t, recs, 1)
			var batch []ledger.Item
			if kind == "static" {
				batch = items
			}
			verdicts := map[ledger.Key]ledger.Outcome{}
			require.NoError(t, f.store.RunItemsOf(ctx, recs[0], batch, []ledger.Outcome{ledger.Completed, ledger.AlreadyHandled}, func(v ledger.ItemVerdict) error {
				require.NotContains(t, verdicts, v.Key, "%s listed twice", v.Key)
				verdicts[v.Key] = v.Outcome
				return nil
			}))
			require.Len(t, verdicts, n)
			for _, it := range before {
				require.Equal(t, ledger.AlreadyHandled, verdicts[it.Key], "%s", it.Key)
			}

			// A chunk of the run committed again (a lost COMMIT answer's
			// retry) says the same, item by item.
			res, err := f.store.CommitChunk(ctx, again.Run, items, ledger.ChunkOptions{})
			require.NoError(t, err)
			held := map[ledger.Key]bool{}
			for _, it := range before {
				held[it.Key] = true
			}
			for i, r := range res {
				if held[items[i].Key] {
					require.Equal(t, ledger.AlreadyHandled, r.Outcome, "%s: the third run's", items[i].Key)
					continue
				}
				require.Equal(t, ledger.Completed, r.Outcome, "%s: the run's own row", items[i].Key)
				require.Equal(t, ledger.HolderSameRun, r.Holder, "%s", items[i].Key)
			}
			require.EqualValues(t, sum.Completed, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'uid-skip'`),
				"and committed no row again")
		})
	}
}

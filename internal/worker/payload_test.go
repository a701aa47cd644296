package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

// failedKeys lists the entities of every failure the shards reported.
func failedKeys(reports []worker.Report) []string {
	var out []string
	for _, r := range reports {
		for _, f := range r.Failures {
			out = append(out, f.Entity)
		}
	}
	slices.Sort(out)
	return out
}

// TestPayloadChangedRepeats: another run over a batch already handled,
// whose payloads are the same values spelled otherwise (key order, white
// space, a number's spelling), other values, or none, plus fresh keys and
// repeats within the batch. Under Report the changed ones are counted in
// payloadChanged and as already handled; under Fail exactly they (and their
// repeats) fail; the same payload stays plain already handled, and nothing
// of the committed rows changes.
func TestPayloadChangedRepeats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n = 300
	first := keyItems("acct", n) // {"amount": i}
	_, sum := runShards(t, f, worker.ShardConfig{Run: run("uid-first"), Shards: 3, Source: worker.NewStaticSource("first", first), ChunkSize: 41})
	require.Equal(t, v1alpha1.ItemCounts{Total: n, Completed: n}, sum)

	var again []ledger.Item
	var changed []string
	for i, it := range first {
		switch i % 6 {
		case 0: // the same text
		case 1: // the same value, spelled otherwise
			it.Payload = json.RawMessage(fmt.Sprintf(`{ "amount" : %d.0 }`, i))
		case 2: // another value
			it.Payload = json.RawMessage(fmt.Sprintf(`{"amount": %d}`, i+1))
			changed = append(changed, it.Entity)
		case 3: // a member more
			it.Payload = json.RawMessage(fmt.Sprintf(`{"note": "x", "amount": %d}`, i))
			changed = append(changed, it.Entity)
		case 4: // none
			it.Payload = nil
			changed = append(changed, it.Entity)
		case 5: // the same value, members reordered
			it.Payload = json.RawMessage(fmt.Sprintf(`{"amount":%de0}`, i))
		}
		again = append(again, it)
	}
	slices.Sort(changed)
	fresh := keyItems("new", 20)
	again = append(again, fresh...)
	again = append(again, again[0], again[1]) // repeats of keys whose payload is the same
	total := int64(len(again))
	changedN := int64(len(changed))

	report := worker.ShardConfig{Run: run("uid-report"), Shards: 3, Source: worker.NewStaticSource("again", again), ChunkSize: 29}
	reports, sum := runShards(t, f, report)
	require.Equal(t, v1alpha1.ItemCounts{Total: total, Completed: 20, AlreadyHandled: total - 20, PayloadChanged: changedN}, sum)
	require.Empty(t, failedKeys(reports))

	fail := report
	fail.Run, fail.FailOnPayloadChange, fail.MaxFailedItems = run("uid-fail"), true, 1000
	reports, sum = runShards(t, f, fail)
	require.Equal(t, v1alpha1.ItemCounts{Total: total, AlreadyHandled: total - changedN, Failed: changedN, PayloadChanged: changedN}, sum,
		"the fresh keys are the report run's now")
	require.Equal(t, changed, failedKeys(reports), "exactly the items whose payload changed fail")
	for _, r := range reports {
		for _, fl := range r.Failures {
			require.Contains(t, fl.Error, "spec.onPayloadChange: Fail")
		}
	}

	// Nothing was written for them: the first run's rows, with their payloads.
	require.EqualValues(t, n+20, f.committed(t))
	require.EqualValues(t, n, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger
		WHERE run_uid = 'uid-first' AND state = 'committed' AND payload = jsonb_build_object('amount', split_part(entity, '-', 2)::int)`))
}

// TestPayloadChangedRandomized: batches with random payload changes,
// repeats and fresh keys, over random shards and chunk sizes, against a
// ledger a first run filled: completed + alreadyHandled + failed = items;
// under Report, payloadChanged counts the changed keys and is part of
// alreadyHandled; under Fail, the failed items are the changed keys and
// their repeats.
func TestPayloadChangedRandomized(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rng := rand.New(rand.NewPCG(22, 1))
	const n = 400
	base := keyItems("acct", n)
	_, _ = runShards(t, f, worker.ShardConfig{Run: run("uid-base"), Shards: 2, Source: worker.NewStaticSource("base", base), ChunkSize: 50})

	for round := range 6 {
		var batch []ledger.Item
		var changedKeys, repeatsOfChanged, fresh int64
		for i, it := range base {
			if rng.IntN(3) == 0 {
				continue // not in this batch
			}
			isChanged := rng.IntN(4) == 0
			if isChanged {
				it.Payload = json.RawMessage(fmt.Sprintf(`{"amount": %d, "round": %d}`, i, round))
				changedKeys++
			} else if rng.IntN(2) == 0 {
				it.Payload = json.RawMessage(fmt.Sprintf(`{ "amount":%d }`, i))
			}
			batch = append(batch, it)
			for range rng.IntN(3) / 2 { // a repeat, now and then
				batch = append(batch, it)
				if isChanged {
					repeatsOfChanged++
				}
			}
		}
		for i := range rng.IntN(30) {
			batch = append(batch, ledger.Item{Key: ledger.Key{Entity: fmt.Sprintf("fresh-%d-%d", round, i), Occurrence: "2024-06"}, Payload: json.RawMessage(`{}`)})
			fresh++
		}
		rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		total := int64(len(batch))
		shards, chunk := 1+rng.IntN(4), 1+rng.IntN(60)
		failOn := round%2 == 1
		cfg := worker.ShardConfig{Run: run(fmt.Sprintf("uid-round-%d", round)), Shards: shards, ChunkSize: chunk,
			Source: worker.NewStaticSource("batch", batch), FailOnPayloadChange: failOn, MaxFailedItems: -1}
		_, sum := runShards(t, f, cfg)
		msg := fmt.Sprintf("round %d (%d shards, chunks of %d, fail %v)", round, shards, chunk, failOn)
		require.Equal(t, total, sum.Completed+sum.AlreadyHandled+sum.Failed, msg)
		require.Equal(t, total, sum.Total, msg)
		require.Equal(t, fresh, sum.Completed, msg)
		require.Equal(t, changedKeys, sum.PayloadChanged, msg)
		if failOn {
			require.Equal(t, changedKeys+repeatsOfChanged, sum.Failed, msg)
		} else {
			require.Zero(t, sum.Failed, msg)
			require.LessOrEqual(t, sum.PayloadChanged, sum.AlreadyHandled, msg)
		}
	}
}

// TestPayloadChangedQuerySource: a query's jsonb payloads are compared by
// the batch's cursor (their text is jsonb's own): the same batch again by
// another run is settled without one statement on the ledger; payloads the
// cursor cannot compare by their text (a text column, spelled otherwise) go
// to the claim, which compares their values.
func TestPayloadChangedQuerySource(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `CREATE TABLE src AS SELECT 'acct-' || i AS account, '2024-06' AS period, i AS amount FROM generate_series(1, 500) i`)
	query := func(payload string) *worker.QuerySource {
		src := worker.NewQuerySource(`SELECT account AS entity, period AS occurrence, ` + payload + ` AS payload FROM src`)
		require.NoError(t, src.Check(context.Background(), f.store))
		return src
	}
	cfg := func(uid string, src worker.Source) worker.ShardConfig {
		return worker.ShardConfig{Run: run(uid), Shards: 2, Source: src, ChunkSize: 64}
	}
	_, sum := runShards(t, f, cfg("uid-first", query(`jsonb_build_object('amount', amount)`)))
	require.Equal(t, v1alpha1.ItemCounts{Total: 500, Completed: 500}, sum)

	writes := f.ledgerWrites(t)
	_, sum = runShards(t, f, cfg("uid-same", query(`jsonb_build_object('amount', amount)`)))
	require.Equal(t, v1alpha1.ItemCounts{Total: 500, AlreadyHandled: 500}, sum)
	require.Equal(t, writes, f.ledgerWrites(t), "the cursor settled every key: no claim")

	_, sum = runShards(t, f, cfg("uid-spelled", query(`format('{"amount":%s.0}', amount)`)))
	require.Equal(t, v1alpha1.ItemCounts{Total: 500, AlreadyHandled: 500}, sum, "the same values spelled otherwise")

	_, sum = runShards(t, f, cfg("uid-changed", query(`jsonb_build_object('amount', amount + (amount % 5 = 0)::int)`)))
	require.Equal(t, v1alpha1.ItemCounts{Total: 500, AlreadyHandled: 500, PayloadChanged: 100}, sum)

	c := cfg("uid-changed-text", query(`CASE WHEN amount % 10 = 0 THEN format('{"amount": %s}', amount + 1) ELSE format('{"amount":%s}', amount) END`))
	c.FailOnPayloadChange, c.MaxFailedItems = true, 100
	_, sum = runShards(t, f, c)
	require.Equal(t, v1alpha1.ItemCounts{Total: 500, AlreadyHandled: 450, Failed: 50, PayloadChanged: 50}, sum)

	_, sum = runShards(t, f, cfg("uid-none", query(`NULL::jsonb`)))
	require.Equal(t, v1alpha1.ItemCounts{Total: 500, AlreadyHandled: 500, PayloadChanged: 500}, sum, "no payload against a value")
	require.EqualValues(t, 500, f.committed(t))
}

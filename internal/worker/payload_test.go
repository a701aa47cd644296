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

// laterCopies is a batch whose keys k-1 to k-6 another run holds with
// {"v": 1}, several of them given more than once, with a payload that
// changed in some copy other than the first; and a fresh key given twice
// with two payloads (its first copy is committed, not compared). Entities
// in key order, so that a query batch reads them as listed.
var laterCopies = []struct {
	entity string
	copies []string // "" is no payload
}{
	{"a-fresh", []string{`{"v": 1}`, `{"v": 2}`}},
	{"k-1", []string{`{"v": 1}`, `{"v": 2}`}},                         // the case: the same, then another value
	{"k-2", []string{`{"v": 2}`, `{"v": 1}`}},                         // reversed
	{"k-3", []string{`{"v":1}`, `{ "v" : 1.0 }`, ``}},                 // the same spelled otherwise, then none
	{"k-4", []string{`{"v": 1}`, `{"v":1}`}},                          // the same twice
	{"k-5", []string{`{"v":1}`}},                                      // once
	{"k-6", []string{`{"v": 1}`, `{"v": 1}`, `{"v": 1}`, `{"v": 3}`}}, // a change after more copies than a small chunk
}

// laterCopiesChanged are laterCopies' keys whose payload changed in some
// copy, and changedCopies how many copies they have.
var laterCopiesChanged, laterCopiesChangedCopies = []string{"k-1", "k-2", "k-3", "k-6"}, int64(11)

// payloadChangedListed lists what `runledger items --payload-changed`
// lists for the run: its already handled items marked payloadChanged and its
// failed ones of class payload-changed (batch: a static run's items).
func payloadChangedListed(t *testing.T, f *fixture, uid string, batch []ledger.Item) []string {
	t.Helper()
	ctx := context.Background()
	runs, err := f.store.FindRuns(ctx, "default", "run-"+uid)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	var out []string
	require.NoError(t, f.store.RunItemsOf(ctx, runs[0], batch, []ledger.Outcome{ledger.Failed, ledger.AlreadyHandled}, func(v ledger.ItemVerdict) error {
		if v.PayloadChanged || v.Outcome == ledger.Failed && v.Class == ledger.ClassPayloadChanged {
			out = append(out, v.Entity)
		}
		return nil
	}))
	slices.Sort(out)
	return out
}

// TestPayloadChangedLaterCopy (#43): every copy of a key in a batch is
// compared with the payload of the row another run committed for it, not
// only the first: a key whose payload changed in any copy is counted once in
// payloadChanged, and under onPayloadChange: Fail all its copies fail,
// whichever copy changed, wherever the chunks split its copies; the counts
// agree with `runledger items --payload-changed`. Inline items and query
// batches (a jsonb payload, which the batch's cursor compares, and a text
// one, which the claim compares). A Supersede run compares nothing: it
// commits each key's first copy.
func TestPayloadChangedLaterCopy(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"static", "query jsonb", "query text"} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			var held []ledger.Item
			for _, k := range laterCopies[1:] {
				held = append(held, ledger.Item{Key: ledger.Key{Entity: k.entity, Occurrence: "2024-06"}, Payload: json.RawMessage(`{"v": 1}`)})
			}
			_, sum := runShards(t, f, worker.ShardConfig{Run: run("uid-holder"), Source: worker.NewStaticSource("holder", held)})
			require.EqualValues(t, len(held), sum.Completed)
			mustExec(t, f.pool, `CREATE TABLE copies (batch text, ord int, entity text, pt text)`)

			// batchOf is laterCopies for run uid, its fresh key its own.
			batchOf := func(uid string) (worker.Source, []ledger.Item) {
				var items []ledger.Item
				for _, k := range laterCopies {
					e := k.entity
					if e == "a-fresh" {
						e += "-" + uid
					}
					for _, p := range k.copies {
						it := ledger.Item{Key: ledger.Key{Entity: e, Occurrence: "2024-06"}}
						if p != "" {
							it.Payload = json.RawMessage(p)
						}
						items = append(items, it)
					}
				}
				if source == "static" {
					return worker.NewStaticSource("items", items), items
				}
				for i, it := range items {
					mustExec(t, f.pool, `INSERT INTO copies VALUES ($1, $2, $3, $4)`, uid, i, it.Entity, nullable(it.Payload))
				}
				col := "pt::jsonb"
				if source == "query text" {
					col = "pt"
				}
				src := worker.NewQuerySource(`SELECT entity, '2024-06' AS occurrence, ` + col + ` AS payload FROM copies WHERE batch = '` + uid + `' ORDER BY ord`)
				require.NoError(t, src.Check(context.Background(), f.store))
				return src, nil
			}

			total := int64(0)
			for _, k := range laterCopies {
				total += int64(len(k.copies))
			}
			changedN := int64(len(laterCopiesChanged))
			for _, chunk := range []int{1, 2, 3, 100} {
				for _, failOn := range []bool{false, true} {
					uid := fmt.Sprintf("uid-%d-%v", chunk, failOn)
					t.Run(fmt.Sprintf("chunks of %d, Fail %v", chunk, failOn), func(t *testing.T) {
						src, items := batchOf(uid)
						cfg := worker.ShardConfig{Run: run(uid), Source: src, ChunkSize: chunk, FailOnPayloadChange: failOn, MaxFailedItems: -1}
						reports, sum := runShards(t, f, cfg)
						want := v1alpha1.ItemCounts{Total: total, Completed: 1, AlreadyHandled: total - 1, PayloadChanged: changedN}
						if failOn {
							want.AlreadyHandled, want.Failed = total-1-laterCopiesChangedCopies, laterCopiesChangedCopies
						}
						require.Equal(t, want, sum)
						require.Equal(t, laterCopiesChanged, payloadChangedListed(t, f, uid, items), "as many as payloadChanged counts")
						if failOn {
							recs := requireRecordsMatch(t, f, uid, reports)
							for _, k := range laterCopies {
								rec, ok := recs[ledger.Key{Entity: k.entity, Occurrence: "2024-06"}]
								if !ok {
									continue
								}
								first := k.copies[0] // as the batch holds it: a jsonb column's text is jsonb's
								if source == "query jsonb" {
									require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT $1::jsonb::text`, first).Scan(&first))
								}
								require.Equal(t, digest(first), rec.Digest, "%s: the record keeps the first copy's payload", k.entity)
							}
							var keys []string
							for _, fl := range failedKeys(reports) {
								if len(keys) == 0 || keys[len(keys)-1] != fl {
									keys = append(keys, fl)
								}
							}
							require.Equal(t, laterCopiesChanged, keys, "exactly the changed keys fail")
						}
					})
				}
			}
			require.EqualValues(t, len(held)+8, f.committed(t), "the holder's keys and each run's fresh key")

			uid := "uid-supersede"
			src, items := batchOf(uid)
			_, sum = runShards(t, f, worker.ShardConfig{Run: run(uid), Source: src, ChunkSize: 2, OnExisting: ledger.Supersede, FailOnPayloadChange: true})
			require.Equal(t, v1alpha1.ItemCounts{Total: total, Completed: int64(len(laterCopies)), AlreadyHandled: total - int64(len(laterCopies))}, sum,
				"a Supersede run commits each key's first copy, compares nothing")
			require.Empty(t, payloadChangedListed(t, f, uid, items))
			require.EqualValues(t, 1, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE entity = 'k-2' AND state = 'committed' AND run_uid = $1 AND payload = '{"v": 2}'`, uid),
				"k-2's first copy")
		})
	}
}

func nullable(p []byte) any {
	if p == nil {
		return nil
	}
	return string(p)
}

// TestPayloadChangedLaterCopyUncastable: a key another run holds whose
// later copy's payload jsonb cannot hold fails whole, as when that copy
// comes first: the claim cannot compare it. Wherever the chunks split its
// copies, in inline items and a query's text column.
func TestPayloadChangedLaterCopyUncastable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	held := []ledger.Item{{Key: ledger.Key{Entity: "k-1", Occurrence: "2024-06"}, Payload: json.RawMessage(`{"v": 1}`)}}
	runShards(t, f, worker.ShardConfig{Run: run("uid-holder"), Source: worker.NewStaticSource("holder", held)})
	mustExec(t, f.pool, `CREATE TABLE copies (batch text, ord int, entity text, pt text)`)
	for _, order := range [][]string{{`{"v": 1}`, `{"s": "\u0000"}`}, {`{"s": "\u0000"}`, `{"v": 1}`}} {
		for _, source := range []string{"static", "query"} {
			for _, chunk := range []int{1, 100} {
				uid := fmt.Sprintf("uid-%s-%d-%s", source, chunk, order[0][2:3])
				var src worker.Source = worker.NewStaticSource("items", []ledger.Item{
					{Key: held[0].Key, Payload: json.RawMessage(order[0])}, {Key: held[0].Key, Payload: json.RawMessage(order[1])}})
				if source == "query" {
					mustExec(t, f.pool, `INSERT INTO copies VALUES ($1, 0, 'k-1', $2), ($1, 1, 'k-1', $3)`, uid, order[0], order[1])
					q := worker.NewQuerySource(`SELECT entity, '2024-06' AS occurrence, pt AS payload FROM copies WHERE batch = '` + uid + `' ORDER BY ord`)
					require.NoError(t, q.Check(context.Background(), f.store))
					src = q
				}
				reports, sum := runShards(t, f, worker.ShardConfig{Run: run(uid), Source: src, ChunkSize: chunk, MaxFailedItems: -1})
				require.Equal(t, v1alpha1.ItemCounts{Total: 2, Failed: 2}, sum, uid)
				recs := requireRecordsMatch(t, f, uid, reports)
				require.Equal(t, "22P05", recs[held[0].Key].Class, uid)
			}
		}
	}
}

// TestPayloadChangedLaterCopyRerun: a rerun of a Fail run whose key another
// run took over since with its payload: the key that failed is already
// handled now, and its failure record goes, wherever the chunks split its
// copies.
func TestPayloadChangedLaterCopyRerun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key := ledger.Key{Entity: "k-1", Occurrence: "2024-06"}
	runShards(t, f, worker.ShardConfig{Run: run("uid-holder"), Source: worker.NewStaticSource("holder", []ledger.Item{{Key: key, Payload: json.RawMessage(`{"v": 1}`)}})})
	for _, chunk := range []int{1, 2, 100} {
		uid := fmt.Sprintf("uid-%d", chunk)
		items := []ledger.Item{
			{Key: ledger.Key{Entity: "a-" + uid, Occurrence: "2024-06"}}, // fresh, before
			{Key: key, Payload: json.RawMessage(`{"v": 2}`)}, {Key: key, Payload: json.RawMessage(`{"v":2}`)}, {Key: key, Payload: json.RawMessage(`{"v": 2}`)},
		}
		cfg := worker.ShardConfig{Run: run(uid), Source: worker.NewStaticSource("items", items), ChunkSize: chunk, FailOnPayloadChange: true, MaxFailedItems: -1}
		reports, sum := runShards(t, f, cfg)
		require.Equal(t, v1alpha1.ItemCounts{Total: 4, Completed: 1, Failed: 3, PayloadChanged: 1}, sum, uid)
		requireRecordsMatch(t, f, uid, reports)

		// Another run takes the key over with the payload of this run's copies.
		runShards(t, f, worker.ShardConfig{Run: run("uid-taker-" + uid), Source: worker.NewStaticSource("taker", []ledger.Item{{Key: key, Payload: json.RawMessage(`{"v": 2}`)}}),
			OnExisting: ledger.Supersede})
		reports, sum = runShards(t, f, cfg)
		require.Equal(t, v1alpha1.ItemCounts{Total: 4, Completed: 1, AlreadyHandled: 3}, sum, uid)
		require.Empty(t, failureRecords(t, f, uid), "%s: the key is already handled now: its record goes", uid)
		requireRecordsMatch(t, f, uid, reports)

		// And back, for the next chunk size.
		runShards(t, f, worker.ShardConfig{Run: run("uid-back-" + uid), Source: worker.NewStaticSource("back", []ledger.Item{{Key: key, Payload: json.RawMessage(`{"v": 1}`)}}),
			OnExisting: ledger.Supersede})
	}
}

// TestPayloadChangedLaterCopyRandomized: batches whose keys another run
// holds, each given one to four times in random order, any copy's payload
// changed or spelled otherwise at random, over random shards and chunk
// sizes, as inline items and as a query's rows: a key counts in
// payloadChanged when any of its copies changed, under Fail all its copies
// fail, and the counts agree with what `runledger items --payload-changed`
// lists and with the failure records.
func TestPayloadChangedLaterCopyRandomized(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rng := rand.New(rand.NewPCG(43, 3))
	const n = 300
	base := keyItems("acct", n) // {"amount": i}
	runShards(t, f, worker.ShardConfig{Run: run("uid-base"), Shards: 2, Source: worker.NewStaticSource("base", base), ChunkSize: 50})
	mustExec(t, f.pool, `CREATE TABLE copies (batch text, ord int, entity text, occurrence text, pt text)`)

	for round := range 12 {
		var batch []ledger.Item
		var changed []string
		var changedCopies int64
		for i, it := range base {
			if rng.IntN(3) == 0 {
				continue // not in this batch
			}
			keyChanged := false
			copies := 1 + rng.IntN(4)
			for c := range copies {
				cp := it
				switch rng.IntN(6) {
				case 0:
					cp.Payload, keyChanged = json.RawMessage(fmt.Sprintf(`{"amount": %d, "copy": %d}`, i, c)), true
				case 1:
					cp.Payload = json.RawMessage(fmt.Sprintf(`{ "amount":%d.0 }`, i))
				}
				batch = append(batch, cp)
			}
			if keyChanged {
				changed, changedCopies = append(changed, it.Entity), changedCopies+int64(copies)
			}
		}
		slices.Sort(changed)
		rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		total := int64(len(batch))
		shards, chunk := 1+rng.IntN(3), 1+rng.IntN(40)
		failOn := round%2 == 1
		uid := fmt.Sprintf("uid-round-%d", round)
		var src worker.Source = worker.NewStaticSource("batch", batch)
		listed, kind := batch, "inline items"
		if round%4 >= 2 {
			for i, it := range batch {
				mustExec(t, f.pool, `INSERT INTO copies VALUES ($1, $2, $3, $4, $5)`, uid, i, it.Entity, it.Occurrence, string(it.Payload))
			}
			q := worker.NewQuerySource(`SELECT entity, occurrence, pt AS payload FROM copies WHERE batch = '` + uid + `' ORDER BY ord`)
			require.NoError(t, q.Check(context.Background(), f.store))
			src, listed, kind = q, nil, "a query"
		}
		cfg := worker.ShardConfig{Run: run(uid), Shards: shards, ChunkSize: chunk, Source: src, FailOnPayloadChange: failOn, MaxFailedItems: -1}
		reports, sum := runShards(t, f, cfg)
		msg := fmt.Sprintf("round %d (%s, %d shards, chunks of %d, fail %v)", round, kind, shards, chunk, failOn)
		want := v1alpha1.ItemCounts{Total: total, AlreadyHandled: total, PayloadChanged: int64(len(changed))}
		if failOn {
			want.AlreadyHandled, want.Failed = total-changedCopies, changedCopies
		}
		require.Equal(t, want, sum, msg)
		require.Equal(t, changed, payloadChangedListed(t, f, uid, listed), msg)
		requireRecordsMatch(t, f, uid, reports)
	}
	require.EqualValues(t, n, f.committed(t))
}

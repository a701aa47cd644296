package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

// failureRecord is a row of runledger.item_failure.
type failureRecord struct {
	Entity, Occurrence string
	Shard, Items       int
	Digest             *string
	Class, Error       string
}

func failureRecords(t *testing.T, f *fixture, uid string) []failureRecord {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT entity, occurrence, shard, items, payload_digest, class, error
FROM runledger.item_failure WHERE run_uid = $1 ORDER BY entity, occurrence`, uid)
	require.NoError(t, err)
	recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[failureRecord])
	require.NoError(t, err)
	return recs
}

// requireRecordsMatch: the run's failure records are exactly the items its
// reports counted failed: the copies they count add up to the failed count,
// and every listed failure has its key's record, with its class.
func requireRecordsMatch(t *testing.T, f *fixture, uid string, reports []worker.Report) map[ledger.Key]failureRecord {
	t.Helper()
	recs := failureRecords(t, f, uid)
	var failed, copies int64
	byKey := make(map[ledger.Key]failureRecord, len(recs))
	for _, r := range recs {
		copies += int64(r.Items)
		byKey[ledger.Key{Entity: r.Entity, Occurrence: r.Occurrence}] = r
	}
	for _, rep := range reports {
		failed += rep.Failed
		for _, fl := range rep.Failures {
			rec, ok := byKey[ledger.Key{Entity: fl.Entity, Occurrence: fl.Occurrence}]
			require.True(t, ok, "failed item %s/%s has a record", fl.Entity, fl.Occurrence)
			require.Equal(t, fl.Class, rec.Class, "class of %s/%s", fl.Entity, fl.Occurrence)
		}
	}
	require.Equal(t, failed, copies, "the records count exactly the items counted failed: %+v", recs)
	return byKey
}

func digest(payload string) *string {
	sum := sha256.Sum256([]byte(payload))
	d := hex.EncodeToString(sum[:])
	return &d
}

// TestFailedItemsAreRecorded_EffectAndInput: a query batch whose effect
// breaks a foreign key for some items (23503), with rows that cannot become
// items (a NULL entity, a payload that is not JSON: class input) and a
// repeat of a failed key. Each failed item is recorded once per key, its
// copies counted, with its class, payload digest and error; a rerun of the
// same run once the accounts exist completes those items and their records
// go, while the bad rows stay failed, recorded by the rerun.
func TestFailedItemsAreRecorded_EffectAndInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema+`
CREATE TABLE src (entity text, occurrence text, payload text);
INSERT INTO src SELECT 'acct-' || i, '2026-06', format('{"amount": %s}', i) FROM generate_series(0, 59) i;
INSERT INTO src VALUES ('acct-7', '2026-06', '{"amount": 7}');   -- a repeat of a key that fails
INSERT INTO src VALUES (NULL, '2026-06', '{"amount": 1}');       -- no entity
INSERT INTO src VALUES ('acct-bad', '2026-06', 'not json');      -- a payload that is not JSON
INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 59) i WHERE i % 7 <> 0`)
	src := worker.NewQuerySource(`SELECT entity, occurrence, payload FROM src`)
	require.NoError(t, src.Check(context.Background(), f.store))
	cfg := worker.ShardConfig{Run: run("uid-recorded"), Shards: 2, ChunkSize: 8, MaxFailedItems: 1 << 20, Source: src, Effect: invoiceEffect}

	reports, sum := runShards(t, f, cfg)
	// acct-0, 7, ..., 56: 9 keys without an account, acct-7 twice; 2 bad rows.
	require.Equal(t, v1alpha1.ItemCounts{Total: 63, Completed: 51, Failed: 12}, sum)
	recs := requireRecordsMatch(t, f, "uid-recorded", reports)
	require.Len(t, recs, 11, "one record per key")
	for i := 0; i < 60; i += 7 {
		rec := recs[ledger.Key{Entity: fmt.Sprintf("acct-%d", i), Occurrence: "2026-06"}]
		require.Equal(t, "23503", rec.Class, "acct-%d: the foreign key's SQLSTATE", i)
		require.Contains(t, rec.Error, `violates foreign key constraint "invoices_account_fkey"`)
		require.Equal(t, digest(fmt.Sprintf(`{"amount": %d}`, i)), rec.Digest, "acct-%d: the payload's digest", i)
		require.Equal(t, map[bool]int{true: 2, false: 1}[i == 7], rec.Items, "acct-%d: its copies", i)
		require.Equal(t, ledger.ShardOf(ledger.Key{Entity: fmt.Sprintf("acct-%d", i), Occurrence: "2026-06"}, 2), rec.Shard)
	}
	noEntity := recs[ledger.Key{Entity: "", Occurrence: "2026-06"}]
	require.Equal(t, ledger.ClassInput, noEntity.Class)
	require.Contains(t, noEntity.Error, `field "entity" is NULL`)
	bad := recs[ledger.Key{Entity: "acct-bad", Occurrence: "2026-06"}]
	require.Equal(t, ledger.ClassInput, bad.Class)
	require.Contains(t, bad.Error, "payload")
	require.Equal(t, digest("not json"), bad.Digest)

	// The accounts exist now: a rerun of the same run completes those items.
	mustExec(t, f.pool, `INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 59, 7) i`)
	reports, sum = runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 63, Completed: 60, AlreadyHandled: 1, Failed: 2}, sum)
	recs = requireRecordsMatch(t, f, "uid-recorded", reports)
	require.Len(t, recs, 2, "the completed items' records are gone: %+v", recs)
	require.Contains(t, recs, ledger.Key{Entity: "", Occurrence: "2026-06"})
	require.Contains(t, recs, ledger.Key{Entity: "acct-bad", Occurrence: "2026-06"})
	require.EqualValues(t, 60, queryInt(t, f.pool, `SELECT count(*) FROM invoices`), "each invoice once")
}

// TestFailedItemsAreRecorded_Processor: a processor's refusal
// (processor-refused), a retry asked until the retries are spent
// (processor-retries-exhausted), and a processor that never answers
// (processor-unavailable) are each recorded with their class.
func TestFailedItemsAreRecorded_Processor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec := newRecorder()
	srv := httptest.NewServer(rec.handler())
	defer srv.Close()
	cfg := processorConfig("uid-refusals", srv.URL, occItems("1", "2-fail", "3", "4-retry", "5-flaky", "6-fail", "6-fail"), 5*time.Second)
	reports, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 7, Completed: 3, Failed: 4}, sum)
	recs := requireRecordsMatch(t, f, "uid-refusals", reports)
	require.Len(t, recs, 3)
	require.Equal(t, ledger.ClassProcessorRefused, recs[ledger.Key{Entity: "acct", Occurrence: "2-fail"}].Class)
	require.Contains(t, recs[ledger.Key{Entity: "acct", Occurrence: "2-fail"}].Error, "card declined")
	require.Equal(t, 2, recs[ledger.Key{Entity: "acct", Occurrence: "6-fail"}].Items, "the repeat counted with its first copy")
	require.Equal(t, ledger.ClassProcessorRetriesExhausted, recs[ledger.Key{Entity: "acct", Occurrence: "4-retry"}].Class)
	require.Contains(t, recs[ledger.Key{Entity: "acct", Occurrence: "4-retry"}].Error, "try later")

	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	cfg = processorConfig("uid-down", down.URL, occItems("d1", "d2"), 5*time.Second)
	reports, sum = runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 2, Failed: 2}, sum)
	for _, r := range requireRecordsMatch(t, f, "uid-down", reports) {
		require.Equal(t, ledger.ClassProcessorUnavailable, r.Class)
		require.Contains(t, r.Error, "503")
	}
}

// failuresSeedEnv replays TestFailureRecords_Randomized: the seed it printed.
const failuresSeedEnv = "RUNLEDGER_FAILURES_SEED"

// TestFailureRecords_Randomized: random batches (repeats, keys another run
// holds, items whose effect fails) over random shard counts and chunk
// sizes, run again and again under one run as the accounts change: after
// every pass the run's failure records are exactly the items the pass counted
// failed (their copies add up to its failed count, one record per key), and
// no record is left of an item the pass completed or found already handled.
func TestFailureRecords_Randomized(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(failuresSeedEnv); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
	}
	t.Logf("seed %d (%s=%d replays it)", seed, failuresSeedEnv, seed)
	rnd := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema)
	ctx := context.Background()

	for round := range 2 {
		const keys = 120
		shards := 1 + rnd.IntN(4) // fixed for the run
		var items []ledger.Item
		for range 150 + rnd.IntN(150) {
			i := rnd.IntN(keys)
			items = append(items, ledger.Item{Key: ledger.Key{Entity: fmt.Sprintf("acct-%03d", i), Occurrence: "2026-06"},
				Payload: []byte(fmt.Sprintf(`{"amount": %d}`, i))})
		}
		// Another run holds a few keys; the accounts of some keys are missing.
		other := worker.ShardConfig{Run: run(fmt.Sprintf("uid-other-%d", round)), Source: worker.NewStaticSource("other", items[:rnd.IntN(10)])}
		mustExec(t, f.pool, `DELETE FROM accounts WHERE id NOT IN (SELECT account FROM invoices)`)
		for i := range keys {
			if rnd.IntN(4) != 0 {
				mustExec(t, f.pool, `INSERT INTO accounts VALUES ($1) ON CONFLICT DO NOTHING`, fmt.Sprintf("acct-%03d", i))
			}
		}
		if len(other.Source.(*worker.StaticSource).Items()) > 0 {
			_, _ = runShards(t, f, other)
		}
		for pass := range 3 {
			cfg := worker.ShardConfig{Run: run(fmt.Sprintf("uid-random-%d", round)), Shards: shards, ChunkSize: 1 + rnd.IntN(40),
				Source: worker.NewStaticSource("items", items), Effect: invoiceEffect, MaxFailedItems: 1 << 20}
			reports, sum := runShards(t, f, cfg)
			recs := requireRecordsMatch(t, f, cfg.Run.UID, reports)
			// The keys counted failed, from the items and the accounts.
			rows, err := f.pool.Query(ctx, `SELECT DISTINCT e FROM unnest($1::text[]) AS e
WHERE NOT EXISTS (SELECT FROM accounts WHERE id = e)
  AND NOT EXISTS (SELECT FROM runledger.ledger WHERE entity = e AND state = 'committed')`, entities(items))
			require.NoError(t, err)
			missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			got := []string{}
			for k := range recs {
				got = append(got, k.Entity)
			}
			sort.Strings(got)
			sort.Strings(missing)
			require.Equal(t, missing, got, "round %d pass %d (%d shards): the records are the keys without an account", round, pass, shards)
			require.Equal(t, int64(len(items)), sum.Total)
			// The next pass finds some accounts created.
			for _, e := range missing {
				if rnd.IntN(2) == 0 {
					mustExec(t, f.pool, `INSERT INTO accounts VALUES ($1)`, e)
				}
			}
		}
	}
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM (SELECT 1 FROM invoices GROUP BY account, period HAVING count(*) > 1) d`), "each effect once")
}

func entities(items []ledger.Item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Entity
	}
	return out
}

// TestFailureRecords_NoWriteWithoutFailures: a pass of a run without
// failure records writes none and deletes none (its chunks send nothing
// more): the table is never touched.
func TestFailureRecords_NoWriteWithoutFailures(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `
CREATE TABLE failure_writes (n bigint NOT NULL);
INSERT INTO failure_writes VALUES (0);
CREATE FUNCTION count_failure_write() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN UPDATE public.failure_writes SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER count_failure_writes AFTER INSERT OR UPDATE OR DELETE ON runledger.item_failure
  FOR EACH STATEMENT EXECUTE FUNCTION count_failure_write();`)
	cfg := worker.ShardConfig{Run: run("uid-clean"), Shards: 2, ChunkSize: 10, Source: worker.NewStaticSource("items", keyItems("acct", 100))}
	_, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, sum)
	_, _ = runShards(t, f, cfg) // a rerun: still nothing on record
	require.Zero(t, queryInt(t, f.pool, `SELECT n FROM failure_writes`), "no statement wrote the failure records")
	require.Empty(t, failureRecords(t, f, "uid-clean"))
}

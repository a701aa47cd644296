package worker_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

// sourceTable: 3000 distinct keys, 200 of them repeated (once or twice), and
// four rows that cannot become items.
const sourceTable = `
CREATE TABLE src (id serial, account text, period text, amount numeric, note text);
INSERT INTO src (account, period, amount) SELECT 'acct-' || i, '2024-06', i FROM generate_series(1, 3000) i;
INSERT INTO src (account, period, amount) SELECT 'acct-' || i, '2024-06', i FROM generate_series(1, 200) i;
INSERT INTO src (account, period, amount) SELECT 'acct-' || i, '2024-06', i FROM generate_series(1, 50) i;
INSERT INTO src (account, period, amount) VALUES (NULL, '2024-06', 1), ('acct-x', '', 2), ('acct-y', NULL, 3);
INSERT INTO src (account, period, amount, note) VALUES ('acct-z', '2024-06', 4, 'not json');`

const sourceQuery = `SELECT account AS entity, period AS occurrence,
  CASE WHEN note IS NULL THEN jsonb_build_object('amount', amount)::text ELSE note END AS payload
FROM src ORDER BY id;`

func TestQuerySource(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, sourceTable)
	src := worker.NewQuerySource(sourceQuery)
	require.NoError(t, src.Check(context.Background(), f.store), "the query is valid")
	cfg := worker.ShardConfig{Run: run("uid-query"), Shards: 3, Source: src, ChunkSize: 97, MaxFailedItems: 10}

	reports, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 3254, Completed: 3000, AlreadyHandled: 250, Failed: 4}, sum)
	require.EqualValues(t, 3000, f.committed(t))
	var msgs []string
	for _, r := range reports {
		for _, fl := range r.Failures {
			msgs = append(msgs, fl.Error)
		}
	}
	joined := strings.Join(msgs, "\n")
	require.Contains(t, joined, `query row 3251: field "entity" is NULL`, "the row number is the position in the query's output")
	require.Contains(t, joined, `query row 3252: field "occurrence" is empty`)
	require.Contains(t, joined, `query row 3253: field "occurrence" is NULL`)
	require.Contains(t, joined, `query row 3254: field "payload" is not valid JSON`)
	require.EqualValues(t, 1500, queryInt(t, f.pool, `SELECT (payload->>'amount')::int FROM runledger.ledger WHERE entity = 'acct-1500'`), "payload stored")

	_, again := runShards(t, f, cfg)
	require.Equal(t, sum, again, "a rerun of the same run reports the same")
}

// TestQuerySourceReadsOnlyItsShard: each shard's stream holds only its keys
// (the filter runs in SQL), and together they hold every row exactly once.
func TestQuerySourceReadsOnlyItsShard(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `CREATE TABLE src AS SELECT 'e' || i AS entity, 'o' || (i % 13) AS occurrence FROM generate_series(1, 2000) i`)
	src := worker.NewQuerySource(`SELECT entity, occurrence FROM src`)
	require.NoError(t, src.Check(context.Background(), f.store))
	const shards = 4
	var total int64
	for s := range shards {
		r := run("uid-q")
		r.Shard = s
		rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: r, Shards: shards, Source: src, ChunkSize: 128})
		require.True(t, rep.Done)
		total += rep.Total
		n := queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE shard = $1`, s)
		require.Equal(t, rep.Completed, n, "shard %d committed its own rows", s)
		rows, err := f.pool.Query(context.Background(), `SELECT entity, occurrence FROM runledger.ledger WHERE shard = $1`, s)
		require.NoError(t, err)
		for rows.Next() {
			var k ledger.Key
			require.NoError(t, rows.Scan(&k.Entity, &k.Occurrence))
			require.Equal(t, s, ledger.ShardOf(k, shards), "key %s read by shard %d", k, s)
		}
		require.NoError(t, rows.Err())
	}
	require.EqualValues(t, 2000, total)
	require.EqualValues(t, 2000, f.committed(t))
}

func TestQuerySourceCheck(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `CREATE TABLE src (account text, period text); CREATE DOMAIN zoned AS timestamptz`)
	tests := []struct{ query, want string }{
		{`SELECT account AS entity FROM src`, `batch.query returns no column "occurrence": it must return entity, occurrence and optionally payload (it returns entity)`},
		{`SELECT account, period FROM src`, `batch.query returns no column "entity"`},
		{`SELECT account AS entity, period AS occurrence FROM nope`, `batch.query is rejected by PostgreSQL: relation "nope" does not exist (SQLSTATE 42P01)`},
		{`SELEC 1`, `batch.query is rejected by PostgreSQL: syntax error`},
		{`SELECT 1 AS entity, 2 AS occurrence; DROP TABLE src`, `syntax error`},
		{`  ;  `, `batch.query is empty`},
		{`UPDATE src SET period = 'x' RETURNING account AS entity, period AS occurrence`, `batch.query is rejected by PostgreSQL: syntax error`},
		// The text of a timestamptz follows the session's TimeZone: the same
		// instant would be another key in another session.
		{`SELECT account AS entity, now() AS occurrence FROM src`, `batch.query returns occurrence as a timestamp with time zone, whose text follows the session's TimeZone`},
		{`SELECT ARRAY[now()] AS entity, period AS occurrence FROM src`, `batch.query returns entity as a timestamp with time zone[]`},
		{`SELECT account AS entity, current_time AS occurrence FROM src`, `batch.query returns occurrence as a time with time zone`},
		{`SELECT account AS entity, now()::zoned AS occurrence FROM src`, `batch.query returns occurrence as a timestamp with time zone`},
	}
	for _, tt := range tests {
		err := worker.NewQuerySource(tt.query).Check(context.Background(), f.store)
		require.Error(t, err, "query %q", tt.query)
		require.True(t, worker.IsInputError(err), "bad input: %v", err)
		require.Contains(t, err.Error(), tt.want, "query %q", tt.query)
	}
	// A timestamp made text in the query is the user's choice of key.
	require.NoError(t, worker.NewQuerySource(`SELECT account AS entity, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM') AS occurrence FROM src`).Check(context.Background(), f.store))
	// A comment at the end of the query does not swallow the wrapper.
	require.NoError(t, worker.NewQuerySource("SELECT account AS entity, period AS occurrence FROM src -- all of them\n;").Check(context.Background(), f.store))
}

// TestQuerySourceWritesAreRefused: a query that writes (even through a
// function) is refused: its transaction is rolled back before anything is
// committed. (It runs in the statement that fixes the batch, so no longer in
// a READ ONLY transaction: the refusal names what it wrote instead.)
func TestQuerySourceWritesAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `CREATE TABLE src (account text, period text); INSERT INTO src VALUES ('a', 'b');
CREATE FUNCTION zap() RETURNS int LANGUAGE sql AS $$ DELETE FROM src; SELECT 1 $$;`)
	src := worker.NewQuerySource(`SELECT account AS entity, period AS occurrence, zap() AS z FROM src`)
	require.NoError(t, src.Check(context.Background(), f.store), "describing the query does not run it")
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-ro"), Source: src})
	require.Error(t, rep.Err, "a writing query is refused")
	require.Contains(t, rep.Err.Error(), "batch.query writes: the batch's query wrote to public.src (0 rows inserted, 0 updated, 1 deleted)")
	require.True(t, worker.IsInputError(rep.Err), "as bad input: %v", rep.Err)
	require.EqualValues(t, 1, queryInt(t, f.pool, `SELECT count(*) FROM src`), "nothing deleted")
	require.Zero(t, f.committed(t))

	err := worker.NewQuerySource(`WITH d AS (DELETE FROM src RETURNING account, period) SELECT account AS entity, period AS occurrence FROM d`).
		Check(context.Background(), f.store)
	require.Error(t, err, "a data-modifying WITH is refused")
	require.True(t, worker.IsInputError(err), "as bad input: %v", err)
}

// TestQuerySourceResumesAfterConnectionLoss: every session of the shard (the
// batch's reader among them) is killed twice mid-stream; the shard reads on
// after the last row it read, and the counts are exactly those of an
// undisturbed run.
func TestQuerySourceResumesAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, sourceTable)
	src := worker.NewQuerySource(sourceQuery)
	require.NoError(t, src.Check(context.Background(), f.store))
	calls, kills := 0, 0
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-resume"), Source: src, ChunkSize: 100, MaxFailedItems: 10,
		Progress: func(worker.Report) {
			if calls++; (calls == 5 || calls == 20) && killOtherBackends(t, f) > 0 {
				kills++
			}
		}})
	require.Equal(t, 2, kills, "the shard's sessions were killed twice")
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.Equal(t, v1alpha1.ItemCounts{Total: 3254, Completed: 3000, AlreadyHandled: 250, Failed: 4}, rep.ItemCounts)
	require.EqualValues(t, 3000, f.committed(t))
}

func TestCheckEffect(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema)
	require.NoError(t, worker.CheckEffect(context.Background(), f.store, invoiceEffect))
	for effect, want := range map[string]string{
		`INSERT INTO invoicez SELECT * FROM claimed`:                              `spec.effect.sql is rejected by PostgreSQL: relation "invoicez" does not exist`,
		`INSERT INTO invoices (account) SELECT entity, occurrence FROM claimed`:   `INSERT has more expressions than target columns`,
		`INSERT INTO invoices (account, period, amount) SELECT nope FROM claimed`: `column "nope" does not exist`,
	} {
		err := worker.CheckEffect(context.Background(), f.store, effect)
		require.Error(t, err, effect)
		require.True(t, worker.IsInputError(err), "bad input: %v", err)
		require.Contains(t, err.Error(), want)
	}
}

// TestQuerySourcePayloadIsReadAsWritten is issue #20.5 for query rows: a
// payload (text or json, which keep what they are given) with a member twice
// or a lone surrogate escape is a failed item naming its row and field, not
// a jsonb that keeps the last member.
func TestQuerySourcePayloadIsReadAsWritten(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `CREATE TABLE notes (id int PRIMARY KEY, note text);
INSERT INTO notes VALUES (1, '{"amount": 1, "amount": 2}'), (2, '{"memo": "\ud800"}'), (3, '{"amount": 3}')`)
	src := worker.NewQuerySource(`SELECT 'acct-' || id AS entity, '2024-06' AS occurrence, note::json AS payload FROM notes ORDER BY id`)
	require.NoError(t, src.Check(context.Background(), f.store))
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-notes"), Source: src, MaxFailedItems: 10})
	require.NoError(t, rep.Err)
	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 1, Failed: 2}, rep.ItemCounts)
	var msgs []string
	for _, fl := range rep.Failures {
		msgs = append(msgs, fl.Error)
	}
	joined := strings.Join(msgs, "\n")
	require.Contains(t, joined, `query row 1: field "payload" holds /amount twice`)
	require.Contains(t, joined, `query row 2: field "payload" holds a lone UTF-16 surrogate escape`)
	require.EqualValues(t, 1, f.committed(t))
}

// TestQuerySource_HeldMidway: a batch whose first keys are fresh and whose
// later keys another run committed (with one payload changed), then fresh
// again: the shard stops looking keys up on its fetches after the first
// fresh fetch, the claim that expects its keys fresh is refused by the
// rule and finds the held keys on its own lookup; every count
// is exact, every already handled key has the other run's committed row,
// and no key is committed twice. The sorted copy is gone at the end.
func TestQuerySource_HeldMidway(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	// Keys in the rule's order: occurrence o0000..o2999, one entity.
	mustExec(t, f.pool, `CREATE TABLE src AS SELECT 'acct' AS entity, 'o' || lpad(i::text, 4, '0') AS occurrence, jsonb_build_object('n', i) AS payload FROM generate_series(0, 2999) i`)
	earlier := worker.NewQuerySource(`SELECT entity, occurrence, payload FROM src WHERE occurrence BETWEEN 'o1000' AND 'o1999'`)
	require.NoError(t, earlier.Check(ctx, f.store))
	_, sum := runShards(t, f, worker.ShardConfig{Run: run("uid-earlier"), Source: earlier, ChunkSize: 100})
	require.EqualValues(t, 1000, sum.Completed)
	mustExec(t, f.pool, `UPDATE src SET payload = '{"n": -1}' WHERE occurrence = 'o1500'`)

	src := worker.NewQuerySource(`SELECT entity, occurrence, payload FROM src`)
	require.NoError(t, src.Check(ctx, f.store))
	_, sum = runShards(t, f, worker.ShardConfig{Run: run("uid-midway"), Source: src, ChunkSize: 100})
	require.Equal(t, v1alpha1.ItemCounts{Total: 3000, Completed: 2000, AlreadyHandled: 1000, PayloadChanged: 1}, sum)
	require.EqualValues(t, 3000, f.committed(t))
	require.EqualValues(t, 1000, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'uid-earlier' AND state = 'committed'`),
		"each already handled key has the earlier run's committed row")
	require.EqualValues(t, 2000, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'uid-midway' AND state = 'committed'`))
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.batch_sorted`), "the sorted copies are deleted once read")
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.batch_sorted_shard`))
}

// TestFreshChunksClaimedOnTheServer: a fresh batch's chunks after the first
// are claimed by the server from the batch (their items never come to the
// worker), and the counts stay the ledger's: every key committed once with
// its payload. A chunk holding an item the server's check refuses (a key
// part only the worker may judge, a payload not as jsonb prints it, a row
// that is no item) is claimed by the worker, which fails exactly the bad
// item with its own error and records it; the pass then claims the rest
// itself. Read in place (the batch in key order) and from a sorted copy.
func TestFreshChunksClaimedOnTheServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, order, plant string
		failed             int64
		msg                string
	}{
		{"in place, all fresh", "occurrence", "", 0, ""},
		{"sorted copy, all fresh", "md5(occurrence)", "", 0, ""},
		{"in place, a NULL entity midway", "occurrence", `UPDATE src SET entity = NULL WHERE occurrence = 'o1234'`, 1, `field "entity" is NULL`},
		{"sorted copy, a blank entity midway", "md5(occurrence)", `UPDATE src SET entity = E' \t' WHERE occurrence = 'o1234'`, 1, `field "entity" is blank`},
		{"in place, a payload as written midway", "occurrence", `UPDATE src SET payload = '{"n":1234}' WHERE occurrence = 'o1234'`, 0, ""},
		{"in place, a non-ASCII key midway", "occurrence", `UPDATE src SET entity = 'счёт' WHERE occurrence = 'o1234'`, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			ctx := context.Background()
			mustExec(t, f.pool, `CREATE TABLE src AS SELECT 'acct' AS entity, 'o' || lpad(i::text, 4, '0') AS occurrence, jsonb_build_object('n', i)::text AS payload FROM generate_series(0, 2999) i`)
			if tc.plant != "" {
				mustExec(t, f.pool, tc.plant)
			}
			src := worker.NewQuerySource(`SELECT entity, occurrence, payload FROM src ORDER BY ` + tc.order)
			require.NoError(t, src.Check(ctx, f.store))
			log, logged := verboseLog()
			uid := "uid-server-" + strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)
			reports, sum := runShards(t, f, worker.ShardConfig{Run: run(uid), Source: src, ChunkSize: 100, MaxFailedItems: 10, Log: log})
			require.Equal(t, v1alpha1.ItemCounts{Total: 3000, Completed: 3000 - tc.failed, Failed: tc.failed}, sum)
			require.EqualValues(t, 3000-tc.failed, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, uid))
			require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM src JOIN runledger.ledger AS l USING (entity, occurrence) WHERE l.run_uid = $1 AND l.payload::text <> src.payload::jsonb::text`, uid),
				"every row holds its item's payload")
			if tc.msg != "" {
				require.Len(t, reports[0].Failures, 1)
				require.Contains(t, reports[0].Failures[0].Error, tc.msg)
				require.EqualValues(t, 1, queryInt(t, f.pool, `SELECT count(*) FROM runledger.item_failure WHERE run_uid = $1`, uid), "the bad item's failure record")
			}
			all := logged()
			require.Contains(t, all, "the server claims the shard's fresh chunks", "the server claimed chunks")
			if tc.plant != "" {
				require.Contains(t, all, "the worker claims the rest of the pass itself", "the worker claimed the chunk the server refused")
			}
		})
	}
}

// TestFreshChunksWithAnEffectClaimedOnTheServer: with an SQL effect, the
// server claims a fresh chunk and runs the effect over it in the same
// transaction. An item the effect fails (a check of its table) fails the
// chunk's server claim whole, with nothing of it committed or written by
// the effect; the worker claims that chunk itself, isolates the one item
// (Failed with the effect's error), and claims the rest of the pass. The
// effect ran exactly once per committed item.
func TestFreshChunksWithAnEffectClaimedOnTheServer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	mustExec(t, f.pool, `CREATE TABLE src AS SELECT 'acct' AS entity, 'o' || lpad(i::text, 4, '0') AS occurrence, jsonb_build_object('n', i) AS payload FROM generate_series(0, 2999) i;
CREATE TABLE eff (entity text NOT NULL, occurrence text NOT NULL, n int NOT NULL CHECK (n <> 1234))`)
	src := worker.NewQuerySource(`SELECT entity, occurrence, payload FROM src`)
	require.NoError(t, src.Check(ctx, f.store))
	log, logged := verboseLog()
	reports, sum := runShards(t, f, worker.ShardConfig{Run: run("uid-server-effect"), Source: src, ChunkSize: 100, MaxFailedItems: 10, Log: log,
		Effect: `INSERT INTO eff SELECT entity, occurrence, (payload->>'n')::int FROM claimed`})
	require.Equal(t, v1alpha1.ItemCounts{Total: 3000, Completed: 2999, Failed: 1}, sum)
	require.Len(t, reports[0].Failures, 1)
	require.Equal(t, "o1234", reports[0].Failures[0].Occurrence)
	require.Contains(t, reports[0].Failures[0].Error, "eff_n_check")
	require.EqualValues(t, 2999, queryInt(t, f.pool, `SELECT count(*) FROM eff`), "the effect wrote once per committed item")
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM (SELECT entity, occurrence FROM eff GROUP BY 1, 2 HAVING count(*) > 1) d`))
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger AS l WHERE l.run_uid = 'uid-server-effect' AND NOT EXISTS (SELECT FROM eff WHERE (eff.entity, eff.occurrence) = (l.entity, l.occurrence))`),
		"every committed item has its effect")
	all := logged()
	require.Contains(t, all, "the server claims the shard's fresh chunks")
	require.Contains(t, all, "the worker claims the rest of the pass itself")
}

// verboseLog is a logger at verbosity 1 and what it logged so far, one
// entry a line.
func verboseLog() (logr.Logger, func() string) {
	var mu sync.Mutex
	var logged []string
	log := funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{Verbosity: 1})
	return log, func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(logged, "\n")
	}
}

// TestQueryBatchOpenedOnce: a shard fixes (or finds) its query's batch
// before it takes its lease, and its first pass reads that stream: the
// batch is looked up, and "batch fixed" logged, once per shard, not again
// under the lease.
func TestQueryBatchOpenedOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `CREATE TABLE src AS SELECT 'acct' AS entity, 'o' || lpad(i::text, 4, '0') AS occurrence FROM generate_series(0, 999) i`)
	src := worker.NewQuerySource(`SELECT entity, occurrence FROM src`)
	log, logged := verboseLog()
	_, sum := runShards(t, f, worker.ShardConfig{Run: run("uid-opened-once"), Shards: 2, Source: src, ChunkSize: 100, Log: log})
	require.Equal(t, v1alpha1.ItemCounts{Total: 1000, Completed: 1000}, sum)
	require.Equal(t, 2, strings.Count(logged(), `"msg"="batch fixed"`), "one \"batch fixed\" per shard:\n%s", logged())
}

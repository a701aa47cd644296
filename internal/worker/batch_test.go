package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// todoTable: 200 rows to do; todoEffect marks the claimed ones done, so the
// query todoQuery returns fewer rows after every chunk.
const (
	todoTable  = `CREATE TABLE todo (id int PRIMARY KEY, done bool NOT NULL DEFAULT false); INSERT INTO todo (id) SELECT i FROM generate_series(1, 200) i;`
	todoQuery  = `SELECT id::text AS entity, 'x' AS occurrence FROM todo WHERE NOT done`
	todoEffect = `UPDATE todo SET done = true FROM claimed WHERE todo.id::text = claimed.entity`
)

// ledgerRows is how many committed rows of run uid (and shard) the ledger holds.
func ledgerRows(t *testing.T, f *fixture, uid string, shard int) int64 {
	t.Helper()
	return queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND shard = $2 AND state = 'committed'`, uid, shard)
}

// killOtherBackends terminates every other client session of the test's
// database (the source's included) and waits until they are gone (their
// locks released): a lost connection, as in a failover.
func killOtherBackends(t *testing.T, f *fixture) int64 {
	t.Helper()
	// From a connection of its own: the shard holds no session between its
	// transactions, and its pool's idle connections are its sessions too.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.Direct(t, f.pool.Config().ConnString()))
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	var n int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
	  WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()) k`).Scan(&n))
	return n
}

// TestQueryBatchSurvivesLostConnection is issue #10's reproduction: 200 rows
// WHERE NOT done, chunks of 50, an effect that sets done, and the reading
// connection lost after the first chunk. The batch is what the query returned
// when the run started: all 200 rows are processed, and the counts equal the
// ledger's rows of the run.
func TestQueryBatchSurvivesLostConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, todoTable)
	src := worker.NewQuerySource(todoQuery)
	require.NoError(t, src.Check(context.Background(), f.store))
	calls, killed := 0, int64(0)
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-lost"), Source: src, ChunkSize: 50, Effect: todoEffect,
		Progress: func(worker.Report) {
			if calls++; calls == 2 { // after the first chunk
				killed = killOtherBackends(t, f)
			}
		}})
	require.NotZero(t, killed, "the reading connection was killed")
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.Equal(t, v1alpha1.ItemCounts{Total: 200, Completed: 200}, rep.ItemCounts)
	require.Equal(t, rep.Completed, ledgerRows(t, f, "uid-lost", 0), "completed == the run's rows in the ledger")
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM todo WHERE NOT done`), "every row's effect ran")
}

// TestQueryBatchIsTheSameOnEveryAttempt: a shard interrupted after its first
// chunk, then run again twice (a pod retry, `runledger run` after a kill)
// while the query's result shrinks with every commit. Every attempt reads the
// same batch: the same total, and a finished shard's completed equals the
// ledger's rows of that run and shard.
func TestQueryBatchIsTheSameOnEveryAttempt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, todoTable)
	src := worker.NewQuerySource(todoQuery)
	require.NoError(t, src.Check(context.Background(), f.store))
	const shards = 2
	for shard := range shards {
		r := run("uid-attempts")
		r.Shard = shard
		cfg := worker.ShardConfig{Run: r, Shards: shards, Source: src, ChunkSize: 50, Effect: todoEffect}

		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		first := cfg
		first.Progress = func(worker.Report) {
			if calls++; calls == 2 {
				cancel()
			}
		}
		rep := worker.RunShard(ctx, f.store, first)
		cancel()
		require.NoError(t, rep.Err)
		require.True(t, rep.Interrupted, "shard %d: the first attempt was interrupted", shard)
		require.EqualValues(t, 50, rep.Completed)
		total := rep.Total

		for attempt := 1; attempt <= 2; attempt++ {
			cfg.Run.Attempt = attempt
			rep := worker.RunShard(context.Background(), f.store, cfg)
			require.NoError(t, rep.Err)
			require.True(t, rep.Done, "shard %d attempt %d", shard, attempt)
			require.Equal(t, total, rep.Total, "shard %d attempt %d: the same total as the first attempt", shard, attempt)
			require.Equal(t, v1alpha1.ItemCounts{Total: total, Completed: total}, rep.ItemCounts, "shard %d attempt %d", shard, attempt)
			require.Equal(t, rep.Completed, ledgerRows(t, f, "uid-attempts", shard), "shard %d attempt %d: completed == the shard's rows in the ledger", shard, attempt)
		}
	}
	require.EqualValues(t, 200, f.committed(t))
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM todo WHERE NOT done`))
}

// TestPrunedBatchFailsClearly: once `runledger prune` deleted a run's batch,
// a worker of that run fails at once with a clear error (bad input, not
// retried) instead of running the query again; nothing is committed.
func TestPrunedBatchFailsClearly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, todoTable)
	src := worker.NewQuerySource(todoQuery)
	require.NoError(t, src.Check(context.Background(), f.store))
	cfg := worker.ShardConfig{Run: run("uid-pruned"), Shards: 2, Source: src, Effect: todoEffect}
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Progress = func(worker.Report) { cancel() } // the batch is fixed, nothing committed
	rep := worker.RunShard(ctx, f.store, cfg)
	require.True(t, rep.Interrupted)
	require.Zero(t, f.committed(t))
	mustExec(t, f.pool, `UPDATE runledger.batch_run SET created_at = now() - interval '1 hour'`)
	p, err := f.store.PruneBatches(context.Background(), time.Now())
	n, rows := p.Batches, p.Items
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 200, rows)

	cfg.Progress = nil
	start := time.Now()
	for shard := range 2 {
		cfg.Run.Shard = shard
		rep = worker.RunShard(context.Background(), f.store, cfg)
		require.Error(t, rep.Err, "shard %d", shard)
		require.True(t, worker.IsInputError(rep.Err), "bad input: %v", rep.Err)
		require.Contains(t, rep.Err.Error(), "the batch of run default/run-uid-pruned (uid uid-pruned) was pruned at ")
		require.Zero(t, rep.Processed())
	}
	require.Less(t, time.Since(start), 5*time.Second, "not retried")
	require.Zero(t, f.committed(t), "nothing committed")
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.batch`), "not materialised again")
}

// TestPrunedWhileRunning: runledger prune leaves a running shard's batch
// alone (its shard lock is held); a batch pruned under a running shard all
// the same (by hand, ignoring the lock) ends the shard with the pruned
// error, not with a short count.
func TestPrunedWhileRunning(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, todoTable)
	src := worker.NewQuerySource(todoQuery)
	require.NoError(t, src.Check(context.Background(), f.store))
	calls := 0
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-pruned-live"), Source: src, ChunkSize: 50,
		Progress: func(worker.Report) {
			if calls++; calls == 2 {
				p, err := f.store.PruneBatches(context.Background(), time.Now().Add(time.Hour))
				n := p.Batches
				var inFlight *ledger.RunsInFlightError
				require.ErrorAs(t, err, &inFlight, "the run is in flight")
				require.Zero(t, n)
				mustExec(t, f.pool, `WITH old AS (UPDATE runledger.batch_run SET pruned_at = now() WHERE run_uid = 'uid-pruned-live' RETURNING id)
DELETE FROM runledger.batch AS b USING old WHERE b.batch_id = old.id`)
			}
		}})
	require.Error(t, rep.Err)
	require.True(t, worker.IsInputError(rep.Err), "bad input: %v", rep.Err)
	require.Contains(t, rep.Err.Error(), "was pruned at ")
	require.False(t, rep.Done)
	require.EqualValues(t, 50, ledgerRows(t, f, "uid-pruned-live", 0))
}

// requireOnlyHeld: a shard attempt that failed before counting anything
// reports what the ledger holds of its shard, committed by earlier
// attempts, and nothing of its own.
func requireOnlyHeld(t *testing.T, f *fixture, rep worker.Report, uid string) {
	t.Helper()
	require.Zero(t, rep.AlreadyHandled+rep.Failed, "shard %d: nothing counted", rep.Shard)
	require.Equal(t, ledgerRows(t, f, uid, rep.Shard), rep.Completed, "shard %d: completed is the ledger's rows of the shard", rep.Shard)
	require.Positive(t, rep.Completed, "shard %d: earlier attempts committed rows", rep.Shard)
	require.GreaterOrEqual(t, rep.Total, rep.Processed(), "shard %d: no more counted than its total", rep.Shard)
}

// TestBatchShardCountIsFixed: a run's batch is split for the shard count it
// started with; a worker with another count fails before committing.
func TestBatchShardCountIsFixed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, todoTable)
	src := worker.NewQuerySource(todoQuery)
	require.NoError(t, src.Check(context.Background(), f.store))
	cfg := worker.ShardConfig{Run: run("uid-shards"), Shards: 2, Source: src}
	_, sum := runShards(t, f, cfg)
	require.EqualValues(t, 200, sum.Completed)

	cfg.Shards = 3
	rep := worker.RunShard(context.Background(), f.store, cfg)
	require.Error(t, rep.Err)
	require.True(t, worker.IsInputError(rep.Err), "bad input: %v", rep.Err)
	require.Contains(t, rep.Err.Error(), "was fixed for 2 shards when the run started; this worker runs 3")
	requireOnlyHeld(t, f, rep, "uid-shards")
	require.EqualValues(t, 200, f.committed(t))
}

// TestStaticBatchThatChangedFailsClearly: a ConfigMap or file read again by
// a later attempt of the same run holds other items: the attempt fails
// instead of counting another batch; the same items run again are fine.
func TestStaticBatchThatChangedFailsClearly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	items := keyItems("acct", 100)
	cfg := worker.ShardConfig{Run: run("uid-static"), Shards: 2, Source: worker.NewStaticSource("configmap june/items.jsonl", items)}
	_, first := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, first)
	_, again := runShards(t, f, cfg)
	require.Equal(t, first, again, "the same items: the same counts")

	for name, changed := range map[string][]ledger.Item{
		"an item more":        keyItems("acct", 101),
		"an item less":        keyItems("acct", 99),
		"another payload":     append(keyItems("acct", 99), ledger.Item{Key: items[99].Key, Payload: []byte(`{"amount": 0}`)}),
		"another key":         append(keyItems("acct", 99), ledger.Item{Key: ledger.Key{Entity: "acct-x", Occurrence: "2024-06"}}),
		"the same, reordered": append(keyItems("acct", 100)[1:], items[0]),
	} {
		c := cfg
		c.Source = worker.NewStaticSource("configmap june/items.jsonl", changed)
		for shard := range 2 {
			c.Run.Shard = shard
			rep := worker.RunShard(context.Background(), f.store, c)
			require.Error(t, rep.Err, "%s: shard %d", name, shard)
			require.True(t, worker.IsInputError(rep.Err), "%s: bad input: %v", name, rep.Err)
			require.Contains(t, rep.Err.Error(), "has changed since the run started", name)
			requireOnlyHeld(t, f, rep, "uid-static")
		}
	}
	require.EqualValues(t, 100, f.committed(t), "nothing more committed")
	require.EqualValues(t, 100, ledgerRows(t, f, "uid-static", 0)+ledgerRows(t, f, "uid-static", 1))
}

// TestQueryBatchWhoseQueryChangedFailsClearly is issue #20.6: a run started
// over one query and run again with another query text (the manifest's
// batch.query edited) fails as bad input before committing anything,
// instead of processing the old batch and reporting it complete; the same
// query run again is fine.
func TestQueryBatchWhoseQueryChangedFailsClearly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, todoTable)
	src := worker.NewQuerySource(todoQuery)
	require.NoError(t, src.Check(context.Background(), f.store))
	cfg := worker.ShardConfig{Run: run("uid-query-edited"), Shards: 2, Source: src}
	_, first := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 200, Completed: 200}, first)
	_, again := runShards(t, f, cfg)
	require.Equal(t, first, again, "the same query: the same counts")

	for _, edited := range []string{
		todoQuery + ` AND id <= 100`,
		`SELECT id::text AS entity, 'y' AS occurrence FROM todo`,
		todoQuery + ` ORDER BY id`,
	} {
		c := cfg
		c.Source = worker.NewQuerySource(edited)
		require.NoError(t, c.Source.(*worker.QuerySource).Check(context.Background(), f.store))
		for shard := range 2 {
			c.Run.Shard = shard
			rep := worker.RunShard(context.Background(), f.store, c)
			require.Error(t, rep.Err, "%s: shard %d", edited, shard)
			require.True(t, worker.IsInputError(rep.Err), "%s: bad input: %v", edited, rep.Err)
			require.Contains(t, rep.Err.Error(), "batch.query has changed since the run started", edited)
			requireOnlyHeld(t, f, rep, "uid-query-edited")
		}
	}
	require.EqualValues(t, 200, f.committed(t), "nothing more committed")
}

// TestQueryBatchFixedWithoutDigestIsAccepted: a batch fixed before the
// ledger recorded the query's digest (batch_run.digest NULL) cannot be
// compared; a later attempt reads it as it was fixed, as before.
func TestQueryBatchFixedWithoutDigestIsAccepted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, todoTable)
	src := worker.NewQuerySource(todoQuery + ` AND id <= 50`)
	require.NoError(t, src.Check(context.Background(), f.store))
	cfg := worker.ShardConfig{Run: run("uid-query-old"), Source: src}
	rep := worker.RunShard(context.Background(), f.store, cfg)
	require.NoError(t, rep.Err)
	require.EqualValues(t, 50, rep.Completed)
	mustExec(t, f.pool, `UPDATE runledger.batch_run SET digest = NULL WHERE run_uid = 'uid-query-old'`)

	cfg.Source = worker.NewQuerySource(todoQuery)
	require.NoError(t, cfg.Source.(*worker.QuerySource).Check(context.Background(), f.store))
	rep = worker.RunShard(context.Background(), f.store, cfg)
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.Equal(t, v1alpha1.ItemCounts{Total: 50, Completed: 50}, rep.ItemCounts, "the batch as it was fixed")
}

// TestCopiedRunIdentityFailsClearly is issue #43.5 in the worker (a pod's
// shard as `runledger run`'s): a run of another namespace/name with the uid
// of a run the ledger knows (a manifest copied with its metadata.uid) fails
// every shard as bad input naming both runs, and commits nothing, for a
// static and a query source; its shards and the first run's, all started
// together on a fresh uid, leave one run the uid's: its shards all pass,
// the other's all fail so.
func TestCopiedRunIdentityFailsClearly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, todoTable)
	for _, kind := range []string{"static", "query"} {
		t.Run(kind, func(t *testing.T) {
			source := func() worker.Source {
				if kind == "static" {
					return worker.NewStaticSource("items", keyItems(kind, 100))
				}
				src := worker.NewQuerySource(todoQuery)
				require.NoError(t, src.Check(context.Background(), f.store))
				return src
			}
			uid := "uid-copied-" + kind
			cfg := worker.ShardConfig{Run: run(uid), Shards: 2, Source: source(), Retry: fastRetry, LockWait: 30 * time.Second}
			_, sum := runShards(t, f, cfg)
			require.EqualValues(t, map[string]int64{"static": 100, "query": 200}[kind], sum.Completed)
			committed, writes := f.committed(t), f.ledgerWrites(t)

			copied := cfg
			copied.Run = ledger.Run{Namespace: "accounts", Name: "july-copy", UID: uid}
			copied.Source = source()
			for shard := range 2 {
				copied.Run.Shard = shard
				rep := worker.RunShard(context.Background(), f.store, copied)
				requireCopiedRun(t, rep, "default/run-"+uid, uid)
			}
			require.Equal(t, committed, f.committed(t), "nothing more committed")
			require.Equal(t, writes, f.ledgerWrites(t), "nothing written to the ledger")

			// Both runs' shards at once, on a fresh uid.
			uid += "-together"
			first, second := cfg, copied
			first.Run, second.Run.UID = run(uid), uid
			reports := make([]worker.Report, 4)
			var wg sync.WaitGroup
			for i := range reports {
				c := first
				if i >= 2 {
					c = second
				}
				c.Run.Shard = i % 2
				c.Source = source()
				wg.Go(func() { reports[i] = worker.RunShard(context.Background(), f.store, c) })
			}
			wg.Wait()
			owner := queryString(t, f.pool, `SELECT run_namespace || '/' || run_name FROM runledger.batch_run WHERE run_uid = $1`, uid)
			for i, rep := range reports {
				name := first.Run.Namespace + "/" + first.Run.Name
				if i >= 2 {
					name = second.Run.Namespace + "/" + second.Run.Name
				}
				if name == owner {
					require.NoError(t, rep.Err, "shard %d of %s, the uid's run", i%2, name)
					require.True(t, rep.Done)
				} else {
					requireCopiedRun(t, rep, owner, uid)
				}
			}
			require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND run_namespace || '/' || run_name <> $2`, uid, owner))
		})
	}
}

func requireCopiedRun(t *testing.T, rep worker.Report, recorded, uid string) {
	t.Helper()
	require.Error(t, rep.Err, "shard %d of a run whose uid %s is %s's", rep.Shard, uid, recorded)
	require.True(t, worker.IsInputError(rep.Err), "bad input: %v", rep.Err)
	require.ErrorContains(t, rep.Err, recorded)
	require.ErrorContains(t, rep.Err, uid)
	require.Zero(t, rep.Processed())
}

func queryString(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&s), "querying %s", sql)
	return s
}

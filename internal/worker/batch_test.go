package worker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
// database (the source's included): a lost connection, as in a failover.
func killOtherBackends(t *testing.T, f *fixture) int64 {
	t.Helper()
	return queryInt(t, f.pool, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	  WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()) k`)
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
	require.NoError(t, src.Check(context.Background(), f.pool))
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
	require.Equal(t, worker.Counts{Total: 200, Completed: 200}, rep.Counts)
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
	require.NoError(t, src.Check(context.Background(), f.pool))
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
			require.Equal(t, worker.Counts{Total: total, Completed: total}, rep.Counts, "shard %d attempt %d", shard, attempt)
			require.Equal(t, rep.Completed, ledgerRows(t, f, "uid-attempts", shard), "shard %d attempt %d: completed == the shard's rows in the ledger", shard, attempt)
		}
	}
	require.EqualValues(t, 200, f.committed(t))
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM todo WHERE NOT done`))
}

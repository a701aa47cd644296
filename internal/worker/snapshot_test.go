package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// maxSnapshotAge is the documented bound on runledger's snapshots (README,
// "Running on a shared PostgreSQL"): none outlives one statement or one
// chunk's transaction, so, with one shard running, the oldest backend_xmin
// of its sessions is never more than a few transactions old, however long
// the shard runs.
const maxSnapshotAge = 3

// TestLongShardHoldsNoSnapshot: a shard of a query source reads its batch
// through 150 chunks while each of them commits. Sampled all along, the
// oldest backend_xmin of the worker's sessions (found by their
// application_name) stays within maxSnapshotAge transactions; a batch cursor
// read in one transaction for the whole shard held its snapshot from the
// shard's start, about one transaction older per chunk. Not parallel: the
// age counts every transaction of the cluster.
func TestLongShardHoldsNoSnapshot(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	admin := pgtest.Pool(t, dsn)
	mustExec(t, admin, `CREATE TABLE src AS SELECT 'e' || i AS entity, 'o' AS occurrence FROM generate_series(1, 3000) i`)
	const app = "runledger/test/long-shard/shard-0"
	pool, err := ledger.Open(ctx, dsn, 2, ledger.ApplicationName(app))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := ledger.NewStore(pool)
	src := worker.NewQuerySource(`SELECT entity, occurrence FROM src`)
	require.NoError(t, src.Check(ctx, store))

	done := make(chan struct{})
	var wg sync.WaitGroup
	var oldest, samples, holding int64
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var age, n int64
			if err := admin.QueryRow(ctx, `SELECT coalesce(max(age(backend_xmin)), 0), count(backend_xmin) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&age, &n); err != nil {
				continue
			}
			samples++
			oldest = max(oldest, age)
			if n > 0 {
				holding++
			}
		}
	})
	rep := worker.RunShard(ctx, store, worker.ShardConfig{Run: run("uid-long"), Source: src, ChunkSize: 20})
	close(done)
	wg.Wait()
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.EqualValues(t, 3000, rep.Completed)
	require.Greater(t, samples, int64(50), "sampled all along")
	t.Logf("%d samples, %d with a snapshot held; oldest backend_xmin: %d transactions", samples, holding, oldest)
	require.LessOrEqual(t, oldest, int64(maxSnapshotAge), "no snapshot outlives a statement or a chunk's transaction")
}

package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// TestLongShardHoldsNoSnapshot: a shard of a query source reads its batch
// through 300 chunks while each of them commits, on a server where another
// tenant's transactions come and go. Sampled all along, every transaction of
// the worker's sessions (found by their application_name) that holds a
// snapshot (backend_xmin) sees at most two chunks of the shard commit before
// it ends: none outlives one statement or one chunk's transaction (README,
// "Running on a shared PostgreSQL"). A batch cursor read in one transaction
// for the whole shard held its snapshot while all 6,000 items committed.
//
// The transaction is told by its backend and xact_start, and its span by the
// shard's committed rows, not by age(backend_xmin): a snapshot's xmin is the
// oldest transaction running anywhere on the server, so another tenant's
// transaction makes the worker's look older than they are (seen in CI).
// Not parallel: the samples must see the worker's sessions only.
func TestLongShardHoldsNoSnapshot(t *testing.T) {
	const app, chunk, total = "runledger/test/long-shard/shard-0", 20, 6000
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	// The observer and the other tenant reach PostgreSQL directly
	// (pgtest.Direct): they are not the code under test.
	admin := pgtest.Pool(t, pgtest.Direct(t, dsn))
	mustExec(t, admin, fmt.Sprintf(`CREATE TABLE src AS SELECT 'e' || i AS entity, 'o' AS occurrence FROM generate_series(1, %d) i`, total))
	pool, err := ledger.Open(ctx, dsn, 2, ledger.ApplicationName(app))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := ledger.NewStore(pool)
	src := worker.NewQuerySource(`SELECT entity, occurrence FROM src`)
	require.NoError(t, src.Check(ctx, store))

	// Another tenant of the server: transactions holding an xid for a few
	// milliseconds each, in a database of their own.
	tenant := pgtest.Pool(t, pgtest.Direct(t, pgtest.NewDatabase(t)))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			_, _ = tenant.Exec(ctx, `DO $$ BEGIN PERFORM txid_current(); PERFORM pg_sleep(0.005); END $$`)
		}
	})

	type txn struct {
		pid   int64
		start time.Time
	}
	type span struct{ first, last int64 }
	spans := map[txn]*span{}
	var samples, holding, oldest int64
	// inTxn: the committed rows at the first and last sample that saw one
	// of the worker's transactions, with or without a snapshot at that
	// instant (most of a short transaction's time through a pooler is spent
	// between its statements, with none).
	inTxn := span{first: total}
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			rows, err := admin.Query(ctx, `
				SELECT a.pid, a.xact_start, a.backend_xmin IS NOT NULL, coalesce(age(a.backend_xmin), 0),
				       (SELECT count(*) FROM runledger.ledger WHERE run_uid = 'uid-long')
				FROM pg_stat_activity a
				WHERE a.application_name = $1 AND a.xact_start IS NOT NULL`, app)
			if err != nil {
				continue
			}
			samples++
			for rows.Next() {
				var tx txn
				var snapshot bool
				var age, committed int64
				if rows.Scan(&tx.pid, &tx.start, &snapshot, &age, &committed) != nil {
					continue
				}
				inTxn.first, inTxn.last = min(inTxn.first, committed), max(inTxn.last, committed)
				if !snapshot {
					continue
				}
				holding++
				oldest = max(oldest, age)
				if s := spans[tx]; s != nil {
					s.last = committed
				} else {
					spans[tx] = &span{first: committed, last: committed}
				}
			}
			rows.Close()
		}
	})
	rep := worker.RunShard(ctx, store, worker.ShardConfig{Run: run("uid-long"), Source: src, ChunkSize: chunk})
	close(done)
	wg.Wait()
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.EqualValues(t, total, rep.Completed)
	require.Greater(t, samples, int64(20), "sampled all along")
	// The samples must see the worker's transactions early and late in the
	// shard, and snapshots in several of them; how many snapshots they
	// catch varies with the machine (ten or fewer in CI once a fresh chunk
	// became one statement; through PgBouncer, once none in the last third
	// of the shard, whose transactions were seen between their statements),
	// so the floor is the spread of the transactions seen, not a count.
	var widest int64
	for _, s := range spans {
		widest = max(widest, s.last-s.first)
	}
	require.GreaterOrEqual(t, len(spans), 5, "snapshots seen in several transactions: the samples see the worker's sessions")
	require.Less(t, inTxn.first, int64(total/3), "the worker's transactions seen early in the shard")
	require.Greater(t, inTxn.last, int64(2*total/3), "the worker's transactions seen late in the shard")
	t.Logf("%d samples, %d snapshots seen in %d transactions, transactions from %d to %d rows committed; widest: %d rows committed during one; oldest backend_xmin: %d transactions (with the tenant's)",
		samples, holding, len(spans), inTxn.first, inTxn.last, widest, oldest)
	require.LessOrEqual(t, widest, int64(2*chunk), "no snapshot outlives a statement or a chunk's transaction")
}

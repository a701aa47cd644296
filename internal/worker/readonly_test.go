package worker_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// TestReadOnlySessionIsRetriedNotFailed: a shard whose sessions may not write
// (25006 read_only_sql_transaction: a standby or a fenced primary, here
// default_transaction_read_only set on the database) retries with back-off,
// each time on a new session, until one may write again, as after a failover;
// no item fails, nothing is recorded as failed, and the counts, the ledger
// and the effect's rows are exact.
//
// (A chunk's own transaction begins READ WRITE, which the setting does not
// refuse: here the shard's other writes, its lease, meet the 25006. On a
// standby the chunk's BEGIN is refused too: IsReadOnlySession.)
func TestReadOnlySessionIsRetriedNotFailed(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "sets default_transaction_read_only on the database, which the pooler's server sessions keep")
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema)
	mustExec(t, f.pool, `INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 99) i`)
	ctx := context.Background()
	// A session of its own, opened while the database may still be written:
	// it takes the setting back.
	admin, err := pgx.Connect(ctx, f.pool.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	db := pgx.Identifier{f.pool.Config().ConnConfig.Database}.Sanitize()
	_, err = admin.Exec(ctx, `ALTER DATABASE `+db+` SET default_transaction_read_only = on`)
	require.NoError(t, err)
	f.pool.Reset() // every session from now on may only read, as on a standby

	var writable sync.Once
	writableAgain := func() {
		writable.Do(func() {
			_, err := admin.Exec(context.Background(), `ALTER DATABASE `+db+` RESET default_transaction_read_only`)
			assert.NoError(t, err) // from the logger's goroutine too
		})
	}
	t.Cleanup(writableAgain)
	var readOnlyRetries atomic.Int64
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "retrying") && strings.Contains(args, "SQLSTATE 25006") && readOnlyRetries.Add(1) == 3 {
			go writableAgain() // refused three times: the failover ends
		}
	}, funcr.Options{})
	never := time.AfterFunc(30*time.Second, writableAgain) // never stuck: the test then fails on its counts
	defer never.Stop()

	rep := worker.RunShard(ctx, f.store, worker.ShardConfig{Run: run("uid-readonly"), Source: worker.NewStaticSource("items", keyItems("acct", 100)),
		Effect: invoiceEffect, ChunkSize: 40, Log: log,
		Retry: worker.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond, MaxElapsed: time.Minute}})
	require.NoError(t, rep.Err)
	require.Empty(t, rep.Failures, "no item fails because its session could not write")
	require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, rep.ItemCounts)
	require.GreaterOrEqual(t, readOnlyRetries.Load(), int64(3), "refused by read-only sessions, and retried")
	require.EqualValues(t, 100, f.committed(t))
	require.EqualValues(t, 100, queryInt(t, f.pool, `SELECT count(*) FROM invoices`), "the effect ran once per item")
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.item_failure`), "no failure record")
}

package ledger_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/ledger/ledgertest"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestMigrate_EarlierReleaseWaitingForTheLock: upgrading from v0.1.0, its
// workers still start while `runledger migrate` runs (its manager creates
// their pods until the new one is applied), and they wait for the migration
// lock in one statement (pg_advisory_lock), whose snapshot 00016's index
// build CONCURRENTLY, under that lock, waits for: PostgreSQL breaks the
// deadlock by aborting the build. The migration must still apply (tried
// again with the lock released in between, the earlier release's migrator
// finding nothing to do), the earlier release's migrator must get its lock,
// and while the build waits, MigrationBlockers names what it waits for.
func TestMigrate_EarlierReleaseWaitingForTheLock(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "an earlier release's migrator, which needed a session, waits for the migration lock on one")
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	downToForThisRelease(t, pool, 15)

	// An earlier release's shard: a transaction open (its batch cursor's).
	shard, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer shard.Release()
	_, err = shard.Exec(ctx, `SET application_name = 'v0.1.0 worker'`)
	require.NoError(t, err)
	tx, err := shard.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM runledger.batch_run`)
	require.NoError(t, err)

	const name = "runledger migrate test"
	migrator, err := ledger.Open(ctx, dsn, 2, ledger.ApplicationName(name))
	require.NoError(t, err)
	defer migrator.Close()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := ledger.Migrate(ctx, migrator)
		done <- result{n, err}
	}()

	// The build waits for the shard's transaction, and says so.
	require.Eventually(t, func() bool {
		b, err := ledger.MigrationBlockers(ctx, pool, name)
		require.NoError(t, err)
		for _, s := range b {
			if s.ApplicationName == "v0.1.0 worker" && s.OpenFor > 0 {
				return true
			}
		}
		return false
	}, time.Minute, 50*time.Millisecond, "MigrationBlockers names the shard the build waits for")

	// An earlier release's worker starts: it waits in pg_advisory_lock.
	old, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer old.Release()
	_, err = old.Exec(ctx, `SET application_name = 'v0.1.0 migrator'`)
	require.NoError(t, err)
	// Its deadlock check comes after the build's: the build is aborted (the
	// other way round, the earlier release's migrator retries a deadlock).
	_, err = old.Exec(ctx, `SET deadlock_timeout = '30s'`)
	require.NoError(t, err)
	locked := make(chan error, 1)
	go func() {
		_, err := old.Exec(ctx, `SELECT pg_advisory_lock($1)`, ledger.MigrationLockKey)
		locked <- err
	}()
	require.Eventually(t, func() bool {
		return scalar[int64](t, pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'v0.1.0 migrator' AND wait_event = 'advisory'`) == 1
	}, time.Minute, 50*time.Millisecond, "the earlier release's migrator waits for the lock")

	// The shard's transaction ends; the next build waits for the earlier
	// migrator's statement, which waits for the lock the build holds.
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-locked:
		require.NoError(t, err, "the earlier release's migrator gets the lock")
		_, err = old.Exec(ctx, `SELECT pg_advisory_unlock($1)`, ledger.MigrationLockKey)
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the earlier release's migrator never got the lock")
	}
	r := <-done
	require.NoError(t, r.err, "the migration applies")
	require.Equal(t, ledgertest.MigrationsAfter(t, 15), r.n, "00016 and every later one, each applied once")
	require.True(t, scalar[bool](t, pool, `SELECT bool_and(indisvalid) FROM pg_index WHERE indexrelid IN
		('runledger.ledger_superseded_key_idx'::regclass, 'runledger.ledger_retired_key_idx'::regclass)`), "both indexes built and valid")
	n, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to apply")
}

// TestMigrationBlockersLeavesOutTheLooker: an index build CONCURRENTLY waits
// for every snapshot older than it, one at a time, the transaction that looks
// up what the build waits for included when it is open at that moment. That
// transaction ends in milliseconds and is the looker's own: named, it made
// `runledger migrate` say it waited for itself ("runledger migrate", open for
// 0s). Here the build waits for a shard's snapshot and for the looker's, in
// the order the server picks: while it waits for the looker's, the looker
// names nothing; while it waits for the shard's, the shard is named.
func TestMigrationBlockersLeavesOutTheLooker(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE built (x int)`)
	require.NoError(t, err)

	const name, shardName = "runledger migrate (looker test)", "v0.1.0 worker (looker test)"
	open := func(app string) (pgx.Tx, int32) {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		t.Cleanup(c.Release)
		_, err = c.Exec(ctx, `SELECT pg_catalog.set_config('application_name', $1, false)`, app)
		require.NoError(t, err)
		var pid int32
		require.NoError(t, c.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid))
		tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
		_, err = tx.Exec(ctx, `SELECT count(*) FROM built`)
		require.NoError(t, err)
		return tx, pid
	}
	looker, lookerPID := open(name)
	shard, shardPID := open(shardName)
	build, buildPID := open(name)
	require.NoError(t, build.Rollback(ctx)) // the session only: CONCURRENTLY runs outside a transaction
	built := make(chan error, 1)
	go func() {
		_, err := build.Conn().Exec(ctx, `CREATE INDEX CONCURRENTLY built_x ON built (x)`)
		built <- err
	}()
	// waitsFor: the session the build waits for, once it waits for one of want.
	waitsFor := func(want ...int32) int32 {
		var pid int32
		require.Eventually(t, func() bool {
			pid = scalar[int32](t, pool, `SELECT coalesce((SELECT b FROM pg_catalog.pg_stat_activity,
				pg_catalog.unnest(pg_catalog.pg_blocking_pids(pid)) AS b WHERE pid = $1 AND wait_event_type = 'Lock' LIMIT 1), 0)`, buildPID)
			return slices.Contains(want, pid)
		}, time.Minute, 20*time.Millisecond, "the build waits for a snapshot of %v", want)
		return pid
	}
	lookerNames := func() {
		t.Helper()
		rows, err := looker.Query(ctx, ledger.SQLMigrationBlockers, name)
		require.NoError(t, err)
		named, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var pid int32
			var app string
			var secs float64
			err := r.Scan(&pid, &app, &secs)
			return app, err
		})
		require.NoError(t, err)
		require.Empty(t, named, "the looker never names itself")
		require.NoError(t, looker.Rollback(ctx))
	}
	shardNamed := func() {
		t.Helper()
		b, err := ledger.MigrationBlockers(ctx, pool, name)
		require.NoError(t, err)
		require.Len(t, b, 1)
		require.Equal(t, shardName, b[0].ApplicationName, "the shard the build waits for is named")
		require.NoError(t, shard.Rollback(ctx))
	}
	if waitsFor(lookerPID, shardPID) == lookerPID {
		lookerNames()
		waitsFor(shardPID)
		shardNamed()
	} else {
		shardNamed()
		waitsFor(lookerPID)
		lookerNames()
	}
	require.NoError(t, <-built)
}

package pgtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

func mustExec(t *testing.T, dsn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	require.NoError(t, err, sql)
}

func rows(t *testing.T, dsn string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var s string
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(string_agg(v, ',' ORDER BY v), '') FROM t`).Scan(&s))
	return s
}

// TestHAPairCrashLosesHeldWAL: what the primary committed while the
// standby's WAL was held is lost when the primary crashes and the standby
// is promoted; the pair's DSN then reaches the promoted server.
func TestHAPairCrashLosesHeldWAL(t *testing.T) {
	t.Parallel()
	h := pgtest.NewHAPair(t, pgtest.HAOptions{})
	db := h.NewDatabase(t)
	ctx := context.Background()
	mustExec(t, h.DSN(db), `CREATE TABLE t (v text); INSERT INTO t VALUES ('a')`)
	require.NoError(t, h.WaitReplayed(ctx))
	h.HoldWAL()
	mustExec(t, h.DSN(db), `INSERT INTO t VALUES ('b')`)
	require.Equal(t, "a,b", rows(t, h.Primary().DSN(db)))
	require.NoError(t, h.CrashPrimary(ctx))
	require.NoError(t, h.Promote(ctx))
	require.Same(t, h.Standby(), h.Primary(), "the promoted standby is the primary")
	require.Equal(t, "a", rows(t, h.DSN(db)), "the commit held back is lost")
	mustExec(t, h.DSN(db), `INSERT INTO t VALUES ('c')`)
	require.Equal(t, "a,c", rows(t, h.Standby().DSN(db)))
}

// TestHAPairSyncCommitWaitsForTheStandby: with Sync, a commit made while
// the WAL is held waits (pg_stat_activity: SyncRep) until it is released.
func TestHAPairSyncCommitWaitsForTheStandby(t *testing.T) {
	t.Parallel()
	h := pgtest.NewHAPair(t, pgtest.HAOptions{Sync: true})
	db := h.NewDatabase(t)
	ctx := context.Background()
	mustExec(t, h.DSN(db), `CREATE TABLE t (v text)`)
	h.HoldWAL()
	done := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(ctx, h.DSN(db))
		if err == nil {
			_, err = conn.Exec(ctx, `INSERT INTO t VALUES ('a')`)
			err = errors.Join(err, conn.Close(ctx))
		}
		done <- err
	}()
	require.Eventually(t, func() bool {
		return rowsOf(t, h.Primary().DSN("postgres"), `SELECT count(*)::text FROM pg_stat_activity WHERE wait_event = 'SyncRep'`) == "1"
	}, time.Minute, 20*time.Millisecond, "the commit waits for the standby")
	h.ReleaseWAL()
	require.NoError(t, <-done)
	require.NoError(t, h.WaitReplayed(ctx))
	require.Equal(t, "a", rows(t, h.Standby().DSN(db)))
}

// TestHAPairSwitchoverKeepsEverything: a planned switchover loses nothing,
// even what was committed while the WAL was held.
func TestHAPairSwitchoverKeepsEverything(t *testing.T) {
	t.Parallel()
	h := pgtest.NewHAPair(t, pgtest.HAOptions{})
	db := h.NewDatabase(t)
	ctx := context.Background()
	mustExec(t, h.DSN(db), `CREATE TABLE t (v text); INSERT INTO t VALUES ('a')`)
	h.HoldWAL()
	mustExec(t, h.DSN(db), `INSERT INTO t VALUES ('b')`)
	require.NoError(t, h.Switchover(ctx))
	require.Equal(t, "a,b", rows(t, h.DSN(db)), "through the pair's DSN, on the promoted server")
}

func rowsOf(t *testing.T, dsn, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var s string
	require.NoError(t, conn.QueryRow(ctx, sql).Scan(&s))
	return s
}

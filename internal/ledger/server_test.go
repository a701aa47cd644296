package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/testtier"
)

// TestServerChanges_Restart: a pool whose sessions reconnect to a server
// that restarted (what a crash with synchronous_commit off, or a failover,
// looks like to it) says so: another life of the server, named by its start.
func TestServerChanges_Restart(t *testing.T) {
	t.Parallel()
	testtier.Needs(t, "PostgreSQL")
	ctx := context.Background()
	c, err := pgtest.StartCluster(ctx, pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	pool, err := ledger.Open(ctx, c.DSN("postgres"), 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	require.Zero(t, ledger.ServerChanges(pool).Changes, "the first server is no change")

	require.NoError(t, c.Restart(ctx))
	require.Eventually(t, func() bool {
		_, err := pool.Exec(ctx, `SELECT 1`) // the old sessions are gone: the pool connects again
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)
	ch := ledger.ServerChanges(pool)
	require.Equal(t, 1, ch.Changes, "%+v", ch)
	require.True(t, ch.To.Started.After(ch.From.Started), "%s -> %s", ch.From, ch.To)
	require.EqualValues(t, 1, ch.From.Timeline, "a primary's timeline is read")
	require.Equal(t, ch.From.Timeline, ch.To.Timeline, "a restart keeps the timeline")
}

package ledger_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
	ctx := context.Background()
	c, pool := serverOfItsOwn(t)
	_, err := pool.Exec(ctx, `SELECT 1`)
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

// TestServerChanges_CrashRecovery: a server that recovers from a crash
// (a backend killed: the postmaster restarts every session and replays its
// WAL, losing what synchronous_commit off acknowledged and never flushed)
// keeps its start time and timeline, yet it is another life of it, which a
// pool whose sessions reconnect says, and which the shard's counted proof
// tells apart (ledger.ServerIdentity.Reset). On the old code the pool saw
// the same server and the change went unnoticed.
func TestServerChanges_CrashRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := serverOfItsOwn(t)
	var backend int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&backend))
	before, err := ledger.NewStore(pool).Server(ctx)
	require.NoError(t, err)
	require.True(t, before.Known(), "%s", before)

	require.NoError(t, syscall.Kill(backend, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		_, err := pool.Exec(ctx, `SELECT 1`) // every session is gone: the pool connects again
		return err == nil && ledger.ServerChanges(pool).Changes > 0
	}, 30*time.Second, 100*time.Millisecond)
	ch := ledger.ServerChanges(pool)
	require.Equal(t, 1, ch.Changes, "%+v", ch)
	require.True(t, ch.To.Started.Equal(ch.From.Started), "the postmaster kept running: %s -> %s", ch.From, ch.To)
	require.Equal(t, ch.From.Timeline, ch.To.Timeline, "a crash recovery keeps the timeline")
	require.True(t, ch.To.Reset.After(ch.From.Reset), "the recovery reset the statistics: %s -> %s", ch.From, ch.To)
	after, err := ledger.NewStore(pool).Server(ctx)
	require.NoError(t, err)
	require.False(t, after.Same(before), "%s and %s are two lives", before, after)
}

// serverOfItsOwn starts a server for the test alone (it restarts or
// crashes it) and opens a pool of 2 on it.
func serverOfItsOwn(t *testing.T) (*pgtest.Cluster, *pgxpool.Pool) {
	t.Helper()
	testtier.Needs(t, "PostgreSQL")
	ctx := context.Background()
	c, err := pgtest.StartCluster(ctx, pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	pool, err := ledger.Open(ctx, c.DSN("postgres"), 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return c, pool
}

// TestCommitChunk_CommitWaitingForAStandbyIsNoticed: a server that waits
// for a synchronous standby that never answers (an old primary a failover
// left behind) holds a chunk's COMMIT for ever; the chunk gives up within
// its lock timeout and the network timeout instead, retryably if it got no
// answer, so that a worker reaches the new primary. On the old code it
// waited until the test's own deadline.
func TestCommitChunk_CommitWaitingForAStandbyIsNoticed(t *testing.T) {
	t.Parallel()
	testtier.Needs(t, "PostgreSQL")
	ctx := context.Background()
	pool := migratedServer(t, ledger.NetworkTimeout(2*time.Second))
	awaitGhostStandby(t, pool)

	tctx, cancel := context.WithTimeout(ctx, 30*time.Second) // without a bound: until then
	defer cancel()
	start := time.Now()
	_, err := ledger.NewStore(pool).CommitChunk(tctx, runNamed("uid-ghost"), []ledger.Item{{Key: ledger.Key{Entity: "a", Occurrence: "b"}}},
		ledger.ChunkOptions{LockTimeout: time.Second, NetworkTimeout: 2 * time.Second})
	require.NoError(t, tctx.Err(), "ended by the bound, not by the test's own deadline")
	require.Less(t, time.Since(start), 15*time.Second)
	if err != nil { // no answer: unknown outcome, sent again; a cancelled wait answers "committed locally"
		require.ErrorIs(t, err, ledger.ErrNoAnswer)
		require.True(t, ledger.IsRetryable(err), "%v", err)
	}
}

// TestWritesOutsideChunksAnswerWithoutAStandby: the small writes a shard
// makes outside its chunks (its lease's renewal, its failure records, its
// progress) on a server whose COMMIT waits for a synchronous standby that
// never answers (an old primary a failover left behind) give up within the
// Store's lock timeout and writeAnswerGrace, retryably if they got no
// answer, so that the shard reaches the new primary. On the old code they
// waited for the statement timeout (an hour by default) or for ever.
func TestWritesOutsideChunksAnswerWithoutAStandby(t *testing.T) {
	t.Parallel()
	testtier.Needs(t, "PostgreSQL")
	ctx := context.Background()
	pool := migratedServer(t)
	store := ledger.NewStore(pool).WithBounds(time.Hour, time.Second)
	lease := store.ShardLease("uid-ghost", 0)
	require.NoError(t, lease.Acquire(ctx, 0, nil))
	awaitGhostStandby(t, pool)

	tctx, cancel := context.WithTimeout(ctx, time.Minute) // without a bound: until then
	defer cancel()
	writes := map[string]func() error{
		"lease": func() error { return lease.Check(tctx) },
		"failure records": func() error {
			return store.RecordVerdicts(tctx, ledger.Pass{Run: runNamed("uid-ghost"), ID: "pass"}, 0,
				[]ledger.FailedItem{{Key: ledger.Key{Entity: "a", Occurrence: "b"}, Class: ledger.ClassInput, Error: "refused"}}, nil)
		},
		"progress": func() error {
			_, _, err := store.PublishProgress(tctx, "uid-ghost", ledger.ShardProgress{Shard: 0}, time.Minute)
			return err
		},
	}
	start := time.Now()
	errs := make(map[string]error, len(writes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, write := range writes {
		wg.Go(func() {
			err := write()
			mu.Lock()
			errs[name] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	require.NoError(t, tctx.Err(), "ended by the bound, not by the test's own deadline")
	require.Less(t, time.Since(start), 40*time.Second)
	for name, err := range errs {
		if err != nil { // no answer: sent again; a cancelled wait answers "committed locally"
			require.ErrorIs(t, err, ledger.ErrNoAnswer, name)
			require.True(t, ledger.IsRetryable(err), "%s: %v", name, err)
		}
	}
}

// awaitGhostStandby makes pool's server wait, at every COMMIT, for a
// synchronous standby that never comes (an old primary a failover left
// behind), and waits until it does.
func awaitGhostStandby(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'ghost'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT pg_catalog.pg_reload_conf()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var names string
		return pool.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&names) == nil && names == "ghost"
	}, 10*time.Second, 50*time.Millisecond)
}

// migratedServer is a pool of 4 on a server of its own (synchronous_commit
// on, no standby yet), its ledger migrated.
func migratedServer(t *testing.T, opts ...ledger.Option) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	c, err := pgtest.StartCluster(ctx, pgtest.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	pool, err := ledger.Open(ctx, c.DSN("postgres"), 4, opts...)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = ledger.Migrate(ctx, pool)
	require.NoError(t, err)
	return pool
}

// TestServerIdentity_SameLife: a life of a server is its start, timeline
// and statistics' start, whatever address a session reached it at (a
// pooler may reach one server at two); Same also tells the addresses apart.
func TestServerIdentity_SameLife(t *testing.T) {
	started := time.Date(2026, 12, 7, 10, 0, 0, 123456000, time.UTC)
	life := ledger.ServerIdentity{Address: "10.0.0.1:5432", Started: started, Timeline: 3, Reset: started}
	for _, tc := range []struct {
		name           string
		other          ledger.ServerIdentity
		sameLife, same bool
	}{
		{"the same", life, true, true},
		{"another address of it", ledger.ServerIdentity{Address: "[::1]:5432", Started: started, Timeline: 3, Reset: started}, true, false},
		{"restarted", ledger.ServerIdentity{Address: life.Address, Started: started.Add(time.Microsecond), Timeline: 3, Reset: started}, false, false},
		{"promoted (another timeline)", ledger.ServerIdentity{Address: life.Address, Started: started, Timeline: 4, Reset: started}, false, false},
		{"recovered from a crash", ledger.ServerIdentity{Address: life.Address, Started: started, Timeline: 3, Reset: started.Add(time.Second)}, false, false},
		{"in recovery", ledger.ServerIdentity{Address: life.Address, Started: started, Reset: started}, false, false},
	} {
		require.Equal(t, tc.sameLife, life.SameLife(tc.other), tc.name)
		require.Equal(t, tc.same, life.Same(tc.other), tc.name)
	}
	require.Equal(t, "unknown", ledger.ServerIdentity{}.String())
	require.Equal(t, "10.0.0.1:5432, timeline 3, started 2026-12-07T10:00:00Z, statistics since 2026-12-07T10:00:00Z", life.String())
}

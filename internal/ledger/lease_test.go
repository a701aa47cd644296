package ledger_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// expire makes the lease of (uid, shard) expired, as a holder that stopped
// renewing it (a dead or stalled process) leaves it.
func expire(t *testing.T, pool *pgxpool.Pool, uid string, shard int) {
	t.Helper()
	mustExec(t, pool, `UPDATE runledger.shard_lease SET expires_at = now() - interval '1 second' WHERE run_uid = $1 AND shard = $2`, uid, shard)
}

// TestShardLease_OneHolder: one process holds a shard's lease; another is
// refused until it is given back, and other shards and runs are free.
func TestShardLease_OneHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := ledger.NewStore(newPool(t))
	a := s.ShardLease("uid", 0)
	require.NoError(t, a.Acquire(ctx, 0, nil))
	require.NoError(t, a.Acquire(ctx, 0, nil), "taking it again is a renewal")
	b := s.ShardLease("uid", 0)
	require.ErrorIs(t, b.Acquire(ctx, 0, nil), ledger.ErrShardBusy)
	require.NoError(t, s.ShardLease("uid", 1).Acquire(ctx, 0, nil), "another shard")
	require.NoError(t, s.ShardLease("other", 0).Acquire(ctx, 0, nil), "another run")

	var waited atomic.Int32
	start := time.Now()
	require.ErrorIs(t, b.Acquire(ctx, 1500*time.Millisecond, func() { waited.Add(1) }), ledger.ErrShardBusy)
	require.GreaterOrEqual(t, time.Since(start), 1500*time.Millisecond, "waited for it")
	require.EqualValues(t, 1, waited.Load(), "said once that it waits")

	a.Release()
	require.NoError(t, b.Acquire(ctx, 0, nil), "given back: taken at once")
	require.ErrorIs(t, a.Check(ctx), ledger.ErrShardBusy, "the earlier holder's is gone")
}

// TestShardLease_TakenOver: a lease its holder stopped renewing expires and
// another process takes it; from then on the first holder commits nothing:
// its chunk and its failure records fail with ErrShardBusy, its Check says
// so, and the ledger holds only the new holder's rows.
func TestShardLease_TakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	run := runNamed("taken")
	a := s.ShardLease(run.UID, 0)
	require.NoError(t, a.Acquire(ctx, 0, nil))
	res := commit(t, s, run, items("a", 0, 10), ledger.ChunkOptions{Lease: a})
	require.Len(t, res, 10)

	b := s.ShardLease(run.UID, 0)
	require.ErrorIs(t, b.Acquire(ctx, 0, nil), ledger.ErrShardBusy, "not expired yet")
	expire(t, pool, run.UID, 0)
	require.NoError(t, b.Acquire(ctx, 0, nil), "expired: taken over")

	_, err := s.CommitChunk(ctx, run, items("a", 10, 20), ledger.ChunkOptions{Lease: a})
	require.ErrorIs(t, err, ledger.ErrShardBusy)
	require.False(t, ledger.IsRetryable(err), "not retried: the shard is another's")
	err = s.RecordVerdicts(ctx, ledger.Pass{Run: run, ID: "pass-a", Lease: a}, 2,
		[]ledger.FailedItem{{Key: ledger.Key{Entity: "a", Occurrence: "occ-x"}, Class: ledger.ClassInput, Error: "bad"}}, nil)
	require.ErrorIs(t, err, ledger.ErrShardBusy)
	require.ErrorIs(t, a.Check(ctx), ledger.ErrShardBusy)
	require.Equal(t, 10, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.ledger`), "nothing of the first holder's after the take-over")
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.item_failure`))

	res = commit(t, s, run, items("a", 10, 20), ledger.ChunkOptions{Lease: b})
	require.Len(t, res, 10)
	require.NoError(t, b.Check(ctx))
}

// TestShardLease_TakeOverWaitsForTheChunkInFlight: a chunk's transaction
// renews and row-locks its lease; a process trying to take the lease meanwhile
// waits a second at most for that chunk, then finds the lease busy and says
// so (its status: waiting for the shard's lock), tries again, and is refused
// once the chunk commits: the chunk renewed the lease.
func TestShardLease_TakeOverWaitsForTheChunkInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	run := runNamed("inflight")
	a := s.ShardLease(run.UID, 0)
	require.NoError(t, a.Acquire(ctx, 0, nil))

	inCall, release := make(chan struct{}), make(chan struct{})
	p := &blockingProcessor{inCall: inCall, release: release}
	committed := make(chan error, 1)
	go func() {
		_, err := s.CommitChunk(ctx, run, items("a", 0, 5), ledger.ChunkOptions{Lease: a, Processor: p})
		committed <- err
	}()
	<-inCall
	taken := make(chan error, 1)
	busy := make(chan struct{})
	b := s.ShardLease(run.UID, 0)
	start := time.Now()
	go func() { taken <- b.Acquire(ctx, 4*time.Second, func() { close(busy) }) }()
	select {
	case <-busy:
		require.Less(t, time.Since(start), 3*time.Second, "busy after a bounded wait for the row")
	case err := <-taken:
		t.Fatalf("taken while the holder's chunk is in flight: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the take waited for the chunk in flight without saying so")
	}
	close(release)
	require.NoError(t, <-committed, "the holder's chunk commits")
	require.ErrorIs(t, <-taken, ledger.ErrShardBusy, "the chunk renewed the lease")
	require.Equal(t, 5, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.ledger`))
}

// blockingProcessor accepts every item once release is closed, after saying
// it is in the call.
type blockingProcessor struct {
	inCall  chan struct{}
	release chan struct{}
	once    atomic.Bool
}

func (p *blockingProcessor) Process(_ context.Context, _ ledger.Run, claims []ledger.Claim) ([]ledger.Verdict, error) {
	if p.once.CompareAndSwap(false, true) {
		close(p.inCall)
	}
	<-p.release
	out := make([]ledger.Verdict, len(claims))
	for i := range out {
		out[i].OK = true
	}
	return out, nil
}

// TestShardLease_EarlierReleaseWorker: a worker of a release before the
// lease holds its shard by a session advisory lock; the lease is refused
// while it does, and left free.
func TestShardLease_EarlierReleaseWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	old, err := directPool(t, pool).Acquire(ctx)
	require.NoError(t, err)
	defer old.Release()
	_, err = old.Exec(ctx, `SELECT pg_advisory_lock($1)`, ledger.ShardLockKey("uid", 3))
	require.NoError(t, err)
	l := s.ShardLease("uid", 3)
	require.ErrorIs(t, l.Acquire(ctx, 0, nil), ledger.ErrShardBusy)
	require.Zero(t, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.shard_lease`), "no lease left behind")
	_, err = old.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	require.NoError(t, l.Acquire(ctx, 0, nil))
}

// TestShardLease_Keep: Keep renews the lease (its expiry moves on); once
// another process has taken it over, Keep says so, once.
func TestShardLease_Keep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	a := s.ShardLease("kept", 0)
	require.NoError(t, a.Acquire(ctx, 0, nil))
	mustExec(t, pool, `UPDATE runledger.shard_lease SET expires_at = now() + interval '2 seconds'`)
	lost := make(chan error, 2)
	stop := a.Keep(ctx, func(err error) { lost <- err })
	defer stop()
	require.Eventually(t, func() bool {
		return scalar[bool](t, pool, `SELECT expires_at > now() + $1 * interval '1 millisecond' FROM runledger.shard_lease`, (ledger.LeaseTTL / 2).Milliseconds())
	}, 5*time.Second, 50*time.Millisecond, "renewed for LeaseTTL")

	expire(t, pool, "kept", 0)
	require.NoError(t, s.ShardLease("kept", 0).Acquire(ctx, 0, nil))
	select {
	case err := <-lost:
		require.ErrorIs(t, err, ledger.ErrShardBusy)
	case <-time.After(ledger.LeaseTTL):
		t.Fatal("Keep did not notice the take-over")
	}
	stop()
	require.Empty(t, lost, "said once")
}

// TestShardLeaseThroughPgBouncer: the lease holds nothing on a session, so
// it works through a transaction pooler: taken, refused to another, renewed
// by a chunk and by Check, taken over once expired, given back.
func TestShardLeaseThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	direct := pgtest.Pool(t, dsn)
	pooled, err := ledger.Open(ctx, pgtest.ThroughBouncer(t, dsn), 2)
	require.NoError(t, err)
	t.Cleanup(pooled.Close)
	s := ledger.NewStore(pooled)
	run := runNamed("pooled")
	a := s.ShardLease(run.UID, 0)
	require.NoError(t, a.Acquire(ctx, 0, nil))
	require.True(t, ledger.BehindPooler(pooled))
	require.ErrorIs(t, s.ShardLease(run.UID, 0).Acquire(ctx, 0, nil), ledger.ErrShardBusy)
	commit(t, s, run, items("a", 0, 10), ledger.ChunkOptions{Lease: a})
	require.NoError(t, a.Check(ctx))
	mustExec(t, direct, `UPDATE runledger.shard_lease SET expires_at = now() - interval '1 second'`)
	b := s.ShardLease(run.UID, 0)
	require.NoError(t, b.Acquire(ctx, 0, nil))
	_, err = s.CommitChunk(ctx, run, items("a", 10, 20), ledger.ChunkOptions{Lease: a})
	require.ErrorIs(t, err, ledger.ErrShardBusy)
	b.Release()
	require.Zero(t, scalar[int](t, direct, `SELECT count(*)::int FROM runledger.shard_lease`))
	require.Equal(t, 10, scalar[int](t, direct, `SELECT count(*)::int FROM runledger.ledger`))
}

// TestShardLeaseLostInAFailoverBehindAPooler: a lease taken within the
// replication lag is lost with a crash failover. Behind a PgBouncer pointed
// at the promoted server after it, the pool's sessions stay open: the
// renewal's refusal comes on a session the pool's watch saw no other server
// on (the pool opens a new one only after, the refused transaction's session
// being dropped), so it must be told from another process's take by the
// server's life: the lease nobody holds there is taken again; one another
// process took over before the failover stays that process's. (The old
// code stopped the shard as "being processed by another process".)
func TestShardLeaseLostInAFailoverBehindAPooler(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers and its own PgBouncer")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, db, b, pool := pooledHAPair(ctx, t)
	s := ledger.NewStore(pool)
	// Shard 1: taken by this process, then by another one (its holder
	// changed, far from expiry), before the failover: the standby has it.
	kept := s.ShardLease("uid-lost", 1)
	require.NoError(t, kept.Acquire(ctx, 0, nil))
	_, err := pool.Exec(ctx, `UPDATE runledger.shard_lease SET holder = 'another process', expires_at = now() + interval '1 hour'
		WHERE run_uid = 'uid-lost' AND shard = 1`)
	require.NoError(t, err)
	require.NoError(t, h.WaitReplayed(ctx))
	// Shard 0: taken within the lag, lost with the failover.
	h.HoldWAL()
	lost := s.ShardLease("uid-lost", 0)
	require.NoError(t, lost.Acquire(ctx, 0, nil))

	require.NoError(t, h.CrashPrimary(ctx))
	require.NoError(t, h.Promote(ctx))
	require.NoError(t, b.Retarget(ctx, h.Standby()))

	// Shard 0 first: its refusal is the first thing of the pool to reach
	// the promoted server, so only the server's life can tell it.
	require.NoError(t, lost.Check(ctx), "the lease lost with the failover is taken again")
	survivor := pgtest.Pool(t, h.Standby().DSN(db))
	require.Equal(t, 1, scalar[int](t, survivor, `SELECT count(*)::int FROM runledger.shard_lease WHERE run_uid = 'uid-lost' AND shard = 0 AND expires_at > now()`),
		"the survivor holds shard 0's lease again")
	require.ErrorIs(t, kept.Check(ctx), ledger.ErrShardBusy, "a lease another process took over is never taken back")
	require.Equal(t, "another process", scalar[string](t, survivor, `SELECT holder FROM runledger.shard_lease WHERE run_uid = 'uid-lost' AND shard = 1`))
	lost.Release()
	require.Zero(t, scalar[int](t, survivor, `SELECT count(*)::int FROM runledger.shard_lease WHERE run_uid = 'uid-lost' AND shard = 0`), "given back")
}

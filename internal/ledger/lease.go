package ledger

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	kwait "k8s.io/apimachinery/pkg/util/wait"
)

// ErrShardBusy: another process holds the shard's lease: the same shard of
// the same run is being processed elsewhere (a second `runledger run`, or a
// pod the controller believes gone), or took it over after this process
// failed to renew it in time. Running it twice at once would not commit
// anything twice (the ledger's rule sees to that), but each process would
// count the other's rows as its own completed ones.
var ErrShardBusy = errors.New("this shard of this run is being processed by another process")

// ErrLeaseTakenAgain: the shard's lease was gone from the ledger's server
// after a failover (it lost the lease's row with the transactions just
// before it: a run started within the replication lag), and this process
// took it again. The statement that found it gone committed nothing; it is
// retryable (IsRetryable).
var ErrLeaseTakenAgain = errors.New("the shard's lease was gone from the ledger's new server (lost with a database failover) and is this process's again")

// LeaseTTL is how long a shard's lease lasts without a renewal: a process
// that dies without giving it back (SIGKILL, a lost node) keeps its shard
// from a successor that long at most, as the session lock it replaces did
// when the server noticed a dead peer only by keep-alives. A live process
// renews it every LeaseTTL/3 (Keep) and with every chunk, whose
// transaction holds the row: no successor takes it while a chunk is in
// flight, however long the chunk takes.
const LeaseTTL = 10 * time.Second

// ShardLease is a row of runledger.shard_lease (migrations/00018), one per
// run and shard: the holder, a random id of this process, and an expiry on
// the database's clock. It keeps two processes from working on one shard at
// once; like the preload it is coordination, not the guarantee: the
// ledger's unique rule is. It holds no session (a transaction pooler lends
// each of its statements any server connection): Acquire takes it when it
// is free or expired, Keep renews it, every chunk's transaction renews it
// and row-locks it (ChunkOptions.Lease: a process taking over waits for a
// chunk in flight, and a holder whose lease was taken commits nothing
// more), Release gives it back.
type ShardLease struct {
	store  *Store
	runUID string
	shard  int
	holder string
	// key is the session advisory lock by which releases before the lease
	// kept a shard (pg_advisory_lock): a shard such a worker still runs is
	// busy too.
	key int64
	// renewed is when a transaction of this process last renewed the lease
	// (unix nanoseconds, the process's clock): Keep leaves it alone while
	// chunks renew it, instead of waiting for a chunk in flight that holds
	// its row.
	renewed atomic.Int64
	// renewedOn is the store's ServerChanges().Changes when the lease was
	// last taken or renewed: a refusal from a server the pool reached since
	// (refused) may be a failover's loss, not another holder.
	renewedOn atomic.Int64
	// life is the server's life the lease was last taken or checked on,
	// read in that transaction: behind a pooler the pool's sessions outlive
	// a failover, so its watch (renewedOn) may never see one, and a refusal
	// is told from another holder's take by the life it comes from.
	life atomic.Pointer[ServerIdentity]
	// takenAgain, when set, is called each time refused takes the lease
	// again (OnTakenAgain).
	takenAgain func()
}

// OnTakenAgain has f called each time the lease, gone from the ledger's
// server after a failover, is taken again (by a chunk, Check or Keep), so
// that the caller can say so. Set it before the lease is used.
func (l *ShardLease) OnTakenAgain(f func()) { l.takenAgain = f }

// queueServerIdentity reads, in b's transaction, the server's life into id.
func queueServerIdentity(b *pgx.Batch, id *ServerIdentity) {
	b.Queue(sqlServerIdentity).QueryRow(func(r pgx.Row) (err error) { *id, err = scanServerIdentity(r); return err })
}

// onLife records the server's life a transaction of the lease ran on.
func (l *ShardLease) onLife(id ServerIdentity) {
	if id.Known() {
		l.life.Store(&id)
	}
}

// Renewed records that a transaction of this process renewed the lease
// (a chunk's, by sqlHold), now, on the server its sessions reach now.
func (l *ShardLease) Renewed() {
	l.renewed.Store(time.Now().UnixNano())
	l.renewedOn.Store(int64(l.store.ServerChanges().Changes))
}

// renewedWithin says whether a transaction renewed the lease in the last d.
func (l *ShardLease) renewedWithin(d time.Duration) bool {
	return time.Since(time.Unix(0, l.renewed.Load())) < d
}

// ShardLease returns the (not yet taken) lease of a run's shard, for this
// process.
func (s *Store) ShardLease(runUID string, shard int) *ShardLease {
	return &ShardLease{store: s, runUID: runUID, shard: shard, holder: rand.Text(), key: shardLockKey(runUID, shard)}
}

// shardLockKey is the advisory lock key of a run's shard in releases before
// the lease.
func shardLockKey(runUID string, shard int) int64 {
	return int64(hashBytesExtended([]byte("runledger.shard/"+runUID+"/"+strconv.Itoa(shard)), shardSeed))
}

// Acquire takes the lease, waiting up to wait (polling every second) while
// another process holds it; onBusy is called once, when the wait begins. It
// returns ErrShardBusy when the lease stays taken.
func (l *ShardLease) Acquire(ctx context.Context, wait time.Duration, onBusy func()) error {
	deadline := time.Now().Add(wait)
	first := true
	// Polled on ctx itself: the wait ends between two tries, never in one.
	err := kwait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		ok, err := l.try(ctx)
		if err != nil || ok {
			return ok, err
		}
		if time.Now().After(deadline) {
			return false, ErrShardBusy
		}
		if first && onBusy != nil {
			onBusy()
		}
		first = false
		return false, nil
	})
	if ctx.Err() != nil && kwait.Interrupted(err) {
		return context.Cause(ctx)
	}
	return err
}

// try takes the lease if it is free, expired or already this process's, in
// one transaction. A chunk in flight of the holder holds the row (a lost
// worker's, until the server drops its session): the take waits a second
// for it at most and the lease is then busy, so that the caller says it
// waits (Acquire's onBusy) and tries again.
func (l *ShardLease) try(ctx context.Context) (bool, error) {
	var free, taken bool
	var life ServerIdentity
	b := l.store.begin(sqlBeginWrite)
	b.Queue(sqlLeaseLockWait)
	b.Queue(sqlPinnedSearchPath)
	b.Queue(sqlTryShardLocks, []int64{l.key}).QueryRow(func(r pgx.Row) error { return r.Scan(&free) })
	b.Queue(sqlTakeShardLease, l.runUID, l.shard, l.holder, LeaseTTL.Milliseconds()).Query(func(rows pgx.Rows) error {
		taken = rows.Next()
		rows.Close()
		return rows.Err()
	})
	queueServerIdentity(b, &life)
	b.Queue(sqlCommit)
	bounded, cancel := l.store.answered(ctx)
	err := noAnswer(ctx, bounded, l.store.pool.SendBatch(bounded, b).Close())
	cancel()
	if isLockNotAvailable(err) { // its own statements only: a holder's chunk in flight
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("taking the lease of shard %d: %w", l.shard, err)
	}
	if taken && !free {
		// A worker of a release before the lease runs the shard: give the
		// row back at once.
		l.Release()
		return false, nil
	}
	if taken {
		l.Renewed()
		l.onLife(life)
	}
	return taken, nil
}

// refused answers a renewal the server refused (RL001: the lease's row is
// not this process's), whose transaction committed nothing. Another
// process took the lease over (ErrShardBusy), unless the pool reached
// another server, or another life of it, since this process last renewed
// it, or the server answering now is another life than the one the lease
// was last taken or checked on (behind a pooler, whose sessions outlive a
// failover): a failover may have lost the row with the commits just before
// it, and the lease is then taken again where nobody else holds it
// (ErrLeaseTakenAgain: the caller tries its statement again). A lease
// released or taken over on the same server is never taken back.
func (l *ShardLease) refused(ctx context.Context) error {
	if int64(l.store.ServerChanges().Changes) == l.renewedOn.Load() {
		changed, err := l.lifeChanged(ctx)
		if err != nil {
			return err
		}
		if !changed {
			return ErrShardBusy
		}
	}
	taken, err := l.try(ctx)
	switch {
	case err != nil:
		return err
	case !taken:
		return ErrShardBusy
	}
	if l.takenAgain != nil {
		l.takenAgain()
	}
	return ErrLeaseTakenAgain
}

// lifeChanged says whether the server answering now is another life than
// the one the lease was last taken or checked on (false when that is not
// known).
func (l *ShardLease) lifeChanged(ctx context.Context) (bool, error) {
	was := l.life.Load()
	if was == nil {
		return false, nil
	}
	bounded, cancel := l.store.answered(ctx)
	now, err := l.store.Server(bounded)
	err = noAnswer(ctx, bounded, err)
	cancel()
	if err != nil {
		return false, fmt.Errorf("telling a failover's loss of the lease of shard %d from another holder: %w", l.shard, err)
	}
	return !now.SameLife(*was), nil
}

// Check renews the lease now: ErrShardBusy if another process has taken it
// over, or it is gone (refused: after a failover it is taken again).
func (l *ShardLease) Check(ctx context.Context) error {
	var life ServerIdentity
	b := l.store.begin(sqlBeginWrite)
	b.Queue(sqlPinnedSearchPath)
	b.Queue(l.sqlHold())
	queueServerIdentity(b, &life)
	b.Queue(sqlCommit)
	bounded, cancel := l.store.answered(ctx)
	err := noAnswer(ctx, bounded, l.store.pool.SendBatch(bounded, b).Close())
	cancel()
	if isShardLeaseLost(err) {
		if err = l.refused(ctx); errors.Is(err, ErrLeaseTakenAgain) {
			return nil // renewed by the take
		}
		return fmt.Errorf("renewing the lease of shard %d: %w", l.shard, err)
	}
	if err != nil {
		return fmt.Errorf("renewing the lease of shard %d: %w", l.shard, err)
	}
	l.Renewed()
	l.onLife(life)
	return nil
}

// sqlHold is the statement that renews the lease in a transaction of the
// holder, and fails it if the lease is no longer its own (literals: it is
// also part of a chunk's BEGIN, a simple query).
func (l *ShardLease) sqlHold() string {
	return sqlHoldShardLease(l.runUID, l.shard, l.holder, LeaseTTL)
}

// Keep renews the lease every LeaseTTL/3 until stop is called or ctx ends,
// unless a transaction of this process renewed it meanwhile (Renewed); lost
// is called once, with ErrShardBusy, if another process took it over (the
// caller stops the shard). A renewal that fails otherwise is tried at the
// next tick: a chunk's transaction checks the lease anyway.
func (l *ShardLease) Keep(ctx context.Context, lost func(error)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		kwait.UntilWithContext(ctx, func(ctx context.Context) {
			if l.renewedWithin(LeaseTTL / 3) {
				return
			}
			if err := l.Check(ctx); errors.Is(err, ErrShardBusy) {
				lost(err)
				cancel()
			}
		}, LeaseTTL/3)
	}()
	return func() { cancel(); <-done }
}

// Release gives the lease back (deletes its row, if it is still this
// process's), so that a successor takes it at once.
func (l *ShardLease) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.store.pinned(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sqlReleaseShardLease, l.runUID, l.shard, l.holder)
		return err
	})
}

package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	kwait "k8s.io/apimachinery/pkg/util/wait"
)

// ErrShardBusy: another process holds the shard's lock: the same shard of
// the same run is being processed elsewhere (a second `runledger run`, or a
// pod the controller believes gone). Running it twice at once would not
// commit anything twice (the ledger's rule sees to that), but each process
// would count the other's rows as its own completed ones.
var ErrShardBusy = errors.New("this shard of this run is being processed by another process")

// ShardLock is a PostgreSQL advisory lock, one per run and shard, held for as
// long as the shard runs on a session of its own. It keeps two processes from
// working on one shard at once; like the preload it is coordination, not the
// guarantee: the ledger's unique rule is.
type ShardLock struct {
	pool *pgxpool.Pool
	key  int64
	conn *pgxpool.Conn
}

// ShardLock returns the (not yet taken) lock of a run's shard.
func (s *Store) ShardLock(runUID string, shard int) *ShardLock {
	key := hashBytesExtended([]byte("runledger.shard/"+runUID+"/"+strconv.Itoa(shard)), shardSeed)
	return &ShardLock{pool: s.pool, key: int64(key)}
}

// Acquire takes the lock, waiting up to wait (polling every second) while
// another session holds it; onBusy is called once, when the wait begins. It
// returns ErrShardBusy when the lock stays taken.
func (l *ShardLock) Acquire(ctx context.Context, wait time.Duration, onBusy func()) error {
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

func (l *ShardLock) try(ctx context.Context) (bool, error) {
	if l.conn == nil {
		conn, err := l.pool.Acquire(ctx)
		if err != nil {
			return false, fmt.Errorf("acquiring a connection for the shard lock: %w", err)
		}
		l.conn = conn
		// If this process dies with its machine, nothing closes the session
		// and the lock would outlive it by the server's TCP keepalive time
		// (2 hours by default): make the server notice a dead peer within
		// about 35 seconds instead. (No effect on unix sockets.)
		if _, err := conn.Exec(ctx, sqlSessionKeepalives); err != nil {
			l.drop()
			return false, fmt.Errorf("setting keepalives of the shard lock's session: %w", err)
		}
	}
	var ok bool
	if err := l.conn.QueryRow(ctx, sqlTryLock, l.key).Scan(&ok); err != nil {
		l.drop()
		return false, fmt.Errorf("taking the shard lock: %w", err)
	}
	return ok, nil
}

// Check verifies that the lock is still held. A session lock lasts as long
// as its session, so a live session means a held lock; but the session may
// have died with its connection (a database restart), and another process
// may have taken the lock since. A dead session is replaced and the lock
// taken again: ErrShardBusy if someone else has it by now.
func (l *ShardLock) Check(ctx context.Context) error {
	if l.conn != nil {
		if _, err := l.conn.Exec(ctx, sqlPing); err == nil {
			return nil
		}
		l.drop()
	}
	ok, err := l.try(ctx)
	switch {
	case err != nil:
		return err
	case !ok:
		return ErrShardBusy
	}
	return nil
}

// Release unlocks and returns the session to the pool.
func (l *ShardLock) Release() {
	if l.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(ctx, sqlReleaseShardSession); err != nil {
		l.drop()
		return
	}
	l.conn.Release()
	l.conn = nil
}

// drop closes the lock's session (which releases the lock, if it still
// held it) instead of returning it to the pool.
func (l *ShardLock) drop() {
	if l.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = l.conn.Conn().Close(ctx)
	l.conn.Release()
	l.conn = nil
}

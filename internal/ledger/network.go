package ledger

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Option tunes the pool Open returns.
type Option func(*pgxpool.Config)

// NetworkTimeout makes a lost server noticed within about d (plus a third of
// d on an idle connection), not after the kernel's default of about 15
// minutes of retransmissions: TCP keep-alive probes start after d/3 of
// silence, every d/6, and TCP_USER_TIMEOUT drops the connection once sent
// data or probes stay unacknowledged for d; a connection attempt gives up
// after d unless the connection string says connect_timeout. A statement
// waiting for its answer is not affected as long as the server's host
// answers the probes. The server is asked for the same as startup
// parameters (serverKeepalives), so that it drops a lost worker's session,
// and releases its locks, as soon; not behind a pooler, which refuses them
// (PgBouncer: FATAL unsupported startup parameter) and whose server
// connections are not the worker's (their keep-alives are the pooler's). Unix sockets are left alone (the
// server ignores those settings there); d <= 0 changes nothing, and a
// setting the connection string gives is kept.
func NetworkTimeout(d time.Duration) Option {
	return func(cfg *pgxpool.Config) {
		if d <= 0 {
			return
		}
		if cfg.ConnConfig.ConnectTimeout == 0 {
			cfg.ConnConfig.ConnectTimeout = d
		}
		dialer := &net.Dialer{
			KeepAliveConfig: net.KeepAliveConfig{
				Enable:   true,
				Idle:     max(d/3, time.Second),
				Interval: max(d/6, time.Second),
				Count:    3,
			},
			Control: userTimeout(d),
		}
		cfg.ConnConfig.DialFunc = dialer.DialContext
		for name, value := range map[string]time.Duration{
			"tcp_keepalives_idle":     dialer.KeepAliveConfig.Idle / time.Second,
			"tcp_keepalives_interval": dialer.KeepAliveConfig.Interval / time.Second,
			"tcp_user_timeout":        d / time.Millisecond,
		} {
			if _, set := cfg.ConnConfig.RuntimeParams[name]; !set {
				cfg.ConnConfig.RuntimeParams[name] = strconv.FormatInt(int64(value), 10)
			}
		}
	}
}

// serverKeepalives are the startup parameters NetworkTimeout asks the server
// for: startup parameters, not SET, because they are then the session's
// reset values and survive the RESET ALL that follows an effect (set by SET,
// a reset put them back to 2 hours, and a lost worker's open transaction
// held its rows' locks for as long); dropped behind a pooler, which refuses
// them (poolerProbe).
var serverKeepalives = []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_user_timeout"}

// ErrNoAnswer: a statement with a server-side timeout got no answer, not even
// the timeout's error, within that timeout plus the network timeout: the
// server hangs or the connection is cut in a way TCP does not see (the
// server's host still answers). The connection is closed; retryable.
var ErrNoAnswer = errors.New("the database server did not answer within the statement's timeout and the network timeout; the connection is presumed lost")

// answerBy bounds, on the client, one statement whose server-side timeout is
// timeout: its answer must arrive within timeout+grace. Either one 0: no
// bound.
func answerBy(ctx context.Context, timeout, grace time.Duration) (context.Context, context.CancelFunc) {
	if timeout <= 0 || grace <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, timeout+grace, ErrNoAnswer)
}

// writeAnswerGrace is how much longer than its lock timeout a small write
// outside a chunk (the shard's lease, its failure records, its progress)
// may take to answer, its COMMIT included (answered).
const writeAnswerGrace = 10 * time.Second

// answered bounds, on the client, a small write of the Store outside a
// chunk: its answer must arrive within the Store's lock timeout and
// writeAnswerGrace. The bound is for a COMMIT that waits for a synchronous
// standby a failover took away (an old primary's: it waits as long as the
// Store's statement timeout, an hour by default, or for ever without one)
// and for a server that is gone. The write is idempotent and tried again,
// on a new session.
func (s *Store) answered(ctx context.Context) (context.Context, context.CancelFunc) {
	lock := s.lockTimeout
	if lock <= 0 {
		lock = DefaultLockTimeout
	}
	return answerBy(ctx, lock, writeAnswerGrace)
}

// noAnswer marks err with ErrNoAnswer when the statement ended because
// answerBy's deadline passed, not the caller's context.
func noAnswer(ctx, bounded context.Context, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(bounded), ErrNoAnswer) {
		return fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	return err
}

package worker_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// commitCutProxy forwards TCP connections to the test server's unix socket.
// Once armed, it forwards the next COMMIT to the server, lets the server
// commit, and closes the connection before the answer reaches the client:
// the client cannot tell whether its transaction committed.
func commitCutProxy(t *testing.T, socketDir string, port uint16, user, dbname string) (dsn string, arm func()) {
	t.Helper()
	var armed atomic.Bool
	p := pgtest.NewProxy(t, pgtest.SocketOf(socketDir, port), pgtest.ProxyOptions{
		ToServer: func(c *pgtest.ProxyConn, b []byte) bool {
			if !bytes.Contains(b, []byte("commit\x00")) || !armed.CompareAndSwap(true, false) {
				return true
			}
			// Forward the COMMIT, close the client's side at once so the
			// answer never reaches it, and let the server commit.
			_ = c.Client.Close()
			_, _ = c.Server.Write(b)
			time.Sleep(300 * time.Millisecond)
			return false
		},
	})
	return p.DSN(user, dbname), func() { armed.Store(true) }
}

// lostAnswerProcessor accepts the first item of its first call and asks to
// retry the others, with the COMMIT that follows cut off; every later call
// fails as a whole (a processor that went down).
type lostAnswerProcessor struct {
	arm   func()
	calls atomic.Int32
}

func (p *lostAnswerProcessor) Process(_ context.Context, _ ledger.Run, items []ledger.Claim) ([]ledger.Verdict, error) {
	if p.calls.Add(1) > 1 {
		return nil, errors.New("503 Service Unavailable")
	}
	p.arm()
	out := make([]ledger.Verdict, len(items))
	out[0].OK = true
	for i := 1; i < len(out); i++ {
		out[i] = ledger.Verdict{Retryable: true, Error: "try later"}
	}
	return out, nil
}

// TestProcessor_LostCommitAnswerThenProcessorDown: the processor accepts
// one item and asks to retry the other; that chunk's COMMIT reaches the
// server but its answer is lost, so the chunk is sent again; the accepted
// item is then this run's committed row (never sent again), and the
// processor fails every later call until the retries are spent. The
// committed item counts as completed, not failed: completed equals the
// run's committed rows.
func TestProcessor_LostCommitAnswerThenProcessorDown(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "a proxy of its own in front of PostgreSQL's socket")
	f := newFixture(t)
	cfg := f.pool.Config().ConnConfig
	dsn, arm := commitCutProxy(t, cfg.Host, cfg.Port, cfg.User, cfg.Database)
	proxied := pgtest.Pool(t, dsn)
	p := &lostAnswerProcessor{arm: arm}
	shard := processorConfig("uid-lost-answer", "http://127.0.0.1:1/unused", occItems("1", "2"), time.Second)
	shard.Processor = p

	reports, sum := runShards(t, &fixture{pool: f.pool, store: ledger.NewStore(proxied)}, shard)
	require.GreaterOrEqual(t, p.calls.Load(), int32(2), "the chunk was sent again after the lost answer")
	require.Equal(t, int64(1), f.committed(t), "the accepted item committed")
	require.Equal(t, v1alpha1.ItemCounts{Total: 2, Completed: 1, Failed: 1}, sum, "%+v", reports[0].Failures)
}

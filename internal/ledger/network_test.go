package ledger_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/testtier"
)

// tcpProxy forwards TCP connections on a loopback port to the unix socket
// of the test's server, and returns a TCP connection string for dbname.
func tcpProxy(t *testing.T, socketDir string, port uint16, user, dbname string) string {
	return pgtest.NewProxy(t, pgtest.SocketOf(socketDir, port), pgtest.ProxyOptions{}).DSN(user, dbname)
}

// freezableProxy is tcpProxy with a switch: once freeze is called, it stops
// forwarding in both directions without closing anything (a hung server, as
// the client sees it, whose host still answers TCP); stop closes it all.
func freezableProxy(t *testing.T, socketDir string, port uint16, user, dbname string) (dsn string, freeze, stop func()) {
	t.Helper()
	frozen := make(chan struct{})
	var freezeOnce sync.Once
	var p *pgtest.Proxy
	hold := func(*pgtest.ProxyConn, []byte) bool {
		select {
		case <-frozen:
			<-p.Done() // hold everything open, forward nothing
			return false
		default:
			return true
		}
	}
	p = pgtest.NewProxy(t, pgtest.SocketOf(socketDir, port), pgtest.ProxyOptions{ToServer: hold, ToClient: hold})
	return p.DSN(user, dbname), func() { freezeOnce.Do(func() { close(frozen) }) }, p.Close
}

// TestNetworkTimeout_TCP: a pool opened with NetworkTimeout(6s) over TCP
// has keep-alive probes after 2s of silence, every 1s, and TCP_USER_TIMEOUT
// 6s on its sockets, and asked the server for the same on its side.
func TestNetworkTimeout_TCP(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "reads the server keep-alives of its own session")
	ctx := context.Background()
	cfg := newPool(t).Config().ConnConfig
	dsn := tcpProxy(t, cfg.Host, cfg.Port, cfg.User, cfg.Database)
	pool, err := ledger.Open(ctx, dsn, 1, ledger.NetworkTimeout(6*time.Second))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	raw, err := conn.Conn().PgConn().Conn().(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	got := map[string]int{}
	require.NoError(t, raw.Control(func(fd uintptr) {
		for name, opt := range map[string][2]int{
			"SO_KEEPALIVE":     {unix.SOL_SOCKET, unix.SO_KEEPALIVE},
			"TCP_KEEPIDLE":     {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
			"TCP_KEEPINTVL":    {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL},
			"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
		} {
			v, err := unix.GetsockoptInt(int(fd), opt[0], opt[1])
			require.NoError(t, err, name)
			got[name] = v
		}
	}))
	require.Equal(t, map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 2, "TCP_KEEPINTVL": 1, "TCP_USER_TIMEOUT": 6000}, got)

	// The server's end here is the proxy's unix socket, where it ignores the
	// values (they read 0); that the connection asked for them shows in
	// their source: startup parameters ("client"), so that they are the
	// session's reset values and survive the RESET ALL that follows every
	// effect chunk (set by SET, they went back to the server's 2 hours, and
	// a lost worker's open transaction kept its rows locked for as long).
	asked := func() []string {
		var names []string
		rows, err := conn.Query(ctx, `SELECT name || '=' || source FROM pg_settings WHERE name IN ('tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_user_timeout') ORDER BY name`)
		require.NoError(t, err)
		for rows.Next() {
			var a string
			require.NoError(t, rows.Scan(&a))
			names = append(names, a)
		}
		require.NoError(t, rows.Err())
		return names
	}
	want := []string{"tcp_keepalives_idle=client", "tcp_keepalives_interval=client", "tcp_user_timeout=client"}
	require.Equal(t, want, asked(), "what the server was asked for its side")
	_, err = conn.Exec(ctx, `RESET ALL`)
	require.NoError(t, err)
	require.Equal(t, want, asked(), "what the server was asked for its side, after the session's reset")
}

// TestNetworkTimeout_ConnectGivesUp: a server that accepts the connection
// and never answers is given up on after the network timeout.
func TestNetworkTimeout_ConnectGivesUp(t *testing.T) {
	t.Parallel()
	host, port, err := net.SplitHostPort(pgtest.SilentServer(t))
	require.NoError(t, err)
	pool, err := ledger.Open(context.Background(), "host="+host+" port="+port+" user=u dbname=d sslmode=disable", 1, ledger.NetworkTimeout(time.Second))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	start := time.Now()
	err = pool.Ping(context.Background())
	require.Error(t, err)
	require.Less(t, time.Since(start), 5*time.Second, "gave up after about a second: %v", err)
	require.True(t, ledger.IsRetryable(err), "a connect timeout is retryable: %v", err)
}

// partitionEnv marks the run of TestNetworkTimeout_Partition inside its own
// network namespace.
const partitionEnv = "RUNLEDGER_TEST_IN_NETNS"

// TestNetworkTimeout_Partition: a real partition. Inside a network namespace
// of its own (so that cutting its loopback cuts nobody else), two pools reach
// the server over TCP; each sends a statement that sleeps 20 s, then the
// namespace's loopback goes down, so no packet arrives anymore and nothing
// is closed. The pool with NetworkTimeout(2s) fails within a few seconds,
// retryably; the pool without it is still waiting.
func TestNetworkTimeout_Partition(t *testing.T) {
	testtier.Needs(t, "PostgreSQL") // before its child process, which runs without -short
	pgtest.DirectOnly(t, "cuts the network between its process and PostgreSQL itself")
	if os.Getenv(partitionEnv) == "" {
		if os.Geteuid() != 0 {
			t.Skip("a network namespace of its own (unshare --net) needs root")
		}
		unshare, err := exec.LookPath("unshare")
		require.NoError(t, err, "unshare (util-linux)")
		cmd := exec.Command(unshare, "--net", os.Args[0], "-test.run=^TestNetworkTimeout_Partition$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), partitionEnv+"=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "in its own network namespace:\n%s", out)
		require.Contains(t, string(out), "--- PASS: TestNetworkTimeout_Partition", "%s", out)
		t.Logf("in its own network namespace:\n%s", out)
		return
	}
	ip := func(args ...string) {
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	ip("link", "set", "lo", "up")
	cfg := newPool(t).Config().ConnConfig
	dsn := tcpProxy(t, cfg.Host, cfg.Port, cfg.User, cfg.Database)
	ctx := context.Background()
	bounded, err := ledger.Open(ctx, dsn, 1, ledger.NetworkTimeout(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(bounded.Close)
	plain, err := ledger.Open(ctx, dsn, 1)
	require.NoError(t, err)
	t.Cleanup(plain.Close)
	require.NoError(t, bounded.Ping(ctx))
	require.NoError(t, plain.Ping(ctx))

	plainCtx, cancelPlain := context.WithCancel(ctx)
	defer cancelPlain()
	boundedDone, plainDone := make(chan error, 1), make(chan error, 1)
	go func() { _, err := bounded.Exec(ctx, `SELECT pg_sleep(20)`); boundedDone <- err }()
	go func() { _, err := plain.Exec(plainCtx, `SELECT pg_sleep(20)`); plainDone <- err }()
	time.Sleep(500 * time.Millisecond)
	ip("link", "set", "lo", "down")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "set", "lo", "up").Run() })
	cut := time.Now()

	select {
	case err := <-boundedDone:
		require.Error(t, err)
		t.Logf("noticed after %s: %v", time.Since(cut).Round(100*time.Millisecond), err)
		require.True(t, ledger.IsRetryable(err), "a lost connection is retryable: %v", err)
	case <-time.After(8 * time.Second):
		t.Fatal("the partition was not noticed within 8s with a network timeout of 2s")
	}
	select {
	case err := <-plainDone:
		t.Fatalf("without a network timeout the statement should still wait, got: %v", err)
	default:
	}
	cancelPlain()
	require.Error(t, <-plainDone, "cancelled")
}

// TestCommitChunk_HungServerIsNoticed: the server stops answering in the
// middle of an effect while its host still answers TCP (the proxy forwards
// nothing more and closes nothing), so neither TCP nor the server's own
// statement_timeout ends the wait. The chunk's effect gets its answer within
// EffectTimeout + NetworkTimeout or the connection is dropped: the chunk fails
// retryably (ErrNoAnswer) in about 3 s, not never.
func TestCommitChunk_HungServerIsNoticed(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "freezes a proxy of its own in front of PostgreSQL's socket")
	admin := newPool(t)
	mustExec(t, admin, `CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY)`)
	cfg := admin.Config().ConnConfig
	dsn, freeze, stop := freezableProxy(t, cfg.Host, cfg.Port, cfg.User, cfg.Database)
	pool, err := ledger.Open(context.Background(), dsn, 2, ledger.NetworkTimeout(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	defer stop() // before the pool closes: the dropped connection's goodbye needs no 15 s
	s := ledger.NewStore(pool)
	opts := ledger.ChunkOptions{Effect: noteEffect + `; SELECT pg_sleep(0.5)`, EffectTimeout: time.Second, NetworkTimeout: 2 * time.Second}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // without a bound: forever
	defer cancel()
	go freezeWhenRunning(admin, `SELECT runledger.run\_effect(%`, freeze)
	start := time.Now()
	res, err := s.CommitChunk(ctx, runNamed("run-a"), noteItems(10), opts)
	require.Error(t, err, "results: %v", res)
	require.NoError(t, ctx.Err(), "ended by the bound, not by the test's own deadline")
	require.Less(t, time.Since(start), 8*time.Second)
	require.ErrorIs(t, err, ledger.ErrNoAnswer)
	require.True(t, ledger.IsRetryable(err), "a lost connection is retryable: %v", err)
	require.Zero(t, scalar[int64](t, admin, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed'`), "nothing committed")
}

// TestFixQueryBatch_HungServerIsNoticed: the same for the batch's query.
func TestFixQueryBatch_HungServerIsNoticed(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "freezes a proxy of its own in front of PostgreSQL's socket")
	admin := newPool(t)
	mustExec(t, admin, batchSource)
	cfg := admin.Config().ConnConfig
	dsn, freeze, stop := freezableProxy(t, cfg.Host, cfg.Port, cfg.User, cfg.Database)
	pool, err := ledger.Open(context.Background(), dsn, 2, ledger.NetworkTimeout(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	defer stop()
	q := batchQuery()
	q.SQL = `SELECT entity, occurrence, payload FROM src WHERE pg_sleep(0.001)::text IS NOT NULL`
	q.Timeout, q.NetworkTimeout = time.Second, 2*time.Second

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The batch's statement, by its start: pg_stat_activity keeps the first
	// track_activity_query_size bytes of it, which need not reach the
	// user's query inside it.
	go freezeWhenRunning(admin, `%WITH hdr AS (%INSERT INTO runledger.batch\_run %`, freeze)
	start := time.Now()
	_, err = ledger.NewStore(pool).FixQueryBatch(ctx, runNamed("q"), q)
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "ended by the bound, not by the test's own deadline")
	require.Less(t, time.Since(start), 8*time.Second)
	require.ErrorIs(t, err, ledger.ErrNoAnswer)
	require.True(t, ledger.IsRetryable(err), "%v", err)
}

// freezeWhenRunning calls freeze once another session runs a statement LIKE
// pattern (or after 10 s, when the test fails anyway).
func freezeWhenRunning(admin *pgxpool.Pool, pattern string, freeze func()) {
	defer freeze()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid() AND query LIKE $1`, pattern).Scan(&n)
		if err != nil || n > 0 {
			return
		}
	}
}

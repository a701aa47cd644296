package ledger_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/testtier"
)

// TestDurability_Verdict: a commit is "synchronous" only when the server
// waits for a named synchronous standby before acknowledging it, and says
// how far that standby has it; every other setting is "asynchronous", in
// which a failover can lose acknowledged commits.
func TestDurability_Verdict(t *testing.T) {
	for _, tc := range []struct {
		commit, names string
		senders       int
		standby       ledger.StandbyHas
		localFlush    bool
	}{
		{"on", "standby1", 10, ledger.StandbyFlushed, true},
		{"on", "FIRST 1 (a, b)", 10, ledger.StandbyFlushed, true},
		{"on", "ANY 2 (a, b, c)", 10, ledger.StandbyFlushed, true},
		{"on", "*", 10, ledger.StandbyFlushed, true},
		{"remote_apply", "standby1", 10, ledger.StandbyApplied, true},
		{"remote_write", "standby1", 10, ledger.StandbyWritten, true},
		// The server acknowledges once it flushed the commit itself: a
		// failover to a standby can lose it.
		{"local", "standby1", 10, ledger.StandbyNone, true},
		// Not even flushed locally.
		{"off", "standby1", 10, ledger.StandbyNone, false},
		// No synchronous standby named: standbys, if any, are asynchronous.
		{"on", "", 10, ledger.StandbyNone, true},
		{"on", "  ", 10, ledger.StandbyNone, true},
		{"remote_apply", "", 10, ledger.StandbyNone, true},
		{"off", "", 10, ledger.StandbyNone, false},
		// A server that serves no standby waits for none.
		{"on", "standby1", 0, ledger.StandbyNone, true},
	} {
		d := ledger.Durability{SynchronousCommit: tc.commit, SynchronousStandbyNames: tc.names, MaxWALSenders: tc.senders}
		name := fmt.Sprintf("synchronous_commit=%s synchronous_standby_names=%q max_wal_senders=%d", tc.commit, tc.names, tc.senders)
		require.Equal(t, tc.standby, d.Standby(), name)
		require.Equal(t, tc.standby != ledger.StandbyNone, d.Synchronous(), name)
		want := "asynchronous"
		if d.Synchronous() {
			want = "synchronous"
		}
		require.Equal(t, want, d.Verdict(), name)
		require.Equal(t, tc.localFlush, d.LocalFlush(), name)
	}
}

// TestDurability_ReadsTheServer reads the promise as an unprivileged
// login, directly and through PgBouncer (transaction mode), from a cluster
// of the test's own: synchronous_standby_names is a server-wide setting,
// which the test changes (ALTER SYSTEM, reload) where no other test runs.
// The login's synchronous_commit is its own (ALTER ROLE), and a session's
// SET of another client on a pooled server connection is not what the
// chunks commit under.
func TestDurability_ReadsTheServer(t *testing.T) {
	testtier.Needs(t, "PostgreSQL")
	t.Parallel()
	ctx := context.Background()
	// Durable: synchronous_commit keeps its default (on), as on a production
	// server; fsync stays on too, which this test does not mind.
	c, err := pgtest.StartCluster(ctx, pgtest.Options{Durable: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	b, err := pgtest.StartPgBouncer(ctx, c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Stop() })

	admin, err := pgx.Connect(ctx, c.DSN("postgres"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close(ctx) })
	exec := func(sql string) {
		t.Helper()
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	// With a synchronous standby named and none connected, a write of this
	// session would wait for ever: it acknowledges locally.
	exec(`SET synchronous_commit = local`)
	exec(`CREATE ROLE worker LOGIN`)
	dsns := map[string]string{
		"direct":    fmt.Sprintf("%s user=worker", c.DSN("postgres")),
		"pgbouncer": fmt.Sprintf("host=127.0.0.1 port=%d user=worker dbname=postgres sslmode=disable", b.Port()),
	}
	read := func(t require.TestingT, dsn string) ledger.Durability {
		pool, err := ledger.Open(ctx, dsn, 2)
		require.NoError(t, err)
		defer pool.Close()
		d, err := ledger.NewStore(pool).Durability(ctx)
		require.NoError(t, err)
		return d
	}
	// reload changes a server setting and waits until new sessions see it.
	reload := func(name, value string) {
		t.Helper()
		exec(fmt.Sprintf(`ALTER SYSTEM SET %s = '%s'`, name, value))
		exec(`SELECT pg_reload_conf()`)
		require.Eventually(t, func() bool {
			conn, err := pgx.Connect(ctx, c.DSN("postgres"))
			if err != nil {
				return false
			}
			defer func() { _ = conn.Close(ctx) }()
			var v string
			return conn.QueryRow(ctx, `SELECT current_setting('`+name+`')`).Scan(&v) == nil && v == value
		}, 10*time.Second, 20*time.Millisecond)
	}

	for _, step := range []struct {
		name        string
		setup       func()
		commit      string
		names       string
		synchronous bool
		standby     ledger.StandbyHas
	}{
		{"no synchronous standby", func() {}, "on", "", false, ledger.StandbyNone},
		{"a synchronous standby", func() { reload("synchronous_standby_names", "standby1") }, "on", "standby1", true, ledger.StandbyFlushed},
		{"the login's remote_write", func() { exec(`ALTER ROLE worker SET synchronous_commit = remote_write`) }, "remote_write", "standby1", true, ledger.StandbyWritten},
		{"the login's local", func() { exec(`ALTER ROLE worker SET synchronous_commit = local`) }, "local", "standby1", false, ledger.StandbyNone},
		{"the server's off", func() {
			exec(`ALTER ROLE worker RESET synchronous_commit`)
			reload("synchronous_commit", "off")
		}, "off", "standby1", false, ledger.StandbyNone},
	} {
		step.setup()
		for via, dsn := range dsns {
			t.Run(step.name+"/"+via, func(t *testing.T) {
				// Through the pooler, a server connection opened before the
				// change keeps its login's old synchronous_commit until it
				// closes (idle 2 s, pgtest's server_idle_timeout; the reads come
				// further apart, or they would keep it busy): the read
				// tells what a chunk on it commits under.
				require.EventuallyWithT(t, func(t *assert.CollectT) {
					d := read(t, dsn)
					require.Equal(t, step.commit, d.SynchronousCommit)
					require.Equal(t, step.names, d.SynchronousStandbyNames)
					require.Positive(t, d.MaxWALSenders)
					require.False(t, d.InRecovery)
					require.Equal(t, step.synchronous, d.Synchronous())
					require.Equal(t, step.standby, d.Standby())
				}, 20*time.Second, 2500*time.Millisecond)
			})
		}
	}
}

// TestDurability_SharedServer reads the promise from the suite's server
// (through PgBouncer when the suite runs behind it) as the server itself
// tells its sessions' synchronous_commit (pgtest's own server acknowledges
// commits unflushed, synchronous_commit=off, for speed).
func TestDurability_SharedServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	d, err := ledger.NewStore(pgtest.Pool(t, dsn)).Durability(ctx)
	require.NoError(t, err)
	var commit, names string
	require.NoError(t, pgtest.Pool(t, pgtest.Direct(t, dsn)).QueryRow(ctx,
		`SELECT reset_val, current_setting('synchronous_standby_names') FROM pg_settings WHERE name = 'synchronous_commit'`).Scan(&commit, &names))
	require.Equal(t, commit, d.SynchronousCommit)
	require.Equal(t, names, d.SynchronousStandbyNames)
	require.False(t, d.InRecovery)
}

// TestAwaitStandby: on an asynchronous primary, AwaitStandby says whether a
// standby has flushed every commit acknowledged before it was asked: not
// while the standby's WAL is held (it waits its bound, then says so), at
// once when it streams; a login that may not read the standbys' positions
// (no pg_monitor) learns that it cannot know, without waiting; a server
// without standbys has nothing to wait for.
func TestAwaitStandby(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers")
	ctx := context.Background()
	h := pgtest.NewHAPair(t, pgtest.HAOptions{})
	db := h.NewDatabase(t)
	owner := pgtest.Pool(t, h.DSN(db))
	s := ledger.NewStore(owner)

	st, err := s.AwaitStandby(ctx, 10*time.Second, ledger.ServerIdentity{})
	require.NoError(t, err)
	require.Equal(t, 1, st.Streaming)
	require.Equal(t, 1, st.Flushed, "a streaming standby has what the primary committed: %+v", st)

	h.HoldWAL()
	_, err = owner.Exec(ctx, `CREATE TABLE after_the_hiccup (v int); INSERT INTO after_the_hiccup VALUES (1)`)
	require.NoError(t, err)
	start := time.Now()
	st, err = s.AwaitStandby(ctx, 500*time.Millisecond, ledger.ServerIdentity{})
	require.NoError(t, err, "a wait that runs out is no error")
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "it waited its bound")
	require.Equal(t, ledger.Standbys{Position: st.Position, Streaming: 1}, st, "the standby has not flushed the commit")
	require.False(t, st.Settled())

	done := make(chan ledger.Standbys, 1)
	go func() {
		st, _ := s.AwaitStandby(ctx, time.Minute, ledger.ServerIdentity{})
		done <- st
	}()
	time.Sleep(200 * time.Millisecond)
	h.ReleaseWAL()
	select {
	case st = <-done:
		require.Equal(t, 1, st.Flushed, "once the WAL flows the wait ends: %+v", st)
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end once the standby had the WAL")
	}

	mustExec(t, owner, `CREATE ROLE plain_login LOGIN`)
	plain := ledger.NewStore(pgtest.Pool(t, strings.Replace(h.DSN(db), "postgres://postgres@", "postgres://plain_login@", 1)))
	start = time.Now()
	st, err = plain.AwaitStandby(ctx, time.Minute, ledger.ServerIdentity{})
	require.NoError(t, err)
	require.Equal(t, ledger.Standbys{Position: st.Position, Streaming: 1, Hidden: 1}, st)
	require.True(t, st.Settled(), "nothing it could wait for")
	require.Less(t, time.Since(start), 10*time.Second, "it did not wait for what it cannot see")

	// A standby cut off: no walsender, its slot kept where it had flushed.
	// It is no standby less (a failover manager may be about to promote
	// it): every login waits for it, the slot's position being public.
	h.DisconnectStandby()
	_, err = owner.Exec(ctx, `INSERT INTO after_the_hiccup VALUES (2)`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, owner.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication`).Scan(&n))
		return n == 0
	}, 30*time.Second, 20*time.Millisecond, "the primary's walsender ends")
	for _, store := range []*ledger.Store{s, plain} {
		st, err = store.AwaitStandby(ctx, 300*time.Millisecond, ledger.ServerIdentity{})
		require.NoError(t, err)
		require.Equal(t, ledger.Standbys{Position: st.Position, Disconnected: 1}, st, "the slot's standby has not flushed the commit")
		require.False(t, st.Settled(), "a standby cut off may be promoted: wait for it")
	}

	alone := ledger.NewStore(newPool(t))
	st, err = alone.AwaitStandby(ctx, time.Minute, ledger.ServerIdentity{})
	require.NoError(t, err)
	require.Zero(t, st.Streaming)
	require.True(t, st.Settled())
}

// TestAwaitStandbyIgnoresLogicalClients: a logical replication client (a
// CDC connector decoding the ledger's database) has a walsender too, and
// confirms its position when it pleases; it is never promoted, so it is no
// standby to wait for. Here it is stopped (SIGSTOP) with its connection
// open while the standby's WAL is held; and another one has connected and
// not started streaming yet (its slot not active: a client starting, or
// stopped before it asked for its slot, as the stopped one was now and
// then under load, which counted it once as a standby whose position
// could not be read). The primary serves three walsenders, of which one
// standby.
func TestAwaitStandbyIgnoresLogicalClients(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers")
	ctx := context.Background()
	h := pgtest.NewHAPair(t, pgtest.HAOptions{Settings: map[string]string{"wal_level": "logical"}})
	db := h.NewDatabase(t)
	owner := pgtest.Pool(t, h.DSN(db))
	mustExec(t, owner, `SELECT pg_create_logical_replication_slot('cdc', 'test_decoding')`)
	bin, err := pgtest.BinDir()
	require.NoError(t, err)
	cdc := exec.Command(filepath.Join(bin, "pg_recvlogical"), "-d", h.Primary().DSN(db)+" replication=database", "-S", "cdc", "--start", "-f", os.DevNull)
	require.NoError(t, cdc.Start())
	t.Cleanup(func() {
		_ = cdc.Process.Kill()
		_ = cdc.Wait()
	})
	walsenders := func() (n int) {
		require.NoError(t, owner.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication`).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool {
		return walsenders() == 2 && scalar[bool](t, owner, `SELECT active FROM pg_replication_slots WHERE slot_name = 'cdc'`)
	}, 30*time.Second, 20*time.Millisecond, "the standby and the client stream")
	require.NoError(t, cdc.Process.Signal(syscall.SIGSTOP))
	starting, err := pgconn.Connect(ctx, h.Primary().DSN(db)+" replication=database")
	require.NoError(t, err)
	t.Cleanup(func() { _ = starting.Close(context.Background()) })
	require.Equal(t, 3, walsenders(), "the starting client has its walsender")
	h.HoldWAL()
	mustExec(t, owner, `CREATE TABLE after_the_hiccup (v int); INSERT INTO after_the_hiccup VALUES (1)`)
	st, err := ledger.NewStore(owner).AwaitStandby(ctx, 300*time.Millisecond, ledger.ServerIdentity{})
	require.NoError(t, err)
	require.Equal(t, ledger.Standbys{Position: st.Position, Streaming: 1}, st, "one standby, which has not flushed the commit; the logical client is none")
	h.ReleaseWAL()
	st, err = ledger.NewStore(owner).AwaitStandby(ctx, time.Minute, ledger.ServerIdentity{})
	require.NoError(t, err)
	require.Equal(t, ledger.Standbys{Position: st.Position, Streaming: 1, Flushed: 1}, st, "the standby has it; the stopped client's position does not matter")
}

// TestAwaitStandbySeesAFailoverBehindAPooler: behind a pooler a failover
// opens no new session of the ledger's pool (the pooler connects its own to
// the server promoted, the pool's stay open), so the pool's watch never
// sees it. The wait must still not take the promoted server's standbys
// (none yet) for the ones of the server the proof was read on, which may
// have lost it.
func TestAwaitStandbySeesAFailoverBehindAPooler(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers and its own PgBouncer")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, _, b, pool := pooledHAPair(ctx, t)
	s := ledger.NewStore(pool)
	on, err := s.Server(ctx)
	require.NoError(t, err)
	require.True(t, on.Known(), "%s", on)
	st, err := s.AwaitStandby(ctx, 10*time.Second, on)
	require.NoError(t, err)
	require.Equal(t, 1, st.Flushed, "the standby streams: %+v", st)

	h.HoldWAL()
	_, err = pool.Exec(ctx, `CREATE TABLE lost_in_the_failover (v int)`)
	require.NoError(t, err)
	type waited struct {
		st  ledger.Standbys
		err error
	}
	done := make(chan waited, 1)
	go func() {
		st, err := s.AwaitStandby(ctx, time.Minute, on)
		done <- waited{st, err}
	}()
	time.Sleep(200 * time.Millisecond) // the wait polls the primary, whose standby lacks the commit
	require.NoError(t, h.CrashPrimary(ctx))
	require.NoError(t, h.Promote(ctx))
	require.NoError(t, b.Retarget(ctx, h.Standby()))
	w := <-done
	require.ErrorIs(t, w.err, ledger.ErrServerChanged, "the wait read the promoted server: %+v", w.st)
	require.Zero(t, s.ServerChanges().Changes, "no session of the pool reached the promoted server: the wait's own reads told")

	// A wait that begins on the promoted server is told at its first read.
	_, err = s.AwaitStandby(ctx, 5*time.Second, on)
	require.ErrorIs(t, err, ledger.ErrServerChanged)
	now, err := s.Server(ctx)
	require.NoError(t, err)
	st, err = s.AwaitStandby(ctx, 5*time.Second, now)
	require.NoError(t, err, "on the server it was asked about")
	require.True(t, st.Settled(), "the promoted server has no standby to wait for: %+v", st)
}

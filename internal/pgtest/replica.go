package pgtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/testtier"
)

// ReplicationUser is the role the standby streams WAL as (REPLICATION
// LOGIN; initdb's trust rules admit its replication connections on the
// unix socket and 127.0.0.1).
const ReplicationUser = "pgtest_replicator"

// StandbyName is the standby's application_name: the name
// synchronous_standby_names gives it, and pg_stat_replication shows.
const StandbyName = "pgtest_standby"

// HAOptions configures an HA pair.
type HAOptions struct {
	// Sync makes the primary acknowledge a commit only once the standby has
	// flushed it (synchronous_standby_names names StandbyName,
	// synchronous_commit = on); otherwise replication is asynchronous, the
	// default of most HA setups: an acknowledged commit may still be lost.
	Sync bool
	// Settings are extra server settings of both servers (see
	// Options.Settings).
	Settings map[string]string
}

// HAPair is a primary and a hot standby streaming from it (made with
// pg_basebackup -R), each a Cluster of this process on its own loopback
// port and socket directory, with the controls of a failover: a WAL
// hiccup (HoldWAL), a crash of the primary, a promotion, a planned
// switchover. DSN names both servers, so that a client reaches whichever
// accepts writes.
type HAPair struct {
	sync bool
	// nodes[0] starts as the primary, nodes[1] as its standby.
	nodes [2]*Cluster
	mu    sync.Mutex
	// primary is the index in nodes of the server that accepts writes.
	primary int
	// link is the standby's way to the primary (its primary_conninfo).
	link *Proxy
	gate walGate
}

// NewHAPair starts a primary and a streaming standby for this test, and
// stops both (their files removed) when it ends. It skips under -short.
func NewHAPair(t testing.TB, opts HAOptions) *HAPair {
	t.Helper()
	testtier.Needs(t, "PostgreSQL (a primary and a streaming standby)")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := startHAPair(ctx, t, opts)
	if err != nil {
		t.Fatalf("pgtest: no HA pair: %v", err)
	}
	return h
}

func startHAPair(ctx context.Context, t testing.TB, opts HAOptions) (_ *HAPair, err error) {
	h := &HAPair{sync: opts.Sync}
	h.gate.cut = make(chan struct{})
	t.Cleanup(func() {
		if err := h.stop(); err != nil {
			t.Errorf("pgtest: stopping the HA pair: %v", err)
		}
	})
	settings := map[string]string{
		"wal_level":       "replica",
		"max_wal_senders": "4",
		"hot_standby":     "on",
		// A commit is acknowledged once flushed locally (and, with Sync,
		// on the standby): StartCluster's fast default (off) would make
		// even a synchronous standby's commits losable.
		"synchronous_commit": "on",
		// Two servers per test: smaller than the shared cluster's.
		"shared_buffers":  "32MB",
		"max_connections": "100",
	}
	maps.Copy(settings, opts.Settings)
	ports := [2]int{}
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	if h.nodes[0], err = StartCluster(ctx, Options{TCPPort: ports[0], Settings: settings}); err != nil {
		return nil, fmt.Errorf("starting the primary: %w", err)
	}
	primary := h.nodes[0]
	if err := execSQL(ctx, primary.DSN("postgres"), "CREATE ROLE "+ReplicationUser+" REPLICATION LOGIN"); err != nil {
		return nil, err
	}
	// The standby streams through a proxy of ours: pausing it holds the
	// WAL in flight exactly (a network hiccup), where SIGSTOP of the
	// walreceiver would let it read what the kernel had buffered when it
	// resumes, and would stall a promotion (its shutdown waits on it).
	h.link = NewProxy(t, SocketOf(primary.socketDir, uint16(primary.port)), ProxyOptions{
		ToClient: h.gate.hold, ToServer: h.gate.pass,
	})
	if h.nodes[1], err = startStandby(ctx, primary, h.link.Addr.Port, ports[1], settings); err != nil {
		return nil, err
	}
	if err := h.waitStreaming(ctx, "streaming", "async"); err != nil {
		return nil, err
	}
	if opts.Sync {
		// Named once the standby streams: before, every commit would wait.
		if err := execSQL(ctx, primary.DSN("postgres"), fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (%s)'", StandbyName)); err != nil {
			return nil, err
		}
		if err := execSQL(ctx, primary.DSN("postgres"), "SELECT pg_reload_conf()"); err != nil {
			return nil, err
		}
		if err := h.waitStreaming(ctx, "streaming", "sync"); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// startStandby copies primary with pg_basebackup -R through the link (so
// that its primary_conninfo names the link) and starts it as a hot standby
// on port.
func startStandby(ctx context.Context, primary *Cluster, linkPort, port int, settings map[string]string) (_ *Cluster, err error) {
	dir, err := os.MkdirTemp("", "pgtest-standby-")
	if err != nil {
		return nil, fmt.Errorf("creating standby directory: %w", err)
	}
	c := &Cluster{dir: dir, socketDir: filepath.Join(dir, "sock"), port: port, logPath: filepath.Join(dir, "postgres.log"),
		bin: primary.bin, cred: primary.cred}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	if err := os.Mkdir(c.socketDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating standby socket directory: %w", err)
	}
	if c.cred != nil {
		for _, p := range []string{dir, c.socketDir} {
			if err := os.Chown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return nil, fmt.Errorf("handing %s to the server user: %w", p, err)
			}
		}
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s sslmode=disable", linkPort, ReplicationUser, StandbyName)
	// -C -S: a replication slot keeps the primary's WAL until the standby
	// has it, however long a test holds it back.
	backup := exec.CommandContext(ctx, filepath.Join(c.bin, "pg_basebackup"), "-D", c.dataDir(), "-d", conninfo,
		"-R", "-X", "stream", "-c", "fast", "--no-sync", "-C", "-S", StandbyName)
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := backup.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("running pg_basebackup: %w\n%s", err, out)
	}
	c.args = serverArgs(c.dataDir(), c.socketDir, port, Options{TCPPort: port, Settings: settings})
	if err := c.start(ctx); err != nil {
		return nil, fmt.Errorf("starting the standby: %w", err)
	}
	return c, nil
}

// walGate is the link's switch: hold pauses the WAL from the primary,
// cut drops the link for good (with what it held).
type walGate struct {
	mu   sync.Mutex
	held chan struct{} // closed by ReleaseWAL; nil while WAL flows
	cut  chan struct{} // closed once the link is cut
	once sync.Once
}

// hold is the link's Hook from the primary: it blocks while WAL is held.
func (g *walGate) hold(c *ProxyConn, b []byte) bool {
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-g.cut:
			return false
		}
	}
	return g.pass(c, b)
}

// pass is the link's Hook to the primary: it forwards until the link is cut.
func (g *walGate) pass(*ProxyConn, []byte) bool {
	select {
	case <-g.cut:
		return false
	default:
		return true
	}
}

func (g *walGate) cutLink() { g.once.Do(func() { close(g.cut) }) }

// HoldWAL stops the standby receiving WAL (a network hiccup between the
// two): the primary goes on committing, its WAL held on the way, until
// ReleaseWAL, or lost with it if the primary crashes first. With Sync, the
// primary's commits wait meanwhile.
func (h *HAPair) HoldWAL() {
	h.gate.mu.Lock()
	defer h.gate.mu.Unlock()
	if h.gate.held == nil {
		h.gate.held = make(chan struct{})
	}
}

// ReleaseWAL lets the WAL held by HoldWAL through.
func (h *HAPair) ReleaseWAL() {
	h.gate.mu.Lock()
	defer h.gate.mu.Unlock()
	if h.gate.held != nil {
		close(h.gate.held)
		h.gate.held = nil
	}
}

// Primary is the server that accepts writes: the first one until a
// promotion, the promoted standby after it.
func (h *HAPair) Primary() *Cluster {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nodes[h.primary]
}

// Standby is the server started as the standby (promoted or not).
func (h *HAPair) Standby() *Cluster { return h.nodes[1] }

// DSN is the connection string of database dbname on the pair as the
// superuser, over loopback TCP: postgres://postgres@127.0.0.1:P1,
// 127.0.0.1:P2/dbname?target_session_attrs=read-write, so that a client
// connects to whichever server accepts writes.
func (h *HAPair) DSN(dbname string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		superuser, h.nodes[0].port, h.nodes[1].port, dbname)
}

// NewDatabase creates a migrated database on the primary, its effects
// sandboxed as NewDatabase's are (EffectRole), and waits until the standby
// has it. It returns the database's name (DSN gives the pair's connection
// string to it).
func (h *HAPair) NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("%s_ha_%d", prefix, counter.Add(1))
	primary := h.Primary()
	if err := execSQL(ctx, primary.DSN("postgres"), "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		t.Fatalf("pgtest: creating the HA database: %v", err)
	}
	pool, err := pgxpool.New(ctx, primary.DSN(name))
	if err != nil {
		t.Fatalf("pgtest: opening pool: %v", err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool); err != nil {
		t.Fatalf("pgtest: migrating the HA database: %v", err)
	}
	if err := sandboxEffects(ctx, pool); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := h.WaitReplayed(ctx); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return name
}

// WaitReplayed waits until the standby has replayed all the WAL the primary
// had written when it was called.
func (h *HAPair) WaitReplayed(ctx context.Context) error {
	var lsn string
	if err := queryRow(ctx, h.Primary().DSN("postgres"), "SELECT pg_current_wal_lsn()::text", &lsn); err != nil {
		return fmt.Errorf("reading the primary's WAL position: %w", err)
	}
	return h.waitStandby(ctx, "has replayed "+lsn, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn)
}

// DisconnectStandby cuts the standby off the primary for good, as a
// standby whose host went away: the primary's walsender ends at its next
// message, and its replication slot stays, inactive, where the standby had
// flushed. CrashPrimary and Promote work as after HoldWAL.
func (h *HAPair) DisconnectStandby() { h.gate.cutLink() }

// CrashPrimary kills the primary as a host crash would: SIGKILL to its
// postmaster (by the PID in postmaster.pid), then to every process it had
// started, so that no orphaned backend answers a client afterwards. The
// link to the standby is cut with it: WAL held by HoldWAL is lost.
func (h *HAPair) CrashPrimary(ctx context.Context) error {
	c := h.Primary()
	pid, err := postmasterPID(c.dataDir())
	if err != nil {
		return err
	}
	children, err := childrenOf(pid)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing the primary's postmaster (pid %d): %w", pid, err)
	}
	for _, child := range children {
		_ = syscall.Kill(child, syscall.SIGKILL) // it may have exited already
	}
	h.gate.cutLink()
	h.link.Close()
	select {
	case <-c.exited:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the primary's postmaster to exit: %w", context.Cause(ctx))
	}
	return wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, child := range children {
			if alive(child) {
				return false, nil
			}
		}
		return true, nil
	})
}

// Promote promotes the standby (pg_ctl promote) and waits until it accepts
// writes (pg_is_in_recovery() is false); it is then the Primary.
func (h *HAPair) Promote(ctx context.Context) error {
	s := h.Standby()
	promote := exec.CommandContext(ctx, filepath.Join(s.bin, "pg_ctl"), "promote", "-D", s.dataDir(), "-w", "-t", "60")
	promote.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := promote.CombinedOutput(); err != nil {
		return fmt.Errorf("running pg_ctl promote: %w\n%s", err, out)
	}
	if err := h.waitStandby(ctx, "accepts writes", "SELECT NOT pg_is_in_recovery()"); err != nil {
		return err
	}
	h.mu.Lock()
	h.primary = 1
	h.mu.Unlock()
	return nil
}

// Switchover is a planned failover: WAL released, the primary stopped
// cleanly (fast shutdown: its sessions are disconnected, its shutdown
// checkpoint streamed to the standby), the standby waited for until it has
// replayed that checkpoint, then promoted. Nothing committed is lost.
func (h *HAPair) Switchover(ctx context.Context) error {
	h.ReleaseWAL()
	old := h.Primary()
	if err := old.shutdown(); err != nil {
		return fmt.Errorf("stopping the primary: %w", err)
	}
	lsn, err := checkpointLSN(ctx, old)
	if err != nil {
		return err
	}
	if err := h.waitStandby(ctx, "has replayed the primary's shutdown checkpoint "+lsn, "SELECT pg_last_wal_replay_lsn() > $1::pg_lsn", lsn); err != nil {
		return err
	}
	h.gate.cutLink()
	h.link.Close()
	return h.Promote(ctx)
}

// waitStreaming waits until the primary sees the standby streaming in
// state with sync_state.
func (h *HAPair) waitStreaming(ctx context.Context, state, syncState string) error {
	dsn := h.nodes[0].DSN("postgres")
	return poll(ctx, "the standby "+state+" ("+syncState+")", func() (bool, error) {
		var ok bool
		err := queryRow(ctx, dsn, `SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE application_name = $1 AND state = $2 AND sync_state = $3)`,
			&ok, StandbyName, state, syncState)
		return ok, err
	})
}

// waitStandby polls sql (one boolean) on the standby until it is true.
func (h *HAPair) waitStandby(ctx context.Context, what, sql string, args ...any) error {
	dsn := h.Standby().DSN("postgres")
	return poll(ctx, "the standby "+what, func() (bool, error) {
		var ok bool
		err := queryRow(ctx, dsn, sql, &ok, args...)
		return ok, err
	})
}

// poll calls cond every 20 ms until it is true, within a minute; its
// errors are retried (a server starting or promoting refuses a while).
func poll(ctx context.Context, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok && err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting until %s: %w", what, errors.Join(err, last))
	}
	return nil
}

func queryRow(ctx context.Context, dsn, sql string, dst any, args ...any) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dst)
}

// stop cuts the link and stops both servers: the link first, so that a
// primary's shutdown does not wait on WAL the link holds.
func (h *HAPair) stop() error {
	h.gate.cutLink()
	if h.link != nil {
		h.link.Close()
	}
	var errs []error
	for i := len(h.nodes) - 1; i >= 0; i-- {
		if h.nodes[i] != nil {
			if err := h.nodes[i].Stop(); err != nil {
				errs = append(errs, fmt.Errorf("server %d: %w", i, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

// postmasterPID reads the postmaster's PID from the first line of
// postmaster.pid in data.
func postmasterPID(data string) (int, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("reading postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("reading postmaster.pid: %w", err)
	}
	return pid, nil
}

// childrenOf lists the processes whose parent is pid (from /proc).
func childrenOf(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(child); ok && ppid == pid {
			out = append(out, child)
		}
	}
	return out, nil
}

// alive reports whether pid is a process that has not exited (a zombie
// waiting to be reaped has).
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != "Z" && state != "X"
}

// procStat reads a process's parent and state from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, "", false
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(fields[1])
	return ppid, fields[0], err == nil
}

// checkpointLSN is the latest checkpoint's location in c's control file
// (pg_controldata), c stopped.
func checkpointLSN(ctx context.Context, c *Cluster) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "pg_controldata"), "-D", c.dataDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("running pg_controldata: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Latest checkpoint location:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("pg_controldata names no latest checkpoint location:\n%s", out)
}

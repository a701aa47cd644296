// Package pgtest gives tests a real PostgreSQL: one throwaway cluster per test
// binary, started from the server binaries of the machine (Debian's
// /usr/lib/postgresql/*/bin) on a unix socket in a temporary directory, and a
// fresh database per test, cloned from a migrated template.
//
// Bouncer puts a real PgBouncer (pool_mode = transaction, its usual
// ignore_startup_parameters = extra_float_digits) in front of the cluster,
// on loopback; ThroughBouncer turns a test database's DSN into one through it.
//
// Set TEST_DATABASE_URL to use an existing server instead (its role needs
// CREATEDB); every test database is then dropped when its test ends.
//
// Under go test -short every entry point that needs the server (NewDatabase,
// NewPool, Server, Bouncer, ...) skips its test (testtier.Needs); without
// -short a missing server binary fails the test, naming what to install.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		pool := pgtest.NewPool(t) // migrated, empty, this test's own
//	}
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Options for a cluster.
type Options struct {
	// Durable keeps PostgreSQL's default durability (fsync, synchronous
	// commit, full page writes). Tests run without it, for speed; benchmarks
	// must set it.
	Durable bool
	// TCPPort, when non-zero, also listens on 127.0.0.1:TCPPort (for
	// processes that cannot reach the unix socket).
	TCPPort int
	// Settings are extra server settings (name: value), e.g. "autovacuum":
	// "off". They are applied last and override the harness's own.
	Settings map[string]string
}

// Cluster is a running throwaway PostgreSQL server owned by this process.
type Cluster struct {
	dir       string // temp root: data/ and sock/
	socketDir string
	port      int
	args      []string
	bin       string
	cred      *syscall.Credential
	cmd       *exec.Cmd
	exited    chan struct{}
	logPath   string
}

const superuser = "postgres"

// BinDir finds PostgreSQL's server binaries: $PG_BINDIR, else the newest
// /usr/lib/postgresql/<version>/bin, else the directory of initdb on PATH.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("PG_BINDIR=%s holds no PostgreSQL server binaries (unset it to look under /usr/lib/postgresql/*/bin and on PATH): %w", d, err)
		}
		return d, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	if len(matches) > 0 {
		return filepath.Dir(matches[0]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not found under /usr/lib/postgresql/*/bin or on PATH: " +
		"apt-get install -y postgresql, set PG_BINDIR to their directory, or set TEST_DATABASE_URL to a server (go test -short skips these tests)")
}

func versionOf(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

// StartCluster initialises and starts a new cluster in a temporary directory.
// As root, the server runs as the unprivileged user "postgres" (or "nobody"),
// since initdb refuses to run as root.
func StartCluster(ctx context.Context, opts Options) (_ *Cluster, err error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("creating cluster directory: %w", err)
	}
	c := &Cluster{dir: dir, socketDir: filepath.Join(dir, "sock"), port: 5432, logPath: filepath.Join(dir, "postgres.log")}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	if err := os.Mkdir(c.socketDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		for _, p := range []string{dir, c.socketDir} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, fmt.Errorf("handing %s to the server user: %w", p, err)
			}
		}
	}

	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", data, "-U", superuser, "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("running initdb: %w\n%s", err, out)
	}
	if err := requirePassword(filepath.Join(data, "pg_hba.conf"), PasswordUser); err != nil {
		return nil, err
	}

	if opts.TCPPort != 0 {
		c.port = opts.TCPPort
	}
	c.args = serverArgs(data, c.socketDir, c.port, opts)
	c.bin, c.cred = bin, cred
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// serverArgs are the postmaster's arguments for data directory data,
// listening on socketDir (and on 127.0.0.1 when opts.TCPPort is set) at port.
func serverArgs(data, socketDir string, port int, opts Options) []string {
	args := []string{"-D", data,
		"-c", "unix_socket_directories=" + socketDir,
		"-c", "port=" + strconv.Itoa(port),
		"-c", "max_connections=300",
		"-c", "shared_buffers=128MB",
	}
	if opts.TCPPort != 0 {
		args = append(args, "-c", "listen_addresses=127.0.0.1")
	} else {
		args = append(args, "-c", "listen_addresses=")
	}
	if !opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for _, name := range slices.Sorted(maps.Keys(opts.Settings)) {
		args = append(args, "-c", name+"="+opts.Settings[name])
	}
	return args
}

// start runs the postmaster on the initialised data directory and waits until
// it accepts connections.
func (c *Cluster) start(ctx context.Context) error {
	logFile, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("opening server log: %w", err)
	}
	defer logFile.Close()
	c.cmd = exec.Command(filepath.Join(c.bin, "postgres"), c.args...)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	// Pdeathsig: if this test binary dies without stopping the server, the
	// kernel stops it (SIGQUIT: immediate shutdown), so no server outlives it.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT}
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	exited := make(chan struct{})
	c.exited = exited
	cmd := c.cmd
	go func() { _ = cmd.Wait(); close(exited) }()
	return c.waitReady(ctx, 60*time.Second)
}

// Restart stops the server (fast shutdown: every session is disconnected)
// and starts it again on the same data, as a database outage would.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.shutdown(); err != nil {
		return err
	}
	return c.start(ctx)
}

// PasswordUser is the one role of a cluster that must give its password
// (scram-sha-256); the cluster trusts every other local connection. It lets
// tests see a real rejected password (see PasswordDSN).
const PasswordUser = "pgtest_password"

// requirePassword puts rules that ask user for a password before initdb's
// "trust" ones (the first matching rule applies).
func requirePassword(hba, user string) error {
	b, err := os.ReadFile(hba)
	if err != nil {
		return fmt.Errorf("reading pg_hba.conf: %w", err)
	}
	rules := fmt.Sprintf("local all %[1]s scram-sha-256\nhost all %[1]s 127.0.0.1/32 scram-sha-256\n", user)
	// WriteFile keeps the existing file's owner (the server user, as root).
	if err := os.WriteFile(hba, append([]byte(rules), b...), 0o600); err != nil {
		return fmt.Errorf("writing pg_hba.conf: %w", err)
	}
	return nil
}

func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root, but neither user postgres nor nobody exists to run the server")
}

func (c *Cluster) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		conn, err := pgx.Connect(ctx, c.DSN("postgres"))
		if err == nil {
			return true, conn.Close(ctx)
		}
		last = err
		select {
		case <-c.exited:
			return false, fmt.Errorf("postgres exited during start-up:\n%s", c.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("postgres not ready after %s: %w\n%s", timeout, err, c.logTail())
		}
		return false, nil
	})
	if ctx.Err() != nil && wait.Interrupted(err) {
		return fmt.Errorf("postgres not ready: %w", errors.Join(context.Cause(ctx), last))
	}
	return err
}

func (c *Cluster) logTail() string {
	b, _ := os.ReadFile(c.logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// DSN returns the connection string of database dbname as the superuser.
func (c *Cluster) DSN(dbname string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", c.socketDir, c.port, superuser, dbname)
}

// PID is the postmaster's process ID.
func (c *Cluster) PID() int { return c.cmd.Process.Pid }

// Stop shuts the server down (fast shutdown, by PID) and removes its files.
func (c *Cluster) Stop() error {
	err := c.shutdown()
	if rmErr := os.RemoveAll(c.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("removing cluster directory: %w", rmErr))
	}
	return err
}

// shutdown stops the postmaster by its PID: SIGINT (fast shutdown), then
// SIGKILL after 30 s.
func (c *Cluster) shutdown() error {
	if c.cmd == nil || c.cmd.Process == nil {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
		return nil
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return errors.New("postgres did not stop within 30s of SIGINT; killed")
	}
}

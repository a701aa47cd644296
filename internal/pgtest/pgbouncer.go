package pgtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/runledger/runledger/internal/testtier"
)

// EnvPgBouncer names the variable that points the tests at another pgbouncer
// binary than Debian's.
const EnvPgBouncer = "PGBOUNCER"

// PgBouncer is a real PgBouncer, owned by this process, in front of the
// test cluster, with the settings production poolers usually have:
// pool_mode = transaction and ignore_startup_parameters =
// extra_float_digits. It listens on loopback TCP only.
type PgBouncer struct {
	dir      string
	port     int
	password string // the superuser's, under BouncerPasswords
	cmd      *exec.Cmd
	exited   chan struct{}
	logPath  string
	// databases is the [databases] section's line's name (Retarget).
	databases string
	cred      *syscall.Credential
	paused    bool
}

var (
	bouncerOnce sync.Once
	bouncer     *PgBouncer
	bouncerErr  error
)

// Bouncer returns this binary's PgBouncer in front of its cluster, starting
// both if needed (it is stopped by Main). It skips the test when
// TEST_DATABASE_URL points at a server pgtest does not own, and fails it
// when pgbouncer is not installed.
func Bouncer(t testing.TB) *PgBouncer {
	t.Helper()
	testtier.Needs(t, "PostgreSQL and PgBouncer")
	c := Server(t)
	bouncerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		bouncer, bouncerErr = StartPgBouncer(ctx, c)
	})
	if bouncerErr != nil {
		t.Fatalf("pgtest: no PgBouncer: %v", bouncerErr)
	}
	return bouncer
}

// ThroughBouncer returns dsn (keyword/value, as NewDatabase returns) going
// through this binary's PgBouncer instead of the server's socket.
func ThroughBouncer(t testing.TB, dsn string) string {
	t.Helper()
	b := Bouncer(t)
	fields := strings.Fields(dsn)
	out := fields[:0]
	for _, f := range fields {
		if !strings.HasPrefix(f, "host=") && !strings.HasPrefix(f, "port=") {
			out = append(out, f)
		}
	}
	return strings.Join(append(out, "host=127.0.0.1", "port="+strconv.Itoa(b.port)), " ")
}

// BouncerOption changes what StartPgBouncer configures.
type BouncerOption func(*bouncerConfig)

type bouncerConfig struct {
	authType string            // auth_type
	users    map[string]string // auth_file's users and their passwords, in the clear
}

// BouncerPasswords makes the PgBouncer check passwords itself, as production
// poolers do: auth_type (md5, scram-sha-256) against users, which must hold
// the cluster's superuser ("postgres": readiness is checked as it), and only
// the database postgres behind it (an unknown database is the pooler's
// refusal, not the server's).
func BouncerPasswords(authType string, users map[string]string) BouncerOption {
	return func(c *bouncerConfig) { c.authType, c.users = authType, users }
}

// StartPgBouncer starts a PgBouncer in front of cluster c, on a free
// loopback port. Every role of c may log in through it without a password
// (auth_type trust), unless BouncerPasswords says otherwise.
func StartPgBouncer(ctx context.Context, c *Cluster, opts ...BouncerOption) (_ *PgBouncer, err error) {
	cfg := bouncerConfig{authType: "trust"}
	for _, o := range opts {
		o(&cfg)
	}
	bin := os.Getenv(EnvPgBouncer)
	if bin == "" {
		bin = "/usr/sbin/pgbouncer"
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("pgbouncer not found (apt-get install -y pgbouncer, or set %s): %w", EnvPgBouncer, err)
	}
	dir, err := os.MkdirTemp("", "pgtest-bouncer-")
	if err != nil {
		return nil, fmt.Errorf("creating pgbouncer directory: %w", err)
	}
	b := &PgBouncer{dir: dir, logPath: filepath.Join(dir, "pgbouncer.log"), cred: c.cred}
	defer func() {
		if err != nil {
			_ = b.Stop()
		}
	}()
	if b.port, err = freePort(); err != nil {
		return nil, err
	}
	// As root, pgbouncer drops to the server's user (it refuses to run as
	// root), who must read its files.
	userLine := ""
	if c.cred != nil {
		userLine = "user = postgres\n"
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return nil, fmt.Errorf("handing %s to the server user: %w", dir, err)
		}
	}
	databases := "*"
	users := fmt.Sprintf("%q \"\"\n", superuser)
	if cfg.users != nil {
		var ok bool
		if b.password, ok = cfg.users[superuser]; !ok {
			return nil, fmt.Errorf("pgtest: BouncerPasswords without a password for %s, as whom readiness is checked", superuser)
		}
		databases, users = "postgres", ""
		for _, u := range slices.Sorted(maps.Keys(cfg.users)) {
			users += fmt.Sprintf("%q %q\n", u, cfg.users[u])
		}
	}
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = %s
auth_file = %s
auth_user = %s
admin_users = %s
pool_mode = transaction
ignore_startup_parameters = extra_float_digits
max_client_conn = 2000
default_pool_size = 50
max_db_connections = 0
server_lifetime = 3600
; idle server connections go within 2 s, not 10 minutes: the cluster's 300
; connections are not filled by the pools of the tests still running
server_idle_timeout = 2
logfile = %s
log_connections = 0
log_disconnections = 0
%s`, databases, c.socketDir, c.port, b.port, cfg.authType, filepath.Join(dir, "userlist.txt"), superuser, superuser, b.logPath, userLine)
	files := map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  users,
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", name, err)
		}
		if c.cred != nil {
			if err := os.Chown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				return nil, fmt.Errorf("handing %s to the server user: %w", p, err)
			}
		}
	}
	b.databases = databases
	b.cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	// Its own log file has everything; stderr only says it started.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting pgbouncer: %w", err)
	}
	b.exited = make(chan struct{})
	cmd, exited := b.cmd, b.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	return b, b.waitReady(ctx, 30*time.Second)
}

// freePort finds a loopback TCP port nobody listens on.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (b *PgBouncer) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	dsn := b.SuperuserDSN("postgres")
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		conn, err := pgconn.Connect(ctx, dsn)
		if err == nil {
			return true, conn.Close(ctx)
		}
		select {
		case <-b.exited:
			return false, fmt.Errorf("pgbouncer exited during start-up:\n%s", b.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("pgbouncer not ready after %s: %w\n%s", timeout, err, b.logTail())
		}
		return false, nil
	})
}

func (b *PgBouncer) logTail() string {
	out, _ := os.ReadFile(b.logPath)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// Pause holds its clients' next transactions (PAUSE, on its admin
// console: it waits for those in flight, then closes its connections to
// the server), as a failover manager's hook does before a failover, so
// that no client sees an error of it; Retarget resumes them.
func (b *PgBouncer) Pause(ctx context.Context) error {
	if err := b.admin(ctx, "PAUSE"); err != nil {
		return err
	}
	b.paused = true
	return nil
}

// SuperuserDSN is the connection string of database dbname through it as
// the cluster's superuser (the admin console's is "pgbouncer").
func (b *PgBouncer) SuperuserDSN(dbname string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable password='%s'", b.port, superuser, dbname, b.password)
}

// admin runs command on its admin console.
func (b *PgBouncer) admin(ctx context.Context, command string) error {
	conn, err := pgconn.Connect(ctx, b.SuperuserDSN("pgbouncer"))
	if err != nil {
		return fmt.Errorf("connecting to pgbouncer's admin console: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, command).ReadAll(); err != nil {
		return fmt.Errorf("pgbouncer %s: %w", command, err)
	}
	return nil
}

// Retarget points it at cluster c instead, as an operator, or a virtual
// address or DNS name moved by a failover manager, does after a failover:
// its configuration rewritten and reloaded (RELOAD), its clients resumed
// if paused (Pause). Its clients' connections stay open; their next
// transactions reach c. It returns once a new connection through it
// reaches c.
func (b *PgBouncer) Retarget(ctx context.Context, c *Cluster) error {
	ini := filepath.Join(b.dir, "pgbouncer.ini")
	raw, err := os.ReadFile(ini)
	if err != nil {
		return fmt.Errorf("reading pgbouncer.ini: %w", err)
	}
	lines := strings.Split(string(raw), "\n")
	prefix := b.databases + " = host="
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
	if i < 0 {
		return errors.New("pgbouncer.ini has no line of its databases")
	}
	lines[i] = fmt.Sprintf("%s%s port=%d", prefix, c.socketDir, c.port)
	if err := os.WriteFile(ini, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		return fmt.Errorf("writing pgbouncer.ini: %w", err)
	}
	if b.cred != nil {
		if err := os.Chown(ini, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
			return fmt.Errorf("handing %s to the server user: %w", ini, err)
		}
	}
	if err := b.admin(ctx, "RELOAD"); err != nil {
		return err
	}
	if b.paused {
		if err := b.admin(ctx, "RESUME"); err != nil {
			return err
		}
		b.paused = false
	}
	dsn := b.SuperuserDSN("postgres") + " default_query_exec_mode=simple_protocol"
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var port string
		err := queryRow(ctx, dsn, "SELECT current_setting('port')", &port)
		return err == nil && port == strconv.Itoa(c.port), nil
	})
}

// Port is the loopback port it listens on.
func (b *PgBouncer) Port() int { return b.port }

// PID is its process ID.
func (b *PgBouncer) PID() int { return b.cmd.Process.Pid }

// Stop stops it by its PID (SIGTERM: immediate shutdown, then SIGKILL after
// 10 s) and removes its files.
func (b *PgBouncer) Stop() error {
	var err error
	if b.cmd != nil && b.cmd.Process != nil {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
			err = errors.New("pgbouncer did not stop within 10s of SIGTERM; killed")
		}
	}
	if rmErr := os.RemoveAll(b.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("removing pgbouncer directory: %w", rmErr))
	}
	return err
}

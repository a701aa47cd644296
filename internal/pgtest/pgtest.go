package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/testtier"
)

// EnvURL names the variable that points the tests at an existing server.
const EnvURL = "TEST_DATABASE_URL"

var (
	mainOpts Options
	once     sync.Once
	server   *Cluster // nil with TEST_DATABASE_URL
	adminDSN string   // maintenance database of the server in use
	template string   // migrated template database
	setupErr error
	prefix   = fmt.Sprintf("rltest_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	counter  atomic.Int64
)

// Main runs the test binary's tests and stops the cluster afterwards (the
// cluster starts lazily, at the first database a test asks for). Call it from
// TestMain: func TestMain(m *testing.M) { pgtest.Main(m) }.
func Main(m *testing.M, opts ...func(*Options)) {
	os.Exit(MainWith(m, opts, nil))
}

// MainWith is Main for a binary that starts more than PostgreSQL: it runs
// the tests, then calls Stop and each of stops (say s3test.Stop), and
// returns the exit code (1 if a stop failed) instead of exiting.
func MainWith(m *testing.M, opts []func(*Options), stops []func() error) int {
	for _, o := range opts {
		o(&mainOpts)
	}
	code := m.Run()
	for _, stop := range append([]func() error{Stop}, stops...) {
		if err := stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Stop stops what this process started (PgBouncer, the cluster, whose
// files go with it) or drops its template database on a TEST_DATABASE_URL
// server. A TestMain that is not Main's calls it after m.Run: a cluster
// left running is killed when the test binary exits, and its files stay.
func Stop() error {
	var errs []error
	if bouncer != nil {
		if err := bouncer.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping pgbouncer: %w", err))
		}
	}
	if server != nil {
		if err := server.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping cluster: %w", err))
		}
	} else if template != "" {
		dropDatabase(template)
	}
	return errors.Join(errs...)
}

// Durable starts the cluster with PostgreSQL's default durability. For
// benchmarks: numbers measured with fsync off mean nothing.
func Durable(o *Options) { o.Durable = true }

// Setting sets one server setting of the cluster (see Options.Settings). It
// has no effect on a server given by TEST_DATABASE_URL.
func Setting(name, value string) func(*Options) {
	return func(o *Options) {
		if o.Settings == nil {
			o.Settings = map[string]string{}
		}
		o.Settings[name] = value
	}
}

func setup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if u := os.Getenv(EnvURL); u != "" {
		adminDSN = u
	} else {
		if server, setupErr = StartCluster(ctx, mainOpts); setupErr != nil {
			return
		}
		adminDSN = server.DSN("postgres")
	}
	template = prefix + "_template"
	if setupErr = execSQL(ctx, adminDSN, "CREATE DATABASE "+template); setupErr != nil {
		return
	}
	pool, err := pgxpool.New(ctx, withDB(adminDSN, template))
	if err != nil {
		setupErr = err
		return
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool); err != nil {
		setupErr = fmt.Errorf("migrating template database: %w", err)
		return
	}
	if setupErr = sandboxEffects(ctx, pool); setupErr != nil {
		return
	}
	if server != nil {
		setupErr = execSQL(ctx, adminDSN, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", PasswordUser, PasswordUserPassword))
	}
}

// EffectRole is the role the test databases' SQL effects run as (`runledger
// migrate --effect-role`): it may use and create in schema public, and every
// table, sequence and function the tests' owner creates there.
const EffectRole = "runledger_effect"

// sandboxEffects gives the template's effect sandbox to EffectRole (created
// once per server; a shared server may have it already) with the default
// privileges of the tests' tables, which CREATE DATABASE ... TEMPLATE copies.
func sandboxEffects(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `DO $$ BEGIN CREATE ROLE `+EffectRole+` NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`); err != nil {
		return fmt.Errorf("creating role %s: %w", EffectRole, err)
	}
	if err := ledger.SetEffectRole(ctx, pool, EffectRole); err != nil {
		return fmt.Errorf("sandboxing the template's effects: %w", err)
	}
	_, err := pool.Exec(ctx, `GRANT USAGE, CREATE ON SCHEMA public TO `+EffectRole+`;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO `+EffectRole+`;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON SEQUENCES TO `+EffectRole)
	if err != nil {
		return fmt.Errorf("granting %s the tests' tables: %w", EffectRole, err)
	}
	return nil
}

// PasswordUserPassword is PasswordUser's password.
const PasswordUserPassword = "pgtest-right-password"

// PasswordDSN returns dsn (keyword/value, as NewDatabase returns) with user
// PasswordUser giving password: the server accepts the connection only when
// password is PasswordUserPassword. It skips the test when TEST_DATABASE_URL
// points at a server whose pg_hba.conf pgtest does not control.
func PasswordDSN(t testing.TB, dsn, password string) string {
	t.Helper()
	Server(t)
	fields := strings.Fields(dsn)
	out := fields[:0]
	for _, f := range fields {
		if !strings.HasPrefix(f, "user=") && !strings.HasPrefix(f, "password=") {
			out = append(out, f)
		}
	}
	return strings.Join(append(out, "user="+PasswordUser, "password="+password), " ")
}

// Server returns this binary's own cluster (starting it if needed), or skips
// the test when TEST_DATABASE_URL points at a server it cannot restart.
func Server(t testing.TB) *Cluster {
	t.Helper()
	ensure(t)
	if server == nil {
		t.Skipf("this test controls the server process; %s points at a server it does not own", EnvURL)
	}
	return server
}

func ensure(t testing.TB) {
	t.Helper()
	testtier.Needs(t, "PostgreSQL")
	once.Do(setup)
	if setupErr != nil {
		t.Fatalf("pgtest: no database server: %v", setupErr)
	}
}

// EnvPooler, set to "pgbouncer", makes NewDatabase's and NewPool's
// connections go through this binary's PgBouncer (transaction mode): the
// suites that run the ledger's statements run once directly and once so
// (make test). A test of what only a session shows says so (DirectOnly).
const EnvPooler = "RUNLEDGER_TEST_POOLER"

// ThroughPooler reports whether this test binary runs its databases behind
// PgBouncer (EnvPooler).
func ThroughPooler() bool { return os.Getenv(EnvPooler) == "pgbouncer" }

// DirectOnly skips t when the suite runs behind the pooler (EnvPooler): why
// names the session state the test needs (a backend it kills, a session
// lock it holds across statements, a setting it reads back).
func DirectOnly(t testing.TB, why string) {
	t.Helper()
	if ThroughPooler() {
		t.Skipf("directly to PostgreSQL only: %s", why)
	}
}

// NewDatabase creates a fresh, migrated database for this test and returns its
// DSN (through the pooler when EnvPooler says so). With TEST_DATABASE_URL it
// is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	ensure(t)
	dsn := create(t, "TEMPLATE "+template)
	if ThroughPooler() {
		return ThroughBouncer(t, dsn)
	}
	return dsn
}

// Direct returns dsn as it reaches PostgreSQL itself (NewDatabase's DSN
// goes through the pooler when EnvPooler says so): for what a test does
// beside the code under test (an owner's or an observer's connection).
func Direct(t testing.TB, dsn string) string {
	t.Helper()
	if !ThroughPooler() {
		return dsn
	}
	return withDB(adminDSN, dbName(strings.Fields(dsn)))
}

// dbName is the dbname= of a DSN's fields.
func dbName(fields []string) string {
	for _, f := range fields {
		if name, ok := strings.CutPrefix(f, "dbname="); ok {
			return name
		}
	}
	return ""
}

// NewEmptyDatabase creates a fresh database with no runledger schema.
func NewEmptyDatabase(t testing.TB) string {
	t.Helper()
	ensure(t)
	return create(t, "TEMPLATE template0")
}

// NewICUDatabase is NewDatabase with ICU's collation of locale (say "en")
// as the database's default instead of C: for what must not depend on the
// database's collation. It is migrated from scratch (the template's
// collation is C); its effects are not sandboxed.
func NewICUDatabase(t testing.TB, locale string) string {
	t.Helper()
	ensure(t)
	dsn := create(t, "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '"+locale+"'")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	defer pool.Close()
	if _, err := ledger.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrating a database collated by ICU's %s: %v", locale, err)
	}
	if ThroughPooler() {
		return ThroughBouncer(t, dsn)
	}
	return dsn
}

// NewPool is NewDatabase plus a pool on it, closed when the test ends.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, NewDatabase(t))
}

// Pool opens a pool on dsn as the workers do (ledger.Open: behind a pooler
// it prepares no named statement), closed when the test ends. Its sessions
// keep their default search_path (ledger.KeepSearchPath): the tests' own
// SQL on it names their tables unqualified. It holds up to 16 connections,
// or the DSN's own pool_max_conns (a test that needs every statement on one
// session says pool_max_conns=1).
func Pool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	maxConns := int32(16)
	if strings.Contains(dsn, "pool_max_conns=") {
		maxConns = 0 // ledger.Open keeps the DSN's
	}
	pool, err := ledger.Open(context.Background(), dsn, maxConns, ledger.KeepSearchPath())
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func create(t testing.TB, tmpl string) string {
	t.Helper()
	name := fmt.Sprintf("%s_%d", prefix, counter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := execSQL(ctx, adminDSN, "CREATE DATABASE "+name+" "+tmpl); err != nil {
		t.Fatalf("creating test database: %v", err)
	}
	if server == nil {
		t.Cleanup(func() { dropDatabase(name) })
	}
	return withDB(adminDSN, name)
}

func dropDatabase(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := execSQL(ctx, adminDSN, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: dropping %s: %v\n", name, err)
	}
}

func execSQL(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connecting to the test server: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", strings.SplitN(sql, " ", 3)[:2], err)
	}
	return nil
}

// withDB returns dsn (URL or keyword/value form) pointing at database name.
func withDB(dsn, name string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	fields := strings.Fields(dsn)
	out := fields[:0]
	for _, f := range fields {
		if !strings.HasPrefix(f, "dbname=") {
			out = append(out, f)
		}
	}
	return strings.Join(append(out, "dbname="+name), " ")
}

// SilentServer listens on a loopback port, accepts every TCP connection and
// never answers (a server that hangs, or a black hole on the way to it), until
// the test ends. It returns the address.
func SilentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening: %v", err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String()
}

package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	kwait "k8s.io/apimachinery/pkg/util/wait"

	"github.com/runledger/runledger/migrations"
)

// migrationLockKey is the advisory lock that serialises migrators: any number
// of workers and `runledger migrate` calls may start at once; one applies the
// migrations, the others wait and then find nothing left to do.
// (The value is the first 8 bytes of sha256("runledger.migrate").)
const migrationLockKey int64 = 0x3f1b_5c2e_9d47_a061

// versionTable is goose's record of applied migrations, kept in our schema.
const versionTable = Schema + ".goose_db_version"

// Migrate applies every embedded migration that the database lacks and returns
// how many it applied. It is idempotent and safe to run concurrently. Straight
// to PostgreSQL it holds one connection of the pool at a time, so a pool of
// one connection will do; behind a pooler it holds two (migrationLock).
//
// A migration PostgreSQL aborts to break a deadlock is tried again, the
// migration lock released in between: v0.1.0 waits for that
// lock in one statement, whose snapshot an index built CONCURRENTLY under
// the lock waits for (the build is the one aborted; its migration drops
// what it left and builds again).
//
// While it waits for the migration lock, every MigrationLockReport it
// calls onWait, if given, with the sessions that hold it (another
// migrator, or user code that took its key): a worker starting during an
// upgrade says what it waits for.
func Migrate(ctx context.Context, pool *pgxpool.Pool, onWait ...func([]MigrationBlocker)) (int, error) {
	applied := 0
	w := lockWait{pool: pool}
	if len(onWait) > 0 {
		w.report = onWait[0]
	}
	for try := 1; ; try++ {
		n, err := migrateOnce(ctx, w)
		applied += n
		if !IsDeadlock(err) || try == migrateDeadlockTries {
			return applied, err
		}
		select {
		case <-ctx.Done():
			return applied, err
		case <-time.After(time.Duration(try) * migrateDeadlockPause):
		}
	}
}

// How often Migrate tries a migration PostgreSQL aborts in a deadlock, and
// the pause before the n-th try again (n times this): the waiting
// migrators of an earlier release take the lock and find nothing to do.
const (
	migrateDeadlockTries = 10
	migrateDeadlockPause = 500 * time.Millisecond
)

// MigrationBlocker is a session a waiting migrator waits for.
type MigrationBlocker struct {
	PID             int32
	ApplicationName string
	// OpenFor is how long its transaction has been open; negative when
	// the migrating login may not see it (another login's session).
	OpenFor time.Duration
}

// String names the session as a waiting migrator reports it: its pid,
// application_name and, where the login may see it, how long its
// transaction has been open.
func (b MigrationBlocker) String() string {
	s := fmt.Sprintf("pid %d %q", b.PID, b.ApplicationName)
	if b.OpenFor >= 0 {
		s += ", transaction open for " + b.OpenFor.Round(time.Second).String()
	}
	return s
}

// MigrationBlockers returns the sessions that the migrators named
// applicationName (ApplicationName) wait for, if they wait for a lock:
// what `runledger migrate` says while an index is built CONCURRENTLY,
// which waits for every transaction older than the build.
func MigrationBlockers(ctx context.Context, pool *pgxpool.Pool, applicationName string) ([]MigrationBlocker, error) {
	out, err := sessions(ctx, pool, sqlMigrationBlockers, applicationName)
	if err != nil {
		return nil, fmt.Errorf("looking up what the migration waits for: %w", err)
	}
	return out, nil
}

// sessions reads q's rows of (pid, application_name, seconds open) as
// MigrationBlockers.
func sessions(ctx context.Context, pool *pgxpool.Pool, q string, args ...any) ([]MigrationBlocker, error) {
	var out []MigrationBlocker
	err := pinnedTx(ctx, pool, sqlBeginPinnedReadOnly, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (MigrationBlocker, error) {
			var b MigrationBlocker
			var secs float64
			err := r.Scan(&b.PID, &b.ApplicationName, &secs)
			b.OpenFor = time.Duration(secs * float64(time.Second))
			return b, err
		})
		return err
	})
	return out, err
}

// migrateOnce applies the migrations under the migration lock.
func migrateOnce(ctx context.Context, w lockWait) (int, error) {
	pool := w.pool
	if err := ensureSchema(ctx, w); err != nil {
		return 0, err
	}
	// goose locks, creates its version table and applies the SQL migrations
	// all on the one connection it takes from db, hence from the pool.
	db := stdlib.OpenDBFromPool(pool) // closing it leaves the pool open
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(versionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(&migrationLocker{wait: w}),
	)
	if err != nil {
		return 0, fmt.Errorf("loading migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	if partial := (*goose.PartialError)(nil); errors.As(err, &partial) {
		results = partial.Applied // applied before the one that failed
	}
	if IsConfigurationError(err) { // e.g. a worker login, which may create nothing
		return len(results), fmt.Errorf("applying migrations: this login may not apply them; run runledger migrate as the schema's owner first: %w", err)
	}
	if err != nil {
		return len(results), fmt.Errorf("applying migrations: %w", err)
	}
	return len(results), nil
}

// ensureSchema creates the schema if it is missing, under the migration lock,
// and gives the connection back: goose looks for its version table in the
// schema before it takes any lock (Provider.Up calls HasPending first).
// It looks first without the lock: a schema that exists stays, and the
// shards of a run, starting together, each waited a poll of the lock
// (migrationLockPoll) for the others' look.
func ensureSchema(ctx context.Context, w lockWait) (err error) {
	if exists, err := schemaExists(ctx, w.pool); err != nil || exists {
		return err
	}
	l, err := takeMigrationLock(ctx, w, nil)
	if err != nil {
		return err
	}
	defer func() {
		if uerr := l.release(context.WithoutCancel(ctx)); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	exists, err := schemaExists(ctx, l.db)
	if err != nil || exists {
		return err
	}
	if _, err := l.db.Exec(ctx, sqlCreateSchema); err != nil {
		return fmt.Errorf("creating schema %s: %w", Schema, err)
	}
	return nil
}

// schemaExists looks the schema up. Looking first matters: CREATE SCHEMA
// IF NOT EXISTS checks the CREATE privilege on the database even when the
// schema exists, and a least-privilege worker role must be able to run
// Migrate when there is nothing to do.
func schemaExists(ctx context.Context, db dbtx) (bool, error) {
	var exists bool
	if err := db.QueryRow(ctx, sqlSchemaExists, pgx.QueryExecModeSimpleProtocol, Schema).Scan(&exists); err != nil {
		return false, fmt.Errorf("looking up schema %s: %w", Schema, err)
	}
	return exists, nil
}

// migrationLock serialises migrators (migrationLockKey). Straight to
// PostgreSQL it is a session lock on the connection that migrates. Behind a
// pooler, whose transaction mode gives each transaction any server
// connection (a session lock would stay on one of them, with nobody to
// release it), it is a transaction lock (sqlMigrationXactLock) held by a
// transaction of its own on a second connection, open while the migrations
// run on the first and committed after them: that transaction pins one
// server connection, and the lock goes with it if the migrator dies. It
// holds no snapshot between its statements (READ COMMITTED, no write, and
// the simple protocol: after an extended-protocol statement an idle
// transaction keeps its xmin), so it holds back no vacuum, and a CREATE
// INDEX CONCURRENTLY of the migrations does not wait for it.
type migrationLock struct {
	conn *pgxpool.Conn // nil: the session lock on goose's connection
	tx   pgx.Tx
	db   dbtx // where ensureSchema's statements run
}

// takeMigrationLock takes the lock; session, when not nil, is goose's
// connection, the session lock's straight to PostgreSQL.
func takeMigrationLock(ctx context.Context, w lockWait, session *sql.Conn) (*migrationLock, error) {
	pool := w.pool
	// ensureSchema's connection came first: the pool knows what it reaches
	// by goose's.
	if session != nil && !BehindPooler(pool) {
		if err := w.poll(ctx, func(ctx context.Context) (got bool, err error) {
			return got, session.QueryRowContext(ctx, sqlMigrationLock, migrationLockKey).Scan(&got)
		}); err != nil {
			return nil, fmt.Errorf("taking migration lock: %w", err)
		}
		if _, err := session.ExecContext(ctx, sqlPinSession); err != nil {
			_, _ = session.ExecContext(context.WithoutCancel(ctx), sqlMigrationUnlock, migrationLockKey)
			return nil, fmt.Errorf("pinning the migration session's search_path: %w", err)
		}
		return &migrationLock{}, nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquiring connection for migration lock: %w", err)
	}
	if !BehindPooler(pool) {
		if err := w.poll(ctx, func(ctx context.Context) (got bool, err error) {
			return got, conn.QueryRow(ctx, sqlMigrationLock, migrationLockKey).Scan(&got)
		}); err != nil {
			conn.Release()
			return nil, fmt.Errorf("taking migration lock: %w", err)
		}
		return &migrationLock{conn: conn, db: conn}, nil
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		err = w.poll(ctx, func(ctx context.Context) (got bool, err error) {
			return got, tx.QueryRow(ctx, sqlMigrationXactLock, pgx.QueryExecModeSimpleProtocol, migrationLockKey).Scan(&got)
		})
	}
	if err != nil {
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
		return nil, fmt.Errorf("taking migration lock (a transaction lock: the connection goes through a pooler): %w", err)
	}
	return &migrationLock{conn: conn, tx: tx, db: tx}, nil
}

// migrationLockPoll is how often a migrator tries the lock another holds.
const migrationLockPoll = 100 * time.Millisecond

// MigrationLockReport is how often a migrator waiting for the migration
// lock says who holds it (Migrate's onWait).
var MigrationLockReport = 10 * time.Second

// lockWait is how a migrator waits for the migration lock: on pool, saying
// every MigrationLockReport who holds it (report, if any).
type lockWait struct {
	pool   *pgxpool.Pool
	report func([]MigrationBlocker)
}

// poll tries the lock until it gets it or ctx ends: between tries the
// waiting session holds no snapshot (sqlMigrationLock).
func (w lockWait) poll(ctx context.Context, try func(context.Context) (bool, error)) error {
	next := time.Now().Add(MigrationLockReport)
	return kwait.PollUntilContextCancel(ctx, migrationLockPoll, true, func(ctx context.Context) (bool, error) {
		got, err := try(ctx)
		if err == nil && !got && w.report != nil && time.Now().After(next) {
			next = time.Now().Add(MigrationLockReport)
			look, cancel := context.WithTimeout(ctx, MigrationLockReport/2)
			// Advice, not the migration: quiet when it cannot look (no
			// connection free in a pool the migration holds).
			if holders, lerr := MigrationLockHolders(look, w.pool); lerr == nil && len(holders) > 0 {
				w.report(holders)
			}
			cancel()
		}
		return got, err
	})
}

// MigrationLockHolders returns the sessions that hold the migration lock
// (migrationLockKey): a migrator applying the migrations, or user code
// that took its key.
func MigrationLockHolders(ctx context.Context, pool *pgxpool.Pool) ([]MigrationBlocker, error) {
	key := uint64(migrationLockKey)
	out, err := sessions(ctx, pool, sqlMigrationLockHolders, uint32(key>>32), uint32(key))
	if err != nil {
		return nil, fmt.Errorf("looking up who holds the migration lock: %w", err)
	}
	return out, nil
}

// release releases the lock taken by takeMigrationLock; session is goose's
// connection, as given to it.
func (l *migrationLock) releaseOn(ctx context.Context, session *sql.Conn) error {
	switch {
	case l.tx != nil:
		defer l.conn.Release()
		if err := l.tx.Commit(ctx); err != nil {
			return fmt.Errorf("releasing migration lock: %w", err)
		}
	case l.conn != nil:
		defer l.conn.Release()
		if _, err := l.conn.Exec(ctx, sqlMigrationUnlock, migrationLockKey); err != nil {
			return fmt.Errorf("releasing migration lock: %w", err)
		}
	case session != nil:
		if _, err := session.ExecContext(ctx, sqlMigrationUnlock, migrationLockKey); err != nil {
			return fmt.Errorf("releasing migration lock: %w", err)
		}
		// The session goes back to the pool with its own path again.
		if _, err := session.ExecContext(ctx, sqlUnpinSession); err != nil {
			return fmt.Errorf("resetting the migration session's search_path: %w", err)
		}
	}
	return nil
}

func (l *migrationLock) release(ctx context.Context) error { return l.releaseOn(ctx, nil) }

// migrationLocker is goose's session lock (migrationLock), taken for the
// connection goose migrates with. It tries the lock every 100 ms for as long
// as ctx allows (goose's own Postgres locker tries every five seconds).
type migrationLocker struct {
	wait lockWait
	held *migrationLock
}

var _ lock.SessionLocker = (*migrationLocker)(nil)

func (m *migrationLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	l, err := takeMigrationLock(ctx, m.wait, conn)
	if err != nil {
		return err
	}
	m.held = l
	return nil
}

func (m *migrationLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if m.held == nil {
		return nil
	}
	l := m.held
	m.held = nil
	return l.releaseOn(ctx, conn)
}

// GrantWorker gives the login role exactly the privileges a worker needs on
// the migrated schema (sqlGrantWorker), taking back any others it had on
// runledger's tables. The caller must own the schema (it just migrated it).
func GrantWorker(ctx context.Context, pool *pgxpool.Pool, role string) error {
	if role == "" {
		return errors.New("granting worker privileges: the role name is empty")
	}
	var db string
	if err := pool.QueryRow(ctx, sqlCurrentDatabase).Scan(&db); err != nil {
		return fmt.Errorf("granting worker privileges to %s: naming the database: %w", role, err)
	}
	// One simple query: PostgreSQL runs its statements as one transaction.
	if _, err := pool.Exec(ctx, sqlGrantWorker(pgx.Identifier{role}.Sanitize(), pgx.Identifier{db}.Sanitize())); err != nil {
		return fmt.Errorf("granting worker privileges to %s: %w", role, err)
	}
	return nil
}

// SetEffectRole gives the effect's sandbox, runledger.run_effect, to role
// (sqlSetEffectRole): SQL effects then run as role, which must exist, and
// which the migrator must be a member of (or a superuser) to hand it a
// function. role must be unprivileged: no superuser, no member of the
// ledger's owner or of a worker login, no privilege on schema runledger (it
// loses any it had). Grant it what the effects need on the user's tables.
func SetEffectRole(ctx context.Context, pool *pgxpool.Pool, role string) error {
	if role == "" {
		return errors.New("setting the effect role: the role name is empty")
	}
	// One simple query: PostgreSQL runs its statements as one transaction.
	if _, err := pool.Exec(ctx, sqlSetEffectRole(pgx.Identifier{role}.Sanitize())); err != nil {
		return fmt.Errorf("giving the effect's sandbox (runledger.run_effect) to role %s (it must exist, and the migrator must be a member of it, e.g. GRANT %s TO the migrator's login, or a superuser): %w",
			role, pgx.Identifier{role}.Sanitize(), err)
	}
	if _, err := NewStore(pool).effectSandbox(ctx); err != nil {
		return fmt.Errorf("setting the effect role %s: %w", role, err)
	}
	return nil
}

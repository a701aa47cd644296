package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

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
// how many it applied. It is idempotent, safe to run concurrently, and holds
// one connection of the pool at a time, so a pool of one connection will do.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	if err := ensureSchema(ctx, pool); err != nil {
		return 0, err
	}
	// goose locks, creates its version table and applies the SQL migrations
	// all on the one connection it takes from db, hence from the pool.
	db := stdlib.OpenDBFromPool(pool) // closing it leaves the pool open
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(versionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(migrationLocker{}),
	)
	if err != nil {
		return 0, fmt.Errorf("loading migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	if IsConfigurationError(err) { // e.g. a worker login, which may create nothing
		return 0, fmt.Errorf("applying migrations: this login may not apply them; run runledger migrate as the schema's owner first: %w", err)
	}
	if err != nil {
		return 0, fmt.Errorf("applying migrations: %w", err)
	}
	return len(results), nil
}

// ensureSchema creates the schema if it is missing, under the migration lock,
// and gives the connection back: goose looks for its version table in the
// schema before it takes any lock (Provider.Up calls HasPending first).
func ensureSchema(ctx context.Context, pool *pgxpool.Pool) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquiring connection for migration lock: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, sqlMigrationLock, migrationLockKey); err != nil {
		return fmt.Errorf("taking migration lock: %w", err)
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), sqlMigrationUnlock, migrationLockKey); uerr != nil {
			err = errors.Join(err, fmt.Errorf("releasing migration lock: %w", uerr))
		}
	}()
	// Look first: CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege on
	// the database even when the schema exists, and a least-privilege worker
	// role must be able to run Migrate when there is nothing to do.
	var exists bool
	if err := conn.QueryRow(ctx, sqlSchemaExists, Schema).Scan(&exists); err != nil {
		return fmt.Errorf("looking up schema %s: %w", Schema, err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, sqlCreateSchema); err != nil {
			return fmt.Errorf("creating schema %s: %w", Schema, err)
		}
	}
	return nil
}

// migrationLocker is goose's session lock, taken on the connection goose
// migrates with. It waits in pg_advisory_lock for as long as ctx allows
// (goose's own Postgres locker polls every five seconds instead).
type migrationLocker struct{}

var _ lock.SessionLocker = migrationLocker{}

func (migrationLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, sqlMigrationLock, migrationLockKey); err != nil {
		return fmt.Errorf("taking migration lock: %w", err)
	}
	return nil
}

func (migrationLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, sqlMigrationUnlock, migrationLockKey); err != nil {
		return fmt.Errorf("releasing migration lock: %w", err)
	}
	return nil
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

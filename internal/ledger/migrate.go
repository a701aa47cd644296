package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

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
// how many it applied. It is idempotent and safe to run concurrently.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (applied int, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("acquiring connection for migration lock: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLockKey); err != nil {
		return 0, fmt.Errorf("taking migration lock: %w", err)
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrationLockKey); uerr != nil {
			err = errors.Join(err, fmt.Errorf("releasing migration lock: %w", uerr))
		}
	}()

	// The schema must exist before goose creates its version table in it.
	// Look first: CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege on
	// the database even when the schema exists, and a least-privilege worker
	// role must be able to run Migrate when there is nothing to do.
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, Schema).Scan(&exists); err != nil {
		return 0, fmt.Errorf("looking up schema %s: %w", Schema, err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+Schema); err != nil {
			return 0, fmt.Errorf("creating schema %s: %w", Schema, err)
		}
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(versionTable),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return 0, fmt.Errorf("loading migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return 0, fmt.Errorf("applying migrations: %w", err)
	}
	return len(results), nil
}

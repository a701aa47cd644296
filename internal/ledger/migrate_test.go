package ledger_test

import (
	"context"
	"io/fs"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/migrations"
)

func schemaSnapshot(t *testing.T, dsn string) []string {
	t.Helper()
	pool := pgtest.Pool(t, dsn)
	rows, err := pool.Query(context.Background(), `
SELECT c.relname || ':' || c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'runledger' ORDER BY 1`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// migrationCount is how many migrations are embedded.
func migrationCount(t *testing.T) int {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	return len(files)
}

func TestMigrate_TwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewEmptyDatabase(t)
	ctx := context.Background()

	// Four migrators at once: all succeed, exactly one applies the migrations.
	const n = 4
	applied := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			pool, err := ledger.Open(ctx, dsn, 2)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			applied[i], errs[i] = ledger.Migrate(ctx, pool)
		})
	}
	wg.Wait()
	total := 0
	for i := range n {
		require.NoError(t, errs[i], "migrator %d", i)
		total += applied[i]
	}
	require.Equal(t, migrationCount(t), total, "every migration is applied once, by one migrator")
	first := schemaSnapshot(t, dsn)
	require.Contains(t, first, ledger.BusinessKeyIndex+":i")

	// Once more: nothing to do, the same schema.
	pool := pgtest.Pool(t, dsn)
	again, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, again)
	require.Equal(t, first, schemaSnapshot(t, dsn))
}

// TestMigrate_PoolOfOneConnection: a caller whose pool has a single connection
// (a worker started with one connection, say) migrates instead of waiting
// forever for a second one.
func TestMigrate_PoolOfOneConnection(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewEmptyDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := ledger.Open(ctx, dsn, 1)
	require.NoError(t, err)
	defer pool.Close()
	require.EqualValues(t, 1, pool.Config().MaxConns)

	applied, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err, "migrating through a pool of one connection")
	require.Equal(t, migrationCount(t), applied)
	require.Contains(t, schemaSnapshot(t, dsn), ledger.BusinessKeyIndex+":i")

	again, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, again)
	// The lock went back with the connection: the pool's one connection holds
	// no advisory lock any more.
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`))
}

// TestMigrate_LeastPrivilegeRole: a worker role that may write the ledger but
// not create anything in the database runs Migrate as a no-op once the schema
// is there.
func TestMigrate_LeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t) // migrated
	admin := pgtest.Pool(t, dsn)
	ctx := context.Background()
	role := "worker_" + scalar[string](t, admin, `SELECT current_database()`)
	mustExec(t, admin, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	mustExec(t, admin, `REVOKE CREATE ON DATABASE `+scalar[string](t, admin, `SELECT current_database()`)+` FROM PUBLIC`)
	mustExec(t, admin, `GRANT USAGE ON SCHEMA runledger TO `+role)
	mustExec(t, admin, `GRANT SELECT, INSERT, UPDATE ON runledger.ledger TO `+role)
	mustExec(t, admin, `GRANT SELECT ON runledger.goose_db_version TO `+role)

	cfg := admin.Config().ConnConfig.Copy()
	cfg.User = role
	pool, err := ledger.Open(ctx, cfg.ConnString()+" user="+role, 2)
	require.NoError(t, err)
	defer pool.Close()
	applied, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err, "nothing to migrate needs no CREATE privilege")
	require.Zero(t, applied)
	// And the role can commit through the insert path.
	res, err := ledger.NewStore(pool).CommitChunk(ctx, runNamed("least"), items("acct", 0, 3), ledger.ChunkOptions{})
	require.NoError(t, err)
	require.Equal(t, tally{completed: 3}, count(res))
}

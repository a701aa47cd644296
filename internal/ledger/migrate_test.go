package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/ledger/ledgertest"
	"github.com/runledger/runledger/internal/pgtest"
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
	return ledgertest.MigrationsAfter(t, 0)
}

func TestMigrate_TwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewEmptyDatabase(t)
	ctx := context.Background()

	// Four migrators at once: all succeed, exactly one applies the migrations.
	const n = 4
	applied := make([]int, n)
	errs := onOwnPools(ctx, dsn, n, func(i int, pool *pgxpool.Pool) (err error) {
		applied[i], err = ledger.Migrate(ctx, pool)
		return err
	})
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

// TestMigrate_LeastPrivilegeRole: a worker login granted by GrantWorker, on a
// database where it may create nothing, runs Migrate as a no-op once the
// schema is up to date, and commits through the insert path. With a
// migration pending, its Migrate fails with a configuration error (it may
// not apply it) and changes nothing; the owner's applies it.
func TestMigrate_LeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	owner := newPool(t) // migrated
	ctx := context.Background()
	mustExec(t, owner, `REVOKE CREATE, TEMPORARY ON DATABASE `+scalar[string](t, owner, `SELECT current_database()`)+` FROM PUBLIC`)
	pool, _ := workerRole(t, owner)
	applied, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err, "nothing to migrate needs no CREATE privilege")
	require.Zero(t, applied)
	// And the role can commit through the insert path, with an effect (its
	// temporary table needs TEMP, which the database no longer gives PUBLIC).
	res, err := ledger.NewStore(pool).CommitChunk(ctx, runNamed("least"), items("acct", 0, 3), ledger.ChunkOptions{Effect: `SELECT count(*) FROM claimed`})
	require.NoError(t, err)
	require.Equal(t, tally{completed: 3}, count(res))

	// The database as an earlier release left it: 00003 and later not
	// applied.
	ledgertest.DownTo(t, owner, 2)
	before := schemaSnapshot(t, owner.Config().ConnString())
	_, err = ledger.Migrate(ctx, pool)
	require.Error(t, err)
	require.True(t, ledger.IsConfigurationError(err), "a role that may not migrate is a configuration error: %v", err)
	require.ErrorContains(t, err, "this login may not apply them; run runledger migrate as the schema's owner first")
	require.ErrorContains(t, err, "permission denied for schema runledger")
	require.Equal(t, before, schemaSnapshot(t, owner.Config().ConnString()), "nothing applied")
	require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'ledger_%'`))
	applied, err = ledger.Migrate(ctx, owner)
	require.NoError(t, err)
	require.Equal(t, migrationCount(t)-2, applied, "the owner applies them")
}

// TestGrantWorker: the privileges a worker login gets, exactly, read back
// from the catalog; what it had before on runledger's tables is taken back;
// a missing role is a clear error.
func TestGrantWorker(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	ctx := context.Background()
	_, role := workerRole(t, owner)
	mustExec(t, owner, `GRANT ALL ON ALL TABLES IN SCHEMA runledger TO `+role)
	require.NoError(t, ledger.GrantWorker(ctx, owner, role), "granting again")

	rows, err := owner.Query(ctx, `
SELECT table_name || ':' || privilege_type FROM information_schema.role_table_grants
WHERE grantee = $1 AND table_schema = 'runledger'
UNION ALL
SELECT table_name || '.' || column_name || ':' || privilege_type FROM information_schema.column_privileges
WHERE grantee = $1 AND table_schema = 'runledger' AND privilege_type = 'UPDATE'
ORDER BY 1`, role)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		got = append(got, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{
		"batch:INSERT", "batch:SELECT",
		"batch_run.items:UPDATE", "batch_run.objects:UPDATE", "batch_run:INSERT", "batch_run:SELECT",
		"batch_sorted:DELETE", "batch_sorted:INSERT", "batch_sorted:SELECT",
		"batch_sorted_shard:DELETE", "batch_sorted_shard:INSERT", "batch_sorted_shard:SELECT",
		"goose_db_version:SELECT",
		"item_failure.attempt:UPDATE", "item_failure.chunk:UPDATE", "item_failure.class:UPDATE", "item_failure.error:UPDATE", "item_failure.failed_at:UPDATE", "item_failure.items:UPDATE", "item_failure.pass:UPDATE", "item_failure.payload:UPDATE", "item_failure.payload_digest:UPDATE", "item_failure.run_name:UPDATE", "item_failure.run_namespace:UPDATE", "item_failure.shard:UPDATE",
		"item_failure:DELETE", "item_failure:INSERT", "item_failure:SELECT",
		"ledger.state:UPDATE", "ledger.superseded_at:UPDATE", "ledger:INSERT", "ledger:SELECT", "ledger_retired:SELECT",
		"shard_lease.expires_at:UPDATE", "shard_lease.holder:UPDATE", "shard_lease:DELETE", "shard_lease:INSERT", "shard_lease:SELECT",
		"shard_progress.already_handled:UPDATE", "shard_progress.attempt:UPDATE", "shard_progress.completed:UPDATE", "shard_progress.done:UPDATE",
		"shard_progress.failed:UPDATE", "shard_progress.message:UPDATE", "shard_progress.payload_changed:UPDATE", "shard_progress.total:UPDATE",
		"shard_progress.updated_at:UPDATE", "shard_progress:INSERT", "shard_progress:SELECT",
	}, got)
	require.True(t, scalar[bool](t, owner, `SELECT has_database_privilege($1, current_database(), 'TEMP')`, role))
	require.False(t, scalar[bool](t, owner, `SELECT has_database_privilege($1, current_database(), 'CREATE')`, role))

	// A login granted before 00014 (and 00015): the migrations let it write
	// a record's payload and publish its progress too, without a grant to
	// run again.
	provider := ledgertest.DownTo(t, owner, 13)
	require.True(t, scalar[bool](t, owner, `SELECT has_column_privilege($1, 'runledger.item_failure', 'payload_digest', 'UPDATE') AND
		NOT EXISTS (SELECT FROM information_schema.columns WHERE table_schema = 'runledger' AND table_name = 'item_failure' AND column_name = 'payload')`, role))
	later := 0
	for _, src := range provider.ListSources() {
		if src.Version > 13 {
			later++
		}
	}
	applied, err := ledger.Migrate(ctx, owner)
	require.NoError(t, err)
	require.Equal(t, later, applied)
	require.True(t, scalar[bool](t, owner, `SELECT has_column_privilege($1, 'runledger.item_failure', 'payload', 'UPDATE')`, role))
	require.True(t, scalar[bool](t, owner, `SELECT has_table_privilege($1, 'runledger.shard_progress', 'SELECT, INSERT')
		AND has_column_privilege($1, 'runledger.shard_progress', 'completed', 'UPDATE')
		AND NOT has_column_privilege($1, 'runledger.shard_progress', 'run_uid', 'UPDATE')
		AND NOT has_table_privilege($1, 'runledger.shard_progress', 'DELETE')`, role))
	// And record the objects of an object batch it fixes (00021).
	require.True(t, scalar[bool](t, owner, `SELECT has_column_privilege($1, 'runledger.batch_run', 'objects', 'UPDATE')
		AND NOT has_column_privilege($1, 'runledger.batch_run', 'run_uid', 'UPDATE')`, role))
	// And sort and read its batch (00017), hold its shard's lease (00018).
	require.True(t, scalar[bool](t, owner, `SELECT has_table_privilege($1, 'runledger.batch_sorted', 'SELECT, INSERT, DELETE')
		AND has_table_privilege($1, 'runledger.batch_sorted_shard', 'SELECT, INSERT, DELETE')
		AND has_table_privilege($1, 'runledger.shard_lease', 'SELECT, INSERT, DELETE')
		AND has_column_privilege($1, 'runledger.shard_lease', 'expires_at', 'UPDATE')
		AND NOT has_column_privilege($1, 'runledger.shard_lease', 'run_uid', 'UPDATE')
		AND has_function_privilege($1, 'runledger.shard_lease_hold(text, integer, text, interval)', 'EXECUTE')
		AND NOT has_function_privilege('public', 'runledger.shard_lease_hold(text, integer, text, interval)', 'EXECUTE')`, role))

	err = ledger.GrantWorker(ctx, owner, `no "such" role`)
	require.ErrorContains(t, err, `granting worker privileges to no "such" role: ERROR: role "no "such" role" does not exist (SQLSTATE 42704)`)
	require.True(t, ledger.IsConfigurationError(err))
}

package ledger_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestMigrateThroughPgBouncer: a pool with the worker's network timeout
// reaches PostgreSQL through a real PgBouncer in transaction mode with its
// usual settings (ignore_startup_parameters = extra_float_digits only), and
// migrates an empty database there. PgBouncer refuses a startup parameter it
// does not know (FATAL: unsupported startup parameter, 08P01): the network
// timeouts used to travel as such.
func TestMigrateThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgtest.ThroughBouncer(t, pgtest.NewEmptyDatabase(t))
	pool, err := ledger.Open(ctx, dsn, 2, ledger.NetworkTimeout(6*time.Second))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	n, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Positive(t, n, "migrations applied")
	n, err = ledger.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to apply")
}

// TestNetworkTimeout_BehindPgBouncer: behind a pooler the server's
// keep-alives are not set (its server connection is PgBouncer's, shared by
// other clients' transactions), the pool knows it is behind one, and the
// connection carries its application_name through PgBouncer.
func TestNetworkTimeout_BehindPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.Direct(t, pgtest.NewDatabase(t))
	direct, err := ledger.Open(ctx, dsn, 1)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	require.NoError(t, direct.Ping(ctx))
	require.False(t, ledger.BehindPooler(direct), "straight to PostgreSQL")

	pool, err := ledger.Open(ctx, pgtest.ThroughBouncer(t, dsn), 1, ledger.NetworkTimeout(6*time.Second),
		ledger.ApplicationName("runledger test/"+t.Name()))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	tx, err := pool.Begin(ctx) // one server connection for the transaction
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var asked int
	var name string
	require.NoError(t, tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_settings WHERE source = 'session' AND name LIKE 'tcp%'), current_setting('application_name')`).Scan(&asked, &name))
	require.True(t, ledger.BehindPooler(pool))
	require.Zero(t, asked, "no keep-alive set on the pooler's server connection")
	require.Equal(t, "runledger test/"+t.Name(), name)
}

// TestCutApplicationName: PostgreSQL keeps 63 bytes of application_name;
// the cut never splits a UTF-8 sequence.
func TestCutApplicationName(t *testing.T) {
	t.Parallel()
	long := ledger.WorkerApplicationName("team-payments-production", "invoices-2026-01-monthly-settlement-run", 255)
	require.Equal(t, "runledger/team-payments-production/invoices-2026-01-monthly-set", ledger.CutApplicationName(long))
	require.Len(t, ledger.CutApplicationName(long), ledger.MaxApplicationName)
	short := ledger.WorkerApplicationName("default", "run-a", 3)
	require.Equal(t, "runledger/default/run-a/shard-3", ledger.CutApplicationName(short))
	// 62 ASCII bytes then a 3-byte rune: the rune goes whole.
	multi := strings.Repeat("a", 62) + "€x"
	require.Equal(t, strings.Repeat("a", 62), ledger.CutApplicationName(multi))
	require.True(t, utf8.ValidString(ledger.CutApplicationName(strings.Repeat("é", 40))))
	require.Len(t, ledger.CutApplicationName(strings.Repeat("é", 40)), 62)
}

// TestMigrateThroughPgBouncer_Concurrent: eight migrators at once through
// PgBouncer in transaction mode, each with a pool of two: one applies the
// migrations, the others wait for the lock (a transaction's, held on a
// server connection the transaction pins) and find nothing left; none is
// left holding it (a ninth migrates at once afterwards).
func TestMigrateThroughPgBouncer_Concurrent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := pgtest.ThroughBouncer(t, pgtest.NewEmptyDatabase(t))
	applied := make([]int, 8)
	errs := onOwnPools(ctx, dsn, 8, func(i int, pool *pgxpool.Pool) (err error) {
		applied[i], err = ledger.Migrate(ctx, pool)
		return err
	}, ledger.NetworkTimeout(6*time.Second))
	total := 0
	for i := range 8 {
		require.NoError(t, errs[i], "migrator %d", i)
		total += applied[i]
	}
	require.Equal(t, migrationCount(t), total, "each migration applied once")
	pool, err := ledger.Open(ctx, dsn, 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	quick, cancelQuick := context.WithTimeout(ctx, 10*time.Second)
	defer cancelQuick()
	n, err := ledger.Migrate(quick, pool)
	require.NoError(t, err, "the lock is free")
	require.Zero(t, n)
	var locks int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&locks))
	require.Zero(t, locks, "no advisory lock left on any server connection")
}

// TestFixQueryBatchThroughPgBouncer_Concurrent: eight shards fix one run's
// batch at once through PgBouncer in transaction mode, each on a pool of its
// own: the batch is written once and every caller gets its header, no
// advisory lock is left on any server connection (a ninth run fixes its
// batch at once), and no server connection keeps a setting of theirs. The
// batch's lock used to be a session's: taken on one server connection and
// released on another, it stayed held, and its lock_timeout stayed set.
func TestFixQueryBatchThroughPgBouncer_Concurrent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.NewDatabase(t)
	direct := pgtest.Pool(t, db)
	mustExec(t, direct, batchSource)
	dsn := pgtest.ThroughBouncer(t, db)
	run := runNamed("through-bouncer")
	const callers = 8
	headers := make([]*ledger.BatchHeader, callers)
	errs := onOwnPools(ctx, dsn, callers, func(i int, pool *pgxpool.Pool) (err error) {
		q := batchQuery()
		q.Timeout, q.LockTimeout = 20*time.Second, 2*time.Second
		headers[i], err = ledger.NewStore(pool).FixQueryBatch(ctx, run, q)
		return err
	})
	for i := range callers {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, headers[0], headers[i], "caller %d sees the same header", i)
	}
	require.EqualValues(t, 1000, headers[0].Items)
	require.EqualValues(t, 1000, scalar[int64](t, direct, `SELECT sum(cardinality(seqs)) FROM runledger.batch WHERE batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = 'through-bouncer')`), "written once")
	require.Zero(t, scalar[int64](t, direct, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`),
		"no advisory lock left on any server connection")

	pool, err := ledger.Open(ctx, dsn, 2*callers)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	quick, cancelQuick := context.WithTimeout(ctx, 10*time.Second)
	defer cancelQuick()
	h, err := ledger.NewStore(pool).FixQueryBatch(quick, runNamed("through-bouncer-2"), batchQuery())
	require.NoError(t, err, "the batch lock is free")
	require.EqualValues(t, 1000, h.Items)

	// As many transactions at once as the fixers had connections (PgBouncer
	// hands out the server connections used last first): none keeps a bound
	// the fixers set.
	txs := make([]pgx.Tx, 0, 2*callers)
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback(ctx)
		}
	}()
	for range 2 * callers {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		txs = append(txs, tx)
		var lockTimeout string
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&lockTimeout))
		require.Equal(t, "0", lockTimeout, "a server connection kept a fixer's lock_timeout")
	}
}

// TestPoolerProbesGoWithTheirPools: a pool's pooler probe is forgotten once
// the pool is garbage, so a process opening pool after pool does not keep
// them all. (Not parallel: it counts every pool of the process.)
func TestPoolerProbesGoWithTheirPools(t *testing.T) {
	ctx := context.Background()
	before := ledger.PoolerProbes()
	open := func() {
		for range 20 {
			pool, err := ledger.Open(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", 1)
			require.NoError(t, err)
			pool.Close()
		}
	}
	open()
	require.GreaterOrEqual(t, ledger.PoolerProbes(), before+20, "each open pool's probe is remembered")
	require.Eventually(t, func() bool {
		runtime.GC()
		return ledger.PoolerProbes() <= before
	}, 10*time.Second, 10*time.Millisecond, "the probes of pools that are gone are forgotten")
}

package clitest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// TestMigrateThroughPgBouncer: `runledger migrate` through a real PgBouncer
// in transaction mode with its usual settings (ignore_startup_parameters =
// extra_float_digits) applies every migration, and a second one finds
// nothing to do. It used to fail at once: FATAL: unsupported startup
// parameter: tcp_keepalives_idle (08P01).
func TestMigrateThroughPgBouncer(t *testing.T) {
	t.Parallel()
	dsn := pgtest.ThroughBouncer(t, pgtest.NewEmptyDatabase(t)) + " password=" + password
	r := runCLI(t, "", "migrate", "--dsn", dsn)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("migrations applied: %d\n", migrationFiles(t)))
	noSecret(t, r)
	r = runCLI(t, "", "migrate", "--dsn", dsn)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, "migrations applied: 0\n")
}

// TestRunThroughPgBouncerIsRefused: a worker's protocol still holds session
// state (the shard's lock and its cursor, an effect's table claimed), so
// `runledger run` through a transaction pooler stops at start, exit 2, with
// an error that says so, before anything is written.
func TestRunThroughPgBouncerIsRefused(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	file := writeFile(t, "run.yaml", manifest("june-invoices",
		inlineItems([2]string{"acct-1", "2024-06"}, [2]string{"acct-2", "2024-06"})))
	r := runCLI(t, "", "run", "-f", file, "--dsn", pgtest.ThroughBouncer(t, d.dsn), "--output", "json")
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "through a connection pooler")
	require.Contains(t, r.stderr, "it must connect to PostgreSQL directly")
	noSecret(t, r)
	require.Zero(t, d.committed(t), "nothing written")
	require.Zero(t, d.ledgerWrites(t))
}

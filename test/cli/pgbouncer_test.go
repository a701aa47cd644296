package clitest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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

// TestRunThroughPgBouncer: `runledger run` through a real PgBouncer in
// transaction mode (each transaction on whichever server connection is
// free): a query batch of 4 shards at once, with an SQL effect, commits
// every item once, with exact counts; the same batch under another run is
// all already handled, and a Supersede run reprocesses it once; `runledger
// items` reads the verdicts back, and `runledger prune` prunes through it.
// It used to stop at start (exit 2): the shard's lock and its batch cursor
// were a session's.
func TestRunThroughPgBouncer(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE src AS SELECT 'acct-' || (i % 37) AS entity, '2026-' || lpad((i / 37)::text, 4, '0') AS occurrence,
  jsonb_build_object('amount', i) AS payload FROM generate_series(1, 3000) i;
CREATE TABLE invoices (account text NOT NULL, period text NOT NULL);
GRANT ALL ON invoices TO PUBLIC`)
	dsn := pgtest.ThroughBouncer(t, pgtest.Direct(t, d.dsn)) + " password=" + password
	run := func(name string, extra ...string) result {
		spec := append([]string{"batch: {query: 'SELECT entity, occurrence, payload FROM src'}", "workers: 4", "chunkSize: 100",
			`effect: {sql: "INSERT INTO invoices SELECT entity, occurrence FROM claimed"}`}, extra...)
		file := writeFile(t, name+".yaml", manifest(name, spec...))
		return runCLI(t, "", "run", "-f", file, "--dsn", dsn, "--parallel", "4", "--output", "json")
	}
	r := run("june")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	noSecret(t, r)
	require.Equal(t, counts{Total: 3000, Completed: 3000}, r.summary(t).counts())
	require.EqualValues(t, 3000, d.committed(t))
	require.EqualValues(t, 3000, d.int(t, `SELECT count(*) FROM invoices`), "each effect once")

	r = run("june-again")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 3000, AlreadyHandled: 3000}, r.summary(t).counts())
	require.EqualValues(t, 3000, d.int(t, `SELECT count(*) FROM invoices`), "no effect for items already handled")

	r = run("june-redo", "onExisting: Supersede")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 3000, Completed: 3000}, r.summary(t).counts())
	require.EqualValues(t, 3000, d.committed(t))
	require.EqualValues(t, 3000, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_name = 'june-redo' AND state = 'committed'`))
	require.EqualValues(t, 6000, d.int(t, `SELECT count(*) FROM invoices`), "the effect once more for each item, once")
	require.Zero(t, d.int(t, `SELECT count(*) FROM runledger.shard_lease`), "every lease given back")
	require.Zero(t, d.int(t, `SELECT count(*) FROM runledger.batch_sorted`), "every sorted copy deleted")

	items := runCLI(t, "", "items", "june-again", "--namespace", "billing", "--dsn", dsn, "--output", "jsonl")
	require.Equal(t, 0, items.code, "stderr:\n%s", items.stderr)
	require.Equal(t, 3000, strings.Count(items.stdout, "\n"))
	d.exec(t, `UPDATE runledger.batch_run SET created_at = now() - interval '2 days'`)
	prune := runCLI(t, "", "prune", "--older-than", "24h", "--dsn", dsn)
	require.Equal(t, 0, prune.code, "stderr:\n%s", prune.stderr)
	require.Contains(t, prune.stdout, "batches pruned: 3")
}

// TestRunRefusedByPgBouncer: behind a PgBouncer that checks passwords itself
// (scram-sha-256, as production poolers do), a wrong password and an unknown
// database are bad input, as they are directly: exit code 2 at once with a
// message that says which, never retried until --retry-timeout. PgBouncer
// refuses both as FATAL 08P01, the class of a lost connection, which used
// to be retried for the whole --retry-timeout and then exit 1.
func TestRunRefusedByPgBouncer(t *testing.T) {
	t.Parallel()
	b, err := pgtest.StartPgBouncer(context.Background(), pgtest.Server(t), pgtest.BouncerPasswords("scram-sha-256", map[string]string{"postgres": "right"}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Stop() })
	file := writeFile(t, "run.yaml", manifest("refused", inlineItems([2]string{"acct-1", "2024-06"})))
	for _, tc := range []struct{ name, password, db, want string }{
		{"wrong password", "wrong", "postgres", "the connection pooler rejected the connection string's credentials (its user or password)"},
		{"no such database", "right", "nosuchdb", "the connection pooler knows no database of the name in the connection string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres password=%s dbname=%s", b.Port(), tc.password, tc.db)
			start := time.Now()
			r := runCLI(t, "", "run", "-f", file, "--dsn", dsn, "--output", "json", "--retry-timeout", "60s")
			require.Equal(t, 2, r.code, "exit code 2 for bad input; stderr:\n%s", r.stderr)
			require.Less(t, time.Since(start), 30*time.Second, "refused at once, not after --retry-timeout")
			require.Contains(t, r.stderr, tc.want)
			require.NotContains(t, r.stderr, "retrying", "never retried")
			require.Contains(t, r.summary(t).Error, tc.want, "the JSON result carries the error")
			noSecret(t, r)
		})
	}
}

package clitest

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger/ledgertest"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/migrations"
)

// twoRoles is the README's set-up on a fresh database: the test's
// (superuser) login owns and migrates the schema with --grant-to; a worker
// login that owns nothing runs the runs.
type twoRoles struct {
	owner, worker *db
	role          string
}

func newTwoRoles(t *testing.T) *twoRoles {
	t.Helper()
	raw := pgtest.NewEmptyDatabase(t)
	owner := &db{dsn: raw + " password=" + password, pool: pgtest.Pool(t, raw)}
	role := "rl_worker_" + owner.name(t)
	owner.exec(t, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		_, _ = owner.pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = owner.pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	// The worker may create nothing in the database.
	owner.exec(t, `REVOKE CREATE ON DATABASE `+owner.name(t)+` FROM PUBLIC`)
	var fields []string
	for _, f := range strings.Fields(raw) {
		if !strings.HasPrefix(f, "user=") {
			fields = append(fields, f)
		}
	}
	workerDSN := strings.Join(append(fields, "user="+role), " ")
	return &twoRoles{owner: owner, worker: &db{dsn: workerDSN + " password=" + password, pool: pgtest.Pool(t, workerDSN)}, role: role}
}

func (d *db) name(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, d.pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&s))
	return s
}

func (d *db) snapshot(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, d.pool.QueryRow(context.Background(),
		`SELECT coalesce(jsonb_agg(to_jsonb(l) ORDER BY l.id), '[]')::text FROM runledger.ledger AS l`).Scan(&s))
	return s
}

// TestTwoRoles_MigrateGrantToAndRun: `runledger migrate --grant-to` as the
// owner, then runs as the worker login: a query batch and an effect work,
// and effects that delete, re-key, rewrite, truncate or supersede ledger rows fail
// their items with PostgreSQL's error, leave every ledger row as it was, and
// a later run still counts those keys as already handled.
func TestTwoRoles_MigrateGrantToAndRun(t *testing.T) {
	t.Parallel()
	d := newTwoRoles(t)

	r := runCLI(t, "", "migrate", "--dsn", d.owner.dsn, "--grant-to", d.role, "--effect-role", pgtest.EffectRole)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("migrations applied: %d\n", migrationFiles(t)))
	require.Contains(t, r.stdout, "SQL effects run as "+pgtest.EffectRole+"\n")
	require.Contains(t, r.stdout, "worker privileges granted to "+d.role+"\n")

	// The worker starts (its migration check finds nothing to do) and runs a
	// query batch with an effect; it may read the source, write the sink.
	d.owner.exec(t, `CREATE TABLE src AS SELECT 'acct-' || i AS entity, '2024-06' AS occurrence FROM generate_series(1, 20) i;
CREATE TABLE sink (entity text, occurrence text);
GRANT SELECT ON src TO `+d.role+`; GRANT INSERT ON sink TO `+pgtest.EffectRole)
	good := manifest("june", `batch: {query: "SELECT entity, occurrence FROM src"}`, "workers: 2",
		`effect: {sql: "INSERT INTO sink SELECT entity, occurrence FROM claimed"}`)
	r = runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", good), "--dsn", d.worker.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 20, Completed: 20}, r.summary(t).counts())
	require.EqualValues(t, 20, d.owner.int(t, `SELECT count(*) FROM sink`))
	before := d.owner.snapshot(t)

	for _, effect := range []struct{ name, sql, want string }{
		{"delete", `DELETE FROM runledger.ledger WHERE run_name = 'june'`, "permission denied for schema runledger"},
		{"rekey", `UPDATE runledger.ledger SET entity = 'moved' WHERE run_name = 'june'`, "permission denied for schema runledger"},
		{"rewrite-state", `UPDATE runledger.ledger SET state = 'committed', superseded_at = NULL WHERE run_name = 'june'`, "permission denied for schema runledger"},
		{"truncate", `TRUNCATE runledger.ledger`, "permission denied for schema runledger"},
		{"supersede", `UPDATE runledger.ledger SET state = 'superseded', superseded_at = now() WHERE run_name = 'june'`, "permission denied for schema runledger"},
		{"forge", `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt) VALUES ('acct-1', '2024-07', 'x', 'x', 'x', 0, 0)`, "permission denied for schema runledger"},
	} {
		t.Run(effect.name, func(t *testing.T) {
			hostile := manifest("hostile-"+effect.name, inlineItems([2]string{"mal-1", "x"}, [2]string{"mal-2", "x"}, [2]string{"mal-3", "x"}),
				`effect: {sql: "`+effect.sql+`"}`)
			r := runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", hostile), "--dsn", d.worker.dsn, "--output", "json")
			s := r.summary(t)
			require.Equal(t, counts{Total: 3, Failed: 3}, s.counts(), "stderr:\n%s", r.stderr)
			require.NotEqual(t, 0, r.code)
			for _, f := range s.Failures {
				require.Contains(t, f.Error, effect.want)
			}
			require.Equal(t, before, d.owner.snapshot(t), "every ledger row is untouched")
		})
	}

	// A later run over the same keys: every one already handled.
	again := manifest("july", `batch: {query: "SELECT entity, occurrence FROM src"}`)
	r = runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", again), "--dsn", d.worker.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 20, AlreadyHandled: 20}, r.summary(t).counts())
	require.Equal(t, before, d.owner.snapshot(t))
	require.EqualValues(t, 20, d.owner.int(t, `SELECT count(*) FROM sink`), "no effect ran twice")
}

// TestTwoRoles_BadInput: a role that does not exist, a worker login that may
// not apply a pending migration, a worker login that tries to prune: each is
// exit 2 with a message that says what to do, and nothing changes.
func TestTwoRoles_BadInput(t *testing.T) {
	t.Parallel()
	d := newTwoRoles(t)

	r := runCLI(t, "", "migrate", "--dsn", d.owner.dsn, "--grant-to", "nobody_"+d.role)
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("migrations applied: %d\n", migrationFiles(t)))
	require.Contains(t, r.stderr, `role "nobody_`+d.role+`" does not exist`)
	r = runCLI(t, "", "migrate", "--dsn", d.owner.dsn, "--grant-to", "")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--grant-to is empty")
	r = runCLI(t, "", "migrate", "--dsn", d.owner.dsn, "--grant-to", d.role)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, "migrations applied: 0\n")

	// The worker's own migrate: nothing to do, read-only.
	r = runCLI(t, "", "migrate", "--dsn", d.worker.dsn)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, "migrations applied: 0\n")

	// History to prune: a run superseded by another.
	items := inlineItems([2]string{"acct-1", "2024-06"}, [2]string{"acct-2", "2024-06"})
	for _, run := range []string{manifest("first", items), manifest("second", items, "onExisting: Supersede")} {
		r = runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", run), "--dsn", d.worker.dsn, "--output", "json")
		require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	}
	before := d.owner.snapshot(t)
	r = runCLI(t, "", "prune", "--superseded-older-than", "1ns", "--dsn", d.worker.dsn)
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "prune as the schema's owner")
	require.Contains(t, r.stderr, "permission denied for table ledger")
	// Even granted DELETE, the worker is not the owner: the trigger refuses.
	d.owner.exec(t, `GRANT DELETE ON runledger.ledger TO `+d.role)
	r = runCLI(t, "", "prune", "--superseded-older-than", "1ns", "--dsn", d.worker.dsn)
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "only the schema's owner may prune")
	require.Contains(t, r.stderr, "runledger.ledger is append-only: DELETE of the superseded row")
	require.Equal(t, before, d.owner.snapshot(t), "nothing pruned")
	r = runCLI(t, "", "prune", "--superseded-older-than", "0s", "--dsn", d.owner.dsn)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--superseded-older-than must be a positive duration")

	// The owner prunes the superseded rows, and only them: every committed
	// row (all older than the cutoff) stays.
	committedBefore := d.owner.int(t, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed' AND created_at < now()`)
	r = runCLI(t, "", "prune", "--superseded-older-than", "1ns", "--dsn", d.owner.dsn)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, "superseded ledger rows pruned: 2,")
	require.EqualValues(t, 2, d.owner.int(t, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed' AND run_name = 'second'`))
	require.Zero(t, d.owner.int(t, `SELECT count(*) FROM runledger.ledger WHERE state = 'superseded'`))
	require.Equal(t, committedBefore, d.owner.int(t, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed'`), "no committed row pruned")

	// The database as the previous releases left it: 00004 and later
	// pending. The worker may not apply them: exit 2, nothing committed,
	// nothing applied.
	ledgertest.DownTo(t, d.owner.pool, 3)
	before = d.owner.snapshot(t)
	r = runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", manifest("pending", inlineItems([2]string{"acct-9", "x"}))), "--dsn", d.worker.dsn, "--output", "json")
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.summary(t).Error, "this login may not apply them; run runledger migrate as the schema's owner first")
	require.Equal(t, before, d.owner.snapshot(t), "nothing committed")
	require.Zero(t, d.owner.int(t, `SELECT count(*) FROM runledger.goose_db_version WHERE version_id = 4`))
}

// migrationFiles is the number of embedded migrations: all of them apply to
// an empty database.
func migrationFiles(t *testing.T) int {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	return len(files)
}

package clitest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// TestRunRefusesAnEffectWithoutTheSandbox: on a ledger whose effect sandbox
// is not set up (runledger.run_effect still the migrator's), runledger run
// with an SQL effect exits 2 at start, saying which command sets it up, and
// runs nothing; `runledger migrate --effect-role` sets it up, and the same
// run then commits its items with the effect running as that role.
func TestRunRefusesAnEffectWithoutTheSandbox(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `ALTER FUNCTION runledger.run_effect(text) OWNER TO CURRENT_USER;
CREATE TABLE notes (entity text, occurrence text, who text)`)
	run := manifest("sandboxed", inlineItems([2]string{"acct-1", "2024-06"}, [2]string{"acct-2", "2024-06"}),
		"effect: {sql: 'INSERT INTO notes SELECT entity, occurrence, current_user FROM claimed'}")
	file := writeFile(t, "run.yaml", run)

	r := runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json", "--retry-timeout", "5s")
	require.Equal(t, 2, r.code, "bad input: exit 2; stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "spec.effect.sql")
	require.Contains(t, r.stderr, "runledger migrate --grant-to WORKER --effect-role ROLE")
	require.Zero(t, d.committed(t), "nothing committed")
	require.Zero(t, d.int(t, `SELECT count(*) FROM notes`), "the effect never ran")

	r = runCLI(t, "", "migrate", "--dsn", d.dsn, "--effect-role", "")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--effect-role is empty")
	r = runCLI(t, "", "migrate", "--dsn", d.dsn, "--effect-role", "runledger_effect")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "SQL effects run as runledger_effect")

	r = runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.EqualValues(t, 2, d.committed(t))
	require.EqualValues(t, 2, d.int(t, `SELECT count(*) FROM notes WHERE who = 'runledger_effect'`), "the effect ran as the effect role")
}

// TestRunEffectThatDeallocatesStillReports: an effect that DEALLOCATEs ALL
// (the driver's prepared statements with its own) on the worker's session
// does not turn a run whose chunks committed into a failed one: the worker
// prepares its statements again, every item commits once, and the run
// reports exactly that. On the old code the run exited 1 after committing
// (the next statement by name: prepared statement does not exist).
func TestRunEffectThatDeallocatesStillReports(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	var keys [][2]string
	for i := range 20 {
		keys = append(keys, [2]string{fmt.Sprintf("acct-%02d", i), "2024-06"})
	}
	run := writeFile(t, "run.yaml", manifest("dealloc", inlineItems(keys...), "chunkSize: 5", "workers: 1",
		`effect: {sql: "DEALLOCATE ALL"}`))
	r := runCLI(t, "", "run", "-f", run, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Equal(t, counts{Total: 20, Completed: 20}, r.summary(t).counts())
	require.EqualValues(t, 20, d.committed(t))
}

// TestRunSaysWhoHoldsTheMigrationLock: a run that starts while a session
// holds the ledger's migration lock (another migrator, or user code that
// took its key) and has migrations to apply waits for it and says, every
// 10 s, which session holds it, then runs once it is free. On the old code
// it waited without a word. A run on a ledger with nothing to apply takes
// no lock and does not wait.
func TestRunSaysWhoHoldsTheMigrationLock(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "holds a session-level advisory lock on a session of its own")
	d := newDB(t)
	conn, err := d.pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	var pid int32
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(4547329604037615713)) AS l`).Scan(&pid))
	released := time.AfterFunc(12*time.Second, func() {
		_, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock(4547329604037615713)`)
	})
	defer released.Stop()

	upToDate := writeFile(t, "up-to-date.yaml", manifest("up-to-date", inlineItems([2]string{"acct-0", "2024-06"})))
	r := runCLI(t, "", "run", "-f", upToDate, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.NotContains(t, r.stderr, "waiting for the ledger's migration lock", "nothing to apply: no lock taken")
	require.Equal(t, counts{Total: 1, Completed: 1}, r.summary(t).counts())

	d.exec(t, `DROP SCHEMA runledger CASCADE`) // every migration to apply again
	run := writeFile(t, "run.yaml", manifest("waits", inlineItems([2]string{"acct-1", "2024-06"})))
	r = runCLI(t, "", "run", "-f", run, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "waiting for the ledger's migration lock")
	require.Contains(t, r.stderr, fmt.Sprintf("pid %d", pid))
	require.Equal(t, counts{Total: 1, Completed: 1}, r.summary(t).counts())
}

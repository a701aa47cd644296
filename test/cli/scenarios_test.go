package clitest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// sinkSchema is the user's side of an effect: invoices for accounts. Its
// statement trigger sleeps a little, so that a run spends most of its time
// inside a chunk's transaction (where a kill or a restart hurts most).
const sinkSchema = `
CREATE TABLE invoices (account text NOT NULL, period text NOT NULL, amount numeric NOT NULL);
CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%g); RETURN NULL; END $$;
CREATE TRIGGER slow AFTER INSERT ON invoices FOR EACH STATEMENT EXECUTE FUNCTION slow();`

const sinkEffect = `effect: {sql: "INSERT INTO invoices SELECT entity, occurrence, (payload->>'amount')::numeric FROM claimed"}`

// queryRun is a manifest whose batch is accounts lo..hi (and repeats of
// lo..lo+repeats-1), with the invoice effect.
func queryRun(name string, lo, hi, repeats, workers, chunk int) string {
	return manifest(name,
		"batch:",
		"  query: |",
		fmt.Sprintf("    SELECT 'acct-' || i AS entity, '2024-06' AS occurrence, jsonb_build_object('amount', i) AS payload FROM generate_series(%d, %d) i", lo, hi),
		fmt.Sprintf("    UNION ALL SELECT 'acct-' || i, '2024-06', jsonb_build_object('amount', i) FROM generate_series(%d, %d) i", lo, lo+repeats-1),
		sinkEffect,
		fmt.Sprintf("workers: %d", workers),
		fmt.Sprintf("chunkSize: %d", chunk),
	)
}

// checkEffectMatchesLedger: the effect ran exactly once per committed row.
func checkEffectMatchesLedger(t *testing.T, d *db) {
	t.Helper()
	require.Equal(t, d.committed(t), d.int(t, `SELECT count(*) FROM invoices`), "one invoice per committed ledger row")
	require.Zero(t, d.int(t, `SELECT count(*) FROM (SELECT 1 FROM invoices GROUP BY account, period HAVING count(*) > 1) d`), "no invoice twice")
}

// TestThreeConcurrentRuns: three runs over overlapping batches, started at
// once, each with two shards in its process: exactly one committed row (and
// one invoice) per distinct key, and the three reports add up.
func TestThreeConcurrentRuns(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.0))
	runs := []struct {
		name       string
		lo, hi, rp int
	}{{"first", 0, 5999, 100}, {"second", 3000, 8999, 0}, {"third", 0, 8999, 300}}
	results := make([]result, len(runs))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, r := range runs {
		file := writeFile(t, "run.yaml", queryRun(r.name, r.lo, r.hi, r.rp, 2, 200))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
		}()
	}
	close(start)
	wg.Wait()

	var completed, handled, total int64
	for i, r := range results {
		require.Equal(t, 0, r.code, "run %s; stderr:\n%s", runs[i].name, r.stderr)
		s := r.summary(t)
		require.EqualValues(t, runs[i].hi-runs[i].lo+1+runs[i].rp, s.Total, "run %s declared", runs[i].name)
		require.Equal(t, s.Total, s.Completed+s.AlreadyHandled+s.Failed, "run %s adds up", runs[i].name)
		require.Zero(t, s.Failed)
		require.Equal(t, s.Completed, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_name = $1`, runs[i].name), "run %s's completed are its rows", runs[i].name)
		completed, handled, total = completed+s.Completed, handled+s.AlreadyHandled, total+s.Total
	}
	require.EqualValues(t, 9000, completed, "Σ completed == distinct keys")
	require.Equal(t, total, completed+handled, "Σ completed + Σ already handled == Σ declared")
	require.EqualValues(t, 9000, d.committed(t))
	checkEffectMatchesLedger(t, d)
}

// startRun starts `runledger run` in the background.
func startRun(t *testing.T, args ...string) (*exec.Cmd, func() result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cmd, stdout, stderr := command(ctx, "", args...)
	require.NoError(t, cmd.Start())
	return cmd, func() result {
		defer cancel()
		err := cmd.Wait()
		r := result{stdout: stdout.String(), stderr: stderr.String()}
		if err != nil {
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit)
			r.code = exit.ExitCode()
			if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				r.code = -int(ws.Signal())
			}
		}
		noSecret(t, r)
		return r
	}
}

// waitUntil polls cond every 5ms for up to a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting until %s", what)
		time.Sleep(5 * time.Millisecond)
	}
}

// effectInFlight reports whether a chunk's transaction is inside the effect
// (which the ledger runs inside a DO block).
func effectInFlight(t *testing.T, d *db) bool {
	return d.int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active'
		AND pid <> pg_backend_pid() AND query LIKE '%INSERT INTO invoices%'`) > 0
}

// TestKillAndRerun: SIGKILL mid-transaction, twice, then a run to the end:
// the final report is exactly an uninterrupted run's, no row and no invoice
// twice.
func TestKillAndRerun(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.003))
	file := writeFile(t, "run.yaml", queryRun("killed", 1, 20000, 500, 2, 100))
	args := []string{"run", "-f", file, "--dsn", d.dsn, "--output", "json"}
	for kill := 1; kill <= 2; kill++ {
		before := d.committed(t)
		cmd, wait := startRun(t, args...)
		waitUntil(t, "the run has committed more", func() bool { return d.committed(t) > before+1000 })
		waitUntil(t, "an effect is in flight", func() bool { return effectInFlight(t, d) })
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		r := wait()
		require.Equal(t, -int(syscall.SIGKILL), r.code, "killed; stderr:\n%s", r.stderr)
		require.Less(t, d.committed(t), int64(20000), "killed before the end (kill %d)", kill)
		checkEffectMatchesLedger(t, d)
	}
	r := runCLI(t, "", args...)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 20500, Completed: 20000, AlreadyHandled: 500}, r.summary(t).counts(),
		"the same counts as one uninterrupted run: what the killed attempts committed counts as completed")
	require.EqualValues(t, 20000, d.committed(t))
	checkEffectMatchesLedger(t, d)
}

// TestSIGTERMStopsGracefully: SIGTERM mid-run: the chunk in flight finishes,
// no new one starts, the report is exact for what was committed, exit 1; a
// rerun finishes the batch.
func TestSIGTERMStopsGracefully(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.003))
	file := writeFile(t, "run.yaml", queryRun("terminated", 1, 20000, 0, 1, 100))
	args := []string{"run", "-f", file, "--dsn", d.dsn, "--output", "json"}
	cmd, wait := startRun(t, args...)
	waitUntil(t, "the run has committed", func() bool { return d.committed(t) > 1000 })
	waitUntil(t, "an effect is in flight", func() bool { return effectInFlight(t, d) })
	sent := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	r := wait()
	require.Less(t, time.Since(sent), 5*time.Second, "exits promptly")
	require.Equal(t, 1, r.code, "interrupted: exit 1; stderr:\n%s", r.stderr)
	s := r.summary(t)
	require.True(t, s.Interrupted, "the result says interrupted")
	require.Contains(t, s.Error, "interrupted")
	require.Contains(t, r.stderr, "stopping: no new chunk is taken")
	require.Equal(t, d.committed(t), s.Completed, "the report is exactly what was committed (the chunk in flight included)")
	require.Zero(t, s.Completed%100, "whole chunks only")
	checkEffectMatchesLedger(t, d)

	r = runCLI(t, "", args...)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 20000, Completed: 20000}, r.summary(t).counts())
	checkEffectMatchesLedger(t, d)
}

// TestRerunWritesNothing: a finished batch run again, by the same run (all
// completed: its own rows) or by another (all already handled), writes
// nothing to the ledger: the preload settles every key.
func TestRerunWritesNothing(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.0))
	file := writeFile(t, "run.yaml", queryRun("rerun", 1, 3000, 10, 3, 250))
	r := runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	first := r.summary(t).counts()
	require.Equal(t, counts{Total: 3010, Completed: 3000, AlreadyHandled: 10}, first)
	writes := d.ledgerWrites(t)

	r = runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, first, r.summary(t).counts(), "the same run again: the same report")
	r = runCLI(t, "", "run", "-f", writeFile(t, "other.yaml", queryRun("another", 1, 3000, 10, 2, 250)), "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 3010, AlreadyHandled: 3010}, r.summary(t).counts(), "another run: all already handled")
	require.Equal(t, writes, d.ledgerWrites(t), "not one statement wrote to the ledger")
	checkEffectMatchesLedger(t, d)
}

// TestFailedItemsAndExitCode: items whose effect violates a foreign key fail
// each with its error; the exit code follows maxFailedItems.
func TestFailedItemsAndExitCode(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE accounts (id text PRIMARY KEY);
INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(1, 1000) i WHERE i % 100 <> 0;
CREATE TABLE invoices (account text NOT NULL REFERENCES accounts, period text NOT NULL, amount numeric NOT NULL);`)
	run := func(name string, maxFailed int) result {
		return runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", manifest(name,
			"batch: {query: \"SELECT 'acct-' || i AS entity, '2024-06' AS occurrence, jsonb_build_object('amount', i) AS payload FROM generate_series(1, 1000) i\"}",
			sinkEffect, "workers: 2", "chunkSize: 64", fmt.Sprintf("maxFailedItems: %d", maxFailed))), "--dsn", d.dsn, "--output", "json")
	}
	r := run("within", 10)
	require.Equal(t, 0, r.code, "10 failures allowed; stderr:\n%s", r.stderr)
	s := r.summary(t)
	require.Equal(t, counts{Total: 1000, Completed: 990, Failed: 10}, s.counts())
	require.Len(t, s.Failures, 10)
	for _, f := range s.Failures {
		require.True(t, strings.HasSuffix(f.Entity, "00"), "only accounts without a row fail: %s", f.Entity)
		require.Equal(t, "2024-06", f.Occurrence)
		require.Contains(t, f.Error, `violates foreign key constraint "invoices_account_fkey"`)
		require.Equal(t, "23503", f.Class, "the error's SQLSTATE")
	}
	require.EqualValues(t, 990, d.int(t, `SELECT count(*) FROM invoices`))
	require.EqualValues(t, 10, d.int(t, `SELECT sum(items) FROM runledger.item_failure WHERE run_name = 'within' AND class = '23503'`),
		"every failure recorded in the ledger database")

	r = run("beyond", 9)
	require.Equal(t, 1, r.code, "10 failures, 9 allowed; stderr:\n%s", r.stderr)
	s = r.summary(t)
	require.Contains(t, s.Error, "more than spec.maxFailedItems (9)")
	require.EqualValues(t, 10, s.Failed, "the 990 others are already handled by run within")
}

// proxy forwards TCP connections on addr to the cluster's unix socket, so a
// test can make the database unreachable (not listening yet) and then
// reachable, without touching the server other tests use.
func proxy(t *testing.T, addr, socket string) {
	t.Helper()
	pgtest.NewProxy(t, socket, pgtest.ProxyOptions{Listen: addr})
}

// freeAddr returns a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// socketOf returns the unix socket path of a keyword/value DSN.
func socketOf(dsn string) (string, string) {
	kv := map[string]string{}
	for _, f := range strings.Fields(dsn) {
		k, v, _ := strings.Cut(f, "=")
		kv[k] = v
	}
	return filepath.Join(kv["host"], ".s.PGSQL."+kv["port"]), kv["dbname"]
}

// TestDatabaseDownAtStart: the database is unreachable when the run starts;
// it retries with back-off, and completes once the database is up. A
// database that stays down fails the run clearly (exit 1), never leaking the
// password.
func TestDatabaseDownAtStart(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "a proxy of its own in front of PostgreSQL's socket")
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.0))
	socket, dbname := socketOf(d.dsn)
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	dsn := fmt.Sprintf("postgres://postgres:%s@%s:%s/%s?sslmode=disable&connect_timeout=2", password, host, port, dbname)
	file := writeFile(t, "run.yaml", queryRun("late-db", 1, 2000, 0, 2, 100))

	_, wait := startRun(t, "run", "-f", file, "--dsn", dsn, "--output", "json")
	time.Sleep(1500 * time.Millisecond)
	proxy(t, addr, socket)
	r := wait()
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "database not reachable, retrying")
	require.Equal(t, counts{Total: 2000, Completed: 2000}, r.summary(t).counts())
	checkEffectMatchesLedger(t, d)

	// Down for good: a clear failure within --retry-timeout.
	down := fmt.Sprintf("postgres://postgres:%s@%s/%s?sslmode=disable", password, freeAddr(t), dbname)
	started := time.Now()
	r = runCLI(t, "", "run", "-f", file, "--dsn", down, "--output", "json", "--retry-timeout", "3s")
	require.Less(t, time.Since(started), 20*time.Second)
	require.Equal(t, 1, r.code, "stderr:\n%s", r.stderr)
	s := r.summary(t)
	require.Contains(t, s.Error, "migrating the ledger: giving up after")
	require.Contains(t, s.Error, "connection refused")
}

// TestDatabaseRestartedMidRun: the PostgreSQL server restarts (every
// connection dropped, the chunk in flight lost) while two shards run; they
// retry, reopen their query where they were, and finish with exact counts.
// Not parallel: it restarts the server every test of this binary uses.
func TestDatabaseRestartedMidRun(t *testing.T) {
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.003))
	raw := strings.TrimSuffix(d.dsn, " password="+password)
	file := writeFile(t, "run.yaml", queryRun("restarted", 1, 20000, 200, 2, 100))
	_, wait := startRun(t, "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	waitUntil(t, "the run has committed", func() bool { return d.committed(t) > 2000 })
	waitUntil(t, "an effect is in flight", func() bool { return effectInFlight(t, d) })
	require.NoError(t, pgtest.Server(t).Restart(context.Background()), "restarting PostgreSQL")
	d.pool = pgtest.Pool(t, raw) // the old pool's connections died with the server

	r := wait()
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "retrying", "the restart was noticed and ridden out")
	require.Equal(t, counts{Total: 20200, Completed: 20000, AlreadyHandled: 200}, r.summary(t).counts())
	require.EqualValues(t, 20000, d.committed(t))
	checkEffectMatchesLedger(t, d)
}

// TestSameRunTwiceAtOnce: the same manifest started twice at once: the second
// process finds every shard busy and exits 1 without touching anything (else
// each would count the other's rows as its own); the first finishes with
// exact counts.
func TestSameRunTwiceAtOnce(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.003))
	file := writeFile(t, "run.yaml", queryRun("twice", 1, 10000, 0, 2, 100))
	args := []string{"run", "-f", file, "--dsn", d.dsn, "--output", "json"}
	_, wait := startRun(t, args...)
	waitUntil(t, "the first run has committed", func() bool { return d.committed(t) > 500 })
	_, waitPatient := startRun(t, append(args, "--lock-wait", "2m")...)
	r := runCLI(t, "", append(args, "--lock-wait", "0s")...)
	require.Equal(t, 1, r.code, "stderr:\n%s", r.stderr)
	s := r.summary(t)
	require.Contains(t, s.Error, "this shard of this run is being processed by another process")
	require.Equal(t, counts{}, s.counts(), "the impatient process processed nothing")

	r = wait()
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 10000, Completed: 10000}, r.summary(t).counts())
	r = waitPatient()
	require.Equal(t, 0, r.code, "the patient process ran once the first was done; stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 10000, Completed: 10000}, r.summary(t).counts(), "the same run's rows: completed")
	checkEffectMatchesLedger(t, d)
}

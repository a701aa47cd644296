package clitest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRunInlineItems(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	file := writeFile(t, "run.yaml", manifest("june-invoices",
		inlineItems([2]string{"acct-1", "2024-06"}, [2]string{"acct-2", "2024-06"}, [2]string{"acct-3", "2024-06"},
			[2]string{"acct-1", "2024-06"}), // a repeat
		"workers: 2",
	))
	r := runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "exit code; stderr:\n%s", r.stderr)
	sum := r.summary(t)
	require.Equal(t, counts{Total: 4, Completed: 3, AlreadyHandled: 1}, sum.counts())
	// What the ledger's server promises of a commit, as it says itself.
	require.NotNil(t, sum.Replication, "the summary says what the ledger's server promises")
	var commit, names string
	require.NoError(t, d.pool.QueryRow(context.Background(),
		`SELECT reset_val, current_setting('synchronous_standby_names') FROM pg_settings WHERE name = 'synchronous_commit'`).Scan(&commit, &names))
	require.Equal(t, commit, sum.Replication.SynchronousCommit)
	require.Equal(t, names, sum.Replication.SynchronousStandbyNames)
	require.Contains(t, r.stderr, `"synchronousCommit":"`+commit+`"`, "a log line says it at start")
	require.EqualValues(t, 3, d.committed(t))
	require.EqualValues(t, 3, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_namespace = 'billing' AND run_name = 'june-invoices'`))
	require.Contains(t, r.stderr, "processing run", "a log line on stderr")
	require.Contains(t, r.stderr, `"uidFrom":"derived from namespace/name"`)

	// The text output, from stdin, with the DSN from the environment, as a URL.
	cmdEnvDSN := d.urlDSN(t)
	r = runCLI(t, readFile(t, file), "run", "-f", "-", "--dsn", cmdEnvDSN)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, "total 4, completed 3, already handled 1, failed 0", "the same run again counts its own rows as completed")
	require.Contains(t, r.stdout, "synchronous_commit="+commit+", synchronous_standby_names='"+names+"'", "the summary's replication line")
}

// TestRunMergeKeys is issue #43.7: a YAML merge key whose merged keys a
// later key overrides is read as kubectl reads it, and the run commits
// those payloads.
func TestRunMergeKeys(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	file := writeFile(t, "run.yaml", manifest("merged", "batch:", "  items:",
		"  - &first {entity: acct-1, occurrence: 2024-06, payload: &base {currency: EUR, amount: 1}}",
		"  - <<: *first",
		"    entity: acct-2",
		"    payload: {<<: *base, amount: 2}",
	))
	r := runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "exit code; stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 2, Completed: 2}, r.summary(t).counts())
	for entity, payload := range map[string]string{"acct-1": `{"currency": "EUR", "amount": 1}`, "acct-2": `{"currency": "EUR", "amount": 2}`} {
		require.EqualValues(t, 1, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE entity = $1 AND occurrence = '2024-06' AND payload = $2::jsonb`, entity, payload), entity)
	}
}

func TestRunConfigMapSource(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	var lines []string
	for i := range 300 {
		lines = append(lines, fmt.Sprintf(`{"entity": "acct-%d", "occurrence": "2024-06", "payload": {"amount": %d}}`, i%250, i))
	}
	jsonl := strings.Join(lines, "\n")
	run := manifest("from-configmap", "batch:", "  configMapRef: {name: june, key: items.jsonl}", "workers: 3", "chunkSize: 40")

	// The ConfigMap in the same file.
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: june, namespace: billing}\ndata:\n  items.jsonl: |\n"
	for _, l := range lines {
		cm += "    " + l + "\n"
	}
	secret := "apiVersion: v1\nkind: Secret\nmetadata: {name: billing-db}\nstringData: {dsn: ignored}\n"
	file := writeFile(t, "run.yaml", "# a run and its items\n---\n"+secret+"---\n"+cm+"---\n"+run)
	r := runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 300, Completed: 250, AlreadyHandled: 50}, r.summary(t).counts())

	// The same items from --from-file, for another run: all already handled.
	items := writeFile(t, "items.jsonl", jsonl)
	r = runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", strings.Replace(run, "from-configmap", "from-file", 1)),
		"--from-file", items, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 300, AlreadyHandled: 300}, r.summary(t).counts())
	require.EqualValues(t, 250, d.committed(t))
}

func TestRunQuerySourceByShard(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE usage (account text, period text, amount numeric);
INSERT INTO usage SELECT 'acct-' || i, '2024-06', i FROM generate_series(1, 5000) i;
INSERT INTO usage SELECT 'acct-' || i, '2024-06', i FROM generate_series(1, 100) i;`)
	file := writeFile(t, "run.yaml", manifest("by-shard",
		"batch:",
		"  query: |",
		"    SELECT account AS entity, period AS occurrence, jsonb_build_object('amount', amount) AS payload",
		"    FROM usage",
		"workers: 4",
		"chunkSize: 300",
	))
	var sum counts
	for s := range 4 {
		r := runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--shard", fmt.Sprintf("%d/4", s), "--output", "json")
		require.Equal(t, 0, r.code, "shard %d; stderr:\n%s", s, r.stderr)
		c := r.summary(t).counts()
		require.NotZero(t, c.Total, "shard %d has rows", s)
		require.Equal(t, c.Total, c.Completed+c.AlreadyHandled+c.Failed, "shard %d adds up", s)
		require.EqualValues(t, c.Completed, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE shard = $1`, s), "shard %d committed its rows", s)
		sum.Total += c.Total
		sum.Completed += c.Completed
		sum.AlreadyHandled += c.AlreadyHandled
	}
	require.Equal(t, counts{Total: 5100, Completed: 5000, AlreadyHandled: 100}, sum)
	require.EqualValues(t, 5000, d.committed(t))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := osReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// TestRunSupersede: a second run over the same keys with onExisting:
// Supersede reprocesses every item (its effect runs again) and retires the
// first run's rows; run again, it supersedes nothing more.
func TestRunSupersede(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE invoices (account text NOT NULL, period text NOT NULL, amount numeric NOT NULL)`)
	items := make([]string, 0, 20)
	for i := range 20 {
		items = append(items, fmt.Sprintf(`{"entity": "acct-%d", "occurrence": "2024-06", "payload": {"amount": %d}}`, i, i))
	}
	jsonl := writeFile(t, "items.jsonl", strings.Join(items, "\n"))
	run := func(name string, extra ...string) result {
		spec := append([]string{"batch: {configMapRef: {name: june, key: items.jsonl}}",
			`effect: {sql: "INSERT INTO invoices SELECT entity, occurrence, (payload->>'amount')::numeric FROM claimed"}`}, extra...)
		// The JSON Lines come from stdin this time.
		return runCLI(t, readFile(t, jsonl), "run", "-f", writeFile(t, "run.yaml", manifest(name, spec...)), "--from-file", "-", "--dsn", d.dsn, "--output", "json")
	}
	r := run("v1")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 20, Completed: 20}, r.summary(t).counts())

	r = run("v2", "onExisting: Supersede")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 20, Completed: 20}, r.summary(t).counts(), "every item reprocessed")
	require.EqualValues(t, 20, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_name = 'v1' AND state = 'superseded'`))
	require.EqualValues(t, 20, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_name = 'v2' AND state = 'committed'`))
	require.EqualValues(t, 40, d.int(t, `SELECT count(*) FROM invoices`), "the effect ran again for each item")

	writes := d.ledgerWrites(t)
	r = run("v2", "onExisting: Supersede")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 20, Completed: 20}, r.summary(t).counts(), "its own rows: completed")
	require.Equal(t, writes, d.ledgerWrites(t), "nothing superseded twice, nothing written")
	require.EqualValues(t, 40, d.int(t, `SELECT count(*) FROM invoices`))
	require.EqualValues(t, 20, d.committed(t))
}

// TestRunEditedQueryIsRefused is issue #20.6 as a user meets it: the
// manifest's batch.query edited and `runledger run` again under the same
// run name exits 2 (bad input) with nothing committed, instead of processing
// the batch the first query fixed and reporting it complete.
func TestRunEditedQueryIsRefused(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE usage (account text, period text, amount numeric);
INSERT INTO usage SELECT 'acct-' || i, '2024-06', i FROM generate_series(1, 100) i;`)
	run := func(query string) result {
		file := writeFile(t, "run.yaml", manifest("edited", "batch:", "  query: |", "    "+query))
		return runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	}
	r := run(`SELECT account AS entity, period AS occurrence FROM usage WHERE amount <= 50`)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 50, Completed: 50}, r.summary(t).counts())

	r = run(`SELECT account AS entity, period AS occurrence FROM usage`)
	require.Equal(t, 2, r.code, "an edited query is bad input; stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "batch.query has changed since the run started")
	require.Equal(t, counts{Total: 50, Completed: 50}, r.summary(t).counts(),
		"what the ledger holds of the run (the first invocation's rows and batch), nothing of the edited query")
	require.EqualValues(t, 50, d.committed(t), "nothing more committed")

	r = run(`SELECT account AS entity, period AS occurrence FROM usage WHERE amount <= 50`)
	require.Equal(t, 0, r.code, "the query as it was: fine; stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 50, Completed: 50}, r.summary(t).counts())
}

package clitest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunFromRunRetriesTheFailed: `runledger run` of a run whose effect
// refuses some items exits 1 and lists them; once the cause is fixed, a
// small manifest with batch.fromRun retries exactly those items, with their
// payloads, and exits 0; run again, it is the same batch and writes nothing.
// A fromRun naming no run exits 2 with nothing committed.
func TestRunFromRunRetriesTheFailed(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE accounts (id text PRIMARY KEY);
INSERT INTO accounts SELECT 'acct-' || lpad(i::text, 2, '0') FROM generate_series(0, 29) i WHERE i % 5 <> 0;
CREATE TABLE invoices (account text NOT NULL REFERENCES accounts, amount numeric NOT NULL)`)
	var lines []string
	for i := range 30 {
		lines = append(lines, fmt.Sprintf(`{"entity": "acct-%02d", "occurrence": "2024-06", "payload": {"amount": %d}}`, i, 100+i))
	}
	effect := `effect: {sql: "INSERT INTO invoices SELECT entity, (payload->>'amount')::numeric FROM claimed"}`
	// maxFailedItems 5: neither shard's failures alone exceed it, so the
	// other shard takes its chunk whichever ends first (a shard takes no
	// chunk once the run's failures exceed it).
	r := runCLI(t, "", "run", "-f", writeFile(t, "june.yaml", manifest("june", "batch: {configMapRef: {name: june, key: items.jsonl}}", effect, "workers: 2", "maxFailedItems: 5")),
		"--from-file", writeFile(t, "items.jsonl", strings.Join(lines, "\n")), "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 1, r.code, "6 accounts are missing: more failures than maxFailedItems; stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 30, Completed: 24, Failed: 6}, r.summary(t).counts())
	var failed []string
	for _, f := range r.summary(t).Failures {
		failed = append(failed, f.Entity)
	}
	slices.Sort(failed)
	require.Equal(t, []string{"acct-00", "acct-05", "acct-10", "acct-15", "acct-20", "acct-25"}, failed)

	// The accounts created, the failed items retried by a run of their own.
	d.exec(t, `INSERT INTO accounts SELECT 'acct-' || lpad(i::text, 2, '0') FROM generate_series(0, 29, 5) i`)
	retry := writeFile(t, "retry.yaml", manifest("june-retry", "batch: {fromRun: {name: june}}", effect, "workers: 3"))
	r = runCLI(t, "", "run", "-f", retry, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 6, Completed: 6}, r.summary(t).counts())
	require.Contains(t, r.stderr, "the failed items of run june")
	require.EqualValues(t, 6, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_name = 'june-retry'`))
	require.EqualValues(t, 30, d.committed(t))
	require.EqualValues(t, 30, d.int(t, `SELECT count(*) FROM invoices`), "each effect once")
	require.EqualValues(t, 6, d.int(t, `SELECT count(*) FROM invoices WHERE amount = 100 + substr(account, 6)::int AND substr(account, 6)::int % 5 = 0`),
		"with the payloads the items failed with")

	writes := d.ledgerWrites(t)
	r = runCLI(t, "", "run", "-f", retry, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 6, Completed: 6}, r.summary(t).counts(), "its own rows: completed")
	require.Equal(t, writes, d.ledgerWrites(t))

	r = runCLI(t, "", "run", "-f", writeFile(t, "typo.yaml", manifest("typo-retry", "batch: {fromRun: {name: jnue}}", effect)), "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "batch.fromRun names no run to retry: run billing/jnue")
	require.EqualValues(t, 30, d.committed(t))
}

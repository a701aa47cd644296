package clitest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunPayloadChanged: another run over keys already handled reports, in
// its JSON result, how many of them came with a payload that differs from
// the committed row's (the same values spelled otherwise do not count);
// with onPayloadChange: Fail exactly those fail (and count
// against maxFailedItems), and nothing of the first run's rows or effect changes.
func TestRunPayloadChanged(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE invoices (account text NOT NULL, amount numeric NOT NULL)`)
	lines := func(amount func(i int) string) string {
		var out []string
		for i := range 20 {
			out = append(out, fmt.Sprintf(`{"entity": "acct-%02d", "occurrence": "2024-06", "payload": %s}`, i, amount(i)))
		}
		return strings.Join(out, "\n")
	}
	run := func(name, jsonl string, extra ...string) result {
		spec := append([]string{"batch: {configMapRef: {name: june, key: items.jsonl}}", "workers: 2", "chunkSize: 3",
			`effect: {sql: "INSERT INTO invoices SELECT entity, (payload->>'amount')::numeric FROM claimed"}`}, extra...)
		return runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", manifest(name, spec...)),
			"--from-file", writeFile(t, "items.jsonl", jsonl), "--dsn", d.dsn, "--output", "json")
	}
	r := run("v1", lines(func(i int) string { return fmt.Sprintf(`{"amount": %d, "currency": "EUR"}`, i) }))
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 20, Completed: 20}, r.summary(t).counts())
	require.Zero(t, r.summary(t).PayloadChanged)

	// Every fourth amount changed; the others the same values, reordered
	// and spelled otherwise.
	changed := func(i int) string {
		if i%4 == 0 {
			return fmt.Sprintf(`{"amount": %d, "currency": "EUR"}`, i+100)
		}
		return fmt.Sprintf(`{"currency":"EUR","amount":%d.0}`, i)
	}
	r = run("v2", lines(changed))
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	s := r.summary(t)
	require.Equal(t, counts{Total: 20, AlreadyHandled: 20}, s.counts())
	require.EqualValues(t, 5, s.PayloadChanged)
	require.Empty(t, s.Failures)

	r = run("v3", lines(changed), "onPayloadChange: Fail", "maxFailedItems: 5")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	s = r.summary(t)
	require.Equal(t, counts{Total: 20, AlreadyHandled: 15, Failed: 5}, s.counts())
	require.EqualValues(t, 5, s.PayloadChanged)
	var failed []string
	for _, f := range s.Failures {
		failed = append(failed, f.Entity)
		require.Contains(t, f.Error, "spec.onPayloadChange: Fail")
	}
	slices.Sort(failed)
	require.Equal(t, []string{"acct-00", "acct-04", "acct-08", "acct-12", "acct-16"}, failed, "exactly the changed ones")

	// They count against maxFailedItems like any failure.
	r = run("v4", lines(changed), "onPayloadChange: Fail")
	require.Equal(t, 1, r.code, "failed items, more than maxFailedItems (0); stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "more than spec.maxFailedItems (0)")

	require.EqualValues(t, 20, d.committed(t))
	require.EqualValues(t, 20, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_name = 'v1'`), "the first run's rows, untouched")
	require.EqualValues(t, 20, d.int(t, `SELECT count(*) FROM invoices`), "the effect ran once per item")
	require.EqualValues(t, 0, d.int(t, `SELECT count(*) FROM invoices WHERE amount >= 100`))
}

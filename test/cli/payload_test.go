package clitest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
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
	files := func(name, jsonl string, extra ...string) []string {
		spec := append([]string{"batch: {configMapRef: {name: june, key: items.jsonl}}", "workers: 2", "chunkSize: 3",
			`effect: {sql: "INSERT INTO invoices SELECT entity, (payload->>'amount')::numeric FROM claimed"}`}, extra...)
		return []string{"-f", writeFile(t, "run.yaml", manifest(name, spec...)), "--from-file", writeFile(t, "items.jsonl", jsonl)}
	}
	run := func(name, jsonl string, extra ...string) result {
		return runCLI(t, "", append([]string{"run", "--dsn", d.dsn, "--output", "json"}, files(name, jsonl, extra...)...)...)
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
	r2 := r
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

	// runledger verify proves payloadChanged too, already handled (v2) or
	// failed (v3): against runledger run's JSON, or a count given.
	for _, v := range []struct {
		name  string
		extra []string
		sum   string
	}{{"v2", nil, writeFile(t, "v2.json", r2.stdout)}, {"v3", []string{"onPayloadChange: Fail", "maxFailedItems: 5"}, writeFile(t, "v3.json", r.stdout)}} {
		p, _ := verify(t, d, "", v.name, append(files(v.name, lines(changed), v.extra...), "--summary", v.sum)...)
		require.True(t, p.Proven, p.Summary)
		require.EqualValues(t, 5, p.Ledger.PayloadChanged)
		require.Equal(t, int64(5), *p.Reported.PayloadChanged)
		c := p.counts()
		p, _ = verify(t, d, "", v.name, append(files(v.name, lines(changed), v.extra...), "--expect-completed", "0",
			"--expect-already-handled", fmt.Sprint(c.AlreadyHandled), "--expect-failed", fmt.Sprint(c.Failed), "--expect-payload-changed", "4")...)
		require.False(t, p.Proven)
		require.Contains(t, p.Summary, "payloadChanged 4 reported, 5 in the ledger")
	}

	// They count against maxFailedItems like any failure.
	r = run("v4", lines(changed), "onPayloadChange: Fail")
	require.Equal(t, 1, r.code, "failed items, more than maxFailedItems (0); stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "more than spec.maxFailedItems (0)")

	require.EqualValues(t, 20, d.committed(t))
	require.EqualValues(t, 20, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_name = 'v1'`), "the first run's rows, untouched")
	require.EqualValues(t, 20, d.int(t, `SELECT count(*) FROM invoices`), "the effect ran once per item")
	require.EqualValues(t, 0, d.int(t, `SELECT count(*) FROM invoices WHERE amount >= 100`))
}

// TestItemsPayloadChanged: runledger items lists the repeats whose payload
// changed, as many as status.payloadChanged counts: with onPayloadChange:
// Report already handled items marked payloadChanged (a jsonb or a text
// payload, the same values spelled otherwise not marked), with Fail failed
// items of class payload-changed (and not also already handled); a run
// whose batch is not kept cannot list them (bad input).
func TestItemsPayloadChanged(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE invoices (account text NOT NULL, amount numeric NOT NULL)`)
	const effect = `effect: {sql: "INSERT INTO invoices SELECT entity, (payload->>'amount')::numeric FROM claimed"}`
	run := func(name, payload string, extra ...string) summary {
		spec := append([]string{"batch:", "  query: |",
			"    SELECT 'acct-' || lpad(i::text, 2, '0') AS entity, '2024-06' AS occurrence, " + payload + " AS payload FROM generate_series(0, 19) i",
			"workers: 2", "chunkSize: 3", effect}, extra...)
		r := runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", manifest(name, spec...)), "--dsn", d.dsn, "--output", "json")
		require.Equal(t, 0, r.code, "run %s; stderr:\n%s", name, r.stderr)
		return r.summary(t)
	}
	items := func(name string, args ...string) []item {
		return decodeItems(t, runCLI(t, "", append([]string{"items", name, "-n", "billing", "--output", "json", "--dsn", d.dsn}, args...)...))
	}
	entities := func(its []item) []string {
		out := []string{}
		for _, it := range its {
			out = append(out, it.Entity)
		}
		return out
	}
	changedKeys := []string{"acct-00", "acct-04", "acct-08", "acct-12", "acct-16"}

	require.Equal(t, counts{Total: 20, Completed: 20}, run("v1", `jsonb_build_object('amount', i, 'currency', 'EUR')`).counts())
	require.Empty(t, items("v1", "--payload-changed"), "a run of fresh keys has none")

	// Every fourth amount changed; the others the same values spelled
	// otherwise: a jsonb (1.0 for 1) and a text payload (keys reordered).
	for _, payload := range []string{
		`jsonb_build_object('amount', CASE WHEN i % 4 = 0 THEN i + 100 ELSE i END::numeric(5,1), 'currency', 'EUR')`,
		`format('{"currency":"EUR",  "amount": %s}', CASE WHEN i % 4 = 0 THEN i + 100 ELSE i END)`,
	} {
		name := map[bool]string{true: "v2", false: "v3"}[strings.HasPrefix(payload, "jsonb")]
		s := run(name, payload)
		require.Equal(t, counts{Total: 20, AlreadyHandled: 20}, s.counts())
		require.EqualValues(t, 5, s.PayloadChanged)
		listed := items(name, "--payload-changed")
		require.Equal(t, changedKeys, entities(listed), "%s: exactly the changed ones", name)
		for _, it := range listed {
			require.Equal(t, "AlreadyHandled", it.Verdict)
			require.True(t, it.PayloadChanged)
			require.Equal(t, "v1", it.HeldBy.Name)
		}
		all := items(name, "--already-handled")
		require.Len(t, all, 20)
		var marked []string
		for _, it := range all {
			if it.PayloadChanged {
				marked = append(marked, it.Entity)
			}
		}
		require.Equal(t, changedKeys, marked, "%s: the same values spelled otherwise are plain already handled", name)
	}
	table := runCLI(t, "", "items", "v2", "-n", "billing", "--payload-changed", "--dsn", d.dsn)
	require.Equal(t, 0, table.code, table.stderr)
	rows := strings.Split(strings.TrimSuffix(table.stdout, "\n"), "\n")
	require.Len(t, rows, 6, "a header and a row per changed item:\n%s", table.stdout)
	require.Regexp(t, `^AlreadyHandled +acct-00 +2024-06 +\d +0 +\S+ +held by billing/v1 \(\S+\), payload changed$`, rows[1])

	// onPayloadChange: Fail: the same five, failed, and only failed.
	s := run("v4", `jsonb_build_object('amount', CASE WHEN i % 4 = 0 THEN i + 100 ELSE i END, 'currency', 'EUR')`,
		"onPayloadChange: Fail", "maxFailedItems: 5")
	require.Equal(t, counts{Total: 20, AlreadyHandled: 15, Failed: 5}, s.counts())
	listed := items("v4", "--payload-changed")
	require.Equal(t, changedKeys, entities(listed))
	for _, it := range listed {
		require.Equal(t, "Failed", it.Verdict)
		require.Equal(t, "payload-changed", it.Class)
	}
	require.Len(t, items("v4", "--already-handled"), 15, "a failed key is listed as Failed only, as the counts say")
	for _, it := range items("v4", "--already-handled") {
		require.False(t, it.PayloadChanged, it.Entity)
	}

	// Inline items: the batch is not kept, whose payloads are not known.
	r := runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", manifest("v5", inlineItems([2]string{"acct-00", "2024-06"}), effect)),
		"--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.EqualValues(t, 1, r.summary(t).PayloadChanged)
	r = runCLI(t, "", "items", "v5", "-n", "billing", "--payload-changed", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitBadInput, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "is not kept in the ledger database")

	require.EqualValues(t, 20, d.committed(t))
	require.EqualValues(t, 20, d.int(t, `SELECT count(*) FROM invoices`), "the effect ran once per item")
}

// TestRunPayloadChangedLaterCopy (#43): with another run holding k1
// {"v": 1}, a run listing k1 {"v": 1} then k1 {"v": 2}, or the other way
// round, has k1's payload changed: under onPayloadChange: Fail both copies
// fail (exit 1 over maxFailedItems 0) and payloadChanged is 1, as
// `runledger items --payload-changed` lists k1; under Report both are
// already handled, payloadChanged 1. A ConfigMap's items and a query's rows.
func TestRunPayloadChangedLaterCopy(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	const cm = "batch: {configMapRef: {name: items, key: items.jsonl}}"
	k1 := func(v int) string {
		return fmt.Sprintf(`{"entity": "k1", "occurrence": "2024-06", "payload": {"v": %d}}`, v)
	}
	r := runCLI(t, "", "run", "-f", writeFile(t, "a.yaml", manifest("a", cm)), "--from-file", writeFile(t, "a.jsonl", k1(1)), "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)

	for _, c := range []struct {
		name, batch, from string
		spec              []string
		code              int
		want              counts
		verdict           string
	}{
		{name: "fail", batch: cm, from: k1(1) + "\n" + k1(2), spec: []string{"onPayloadChange: Fail"}, code: 1, want: counts{Total: 2, Failed: 2}, verdict: "Failed"},
		{name: "fail-reversed", batch: cm, from: k1(2) + "\n" + k1(1), spec: []string{"onPayloadChange: Fail"}, code: 1, want: counts{Total: 2, Failed: 2}, verdict: "Failed"},
		{name: "report", batch: cm, from: k1(1) + "\n" + k1(2), code: 0, want: counts{Total: 2, AlreadyHandled: 2}, verdict: "AlreadyHandled"},
		{name: "query-fail", batch: `batch: {query: "SELECT 'k1' AS entity, '2024-06' AS occurrence, p::jsonb AS payload FROM (VALUES (1, '{\"v\": 1}'), (2, '{\"v\": 2}')) AS r(n, p) ORDER BY n"}`,
			spec: []string{"onPayloadChange: Fail"}, code: 1, want: counts{Total: 2, Failed: 2}, verdict: "Failed"},
		{name: "query-report", batch: `batch: {query: "SELECT 'k1' AS entity, '2024-06' AS occurrence, p::jsonb AS payload FROM (VALUES (1, '{\"v\": 1}'), (2, '{\"v\": 2}')) AS r(n, p) ORDER BY n"}`,
			code: 0, want: counts{Total: 2, AlreadyHandled: 2}, verdict: "AlreadyHandled"},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := writeFile(t, "run.yaml", manifest(c.name, append([]string{c.batch}, c.spec...)...))
			args := []string{"-f", run}
			if c.from != "" {
				args = append(args, "--from-file", writeFile(t, "items.jsonl", c.from))
			}
			r := runCLI(t, "", append(append([]string{"run"}, args...), "--dsn", d.dsn, "--output", "json")...)
			require.Equal(t, c.code, r.code, "stderr:\n%s", r.stderr)
			s := r.summary(t)
			require.Equal(t, c.want, s.counts())
			require.EqualValues(t, 1, s.PayloadChanged)

			if c.from == "" {
				args = nil // a query's batch is kept in the ledger database
			}
			res := runCLI(t, "", append([]string{"items", c.name, "-n", "billing", "--payload-changed", "--output", "json", "--dsn", d.dsn}, args...)...)
			listed := decodeItems(t, res)
			require.Len(t, listed, 1, "as many as payloadChanged counts")
			require.Equal(t, "k1", listed[0].Entity)
			require.Equal(t, c.verdict, listed[0].Verdict)
		})
	}
	require.EqualValues(t, 1, d.committed(t), "run a's row only")
}

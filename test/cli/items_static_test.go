package clitest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestItemsOfAStaticBatch: the already handled items of a run of inline
// items or a ConfigMap, whose batch the ledger database does not keep, are
// listed from its manifest given with -f (a ConfigMap's items with
// --from-file, a manifest on stdin as kubectl prints it), checked against the
// digest the run recorded: the same keys, holders and payloadChanged marks
// as its counts say; items that are not the run's batch, a query run's
// manifest or another run's are refused as bad input with nothing listed.
func TestItemsOfAStaticBatch(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE invoices (account text NOT NULL, amount numeric NOT NULL)`)
	const effect = `effect: {sql: "INSERT INTO invoices SELECT entity, (payload->>'amount')::numeric FROM claimed"}`
	line := func(i, amount int) string {
		return fmt.Sprintf(`{"entity": "acct-%02d", "occurrence": "2024-06", "payload": {"amount": %d}}`, i, amount)
	}
	// june: acct-00..09 from a ConfigMap.
	var june []string
	for i := range 10 {
		june = append(june, line(i, i))
	}
	juneRun := writeFile(t, "june.yaml", manifest("june", "batch: {configMapRef: {name: june, key: items.jsonl}}", effect, "workers: 2", "chunkSize: 3"))
	juneItems := writeFile(t, "june.jsonl", strings.Join(june, "\n"))
	r := runCLI(t, "", "run", "-f", juneRun, "--from-file", juneItems, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)

	// again: acct-05..14 from a ConfigMap, acct-06 twice, acct-07's amount
	// changed: 05..09 already handled (07 changed), 10..14 completed.
	var again []string
	for i := 5; i < 15; i++ {
		amount := i
		if i == 7 {
			amount = 700
		}
		again = append(again, line(i, amount))
	}
	again = append(again, line(6, 6))
	againRun := writeFile(t, "again.yaml", manifest("again", "batch: {configMapRef: {name: june, key: items.jsonl}}", effect, "workers: 3", "chunkSize: 2"))
	againItems := writeFile(t, "again.jsonl", strings.Join(again, "\n"))
	r = runCLI(t, "", "run", "-f", againRun, "--from-file", againItems, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)
	s := r.summary(t)
	require.Equal(t, counts{Total: 11, Completed: 5, AlreadyHandled: 6}, s.counts(), "acct-06's two copies count twice")
	require.EqualValues(t, 1, s.PayloadChanged)

	items := func(args ...string) []item {
		res := runCLI(t, "", append([]string{"items", "again", "-n", "billing", "--output", "json", "--dsn", d.dsn}, args...)...)
		require.Equal(t, 0, res.code, res.stderr)
		return decodeItems(t, res)
	}
	entities := func(its []item) []string {
		out := []string{}
		for _, it := range its {
			out = append(out, it.Entity)
		}
		return out
	}

	handled := items("-f", againRun, "--from-file", againItems, "--already-handled")
	require.Equal(t, []string{"acct-05", "acct-06", "acct-07", "acct-08", "acct-09"}, entities(handled), "each key once, in key order")
	for _, it := range handled {
		require.Equal(t, "AlreadyHandled", it.Verdict)
		require.NotNil(t, it.HeldBy)
		require.Equal(t, "june", it.HeldBy.Name)
		require.Equal(t, it.Entity == "acct-07", it.PayloadChanged, it.Entity)
	}
	require.Equal(t, []string{"acct-07"}, entities(items("-f", againRun, "--from-file", againItems, "--payload-changed")),
		"as many as status.payloadChanged counts")

	all := byVerdict(items("-f", againRun, "--from-file", againItems))
	require.Len(t, all["Completed"], int(s.Completed))
	require.Empty(t, all["Failed"])
	require.Len(t, all["AlreadyHandled"], 5)

	// The manifest on stdin, as kubectl prints it, its ConfigMap beside it.
	var cm strings.Builder
	cm.WriteString("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: june, namespace: billing}\ndata:\n  items.jsonl: |\n")
	for _, l := range again {
		cm.WriteString("    " + l + "\n")
	}
	againManifest, err := osReadFile(againRun)
	require.NoError(t, err)
	res := runCLI(t, string(againManifest)+cm.String(), "items", "again", "--already-handled", "-f", "-", "--output", "json", "--dsn", d.dsn)
	require.Equal(t, 0, res.code, "the namespace is the manifest's; stderr:\n%s", res.stderr)
	require.Equal(t, entities(handled), entities(decodeItems(t, res)))

	// Inline items.
	inline := writeFile(t, "inline.yaml", manifest("inline", inlineItems([2]string{"acct-02", "2024-06"}, [2]string{"acct-20", "2024-06"}), effect))
	r = runCLI(t, "", "run", "-f", inline, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.EqualValues(t, 1, r.summary(t).PayloadChanged, "acct-02's amount 1, june's 2")
	res = runCLI(t, "", "items", "inline", "-n", "billing", "--payload-changed", "-f", inline, "--output", "json", "--dsn", d.dsn)
	require.Equal(t, 0, res.code, res.stderr)
	require.Equal(t, []string{"acct-02"}, entities(decodeItems(t, res)))
	committed := d.committed(t)

	// Refused, with nothing listed.
	edited := strings.Replace(strings.Join(again, "\n"), `"amount": 700`, `"amount": 701`, 1)
	query := writeFile(t, "query.yaml", manifest("query", "batch:", "  query: |", `    SELECT 'acct-30' AS entity, '2024-06' AS occurrence, '{"amount": 30}'::jsonb AS payload`, effect))
	r = runCLI(t, "", "run", "-f", query, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"edited items", []string{"items", "again", "-n", "billing", "-f", againRun, "--from-file", writeFile(t, "edited.jsonl", edited)},
			"the items given are not run billing/again's batch: their digest differs"},
		{"a missing item", []string{"items", "again", "-n", "billing", "-f", againRun, "--from-file", writeFile(t, "fewer.jsonl", strings.Join(again[1:], "\n"))},
			"the items given are not run billing/again's batch"},
		{"another run's manifest", []string{"items", "again", "-n", "billing", "-f", juneRun, "--from-file", againItems},
			"is run billing/june, not billing/again"},
		{"another namespace", []string{"items", "again", "-n", "sales", "-f", againRun, "--from-file", againItems},
			"is run billing/again, not sales/again"},
		{"a query run", []string{"items", "query", "-n", "billing", "-f", query},
			"-f is for a run of inline items or a ConfigMap"},
		{"--from-file alone", []string{"items", "again", "-n", "billing", "--from-file", againItems},
			"--from-file needs the run's manifest (-f)"},
		{"june's items for again", []string{"items", "again", "-n", "billing", "-f", againRun, "--from-file", juneItems},
			"are not run billing/again's batch"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := runCLI(t, "", append(c.args, "--output", "json", "--dsn", d.dsn)...)
			require.Equal(t, v1alpha1.ExitBadInput, res.code, "stderr:\n%s", res.stderr)
			require.Contains(t, res.stderr, c.want)
			require.Empty(t, strings.TrimSpace(res.stdout), "nothing listed")
		})
	}

	// Without -f, the note says how.
	res = runCLI(t, "", "items", "again", "-n", "billing", "--already-handled", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitBadInput, res.code, res.stderr)
	require.Contains(t, res.stderr, "runledger items NAME -n NS -f -")

	require.Equal(t, committed+1, d.committed(t), "listing committed nothing (the query run's one row)")
	require.Equal(t, committed+1, d.int(t, `SELECT count(*) FROM invoices`), "the effect ran once per committed item")
	require.Equal(t, committed+1, d.int(t, `SELECT count(DISTINCT account) FROM invoices`))
}

// TestItemsOfAClusterRunFromItsManifestInGit: a run a cluster made has a
// uid of the API server's, which the manifest kept in git does not carry:
// items and verify, given that manifest, take the latest run of its name
// (saying so) and check its items against the run's batch; items that are
// not the run's batch are refused, and a uid given that no run has is not
// found.
func TestItemsOfAClusterRunFromItsManifestInGit(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.0))
	keys := [][2]string{{"acct-1", "2024-06"}, {"acct-2", "2024-06"}}
	first := runCLI(t, "", "run", "-f", writeFile(t, "first.yaml", manifest("first", inlineItems(keys...), sinkEffect)), "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, first.code, first.stderr)
	inGit := manifest("again", inlineItems(append(keys, [2]string{"acct-3", "2024-06"})...), sinkEffect)
	// As the API server stored it: with a uid of its own.
	stored := strings.Replace(inGit, "  namespace: billing\n", "  namespace: billing\n  uid: 6c1f4d52-3e0b-4f55-9d8e-0b7f2a1c9e11\n", 1)
	r := runCLI(t, "", "run", "-f", writeFile(t, "stored.yaml", stored), "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, counts{Total: 3, Completed: 1, AlreadyHandled: 2}, r.summary(t).counts())

	file := writeFile(t, "again.yaml", inGit)
	res := runCLI(t, "", "items", "again", "-n", "billing", "-f", file, "--already-handled", "--output", "json", "--dsn", d.dsn)
	require.Equal(t, 0, res.code, res.stderr)
	require.Contains(t, res.stderr, "the manifest has no metadata.uid")
	require.Len(t, decodeItems(t, res), 2)
	p, _ := verify(t, d, "", "again", "-f", file, "--expect-completed", "1", "--expect-already-handled", "2", "--expect-failed", "0")
	require.True(t, p.Proven, p.Summary)
	require.Equal(t, "6c1f4d52-3e0b-4f55-9d8e-0b7f2a1c9e11", p.Run.UID)

	edited := writeFile(t, "edited.yaml", strings.Replace(inGit, "acct-3", "acct-4", 1))
	res = runCLI(t, "", "items", "again", "-n", "billing", "-f", edited, "--already-handled", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitBadInput, res.code, res.stderr)
	require.Contains(t, res.stderr, "not run billing/again's batch")
	require.Empty(t, res.stdout)
	wrong := writeFile(t, "wrong.yaml", strings.Replace(stored, "6c1f4d52", "00000000", 1))
	res = runCLI(t, "", "items", "again", "-n", "billing", "-f", wrong, "--already-handled", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitNotFound, res.code, res.stderr)
}

package clitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

// item is one object of runledger items' JSON output.
type item struct {
	Verdict       string `json:"verdict"`
	Entity        string `json:"entity"`
	Occurrence    string `json:"occurrence"`
	Shard         int    `json:"shard"`
	Attempt       int    `json:"attempt"`
	Time          string `json:"time"`
	State         string `json:"state"`
	Class         string `json:"class"`
	Error         string `json:"error"`
	Copies        int    `json:"copies"`
	PayloadDigest string `json:"payloadDigest"`
	HeldBy        *struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		UID       string `json:"uid"`
	} `json:"heldBy"`
	PayloadChanged bool `json:"payloadChanged"`
}

func decodeItems(t *testing.T, r result) []item {
	t.Helper()
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	var out []item
	require.NoError(t, dec.Decode(&out), "stdout is one JSON array:\n%s", r.stdout)
	require.False(t, dec.More(), "nothing after the array")
	require.NotNil(t, out, "an array, even empty")
	return out
}

func byVerdict(items []item) map[string][]item {
	out := map[string][]item{}
	for _, it := range items {
		out[it.Verdict] = append(out[it.Verdict], it)
	}
	return out
}

// ledgerSchema: invoices of accounts, accounts 0, 250, 500, ... missing (the
// effect's foreign key fails them in every run that tries them).
const itemsSchema = `
CREATE TABLE accounts (id text PRIMARY KEY);
INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 3999) i WHERE i % 250 <> 0;
CREATE TABLE invoices (account text NOT NULL REFERENCES accounts (id), period text NOT NULL, amount numeric NOT NULL);`

// TestItemsAndKey: three runs at once over overlapping batches (two query
// batches, one of inline items, one of them with repeats), some of whose
// items fail their effect's foreign key; then runledger items and
// runledger key answer from the ledger they built: every run's items with
// their verdicts add up to its report, the failed ones with their SQLSTATE,
// the already handled ones with the run that holds them; a key's committed
// row, its superseded history and its failures; and the exit codes.
func TestItemsAndKey(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, itemsSchema)
	runs := []struct{ name, manifest string }{
		{"first", queryRun("first", 0, 1999, 50, 2, 64)},
		{"second", queryRun("second", 1000, 2999, 0, 3, 100)},
		{"third", manifest("third", inlineItems([2]string{"acct-1750", "2024-06"}, [2]string{"acct-3500", "2024-06"}, [2]string{"acct-3501", "2024-06"}),
			sinkEffect, "maxFailedItems: 100")},
	}
	for i := range runs[:2] {
		runs[i].manifest += "  maxFailedItems: 100\n"
	}
	sums := make([]summary, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		file := writeFile(t, "run.yaml", r.manifest)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
			require.Equal(t, 0, res.code, "run %s; stderr:\n%s", r.name, res.stderr)
			sums[i] = res.summary(t)
		}()
	}
	wg.Wait()

	// Without -n: the kubeconfig context's namespace, as kubectl (and the
	// kubectl plugin) would pick it; "default" without a kubeconfig.
	kubeconfig := writeFile(t, "kubeconfig", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {}}]
contexts: [{name: billing, context: {cluster: c, user: u, namespace: billing}}]
current-context: billing
`)
	inContext := runCLIEnv(t, []string{"KUBECONFIG=" + kubeconfig}, "", "items", "first", "--output", "json", "--dsn", d.dsn)
	require.Equal(t, 0, inContext.code, "stderr:\n%s", inContext.stderr)
	require.Len(t, byVerdict(decodeItems(t, inContext))["Completed"], int(sums[0].Completed))
	noContext := runCLI(t, "", "items", "first", "--output", "json", "--dsn", d.dsn)
	require.Equal(t, int(v1alpha1.ExitNotFound), noContext.code, "stdout:\n%s", noContext.stdout)
	require.Contains(t, noContext.stderr, "default/first")

	committed := map[string]string{} // entity -> run
	for i, r := range runs[:2] {
		got := byVerdict(decodeItems(t, runCLI(t, "", "items", r.name, "-n", "billing", "--output", "json", "--dsn", d.dsn)))
		s := sums[i]
		require.Len(t, got["Completed"], int(s.Completed), "run %s: its completed items", r.name)
		copies := 0
		for _, it := range got["Failed"] {
			copies += it.Copies
		}
		require.Equal(t, int(s.Failed), copies, "run %s: its failed items, a key's repeats among its copies (acct-0 fails twice in first)", r.name)
		for _, it := range got["Completed"] {
			require.Equal(t, "committed", it.State)
			require.Empty(t, committed[it.Entity], "%s completed by one run only", it.Entity)
			committed[it.Entity] = r.name
		}
		for _, it := range got["Failed"] {
			var n int
			_, err := fmt.Sscanf(it.Entity, "acct-%d", &n)
			require.NoError(t, err)
			require.Zero(t, n%250, "only the items without an account fail: %s", it.Entity)
			require.Equal(t, "23503", it.Class)
			require.Contains(t, it.Error, `violates foreign key constraint "invoices_account_fkey"`)
			require.NotEmpty(t, it.PayloadDigest)
		}
		handled := 0
		for _, it := range got["AlreadyHandled"] {
			require.NotNil(t, it.HeldBy, "an already handled item names its holder")
			require.NotEqual(t, r.name, it.HeldBy.Name)
			require.Equal(t, "billing", it.HeldBy.Namespace)
			require.NotEmpty(t, it.HeldBy.UID)
			handled++
		}
		// The report counts the batch's repeats of committed keys as
		// already handled too; the list names each key once.
		repeatsHandled := map[string]int{"first": 50 - 1, "second": 0}[r.name] // acct-0 repeats a failed key
		require.Equal(t, int(s.AlreadyHandled)-repeatsHandled, handled, "run %s: its already handled keys", r.name)
	}
	// A key both query runs had: committed by one, already handled by the other.
	for e, holder := range committed {
		if e == "acct-1510" {
			other := map[string]string{"first": "second", "second": "first"}[holder]
			for _, it := range decodeItems(t, runCLI(t, "", "items", other, "-n", "billing", "--already-handled", "--output", "json", "--dsn", d.dsn)) {
				require.Equal(t, "AlreadyHandled", it.Verdict)
				if it.Entity == e {
					require.Equal(t, holder, it.HeldBy.Name, "acct-1510 is held by the run that committed it")
				}
			}
		}
	}
	require.Len(t, committed, 3000-12, "every key of the query runs with an account is committed once (acct-0, 250, ..., 2750 have none)")

	// --failed in the three formats.
	failed := decodeItems(t, runCLI(t, "", "items", "second", "-n", "billing", "--failed", "--output", "json", "--dsn", d.dsn))
	require.Len(t, failed, 8, "acct-1000, 1250, ..., 2750")
	jsonl := runCLI(t, "", "items", "second", "-n", "billing", "--failed", "--output", "jsonl", "--dsn", d.dsn)
	require.Equal(t, 0, jsonl.code, jsonl.stderr)
	lines := strings.Split(strings.TrimSuffix(jsonl.stdout, "\n"), "\n")
	require.Len(t, lines, 8)
	for i, l := range lines {
		var it item
		dec := json.NewDecoder(bytes.NewReader([]byte(l)))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&it))
		require.Equal(t, failed[i], it)
	}
	table := runCLI(t, "", "items", "second", "-n", "billing", "--failed", "--dsn", d.dsn)
	require.Equal(t, 0, table.code, table.stderr)
	rows := strings.Split(strings.TrimSuffix(table.stdout, "\n"), "\n")
	require.Len(t, rows, 9, "a header and a row per failed item:\n%s", table.stdout)
	require.Regexp(t, `^VERDICT +ENTITY +OCCURRENCE +SHARD +ATTEMPT +TIME +DETAIL$`, rows[0])
	require.Regexp(t, `^Failed +acct-1000 +2024-06 +\d +0 +\S+ +23503: item acct-1000/2024-06: running effect: .*invoices_account_fkey`, rows[1])

	// Inline items: their batch is not kept; already handled cannot be listed.
	third := runCLI(t, "", "items", "third", "-n", "billing", "--output", "json", "--dsn", d.dsn)
	require.Contains(t, third.stderr, "the already handled items of run billing/third are not listed")
	listed := byVerdict(decodeItems(t, third))
	require.Len(t, listed["Completed"], int(sums[2].Completed))
	require.Len(t, listed["Failed"], 2, "acct-1750, acct-3500: no account")
	require.Equal(t, int(sums[2].Failed), len(listed["Failed"]))
	r := runCLI(t, "", "items", "third", "-n", "billing", "--already-handled", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitBadInput, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "is not kept in the ledger database")

	// runledger key: a committed key, a key that failed in two runs, none.
	kr := runCLI(t, "", "key", "acct-1510", "2024-06", "--output", "json", "--dsn", d.dsn)
	k := keyOf(t, kr)
	require.NotNil(t, k.Committed, "%s", kr.stdout)
	require.Equal(t, committed["acct-1510"], k.Committed.Run.Name)
	require.Equal(t, "billing", k.Committed.Run.Namespace)
	require.Equal(t, d.int(t, `SELECT shard FROM runledger.ledger WHERE entity = 'acct-1510' AND state = 'committed'`), int64(k.Committed.Shard))
	require.Empty(t, k.History)
	k = keyOf(t, runCLI(t, "", "key", "acct-1000", "2024-06", "--output", "json", "--dsn", d.dsn))
	require.Nil(t, k.Committed, "no run committed it")
	var in []string
	for _, f := range k.Failures {
		require.Equal(t, "23503", f.Class)
		in = append(in, f.Run.Name)
	}
	sort.Strings(in)
	require.Equal(t, []string{"first", "second"}, in, "it failed in both runs that had it")
	r = runCLI(t, "", "key", "acct-1000", "2024-06", "--dsn", d.dsn)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "committed by  no run")
	require.Contains(t, r.stdout, "failed in")

	// A later run supersedes acct-1510: the key's history shows the old row.
	r = runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", manifest("again", inlineItems([2]string{"acct-1510", "2024-06"}), sinkEffect, "onExisting: Supersede")), "--dsn", d.dsn)
	require.Equal(t, 0, r.code, r.stderr)
	k = keyOf(t, runCLI(t, "", "key", "acct-1510", "2024-06", "--output", "json", "--dsn", d.dsn))
	require.Equal(t, "again", k.Committed.Run.Name)
	require.Len(t, k.History, 1)
	require.Equal(t, committed["acct-1510"], k.History[0].Run.Name)
	require.Equal(t, "superseded", k.History[0].State)
	require.NotNil(t, k.History[0].SupersededAt)
	require.Equal(t, []string{k.History[0].Run.UID}, k.RetiredBy)
	r = runCLI(t, "", "key", "acct-1510", "2024-06", "--dsn", d.dsn)
	require.Contains(t, r.stdout, "committed by  billing/again")
	require.Contains(t, r.stdout, "superseded    billing/"+committed["acct-1510"])

	// Not found, and bad input.
	r = runCLI(t, "", "items", "nope", "-n", "billing", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitNotFound, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, 5, r.code, "the code is part of the CLI's contract")
	require.Contains(t, r.stderr, "the ledger database has no run billing/nope")
	r = runCLI(t, "", "items", "first", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitNotFound, r.code, "another namespace: stderr:\n%s", r.stderr)
	r = runCLI(t, "", "key", "acct-never", "2024-06", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitNotFound, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "knows nothing of key acct-never/2024-06")
	for _, bad := range [][]string{
		{"items", "first", "-n", "billing", "--failed", "--completed"},
		{"items", "first", "-n", "billing", "--output", "yaml"},
		{"items"},
		{"key", "acct-1"},
		{"key", "acct-1", "2024-06", "--output", "jsonl"},
	} {
		r = runCLI(t, "", append(bad, "--dsn", d.dsn)...)
		require.Equal(t, v1alpha1.ExitBadInput, r.code, "%v: stderr:\n%s", bad, r.stderr)
	}
	r = runCLI(t, "", "items", "first", "-n", "billing")
	require.Equal(t, v1alpha1.ExitBadInput, r.code, "no database")
}

type keyOutput struct {
	Entity     string    `json:"entity"`
	Occurrence string    `json:"occurrence"`
	Committed  *keyRow   `json:"committed"`
	History    []keyRow  `json:"history"`
	RetiredBy  []string  `json:"retiredBy"`
	Failures   []keyFail `json:"failures"`
}

type runRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

type keyRow struct {
	Run          runRef  `json:"run"`
	Shard        int     `json:"shard"`
	Attempt      int     `json:"attempt"`
	State        string  `json:"state"`
	CommittedAt  string  `json:"committedAt"`
	SupersededAt *string `json:"supersededAt"`
}

type keyFail struct {
	Run      runRef `json:"run"`
	Shard    int    `json:"shard"`
	Attempt  int    `json:"attempt"`
	Copies   int    `json:"copies"`
	Class    string `json:"class"`
	Error    string `json:"error"`
	FailedAt string `json:"failedAt"`
}

func keyOf(t *testing.T, r result) keyOutput {
	t.Helper()
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	var k keyOutput
	require.NoError(t, dec.Decode(&k), "stdout:\n%s", r.stdout)
	require.NotNil(t, k.History, "a list, even empty")
	require.NotNil(t, k.RetiredBy)
	require.NotNil(t, k.Failures)
	return k
}

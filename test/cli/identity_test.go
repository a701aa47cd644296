package clitest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// copiedUID is the metadata.uid `kubectl get -o yaml` keeps in a copied
// manifest.
const copiedUID = "0b5d3c9e-7d1f-4a57-9a52-3f1c2b8e6d40"

// withUID renames manifest m into namespace ns and name name, keeping (or
// giving) it the metadata.uid copiedUID.
func withUID(m, name, ns string) string {
	m = strings.Replace(m, "  namespace: billing\n", "  namespace: "+ns+"\n  uid: "+copiedUID+"\n", 1)
	return strings.Replace(m, "  name: june-invoices\n", "  name: "+name+"\n", 1)
}

// TestRunCopiedManifestIsRefused is issue #43.5: a manifest copied with
// `kubectl get -o yaml` keeps metadata.uid; renamed into another namespace
// and name, with another effect, `runledger run` must not become the run
// the uid names (exit 0, its items "completed", its own effect never run):
// it is bad input (exit 2), the message names both runs, and the ledger,
// the batch headers and the effect's table are as they were. For every
// source (static: the header's insert; query: the batch's fix) and for one
// shard of several (--shard) as for all of them.
func TestRunCopiedManifestIsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, batch string }{
		{"static", inlineItems([2]string{"acct-1", "2024-06"}, [2]string{"acct-2", "2024-06"})},
		{"query", "batch: {query: \"SELECT 'acct-' || i AS entity, '2024-06' AS occurrence FROM generate_series(1, 2) AS i\"}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newDB(t)
			d.exec(t, `CREATE TABLE invoices (run text NOT NULL, account text NOT NULL)`)
			effect := func(tag string) string {
				return `effect: {sql: "INSERT INTO invoices SELECT '` + tag + `', entity FROM claimed"}`
			}
			original := withUID(manifest("june-invoices", c.batch, effect("june"), "workers: 2"), "june-invoices", "billing")
			r := runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", original), "--dsn", d.dsn, "--output", "json")
			require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			require.Equal(t, counts{Total: 2, Completed: 2}, r.summary(t).counts())
			require.Contains(t, r.stderr, `"uidFrom":"metadata.uid"`)
			writes, headers := d.ledgerWrites(t), d.int(t, `SELECT count(*) FROM runledger.batch_run`)

			copied := withUID(manifest("june-invoices", c.batch, effect("july"), "workers: 2"), "july-copy", "accounts")
			for _, args := range [][]string{nil, {"--shard", "1/2"}} {
				r = runCLI(t, "", append([]string{"run", "-f", writeFile(t, "copy.yaml", copied), "--dsn", d.dsn, "--output", "json"}, args...)...)
				require.Equal(t, 2, r.code, "%v: a copied uid is bad input; stdout:\n%s\nstderr:\n%s", args, r.stdout, r.stderr)
				require.Contains(t, r.stderr, "billing/june-invoices", "%v: the run the ledger recorded for the uid", args)
				require.Contains(t, r.stderr, "accounts/july-copy", "%v: the run given", args)
				require.Contains(t, r.stderr, copiedUID, args)
				require.Equal(t, counts{}, r.summary(t).counts(), "%v: nothing processed", args)
			}
			require.Equal(t, writes, d.ledgerWrites(t), "not one statement wrote to the ledger")
			require.EqualValues(t, 2, d.committed(t))
			require.Zero(t, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_name <> 'june-invoices' OR run_namespace <> 'billing'`))
			require.Equal(t, headers, d.int(t, `SELECT count(*) FROM runledger.batch_run`))
			require.Zero(t, d.int(t, `SELECT count(*) FROM runledger.batch_run WHERE run_name <> 'june-invoices'`))
			require.Zero(t, d.int(t, `SELECT count(*) FROM invoices WHERE run <> 'june'`), "the copy's effect never ran")
			require.Zero(t, d.int(t, `SELECT count(*) FROM runledger.item_failure`), "no failure recorded under the uid")

			// The original, run again, is still itself.
			r = runCLI(t, "", "run", "-f", writeFile(t, "run.yaml", original), "--dsn", d.dsn, "--output", "json")
			require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			require.Equal(t, counts{Total: 2, Completed: 2}, r.summary(t).counts())
		})
	}
}

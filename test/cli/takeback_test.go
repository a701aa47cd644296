package clitest

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/pkg/processor"
)

// TestKeyAfterARefusedSupersede is issue #43.6: a Supersede run whose
// processor refuses a key has its claim taken back and the earlier holder's
// row restored; `runledger key` then shows only what happened: the earlier
// run committed the key, nothing was superseded, no run was retired from it
// (it printed both "committed by" and "retired from" the same run). The key
// the processor accepted shows its real history.
func TestKeyAfterARefusedSupersede(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	srv := httptest.NewServer(processor.Handler(func(_ context.Context, _ *processor.Request, it processor.Item) processor.Result {
		if it.Entity == "acct-refused" {
			return processor.Refuse(errors.New("card declined"))
		}
		return processor.OK()
	}))
	defer srv.Close()
	items := inlineItems([2]string{"acct-ok", "2024-06"}, [2]string{"acct-refused", "2024-06"})

	r := runCLI(t, "", "run", "-f", writeFile(t, "first.yaml", manifest("first", items)), "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 2, Completed: 2}, r.summary(t).counts())
	first := keyOf(t, runCLI(t, "", "key", "acct-refused", "2024-06", "--output", "json", "--dsn", d.dsn)).Committed.Run.UID

	again := manifest("again", items, "onExisting: Supersede", "maxFailedItems: 1",
		"effect:\n    processor: {image: example-processor}")
	r = runCLI(t, "", "run", "-f", writeFile(t, "again.yaml", again), "--dsn", d.dsn, "--output", "json", "--processor-url", srv.URL)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 2, Completed: 1, Failed: 1}, r.summary(t).counts())

	k := keyOf(t, runCLI(t, "", "key", "acct-refused", "2024-06", "--output", "json", "--dsn", d.dsn))
	require.Equal(t, "first", k.Committed.Run.Name, "the earlier holder's row, restored")
	require.Empty(t, k.History, "no row was superseded")
	require.Empty(t, k.RetiredBy, "no run was retired from the key")
	require.Len(t, k.Failures, 1, "the refusal is recorded")
	table := runCLI(t, "", "key", "acct-refused", "2024-06", "--dsn", d.dsn)
	require.Equal(t, 0, table.code, "stderr:\n%s", table.stderr)
	require.Contains(t, table.stdout, "committed by  billing/first")
	require.NotContains(t, table.stdout, "retired from", "only what happened:\n%s", table.stdout)
	require.Zero(t, d.int(t, `SELECT count(*) FROM runledger.ledger_retired WHERE entity = 'acct-refused'`))

	k = keyOf(t, runCLI(t, "", "key", "acct-ok", "2024-06", "--output", "json", "--dsn", d.dsn))
	require.Equal(t, "again", k.Committed.Run.Name)
	require.Len(t, k.History, 1)
	require.Equal(t, []string{first}, k.RetiredBy, "the accepted key's history is real")
}

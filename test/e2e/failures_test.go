//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli"
)

// TestRetryFailedItems: a run whose effect fails for some keys (a CHECK
// constraint of the user's own table refuses accounts ending in 7) succeeds
// within maxFailedItems, its status shows a sample of the failures and the
// command for the rest, and the ledger keeps one failure record per failed
// key; once the cause is fixed, a run with batch.fromRun takes exactly those
// items and completes them: every key committed exactly once overall.
func TestRetryFailedItems(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "retry", 0)
	_, err := f.sql(f.ctx, f.dsn, `ALTER TABLE sink ADD CONSTRAINT sink_no_7 CHECK (entity !~ '7$')`)
	require.NoError(t, err)

	first := f.newRun("first", runSpec{workers: 2, chunk: 25, batch: inlineItems(1, 200)})
	first.Spec.MaxFailedItems = 20
	require.NoError(t, f.c.Create(f.ctx, first))
	first = f.waitComplete(first.Name, runTimeout)
	require.Equal(t, counts{Total: 200, Completed: 180, Failed: 20}, countsOf(first), "acct-7, 17, ..., 197 fail the constraint")
	f.requireShardsAddUp(first)

	// The status: a bounded sample of the failures, and where the rest is.
	var sample []v1alpha1.FailureSample
	for _, sh := range first.Status.Shards {
		require.LessOrEqual(t, len(sh.Failures), 3, "shard %d's sample", sh.Index)
		if sh.Failed > 0 {
			require.NotEmpty(t, sh.Failures, "shard %d failed %d items and shows some", sh.Index, sh.Failed)
		}
		sample = append(sample, sh.Failures...)
	}
	require.NotEmpty(t, sample)
	require.LessOrEqual(t, len(sample), 10)
	for _, s := range sample {
		require.True(t, strings.HasSuffix(s.Entity, "7"), "only the accounts ending in 7 fail: %s", s.Entity)
		require.Equal(t, "2026-01", s.Occurrence)
		require.Equal(t, "23514", s.Class, "a check violation: %s", s.Error)
		require.Contains(t, s.Error, "sink_no_7")
	}
	require.Contains(t, first.Status.FailedItems, "runledger items first")
	require.Contains(t, first.Status.FailedItems, "--failed")
	require.Contains(t, first.Status.FailedItems, f.ns)

	// The ledger: one failure record per failed key, none of another key.
	uid := string(first.UID)
	require.EqualValues(t, 20, f.int(`SELECT count(*) FROM runledger.item_failure WHERE run_uid = $1`, uid))
	require.EqualValues(t, 20, f.int(`SELECT sum(items) FROM runledger.item_failure WHERE run_uid = $1`, uid), "the records add up to status.failed")
	require.EqualValues(t, 20, f.int(`SELECT count(*) FROM runledger.item_failure WHERE run_uid = $1 AND entity ~ '7$' AND class = '23514'`, uid))
	require.EqualValues(t, 180, f.committedRows(uid))

	// The cause fixed, retry exactly what failed.
	_, err = f.sql(f.ctx, f.dsn, `ALTER TABLE sink DROP CONSTRAINT sink_no_7`)
	require.NoError(t, err)
	retry := f.createRun("retry", runSpec{workers: 2, chunk: 25, batch: v1alpha1.BatchSpec{
		FromRun: &v1alpha1.FromRunSource{Name: first.Name, Verdict: v1alpha1.FromRunFailed},
	}})
	retry = f.waitComplete(retry.Name, runTimeout)
	require.Equal(t, counts{Total: first.Status.Failed, Completed: first.Status.Failed}, countsOf(retry),
		"the retry's batch is exactly the first run's failed items, and they complete")
	f.requireShardsAddUp(retry)
	require.Empty(t, retry.Status.FailedItems)
	rid := string(retry.UID)
	require.EqualValues(t, 20, f.committedRows(rid))
	require.EqualValues(t, 20, f.int(`SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND entity ~ '7$'`, rid), "the retry committed the failed keys and no other")
	require.Zero(t, f.int(`SELECT count(*) FROM runledger.item_failure WHERE run_uid = $1`, rid))
	require.EqualValues(t, 180, f.committedRows(uid), "the first run's rows, untouched")

	// An inline run over acct-191..210 (acct-195's amount changed): its
	// already handled items, which the ledger database does not keep, are
	// listed from its manifest as kubectl prints it.
	again := f.newRun("again", runSpec{workers: 2, chunk: 5, batch: inlineItems(191, 210)})
	again.Spec.Batch.Items[4].Payload = &apiextensionsv1.JSON{Raw: []byte(`{"amount":9999}`)}
	require.NoError(t, f.c.Create(f.ctx, again))
	again = f.waitComplete(again.Name, runTimeout)
	require.Equal(t, counts{Total: 20, Completed: 10, AlreadyHandled: 10}, countsOf(again))
	require.EqualValues(t, 1, again.Status.PayloadChanged)
	manifest, err := f.kubectl("get", "prun", "again", "-o", "yaml")
	require.NoError(t, err)
	var out, stderr bytes.Buffer
	cmd := cli.NewRootCommand()
	cmd.SetArgs([]string{"items", "again", "-n", f.ns, "-f", "-", "--already-handled", "--output", "jsonl", "--dsn", f.dsn})
	cmd.SetIn(strings.NewReader(manifest))
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	require.NoError(t, cmd.ExecuteContext(f.ctx), "stderr:\n%s", stderr.String())
	holders := map[string]string{}
	changed := []string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var it struct {
			Entity, Verdict string
			HeldBy          struct{ Name string }
			PayloadChanged  bool
		}
		require.NoError(t, json.Unmarshal([]byte(line), &it), line)
		require.Equal(t, "AlreadyHandled", it.Verdict)
		holders[it.Entity] = it.HeldBy.Name
		if it.PayloadChanged {
			changed = append(changed, it.Entity)
		}
	}
	require.Len(t, holders, 10, "acct-191..200:\n%s", out.String())
	require.Equal(t, "retry", holders["acct-197"], "the retry committed acct-197")
	require.Equal(t, "first", holders["acct-191"])
	require.Equal(t, []string{"acct-195"}, changed, "as status.payloadChanged counts")
	f.requireExactlyOnce(210)
}

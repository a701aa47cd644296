package worker_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/worker"
)

// fromRunPlan is the plan of run name (uid) in namespace default whose batch
// is fromRun: earlier, with effect.
func fromRunPlan(t *testing.T, name, uid, earlier, effect string) *worker.Plan {
	t.Helper()
	p, err := worker.NewPlan(context.Background(), &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: k8stypes.UID(uid)},
		Spec: v1alpha1.ProcessingRunSpec{Workers: 3, ChunkSize: 17, MaxFailedItems: 1000, Effect: &v1alpha1.EffectSpec{SQL: effect},
			Batch: v1alpha1.BatchSpec{FromRun: &v1alpha1.FromRunSource{Name: earlier}}},
	}, nil, worker.Limits{})
	require.NoError(t, err)
	return p
}

func runPlanShards(t *testing.T, f *fixture, p *worker.Plan) ([]worker.Report, v1alpha1.ItemCounts) {
	t.Helper()
	require.NoError(t, p.Check(context.Background(), f.store, worker.Backoff{}, nil))
	cfg := p.ShardConfig(0, 0)
	return runShards(t, f, cfg)
}

// TestFromRunRetriesExactlyTheFailed: a run whose effect refuses some items
// (a check constraint) and whose query has rows that are no items; once the
// cause is fixed, a run with batch.fromRun processes exactly the items that
// failed, with their payloads, and nothing else; the rows that were no
// items fail again, never processed under the key their record keeps. Its
// batch is fixed at its first start: failures recorded later are not in it.
// A fromRun naming no run is bad input.
func TestFromRunRetriesExactlyTheFailed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `
CREATE TABLE invoices (account text NOT NULL, period text NOT NULL, amount numeric NOT NULL CONSTRAINT positive CHECK (amount > 0));
CREATE TABLE src AS SELECT 'acct-' || lpad(i::text, 3, '0') AS account, '2024-06' AS period,
    CASE WHEN i % 7 = 0 THEN -i ELSE i END AS amount FROM generate_series(1, 300) i;
INSERT INTO src VALUES (NULL, '2024-06', 5), ('acct-' || repeat('x', 1100), '2024-06', 6);`)
	const effect = `INSERT INTO invoices SELECT entity, occurrence, (payload->>'amount')::numeric FROM claimed`
	first, err := worker.NewPlan(context.Background(), &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "june", UID: "uid-june"},
		Spec: v1alpha1.ProcessingRunSpec{Workers: 2, ChunkSize: 23, MaxFailedItems: 1000, Effect: &v1alpha1.EffectSpec{SQL: effect},
			Batch: v1alpha1.BatchSpec{Query: `SELECT account AS entity, period AS occurrence, jsonb_build_object('amount', amount) AS payload FROM src`}},
	}, nil, worker.Limits{})
	require.NoError(t, err)
	_, sum := runPlanShards(t, f, first)
	refused := int64(300 / 7)
	require.Equal(t, v1alpha1.ItemCounts{Total: 302, Completed: 300 - refused, Failed: refused + 2}, sum)
	require.EqualValues(t, refused+2, queryInt(t, f.pool, `SELECT count(*) FROM runledger.item_failure WHERE run_uid = 'uid-june'`))

	// The cause fixed: negative amounts are credits.
	mustExec(t, f.pool, `ALTER TABLE invoices DROP CONSTRAINT positive`)
	retry := fromRunPlan(t, "june-retry", "uid-retry", "june", effect)
	reports, sum := runPlanShards(t, f, retry)
	require.Equal(t, v1alpha1.ItemCounts{Total: refused + 2, Completed: refused, Failed: 2}, sum, "exactly the failed items")
	var msgs []string
	for _, r := range reports {
		for _, fl := range r.Failures {
			msgs = append(msgs, fl.Error)
			require.Equal(t, "input", fl.Class)
		}
	}
	require.Len(t, msgs, 2)
	for _, m := range msgs {
		require.Contains(t, m, "failed in run june as bad input")
	}

	// The ledger: the retry committed exactly the refused keys, the effect
	// ran with their payloads, and nothing else moved.
	retried := queryStrings(t, f, `SELECT entity FROM runledger.ledger WHERE run_uid = 'uid-retry' AND state = 'committed' ORDER BY entity`)
	want := queryStrings(t, f, `SELECT account FROM src WHERE amount < 0 ORDER BY account`)
	require.Equal(t, want, retried)
	require.EqualValues(t, 300, f.committed(t), "every valid key once")
	require.EqualValues(t, 300, queryInt(t, f.pool, `SELECT count(*) FROM invoices`), "each effect once")
	require.EqualValues(t, refused, queryInt(t, f.pool, `SELECT count(*) FROM invoices i JOIN src s ON s.account = i.account AND s.amount = i.amount WHERE i.amount < 0`),
		"the retry's effect read the payloads the items failed with")
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE entity LIKE 'acct-xxx%'`), "no key cut to size was processed")

	// Fixed at its first start: a failure of june recorded since is not in it.
	mustExec(t, f.pool, `INSERT INTO runledger.item_failure (run_uid, entity, occurrence, run_namespace, run_name, shard, attempt, pass, chunk, items, class, error, payload)
VALUES ('uid-june', 'acct-late', '2024-06', 'default', 'june', 0, 0, 'p', 1, 1, '23514', 'late', '{"amount": 1}')`)
	_, again := runPlanShards(t, f, retry)
	require.Equal(t, sum, again, "the same batch: its own rows completed, the bad rows failed again")

	// A name that matches no run: bad input before anything is read.
	err = fromRunPlan(t, "typo-retry", "uid-typo", "jnue", effect).Check(context.Background(), f.store, worker.Backoff{}, nil)
	require.Error(t, err)
	require.True(t, worker.IsInputError(err), "%v", err)
	require.ErrorContains(t, err, `batch.fromRun names no run to retry: run default/jnue`)
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.batch_run WHERE run_uid = 'uid-typo'`), "no batch fixed")
}

func queryStrings(t *testing.T, f *fixture, sql string) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), sql)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	slices.Sort(out)
	return slices.DeleteFunc(out, func(s string) bool { return strings.TrimSpace(s) == "" })
}

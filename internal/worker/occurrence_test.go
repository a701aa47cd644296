package worker_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// occurrenceRun is a run of a schedule's occurrence 2026-10 with batch b.
func occurrenceRun(uid string, b v1alpha1.BatchSpec) *v1alpha1.ProcessingRun {
	return &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "run-" + uid, UID: k8stypes.UID("uid-" + uid)},
		Spec:       v1alpha1.ProcessingRunSpec{Workers: 2, Occurrence: "2026-10", Batch: b},
	}
}

func committedKeys(t *testing.T, f *fixture) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT entity || '/' || occurrence FROM runledger.ledger WHERE state = 'committed' ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		out = append(out, k)
	}
	require.NoError(t, rows.Err())
	return out
}

func runPlan(t *testing.T, f *fixture, p *worker.Plan) v1alpha1.ItemCounts {
	t.Helper()
	if q, ok := p.Source.(*worker.QuerySource); ok {
		require.NoError(t, q.Check(context.Background(), f.store))
	}
	_, sum := runShards(t, f, p.ShardConfig(0, 0))
	return sum
}

// TestOccurrenceReachesInlineAndConfigMapItems: $(OCCURRENCE) in an item's
// occurrence becomes the run's spec.occurrence, inline and in JSON Lines.
func TestOccurrenceReachesInlineAndConfigMapItems(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	inline := occurrenceRun("inline", v1alpha1.BatchSpec{Items: []v1alpha1.Item{
		{Entity: "acct-1", Occurrence: "$(OCCURRENCE)"},
		{Entity: "acct-2", Occurrence: "invoice-$(OCCURRENCE)"},
		{Entity: "acct-3", Occurrence: "fixed"},
	}})
	p, err := worker.NewPlan(context.Background(), inline, nil, worker.Limits{})
	require.NoError(t, err)
	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 3}, runPlan(t, f, p))
	require.Equal(t, []string{"acct-1/2026-10", "acct-2/invoice-2026-10", "acct-3/fixed"}, committedKeys(t, f))

	cm := occurrenceRun("cm", v1alpha1.BatchSpec{ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "b", Key: "items"}})
	data := func(context.Context, v1alpha1.ConfigMapKeyRef) ([]byte, string, error) {
		return []byte(`{"entity":"acct-4","occurrence":"$(OCCURRENCE)"}` + "\n" + `{"entity":"acct-1","occurrence":"$(OCCURRENCE)"}` + "\n"), "configmap b", nil
	}
	p, err = worker.NewPlan(context.Background(), cm, data, worker.Limits{})
	require.NoError(t, err)
	require.Equal(t, v1alpha1.ItemCounts{Total: 2, Completed: 1, AlreadyHandled: 1}, runPlan(t, f, p),
		"acct-1's occurrence 2026-10 was committed by the inline run")

	// Without spec.occurrence the text stays as written.
	plain := occurrenceRun("plain", v1alpha1.BatchSpec{Items: []v1alpha1.Item{{Entity: "acct-9", Occurrence: "$(OCCURRENCE)"}}})
	plain.Spec.Occurrence = ""
	p, err = worker.NewPlan(context.Background(), plain, nil, worker.Limits{})
	require.NoError(t, err)
	runPlan(t, f, p)
	require.Contains(t, committedKeys(t, f), "acct-9/$(OCCURRENCE)")
}

// TestOccurrenceTooLongIsBadInput: an occurrence that makes a key part
// longer than the ledger holds refuses the batch before any commit.
func TestOccurrenceTooLongIsBadInput(t *testing.T) {
	t.Parallel()
	r := occurrenceRun("long", v1alpha1.BatchSpec{Items: []v1alpha1.Item{{Entity: "a", Occurrence: strings.Repeat("x", 1000) + strings.Repeat("$(OCCURRENCE)", 4)}}})
	_, err := worker.NewPlan(context.Background(), r, nil, worker.Limits{})
	require.Error(t, err)
	require.True(t, worker.IsInputError(err), "%v", err)
	require.Contains(t, err.Error(), "spec.batch.items[0]")
}

// TestOccurrenceReachesTheQuery: a batch query reads the run's occurrence
// as current_setting('runledger.occurrence'), as a value: an occurrence
// holding quotes and SQL is only text.
func TestOccurrenceReachesTheQuery(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `CREATE TABLE accounts (id text); INSERT INTO accounts VALUES ('a1'), ('a2');`)
	q := `SELECT id AS entity, current_setting('` + v1alpha1.OccurrenceSetting + `') AS occurrence FROM accounts`
	r := occurrenceRun("query", v1alpha1.BatchSpec{Query: q})
	r.Spec.Occurrence = `2026-10'; DROP TABLE accounts; --`
	p, err := worker.NewPlan(context.Background(), r, nil, worker.Limits{})
	require.NoError(t, err)
	require.Equal(t, v1alpha1.ItemCounts{Total: 2, Completed: 2}, runPlan(t, f, p))
	require.Equal(t, []string{"a1/" + r.Spec.Occurrence, "a2/" + r.Spec.Occurrence}, committedKeys(t, f))
	require.EqualValues(t, 2, queryInt(t, f.pool, `SELECT count(*) FROM accounts`), "the occurrence was a value, not SQL")

	// A run without an occurrence: a query that names the setting is
	// refused as bad input before anything is committed; one that reads it
	// in a function finds it does not exist (directly to PostgreSQL).
	mustExec(t, f.pool, `CREATE FUNCTION occ() RETURNS text LANGUAGE sql AS $$ SELECT current_setting('runledger.occurrence') $$`)
	for _, tt := range []struct{ query, want string }{
		{q, `reads runledger.occurrence, and the run has no occurrence (spec.occurrence) to give it`},
		{`SELECT id AS entity, occ() AS occurrence FROM accounts`, `unrecognized configuration parameter "runledger.occurrence"`},
	} {
		if tt.query != q && pgtest.ThroughPooler() {
			continue // a server connection of the pooler may keep a placeholder
		}
		none := occurrenceRun("none", v1alpha1.BatchSpec{Query: tt.query})
		none.Spec.Occurrence = ""
		p, err = worker.NewPlan(context.Background(), none, nil, worker.Limits{})
		require.NoError(t, err)
		rep := worker.RunShard(context.Background(), f.store, p.ShardConfig(0, 0))
		require.Error(t, rep.Err)
		require.True(t, worker.IsInputError(rep.Err), "%v", rep.Err)
		require.Contains(t, rep.Err.Error(), tt.want)
		require.Zero(t, rep.Completed)
		require.EqualValues(t, 2, f.committed(t))
	}
}

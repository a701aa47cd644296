package ledger_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestFailureRecordsKeepPayloads: a failure record keeps its item's payload
// for a retry, as given, except one text cannot hold or over the limit
// (its digest alone is kept); a later pass replaces it, a chunk of the same
// pass keeps the first copy's.
func TestFailureRecordsKeepPayloads(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	item := func(entity, payload string) ledger.FailedItem {
		it := failedItem(entity, "23514", "refused")
		if payload != "" {
			it.Payload = []byte(payload)
		}
		return it
	}
	big := `"` + strings.Repeat("x", ledger.MaxFailurePayloadBytes) + `"`
	p1 := ledger.Pass{Run: runNamed("uid-p"), ID: "p1"}
	require.NoError(t, s.RecordVerdicts(ctx, p1, 1, []ledger.FailedItem{
		item("a", `{ "amount" : 1 }`), item("b", ""), item("c", "{\"s\": \"\xff\"}"), item("d", "nul\x00"), item("e", big),
	}, nil))
	kept := func(entity string) *string {
		return scalar[*string](t, pool, `SELECT payload FROM runledger.item_failure WHERE run_uid = 'uid-p' AND entity = $1`, entity)
	}
	require.Equal(t, `{ "amount" : 1 }`, *kept("a"), "as the source gave it")
	for _, e := range []string{"b", "c", "d", "e"} {
		require.Nil(t, kept(e), "%s: none kept", e)
	}
	require.True(t, scalar[bool](t, pool, `SELECT bool_and(payload_digest IS NOT NULL) FROM runledger.item_failure WHERE run_uid = 'uid-p' AND entity IN ('c', 'd', 'e')`),
		"a payload not kept still has its digest: the retry tells it from none")

	require.NoError(t, s.RecordVerdicts(ctx, p1, 2, []ledger.FailedItem{item("a", `{"amount": 2}`)}, nil))
	require.Equal(t, `{ "amount" : 1 }`, *kept("a"), "the same pass keeps its first copy's")
	p2 := ledger.Pass{Run: runNamed("uid-p"), ID: "p2"}
	require.NoError(t, s.RecordVerdicts(ctx, p2, 1, []ledger.FailedItem{item("a", `{"amount": 3}`)}, nil))
	require.Equal(t, `{"amount": 3}`, *kept("a"), "a later pass replaces it")
}

// TestEarlierRun: the run a fromRun batch reads is the latest of that name
// in the namespace whose batch the ledger holds; none, another namespace's,
// or a pruned one is ErrNoEarlierRun.
func TestEarlierRun(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	mustExec(t, pool, `INSERT INTO runledger.batch_run (run_uid, run_namespace, run_name, source, shards, items, created_at, pruned_at) VALUES
('old', 'billing', 'june', 'static', 1, 1, now() - interval '2 days', NULL),
('new', 'billing', 'june', 'query', 1, 1, now() - interval '1 day', NULL),
('other-ns', 'sales', 'june', 'static', 1, 1, now(), NULL),
('gone', 'billing', 'may', 'static', 1, 1, now(), now())`)
	uid, err := s.EarlierRun(ctx, "billing", "june")
	require.NoError(t, err)
	require.Equal(t, "new", uid, "the latest of that name")
	for _, tc := range []struct{ ns, name, want string }{
		{"billing", "july", "run billing/july: the ledger holds no such run (it never started, or it is in another namespace)"},
		{"default", "june", "run default/june: the ledger holds no such run"},
		{"billing", "may", "run billing/may (uid gone): the ledger holds no such run: its batch was pruned, and its failure records with it"},
	} {
		_, err := s.EarlierRun(ctx, tc.ns, tc.name)
		require.ErrorIs(t, err, ledger.ErrNoEarlierRun)
		require.ErrorContains(t, err, tc.want)
	}
	require.Equal(t, `'it''s'`, ledger.QuoteLiteralForTest(`it's`))
}

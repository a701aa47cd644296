package ledger_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// TestKeyProofVerdict: a key's copies are counted as the worker counts
// them (first copy completed or already handled, repeats already handled,
// a record's copies failed), and a key with no proof or contradicting
// records is Missing or Mismatched with the reason.
func TestKeyProofVerdict(t *testing.T) {
	other := &ledger.RunRef{Namespace: "billing", Name: "may", UID: "u-may"}
	key := ledger.Key{Entity: "acct-1", Occurrence: "2026-06"}
	for _, c := range []struct {
		name    string
		p       ledger.KeyProof
		verdict ledger.ProofVerdict
		counts  v1alpha1.ItemCounts
		missing int64
		problem bool
	}{
		{"own, repeated", ledger.KeyProof{Key: key, Copies: 3, Own: true}, ledger.ProofCompleted, v1alpha1.ItemCounts{Total: 3, Completed: 1, AlreadyHandled: 2}, 0, false},
		{"own, retired by another's Supersede", ledger.KeyProof{Key: key, Copies: 1, Own: true, Holder: other}, ledger.ProofCompleted, v1alpha1.ItemCounts{Total: 1, Completed: 1}, 0, false},
		{"another's", ledger.KeyProof{Key: key, Copies: 2, Holder: other}, ledger.ProofAlreadyHandled, v1alpha1.ItemCounts{Total: 2, AlreadyHandled: 2}, 0, false},
		{"failed", ledger.KeyProof{Key: key, Copies: 2, FailedCopies: 2, Holder: other}, ledger.ProofFailed, v1alpha1.ItemCounts{Total: 2, Failed: 2}, 0, false},
		{"a bad copy beside a committed one", ledger.KeyProof{Key: key, Copies: 2, FailedCopies: 1, Own: true}, ledger.ProofCompleted, v1alpha1.ItemCounts{Total: 2, Completed: 1, Failed: 1}, 0, false},
		{"no proof", ledger.KeyProof{Key: key, Copies: 2}, ledger.ProofMissing, v1alpha1.ItemCounts{Total: 2}, 2, true},
		{"a NULL key", ledger.KeyProof{NullKey: true, Copies: 2}, ledger.ProofBadRow, v1alpha1.ItemCounts{Total: 2}, 0, false},
		{"a blank key part", ledger.KeyProof{Key: ledger.Key{Entity: " ", Occurrence: "x"}, Copies: 1}, ledger.ProofBadRow, v1alpha1.ItemCounts{Total: 1}, 0, false},
		{"a record of more copies", ledger.KeyProof{Key: key, Copies: 1, FailedCopies: 2}, ledger.ProofMismatched, v1alpha1.ItemCounts{Total: 1, Failed: 2}, 0, true},
		{"committed and failed", ledger.KeyProof{Key: key, Copies: 1, FailedCopies: 1, Own: true}, ledger.ProofMismatched, v1alpha1.ItemCounts{Total: 1, Completed: 1, Failed: 1}, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := c.p.Verdict()
			require.Equal(t, c.verdict, v.Verdict)
			require.Equal(t, c.counts, v.ItemCounts)
			require.Equal(t, c.missing, v.Missing)
			require.Equal(t, c.problem, v.Problem != "", v.Problem)
		})
	}
}

// TestProveShard_CountedOnlyInOneServerLife: a shard's proof trusts no
// count the ledger does not agree with. While the server keeps the life it
// had as the pass began, the shard's counts are proven by counts on the
// server (its own rows, its batch's items, no failure record) without
// reading each key again; when they disagree with the ledger, or the server
// is another life of it (here its statistics reset, as a crash recovery
// resets them; TestServerChanges_CrashRecovery), or its life is unknown,
// every key is proven again and the ledger's counts are the proof's.
func TestProveShard_CountedOnlyInOneServerLife(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := migratedServer(t) // a server of its own: this test resets its statistics
	mustExec(t, pool, `CREATE TABLE public.src AS SELECT 'e' || i AS entity, 'o' AS occurrence FROM generate_series(1, 100) AS i`)
	s := ledger.NewStore(pool)
	run := runNamed("counted")
	_, err := s.FixQueryBatch(ctx, run, ledger.BatchQuery{SQL: `SELECT entity, occurrence FROM public.src`, Shards: 1,
		ShardOf: func(string, string) string { return "0" }})
	require.NoError(t, err)
	server, err := s.Server(ctx)
	require.NoError(t, err)
	require.True(t, server.Known(), "%s", server)
	// 70 keys the run commits, 30 another run held before.
	mustExec(t, pool, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
SELECT entity, occurrence, 'default', CASE WHEN i <= 70 THEN 'run-counted' ELSE 'earlier' END, CASE WHEN i <= 70 THEN 'counted' ELSE 'earlier' END, 0, 0
FROM public.src, LATERAL (SELECT substr(entity, 2)::int AS i) AS n`)
	truth := v1alpha1.ItemCounts{Total: 100, Completed: 70, AlreadyHandled: 30}

	prove := func(c *ledger.Counted) ledger.RunProof {
		t.Helper()
		p, err := s.ProveShard(ctx, "counted", 0, true, nil, c)
		require.NoError(t, err)
		require.True(t, p.Proven(), "%+v", p)
		return p
	}
	p := prove(&ledger.Counted{Server: server, ItemCounts: truth})
	require.True(t, p.Counted, "the same life, counts the ledger agrees with: no key read again")
	require.Equal(t, truth, p.ItemCounts)

	for name, wrong := range map[string]v1alpha1.ItemCounts{
		"completed one too many":  {Total: 100, Completed: 71, AlreadyHandled: 29},
		"completed one too few":   {Total: 100, Completed: 69, AlreadyHandled: 31},
		"a batch of another size": {Total: 101, Completed: 70, AlreadyHandled: 31},
	} {
		p := prove(&ledger.Counted{Server: server, ItemCounts: wrong})
		require.False(t, p.Counted, "%s: proven key by key", name)
		require.Equal(t, truth, p.ItemCounts, "%s: the ledger's counts", name)
		require.EqualValues(t, 100, p.Keys, name)
	}
	p = prove(&ledger.Counted{ItemCounts: truth})
	require.False(t, p.Counted, "a server of unknown life: key by key")
	require.Equal(t, truth, p.ItemCounts)
	require.False(t, prove(nil).Counted)

	mustExec(t, pool, `SELECT pg_catalog.pg_stat_reset_shared('bgwriter')`)
	now, err := s.Server(ctx)
	require.NoError(t, err)
	require.False(t, now.Same(server), "%s and %s", server, now)
	p = prove(&ledger.Counted{Server: server, ItemCounts: truth})
	require.False(t, p.Counted, "another life of the server: key by key")
	require.Equal(t, truth, p.ItemCounts)
	require.True(t, prove(&ledger.Counted{Server: now, ItemCounts: truth}).Counted, "counted again in the life the pass began in")
}

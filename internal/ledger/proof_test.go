package ledger_test

import (
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

package controllers

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestLedgerChangedNote: what the LedgerServerChanged Event says of a
// succeeded shard's report; nothing when its ledger did not change under it.
func TestLedgerChangedNote(t *testing.T) {
	for _, tc := range []struct {
		rep  v1alpha1.ShardReport
		want string
	}{
		{v1alpha1.ShardReport{Shard: 1}, ""},
		{v1alpha1.ShardReport{Shard: 1, Attempt: 2, ServerChanges: 1},
			"Shard 1 attempt 2: its ledger sessions reached another database server, or a restarted one, 1 time(s) (a failover?); the ledger held everything the shard had counted; the shard's counts are the ledger's, proven before it reported"},
		{v1alpha1.ShardReport{Shard: 1, Reproven: 1, Reprocessed: 40},
			"Shard 1 attempt 0: the ledger no longer held 40 item(s) the shard had counted (their commits lost with the old server): processed again in 1 more pass(es), SQL effects once on the new server, a processor's items again with the same key; the shard's counts are the ledger's, proven before it reported"},
	} {
		require.Equal(t, tc.want, ledgerChangedNote(tc.rep.Shard, &tc.rep))
	}
}

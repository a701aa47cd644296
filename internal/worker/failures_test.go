package worker_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/worker"
)

// TestDeferredForeignKeyWithinMaxFailedItems: the effect writes into a table
// whose foreign key is checked at COMMIT (DEFERRABLE INITIALLY DEFERRED).
// The items without an account fail on their own; the shard finishes, within
// maxFailedItems, instead of failing its chunk on every attempt.
func TestDeferredForeignKeyWithinMaxFailedItems(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, strings.Replace(invoiceSchema, "REFERENCES accounts (id)", "REFERENCES accounts (id) DEFERRABLE INITIALLY DEFERRED", 1))
	items := keyItems("acct", 200)
	// Every item has an account but those with an index divisible by 50.
	mustExec(t, f.pool, `INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 199) i WHERE i % 50 <> 0`)
	cfg := worker.ShardConfig{Run: run("uid-deferred"), Shards: 2, Source: worker.NewStaticSource("items", items),
		Effect: invoiceEffect, ChunkSize: 32, MaxFailedItems: 4}

	reports, sum := runShards(t, f, cfg)
	require.Equal(t, worker.Counts{Total: 200, Completed: 196, Failed: 4}, sum)
	for _, r := range reports {
		require.False(t, r.TooManyFailures, "shard %d: 4 failures are allowed", r.Shard)
		for _, fl := range r.Failures {
			var i int
			_, err := fmt.Sscanf(fl.Entity, "acct-%d", &i)
			require.NoError(t, err)
			require.Zero(t, i%50, "only items without an account fail: %s", fl.Entity)
			require.Contains(t, fl.Error, `violates foreign key constraint "invoices_account_fkey"`)
		}
	}
	require.EqualValues(t, 196, queryInt(t, f.pool, `SELECT count(*) FROM invoices`), "the effect ran once per committed item")
	require.EqualValues(t, 196, f.committed(t))
}

package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestMigrate_RuleRebuildWhileAShardReads: migration 00005 rebuilds the
// rule's index, which needs the ledger to itself. Applied while a shard of a
// query-source run has its batch cursor open and its worker keeps
// committing, it must neither freeze that worker nor hang itself. The
// cursor holds no transaction open (it was materialised when it was
// opened; it used to read the ledger until the shard ended, and the
// migration had to give up), so the migration applies while the shard
// reads, every row kept, and the cursor reads on.
func TestMigrate_RuleRebuildWhileAShardReads(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// A ledger as a release before 00005 left it, with rows.
	downToForThisRelease(t, pool, 4)
	s := ledger.NewStore(pool)
	commit(t, s, runNamed("earlier"), items("e", 0, 50), ledger.ChunkOptions{})

	// A shard of a query-source run reads its batch.
	mustExec(t, pool, batchSource)
	run := runNamed("in-flight")
	h, err := s.FixQueryBatch(ctx, run, batchQuery())
	require.NoError(t, err)
	r, err := s.OpenBatch(ctx, h, run.UID, 0, true)
	require.NoError(t, err)
	rows, _, err := r.Fetch(ctx, 0, 10, true)
	require.NoError(t, err)
	require.Len(t, rows, 10)

	migrated := make(chan error, 1)
	go func() {
		_, err := ledger.Migrate(ctx, pool)
		migrated <- err
	}()
	// The shard's worker commits its chunk meanwhile, and the next.
	for i := range 3 {
		chunkCtx, chunkCancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := s.CommitChunk(chunkCtx, run, items("w"+string(rune('a'+i)), 0, 10), ledger.ChunkOptions{})
		chunkCancel()
		require.NoError(t, err, "a worker's chunk while the migration waits for the ledger")
		time.Sleep(500 * time.Millisecond)
	}
	select {
	case err = <-migrated:
	case <-time.After(30 * time.Second):
		t.Fatal("the migration still waits for the ledger the shard reads")
	}
	require.NoError(t, err, "the shard's open cursor holds no lock on the ledger")
	rows, _, err = r.Fetch(ctx, 10, 10, true)
	require.NoError(t, err, "the shard reads on after the migration")
	require.Len(t, rows, 10)
	require.Equal(t, "CREATE UNIQUE INDEX ledger_business_key_uq ON runledger.ledger USING btree (occurrence, entity) WHERE (state = 'committed'::text)",
		scalar[string](t, pool, `SELECT pg_get_indexdef('runledger.ledger_business_key_uq'::regclass)`))
	require.Equal(t, 80, scalar[int](t, pool, `SELECT count(*)::int FROM runledger.ledger WHERE state = 'committed'`))
	requireOneCommittedPerKey(t, pool, 80)
}

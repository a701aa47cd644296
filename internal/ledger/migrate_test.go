package ledger_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

func schemaSnapshot(t *testing.T, dsn string) []string {
	t.Helper()
	pool := pgtest.Pool(t, dsn)
	rows, err := pool.Query(context.Background(), `
SELECT c.relname || ':' || c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'runledger' ORDER BY 1`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestMigrate_TwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewEmptyDatabase(t)
	ctx := context.Background()

	// Four migrators at once: all succeed, exactly one applies the migrations.
	const n = 4
	applied := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			pool, err := ledger.Open(ctx, dsn, 2)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			applied[i], errs[i] = ledger.Migrate(ctx, pool)
		})
	}
	wg.Wait()
	total := 0
	for i := range n {
		require.NoError(t, errs[i], "migrator %d", i)
		total += applied[i]
	}
	require.Equal(t, 1, total, "the one migration is applied once, by one migrator")
	first := schemaSnapshot(t, dsn)
	require.Contains(t, first, ledger.BusinessKeyIndex+":i")

	// Once more: nothing to do, the same schema.
	pool := pgtest.Pool(t, dsn)
	again, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, again)
	require.Equal(t, first, schemaSnapshot(t, dsn))
}

package clitest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/cli"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestPrune: runledger prune deletes the rows of old batches only, keeps
// their headers as tombstones, and a bad flag prunes nothing.
func TestPrune(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE src AS SELECT 'e' || i AS entity, 'o' AS occurrence FROM generate_series(1, 10) i`)
	require.NoError(t, err)
	store := ledger.NewStore(pool)
	q := ledger.BatchQuery{SQL: `SELECT entity, occurrence FROM src`, Shards: 1, ShardOf: func(string, string) string { return "0" }}
	for _, uid := range []string{"old", "new"} {
		_, err := store.FixQueryBatch(ctx, ledger.Run{Namespace: "ns", Name: uid, UID: uid}, q)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `UPDATE runledger.batch_run SET created_at = now() - interval '48 hours' WHERE run_uid = 'old'`)
	require.NoError(t, err)

	prune := func(args ...string) (string, error) {
		cmd := cli.NewRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"prune", "--dsn", dsn}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := prune("--older-than", "24h")
	require.NoError(t, err)
	require.Contains(t, out, "batches pruned: 1 (10 rows deleted)")
	var pruned *time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT pruned_at FROM runledger.batch_run WHERE run_uid = 'old'`).Scan(&pruned))
	require.NotNil(t, pruned, "the header stays, marked pruned")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(cardinality(seqs)), 0) FROM runledger.batch`).Scan(&left))
	require.Equal(t, 10, left, "the newer batch is kept")

	for _, bad := range [][]string{{"--older-than", "0s"}, {"--older-than", "-1h"}, {}} {
		_, err := prune(bad...)
		require.Error(t, err, "%v", bad)
	}
	_, err = prune("--older-than", "0s")
	var exit *cli.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, cli.ExitBadInput, exit.Code)
	require.ErrorContains(t, err, "--older-than must be a positive duration")
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(cardinality(seqs)), 0) FROM runledger.batch`).Scan(&left))
	require.Equal(t, 10, left, "a bad flag prunes nothing")
}

package clitest

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	// The old run committed its items: pruning its batch keeps every one.
	var committed []ledger.Item
	for i := 1; i <= 10; i++ {
		committed = append(committed, ledger.Item{Key: ledger.Key{Entity: fmt.Sprintf("e%d", i), Occurrence: "o"}})
	}
	_, err = store.CommitChunk(ctx, ledger.Run{Namespace: "ns", Name: "old", UID: "old"}, committed, ledger.ChunkOptions{})
	require.NoError(t, err)
	ledgerRows := func() (rows []string) {
		r, err := pool.Query(ctx, `SELECT format('%s/%s %s %s', entity, occurrence, state, run_uid) FROM runledger.ledger ORDER BY id`)
		require.NoError(t, err)
		rows, err = pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(t, err)
		return rows
	}
	before := ledgerRows()
	require.Len(t, before, 10)

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
	require.Equal(t, before, ledgerRows(), "pruning a batch never removes a committed row")

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

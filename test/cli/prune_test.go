package clitest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestPrune: runledger prune deletes the rows of old batches only, and the
// failure records of their runs, keeps their headers as tombstones, and a
// bad flag prunes nothing.
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
	// Both runs have failed items on record.
	for _, uid := range []string{"old", "new"} {
		pass := ledger.Pass{Run: ledger.Run{Namespace: "ns", Name: uid, UID: uid}, ID: "pass-" + uid}
		require.NoError(t, store.RecordVerdicts(ctx, pass, 1, []ledger.FailedItem{
			{Key: ledger.Key{Entity: "f1", Occurrence: "o"}, Class: "23503", Error: "no account"},
			{Key: ledger.Key{Entity: "f2", Occurrence: "o"}, Class: ledger.ClassInput, Error: "blank"},
		}, nil))
	}
	failures := func(uid string) (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM runledger.item_failure WHERE run_uid = $1`, uid).Scan(&n))
		return n
	}

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
	require.Contains(t, out, "batches pruned: 1 (10 rows deleted, 2 failure records)")
	require.Zero(t, failures("old"), "the pruned run's failure records go with it")
	require.Equal(t, 2, failures("new"), "the newer run's stay")
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
	var exit *exitcode.Error
	require.ErrorAs(t, err, &exit)
	require.Equal(t, v1alpha1.ExitBadInput, exit.Code)
	require.ErrorContains(t, err, "--older-than must be a positive duration")
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(cardinality(seqs)), 0) FROM runledger.batch`).Scan(&left))
	require.Equal(t, 10, left, "a bad flag prunes nothing")
	require.Equal(t, 2, failures("new"), "a bad flag prunes nothing")
}

// TestPrune_RunInFlight: runledger prune leaves the batch of a run in flight
// (a worker holds a shard's lease) and exits 4 (not 2: nothing was wrong with
// the input, and the rest was pruned), naming the run; once the run is over,
// the same command prunes it and exits 0.
func TestPrune_RunInFlight(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	ctx := context.Background()
	d.exec(t, `CREATE TABLE src AS SELECT 'e' || i AS entity, 'o' AS occurrence FROM generate_series(1, 10) i`)
	store := ledger.NewStore(d.pool)
	q := ledger.BatchQuery{SQL: `SELECT entity, occurrence FROM src`, Shards: 2}
	for _, uid := range []string{"uid-over", "uid-busy"} {
		_, err := store.FixQueryBatch(ctx, ledger.Run{Namespace: "ns", Name: strings.TrimPrefix(uid, "uid-"), UID: uid}, q)
		require.NoError(t, err)
	}
	d.exec(t, `UPDATE runledger.batch_run SET created_at = now() - interval '48 hours'`)
	lock := store.ShardLease("uid-busy", 1)
	require.NoError(t, lock.Acquire(ctx, time.Second, nil))
	defer lock.Release()
	left := func(uid string) int64 {
		var n int64
		require.NoError(t, d.pool.QueryRow(ctx, `SELECT coalesce(sum(cardinality(b.seqs)), 0) FROM runledger.batch AS b
JOIN runledger.batch_run AS h ON h.id = b.batch_id WHERE h.run_uid = $1`, uid).Scan(&n))
		return n
	}

	r := runCLI(t, "", "prune", "--older-than", "24h", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitRunsInFlight, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Equal(t, 4, r.code, "the code is part of the CLI's contract")
	require.Contains(t, r.stdout, "batches pruned: 1 (10 rows deleted, 0 failure records)")
	require.Contains(t, r.stderr, "1 runs in flight left unpruned")
	require.Contains(t, r.stderr, "ns/busy (uid-busy)")
	require.Zero(t, left("uid-over"), "the run that is over is pruned")
	require.EqualValues(t, 10, left("uid-busy"), "the run in flight is not")

	help := runCLI(t, "", "prune", "--help")
	require.Contains(t, help.stdout, "4 when some batches were\nleft because their run is in flight")

	lock.Release()
	r = runCLI(t, "", "prune", "--older-than", "24h", "--dsn", d.dsn)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, "batches pruned: 1 (10 rows deleted, 0 failure records)")
	require.Zero(t, left("uid-busy"))
}

package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// TestPrepareAndRunShards: Prepare migrates an empty database (whose effect
// sandbox is then given to the effect role, as `runledger migrate
// --effect-role` does) and checks the plan; RunShards runs every shard with one failure budget: once the run as a
// whole has more failed items than allowed, every shard stops, and the
// reports add up to the result.
func TestPrepareAndRunShards(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewEmptyDatabase(t)
	pool := pgtest.Pool(t, dsn)
	mustExec(t, pool, invoiceSchema+`GRANT ALL ON accounts, invoices TO `+pgtest.EffectRole) // no accounts: every effect fails
	plan := &worker.Plan{Run: ledger.Run{Namespace: "default", Name: "budget", UID: "uid-budget"}, Shards: 3,
		Source: worker.NewStaticSource("items", keyItems("acct", 300)), Effect: invoiceEffect, ChunkSize: 10, MaxFailedItems: 45}

	_, _, err := worker.Prepare(context.Background(), plan, worker.PrepareConfig{DSN: dsn, Parallel: 3})
	require.ErrorContains(t, err, "runledger migrate --grant-to WORKER --effect-role ROLE", "migrated, but no effect runs unsandboxed")
	require.NoError(t, ledger.SetEffectRole(context.Background(), pool, pgtest.EffectRole))
	store, closeStore, err := worker.Prepare(context.Background(), plan, worker.PrepareConfig{DSN: dsn, Parallel: 3})
	require.NoError(t, err)
	defer closeStore()
	res := worker.RunShards(context.Background(), store, plan, []int{0, 1, 2}, worker.ShardsConfig{Parallel: 3})

	require.Len(t, res.Shards, 3)
	var sum v1alpha1.ItemCounts
	for i, r := range res.Shards {
		require.Equal(t, i, r.Shard, "reports in the order asked")
		require.NoError(t, r.Err)
		require.True(t, r.TooManyFailures, "shard %d stopped with the run's budget", i)
		sum.Add(r.ItemCounts)
	}
	require.Equal(t, sum, res.ItemCounts, "the result is the sum of the reports")
	require.EqualValues(t, 300, res.Total)
	// Alone, each shard would stop after 5 chunks (50 > 45), 150 in all; on
	// one budget they stop once the run has crossed 45, with at most one
	// chunk per shard in flight.
	require.Greater(t, res.Failed, int64(45))
	require.LessOrEqual(t, res.Failed, int64(90), "one budget for the run, not one per shard")
	require.Len(t, res.Failures, int(res.Failed), "every failure listed (fewer than MaxFailures)")
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM runledger.ledger`), "nothing committed")
}

// TestRunShardsStoppedBeforeStart: shards not started when the context is
// cancelled are reported interrupted, having done nothing.
func TestRunShardsStoppedBeforeStart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	plan := &worker.Plan{Run: ledger.Run{Namespace: "default", Name: "stopped", UID: "uid-stopped"}, Shards: 2,
		Source: worker.NewStaticSource("items", keyItems("acct", 10)), ChunkSize: 10}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := worker.RunShards(ctx, f.store, plan, []int{0, 1}, worker.ShardsConfig{Parallel: 1})
	require.True(t, res.Interrupted)
	require.Equal(t, v1alpha1.ItemCounts{}, res.ItemCounts)
	require.Equal(t, []worker.Report{{Shard: 0, Interrupted: true}, {Shard: 1, Interrupted: true}}, res.Shards)
	require.Zero(t, f.committed(t))
}

// TestPrepareBadDSN: a connection string that cannot be parsed is bad input,
// its password masked.
func TestPrepareBadDSN(t *testing.T) {
	t.Parallel()
	plan := &worker.Plan{Source: worker.NewStaticSource("items", keyItems("acct", 1))}
	_, _, err := worker.Prepare(context.Background(), plan, worker.PrepareConfig{DSN: "postgres://u:s3cret@host:notaport/db"})
	require.Error(t, err)
	require.True(t, worker.IsInputError(err), "%v", err)
	require.NotContains(t, err.Error(), "s3cret")
}

// TestPrepareUsesTheRunsNetworkTimeout: the pool Prepare opens takes the
// plan's spec.timeouts.networkSeconds: a server that accepts connections and
// never answers is given up on after it (one attempt here), not after the
// default's 30 seconds.
func TestPrepareUsesTheRunsNetworkTimeout(t *testing.T) {
	t.Parallel()
	host, port, _ := strings.Cut(pgtest.SilentServer(t), ":")
	prun := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Name: "silent"}, Spec: v1alpha1.ProcessingRunSpec{
		Batch:    v1alpha1.BatchSpec{Items: specItems("acct", 1)},
		Timeouts: &v1alpha1.Timeouts{NetworkSeconds: 2},
	}}
	plan, err := worker.NewPlan(context.Background(), prun, nil, worker.Limits{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // pgx alone waits forever
	defer cancel()
	start := time.Now()
	_, _, err = worker.Prepare(ctx, plan, worker.PrepareConfig{
		DSN:   "host=" + host + " port=" + port + " user=app dbname=app sslmode=disable",
		Retry: worker.Backoff{Initial: time.Millisecond, Max: time.Millisecond, MaxAttempts: 1, MaxElapsed: time.Minute},
	})
	require.Error(t, err)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the connect timeout: %v", err)
	require.Less(t, time.Since(start), 10*time.Second, "bounded by networkSeconds (2s)")
}

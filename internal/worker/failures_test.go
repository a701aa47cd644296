package worker_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
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
	require.Equal(t, v1alpha1.ItemCounts{Total: 200, Completed: 196, Failed: 4}, sum)
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

// TestLockTimeoutIsRetriedByTheShard: the effect waits for a row lock another
// session holds until the role's lock_timeout. The shard retries the chunk
// with back-off (no item is Failed for it) and commits it once the lock is
// released, each item and its effect once.
func TestLockTimeoutIsRetriedByTheShard(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "gives the session its lock_timeout as a startup parameter, which PgBouncer refuses")
	ctx := context.Background()
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema+`
INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 99) i;
ALTER TABLE accounts ADD COLUMN invoiced int NOT NULL DEFAULT 0`)
	app := pgtest.Pool(t, f.pool.Config().ConnConfig.ConnString()+" lock_timeout=100")

	holder, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT * FROM accounts WHERE id = 'acct-42' FOR UPDATE`)
	require.NoError(t, err)

	var retries atomic.Int32
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "55P03") && retries.Add(1) == 2 {
			_ = holder.Rollback(ctx) // the lock is released after two retries
		}
	}, funcr.Options{})
	rep := worker.RunShard(ctx, ledger.NewStore(app), worker.ShardConfig{Run: run("uid-locked"),
		Source: worker.NewStaticSource("items", keyItems("acct", 100)), ChunkSize: 100, MaxFailedItems: 0, Log: log,
		Effect: `UPDATE accounts SET invoiced = invoiced + 1 FROM claimed WHERE accounts.id = claimed.entity`,
		Retry:  worker.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 20, MaxElapsed: time.Minute}})
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, rep.ItemCounts, "failures: %v", rep.Failures)
	require.GreaterOrEqual(t, retries.Load(), int32(2), "the chunk was retried after the lock timeout")
	require.EqualValues(t, 100, f.committed(t))
	require.EqualValues(t, 100, queryInt(t, f.pool, `SELECT sum(invoiced) FROM accounts`), "the effect ran once per item")
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM accounts WHERE invoiced <> 1`))
}

// TestSpecTimeoutsBoundTheEffect: spec.timeouts reach the effect through the
// plan. An effect that sleeps past effectSeconds, or waits for a lock held
// elsewhere past lockSeconds, fails its chunk as transient; the chunk is
// retried and commits once, each item's effect once.
func TestSpecTimeoutsBoundTheEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	mustExec(t, f.pool, `
CREATE TABLE accounts (id text PRIMARY KEY, invoiced int NOT NULL DEFAULT 0);
INSERT INTO accounts (id) SELECT 'acct-' || i FROM generate_series(0, 99) i;
CREATE SEQUENCE tries;
CREATE FUNCTION first_try_sleeps() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('tries') = 1 THEN PERFORM pg_sleep(60); END IF;
    RETURN true;
END $$`)
	holder, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT * FROM accounts WHERE id = 'acct-42' FOR UPDATE`)
	require.NoError(t, err)

	var timeouts, lockTimeouts atomic.Int32
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "57014") {
			timeouts.Add(1)
		}
		if strings.Contains(args, "55P03") && lockTimeouts.Add(1) == 1 {
			_ = holder.Rollback(ctx) // the lock is released after the first lock timeout
		}
	}, funcr.Options{})
	prun := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "timeouts", UID: "uid-timeouts"},
		Spec: v1alpha1.ProcessingRunSpec{
			Batch:     v1alpha1.BatchSpec{Items: specItems("acct", 100)},
			Effect:    &v1alpha1.EffectSpec{SQL: `UPDATE accounts SET invoiced = invoiced + 1 FROM claimed WHERE accounts.id = claimed.entity AND first_try_sleeps()`},
			ChunkSize: 100,
			Timeouts:  &v1alpha1.Timeouts{EffectSeconds: 2, LockSeconds: 1},
		},
	}
	plan, err := worker.NewPlan(ctx, prun, nil, worker.Limits{})
	require.NoError(t, err)
	require.Equal(t, v1alpha1.RunTimeouts{Effect: 2 * time.Second, Query: v1alpha1.DefaultQuerySeconds * time.Second,
		Lock: time.Second, Network: v1alpha1.DefaultNetworkSeconds * time.Second}, plan.Timeouts, "unset timeouts take their defaults")
	cfg := plan.ShardConfig(0, 0)
	cfg.Log = log
	cfg.Retry = worker.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 20, MaxElapsed: time.Minute}
	start := time.Now()
	rep := worker.RunShard(ctx, f.store, cfg)
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.Less(t, time.Since(start), 30*time.Second, "the sleeping effect was stopped by its timeout")
	require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, rep.ItemCounts, "failures: %v", rep.Failures)
	require.EqualValues(t, 1, timeouts.Load(), "the chunk was retried after the statement timeout")
	require.EqualValues(t, 1, lockTimeouts.Load(), "and after the lock timeout")
	require.EqualValues(t, 100, f.committed(t))
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM accounts WHERE invoiced <> 1`), "the effect ran once per item")
}

func specItems(entity string, n int) []v1alpha1.Item {
	out := make([]v1alpha1.Item, n)
	for i := range out {
		out[i] = v1alpha1.Item{Entity: fmt.Sprintf("%s-%d", entity, i), Occurrence: "2026-01"}
	}
	return out
}

// TestSpecLockSecondsBoundTheClaim: a key of the chunk is held by another
// transaction that inserted it and never commits (a stopped process whose
// connection stays up). The claim waits at most spec.timeouts.lockSeconds,
// without an effect, with one and with a processor; the chunk is retried as
// transient and completes, each item (and its effect or call) once, as soon
// as the holder goes.
func TestSpecLockSecondsBoundTheClaim(t *testing.T) {
	t.Parallel()
	for _, tc := range []string{"no effect", "sql effect", "processor"} {
		t.Run(tc, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := newFixture(t)
			mustExec(t, f.pool, `CREATE TABLE notes (entity text PRIMARY KEY)`)
			holder, err := f.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(ctx) }()
			_, err = holder.Exec(ctx, `INSERT INTO runledger.ledger (entity, occurrence, state, run_namespace, run_name, run_uid, shard, attempt)
VALUES ('acct-42', '2026-01', 'committed', 'ns', 'stopped', 'uid-stopped', 0, 0)`)
			require.NoError(t, err)

			var lockTimeouts atomic.Int32
			log := funcr.New(func(_, args string) {
				if strings.Contains(args, "55P03") && lockTimeouts.Add(1) == 1 {
					_ = holder.Rollback(ctx) // the holder goes after the first lock timeout
				}
			}, funcr.Options{})
			prun := &v1alpha1.ProcessingRun{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "claim", UID: "uid-claim"},
				Spec: v1alpha1.ProcessingRunSpec{
					Batch:     v1alpha1.BatchSpec{Items: specItems("acct", 100)},
					ChunkSize: 100,
					Timeouts:  &v1alpha1.Timeouts{LockSeconds: 1},
				},
			}
			if tc == "sql effect" {
				prun.Spec.Effect = &v1alpha1.EffectSpec{SQL: `INSERT INTO notes SELECT entity FROM claimed`}
			}
			plan, err := worker.NewPlan(ctx, prun, nil, worker.Limits{})
			require.NoError(t, err)
			cfg := plan.ShardConfig(0, 0)
			rec := newRecorder()
			if tc == "processor" {
				srv := httptest.NewServer(rec.handler())
				defer srv.Close()
				cfg.Processor = worker.NewHTTPProcessor(srv.URL, 5*time.Second)
			}
			cfg.Log = log
			cfg.Retry = worker.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 20, MaxElapsed: time.Minute}
			// An unbounded wait lasts until this context ends: the test then
			// fails instead of hanging.
			bounded, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			rep := worker.RunShard(bounded, f.store, cfg)
			require.NoError(t, bounded.Err(), "the claim waited for the holder without a bound")
			require.NoError(t, rep.Err)
			require.True(t, rep.Done)
			require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, rep.ItemCounts, "failures: %v", rep.Failures)
			require.EqualValues(t, 1, lockTimeouts.Load(), "the chunk was retried after the lock timeout")
			require.EqualValues(t, 100, f.committed(t))
			switch tc {
			case "sql effect":
				require.EqualValues(t, 100, queryInt(t, f.pool, `SELECT count(*) FROM notes`), "the effect ran once per item")
			case "processor":
				_, sent, _ := rec.snapshot()
				require.Len(t, sent, 100)
				for k, n := range sent {
					require.Equal(t, 1, n, "key %s sent once", k)
				}
			}
		})
	}
}

package worker_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// fixture is a fresh ledger database with a statement counter on the ledger
// table: every INSERT, UPDATE or DELETE statement against it (even one that
// changes no row, like an INSERT ... ON CONFLICT DO NOTHING that skipped every
// key) bumps ledger_writes.n, so "zero writes to the ledger" is checkable.
type fixture struct {
	pool  *pgxpool.Pool
	store *ledger.Store
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := pgtest.NewPool(t)
	mustExec(t, pool, `
CREATE TABLE ledger_writes (n bigint NOT NULL);
INSERT INTO ledger_writes VALUES (0);
CREATE FUNCTION count_ledger_write() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN UPDATE public.ledger_writes SET n = n + 1; RETURN NULL; END $$; -- qualified: ledger_take_back pins search_path
CREATE TRIGGER count_ledger_writes AFTER INSERT OR UPDATE OR DELETE ON runledger.ledger
  FOR EACH STATEMENT EXECUTE FUNCTION count_ledger_write();`)
	return &fixture{pool: pool, store: ledger.NewStore(pool)}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, "executing %s", sql)
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n), "querying %s", sql)
	return n
}

func (f *fixture) ledgerWrites(t *testing.T) int64 {
	return queryInt(t, f.pool, `SELECT n FROM ledger_writes`)
}

// committed returns how many committed rows the ledger holds, and checks
// that no key has two.
func (f *fixture) committed(t *testing.T) int64 {
	t.Helper()
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM (SELECT 1 FROM runledger.ledger WHERE state = 'committed' GROUP BY entity, occurrence HAVING count(*) > 1) d`),
		"a business key with two committed rows")
	return queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed'`)
}

func run(uid string) ledger.Run {
	return ledger.Run{Namespace: "default", Name: "run-" + uid, UID: uid}
}

// runShards runs every shard of cfg concurrently and returns their reports
// (in shard order) and their sum.
func runShards(t *testing.T, f *fixture, cfg worker.ShardConfig) ([]worker.Report, v1alpha1.ItemCounts) {
	t.Helper()
	reports := make([]worker.Report, max(cfg.Shards, 1))
	var wg sync.WaitGroup
	for i := range reports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Run.Shard = i
			reports[i] = worker.RunShard(context.Background(), f.store, c)
		}()
	}
	wg.Wait()
	var sum v1alpha1.ItemCounts
	for _, r := range reports {
		require.NoError(t, r.Err, "shard %d", r.Shard)
		require.True(t, r.Done, "shard %d done", r.Shard)
		require.True(t, r.TotalKnown, "shard %d knows its total", r.Shard)
		require.Equal(t, r.Total, r.Processed(), "shard %d: completed + alreadyHandled + failed == total", r.Shard)
		require.True(t, r.Proven, "shard %d: its counts proven by the ledger", r.Shard)
		sum.Add(r.ItemCounts)
	}
	requireLedgerProves(t, f.store, cfg, sum)
	return reports, sum
}

// requireLedgerProves: the ledger alone (ProveRun, what runledger verify
// reads) proves counts for cfg's run, which every shard ran: the shards'
// own proofs, added up, are the run's.
func requireLedgerProves(t *testing.T, store *ledger.Store, cfg worker.ShardConfig, counts v1alpha1.ItemCounts) {
	t.Helper()
	ctx := context.Background()
	runs, err := store.FindRuns(ctx, cfg.Run.Namespace, cfg.Run.Name)
	require.NoError(t, err)
	i := slices.IndexFunc(runs, func(r ledger.RunRecord) bool { return r.UID == cfg.Run.UID })
	require.GreaterOrEqual(t, i, 0, "the ledger holds run %s", cfg.Run.UID)
	var batch []ledger.Key
	if src, ok := cfg.Source.(*worker.StaticSource); ok {
		for _, it := range src.Items() {
			batch = append(batch, it.Key)
		}
	}
	p, err := store.ProveRun(ctx, runs[i], batch, func(ledger.KeyProof, ledger.KeyVerdict) error { return nil })
	require.NoError(t, err)
	require.True(t, p.Proven(), "the ledger proves run %s: %+v", cfg.Run.UID, p)
	counts.PayloadChanged = 0
	require.Equal(t, counts, p.ItemCounts, "run %s: the shards' counts are the ledger's", cfg.Run.UID)
}

func keyItems(prefix string, n int) []ledger.Item {
	out := make([]ledger.Item, n)
	for i := range out {
		out[i] = ledger.Item{Key: ledger.Key{Entity: fmt.Sprintf("%s-%d", prefix, i), Occurrence: "2024-06"}, Payload: []byte(fmt.Sprintf(`{"amount": %d}`, i))}
	}
	return out
}

// TestInlineSourceCountsAndDuplicates: a batch with repeats, spread over 3
// shards and small chunks so that repeats straddle chunks: every distinct key
// is committed once; repeats are already handled; the counts add up.
func TestInlineSourceCountsAndDuplicates(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	base := keyItems("acct", 500)
	items := append([]ledger.Item(nil), base...)
	items = append(items, base[:100]...)    // 100 repeats
	items = append(items, base[7], base[7]) // 2 more of one key
	cfg := worker.ShardConfig{Run: run("uid-inline"), Shards: 3, Source: worker.NewStaticSource("items", items), ChunkSize: 7}

	reports, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 602, Completed: 500, AlreadyHandled: 102}, sum)
	require.EqualValues(t, 500, f.committed(t), "one committed row per distinct key")
	for _, r := range reports {
		require.NotZero(t, r.Total, "shard %d has items: the hash spreads them", r.Shard)
	}
}

// TestRerunOfFinishedBatch: the same run again counts everything completed
// (its own rows) without one write to the ledger; another run over the same
// batch counts everything already handled, again without a write.
func TestRerunOfFinishedBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	items := keyItems("acct", 1000)
	items = append(items, items[:10]...)
	cfg := worker.ShardConfig{Run: run("uid-first"), Shards: 2, Source: worker.NewStaticSource("items", items), ChunkSize: 100}
	_, first := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 1010, Completed: 1000, AlreadyHandled: 10}, first)
	writes := f.ledgerWrites(t)
	require.NotZero(t, writes, "the first run wrote")

	_, again := runShards(t, f, cfg)
	require.Equal(t, first, again, "the same run again: its own rows count as completed, as in an uninterrupted run")
	require.Equal(t, writes, f.ledgerWrites(t), "no statement wrote to the ledger: the preload settled every key")

	other := cfg
	other.Run = run("uid-other")
	_, second := runShards(t, f, other)
	require.Equal(t, v1alpha1.ItemCounts{Total: 1010, AlreadyHandled: 1010}, second, "another run: all already handled")
	require.Equal(t, writes, f.ledgerWrites(t), "still no write to the ledger")
	require.EqualValues(t, 1000, f.committed(t))
}

// TestEarlierAttemptCountsAsCompleted: rows an earlier attempt of the same run
// committed (it died after COMMIT) count as completed; rows of another run as
// already handled.
func TestEarlierAttemptCountsAsCompleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	items := keyItems("acct", 300)
	earlier := run("uid-restart")
	_, err := f.store.CommitChunk(ctx, earlier, items[:120], ledger.ChunkOptions{})
	require.NoError(t, err, "the earlier attempt's commit")
	_, err = f.store.CommitChunk(ctx, run("uid-someone-else"), items[250:], ledger.ChunkOptions{})
	require.NoError(t, err, "another run's commit")

	cfg := worker.ShardConfig{Run: earlier, Source: worker.NewStaticSource("items", items), ChunkSize: 50}
	cfg.Run.Attempt = 1
	_, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 300, Completed: 250, AlreadyHandled: 50}, sum)
	require.EqualValues(t, 300, f.committed(t))
	require.EqualValues(t, 130, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'uid-restart' AND attempt = 1`), "attempt 1 committed the rest")
}

const invoiceSchema = `
CREATE TABLE accounts (id text PRIMARY KEY);
CREATE TABLE invoices (
    account text NOT NULL REFERENCES accounts (id),
    period  text NOT NULL,
    amount  numeric NOT NULL,
    PRIMARY KEY (account, period, amount));`

const invoiceEffect = `INSERT INTO invoices (account, period, amount)
SELECT entity, occurrence, (payload->>'amount')::numeric FROM claimed`

// TestShardChunkSizeDefaultsToTheAPIs: a shard configured without a chunk
// size takes chunks of spec.chunkSize's default, the one the CRD applies.
func TestShardChunkSizeDefaultsToTheAPIs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n = 2*v1alpha1.DefaultChunkSize + 1
	var completed []int64
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-default-chunk"),
		Source:   worker.NewStaticSource("items", keyItems("acct", n)),
		Progress: func(r worker.Report) { completed = append(completed, r.Completed) }})
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.Equal(t, []int64{0, v1alpha1.DefaultChunkSize, 2 * v1alpha1.DefaultChunkSize, n}, completed,
		"the start, then one report per chunk of %d", v1alpha1.DefaultChunkSize)
	require.EqualValues(t, n, f.committed(t))
}

// TestEffectForeignKeyFailures: items whose effect violates a foreign key fail
// with that error, each on its own; the others commit with their effect,
// exactly once, also on a rerun.
func TestEffectForeignKeyFailures(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema)
	items := keyItems("acct", 400)
	// Accounts exist for every item but those with an index divisible by 40.
	mustExec(t, f.pool, `INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 399) i WHERE i % 40 <> 0`)
	cfg := worker.ShardConfig{Run: run("uid-fk"), Shards: 2, Source: worker.NewStaticSource("items", items),
		Effect: invoiceEffect, ChunkSize: 64, MaxFailedItems: 1000}

	reports, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 400, Completed: 390, Failed: 10}, sum)
	require.EqualValues(t, 390, queryInt(t, f.pool, `SELECT count(*) FROM invoices`), "the effect ran once per committed item")
	require.EqualValues(t, 390, f.committed(t))
	var failures []worker.Failure
	for _, r := range reports {
		failures = append(failures, r.Failures...)
	}
	require.Len(t, failures, 10)
	for _, fl := range failures {
		var i int
		_, err := fmt.Sscanf(fl.Entity, "acct-%d", &i)
		require.NoError(t, err)
		require.Zero(t, i%40, "only items without an account fail: %s", fl.Entity)
		require.Contains(t, fl.Error, "foreign key", "the failure says why: %s", fl.Error)
		require.Contains(t, fl.Error, "23503", "with its SQLSTATE: %s", fl.Error)
	}

	_, again := runShards(t, f, cfg)
	require.Equal(t, sum, again, "a rerun reports the same: its rows completed, the same items failed")
	require.EqualValues(t, 390, queryInt(t, f.pool, `SELECT count(*) FROM invoices`), "no effect twice")
}

// TestMaxFailedItemsStopsTheShard: once more items failed than allowed, the
// shard takes no new chunk and says so.
func TestMaxFailedItemsStopsTheShard(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema) // no accounts: every effect fails
	items := keyItems("acct", 200)
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-maxfail"),
		Source: worker.NewStaticSource("items", items), Effect: invoiceEffect, ChunkSize: 20, MaxFailedItems: 30})
	require.NoError(t, rep.Err)
	require.True(t, rep.TooManyFailures, "stopped for too many failures")
	require.False(t, rep.Done)
	require.EqualValues(t, 200, rep.Total)
	require.EqualValues(t, 40, rep.Failed, "two chunks of 20 ran: the second crossed 30")
	require.Len(t, rep.Failures, 40)
	require.Zero(t, f.committed(t))
}

// TestFailuresAreCapped: a report lists at most MaxFailures failures but
// counts them all.
func TestFailuresAreCapped(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema)
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-cap"),
		Source: worker.NewStaticSource("items", keyItems("acct", 250)), Effect: invoiceEffect, ChunkSize: 250, MaxFailedItems: -1})
	require.True(t, rep.Done)
	require.EqualValues(t, 250, rep.Failed)
	require.Len(t, rep.Failures, worker.MaxFailures)
}

// TestSupersede: a later run with Supersede retires the rows of an earlier
// run and commits its own, running the effect again; its own rerun supersedes
// nothing more.
func TestSupersede(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, invoiceSchema)
	mustExec(t, f.pool, `INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 99) i`)
	items := keyItems("acct", 100)
	first := worker.ShardConfig{Run: run("uid-v1"), Source: worker.NewStaticSource("items", items), Effect: invoiceEffect, ChunkSize: 30}
	_, sum := runShards(t, f, first)
	require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, sum)

	// Version 2 of the batch: amounts changed, and deliberately reprocessed.
	v2 := make([]ledger.Item, len(items))
	for i, it := range items {
		v2[i] = ledger.Item{Key: it.Key, Payload: []byte(fmt.Sprintf(`{"amount": %d}`, 1000+i))}
	}
	second := worker.ShardConfig{Run: run("uid-v2"), Shards: 2, Source: worker.NewStaticSource("items", v2), Effect: invoiceEffect,
		OnExisting: ledger.Supersede, ChunkSize: 30}
	_, sum = runShards(t, f, second)
	require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, sum, "every item reprocessed")
	require.EqualValues(t, 100, f.committed(t))
	require.EqualValues(t, 100, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE state = 'superseded' AND run_uid = 'uid-v1'`))
	require.EqualValues(t, 100, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed' AND run_uid = 'uid-v2'`))
	require.EqualValues(t, 200, queryInt(t, f.pool, `SELECT count(*) FROM invoices`), "the effect ran again for each item")

	writes := f.ledgerWrites(t)
	_, sum = runShards(t, f, second)
	require.Equal(t, v1alpha1.ItemCounts{Total: 100, Completed: 100}, sum, "its own rows: completed")
	require.Equal(t, writes, f.ledgerWrites(t), "a rerun supersedes nothing and writes nothing")
	require.EqualValues(t, 200, queryInt(t, f.pool, `SELECT count(*) FROM invoices`))
}

// TestInterruptedShardResumesExactly: cancelling the context mid-run stops the
// shard after the chunk in flight; what it reports is exactly what it
// committed; running it again finishes with an uninterrupted run's counts.
func TestInterruptedShardResumesExactly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	items := keyItems("acct", 1000)
	items = append(items, items[:50]...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	chunks := 0
	cfg := worker.ShardConfig{Run: run("uid-interrupt"), Source: worker.NewStaticSource("items", items), ChunkSize: 100,
		Progress: func(worker.Report) {
			if chunks++; chunks == 4 { // the start, then three chunks
				cancel()
			}
		}}
	rep := worker.RunShard(ctx, f.store, cfg)
	require.NoError(t, rep.Err)
	require.True(t, rep.Interrupted, "interrupted")
	require.False(t, rep.Done)
	require.EqualValues(t, 300, rep.Processed(), "three chunks settled, no fourth taken")
	require.Equal(t, rep.Completed, f.committed(t), "the report is exactly what was committed")

	cfg.Progress = nil
	_, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 1050, Completed: 1000, AlreadyHandled: 50}, sum, "the same as one uninterrupted run")
}

// TestStoppedShardReportsWhatTheLedgerHolds: a shard that stops before its
// proof reports as completed the rows the ledger holds of it, not what it
// counted: commits it counted and the ledger lost (a failover to a standby
// that had not received them, here deleted behind the ledger's guards) are
// not reported; a later attempt processes them again.
func TestStoppedShardReportsWhatTheLedgerHolds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	chunks := 0
	cfg := worker.ShardConfig{Run: run("uid-lost-commits"), Source: worker.NewStaticSource("items", keyItems("acct", 500)), ChunkSize: 100,
		Progress: func(worker.Report) {
			if chunks++; chunks == 3 { // the start, then two chunks
				mustExec(t, f.pool, `BEGIN; SET LOCAL session_replication_role = replica;
DELETE FROM runledger.ledger WHERE id IN (SELECT id FROM runledger.ledger WHERE run_uid = 'uid-lost-commits' ORDER BY id DESC LIMIT 30);
COMMIT`)
				cancel()
			}
		}}
	rep := worker.RunShard(ctx, f.store, cfg)
	require.True(t, rep.Interrupted)
	require.EqualValues(t, 170, f.committed(t))
	require.Equal(t, v1alpha1.ItemCounts{Total: 500, Completed: 170}, rep.ItemCounts, "the ledger's 170 rows, not the 200 counted")

	cfg.Progress = nil
	cfg.Run.Attempt = 1
	_, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 500, Completed: 500}, sum, "the lost ones processed again")
}

// TestOneProcessPerShard: while a shard runs, the same shard of the same run
// cannot start elsewhere (it would count the first one's rows as its own);
// other shards and other runs can.
func TestOneProcessPerShard(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	items := keyItems("acct", 200)
	cfg := worker.ShardConfig{Run: run("uid-lock"), Shards: 2, Source: worker.NewStaticSource("items", items), ChunkSize: 10}
	var second, otherShard, otherRun worker.Report
	calls := 0
	first := cfg
	first.Progress = func(worker.Report) {
		if calls++; calls != 2 {
			return
		}
		second = worker.RunShard(context.Background(), f.store, cfg)
		o := cfg
		o.Run.Shard = 1
		otherShard = worker.RunShard(context.Background(), f.store, o)
		o = cfg
		o.Run = run("uid-lock-other")
		otherRun = worker.RunShard(context.Background(), f.store, o)
	}
	rep := worker.RunShard(context.Background(), f.store, first)
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.ErrorIs(t, second.Err, ledger.ErrShardBusy, "the same shard of the same run is refused")
	require.Contains(t, second.Err.Error(), "shard 0 of run default/run-uid-lock: this shard of this run is being processed by another process")
	require.Zero(t, second.Processed(), "and did nothing")
	require.NoError(t, otherShard.Err, "another shard runs")
	require.True(t, otherShard.Done)
	require.NoError(t, otherRun.Err, "another run's shard 0 runs")

	// Released at the end: the shard can run again.
	again := worker.RunShard(context.Background(), f.store, cfg)
	require.NoError(t, again.Err)
	require.Equal(t, rep.ItemCounts, again.ItemCounts)
}

// TestShardWaitsForTheLockAndSaysSo: a replacement pod whose predecessor
// still holds the shard's lock reports that it waits for the lock (the
// status message the controller and kubectl show), and when the lock stays
// taken it gives up with ErrShardBusy, having processed nothing: the worker
// exits ExitShardBusy, which the controller does not count as a failure.
func TestShardWaitsForTheLockAndSaysSo(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg := worker.ShardConfig{Run: run("uid-wait"), Source: worker.NewStaticSource("items", keyItems("acct", 50)), ChunkSize: 10}
	var waiting []worker.Report
	var second worker.Report
	calls := 0
	first := cfg
	first.Progress = func(worker.Report) {
		if calls++; calls != 2 {
			return
		}
		replacement := cfg
		replacement.LockWait = 1500 * time.Millisecond
		replacement.Progress = func(r worker.Report) { waiting = append(waiting, r) }
		second = worker.RunShard(context.Background(), f.store, replacement)
	}
	rep := worker.RunShard(context.Background(), f.store, first)
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)

	require.Len(t, waiting, 1, "one report when the wait begins")
	require.True(t, waiting[0].WaitingForLock)
	require.True(t, strings.HasPrefix(worker.ShardMessage(waiting[0], 0), v1alpha1.ShardBusyMessage+": "),
		"message %q", worker.ShardMessage(waiting[0], 0))
	require.ErrorIs(t, second.Err, ledger.ErrShardBusy)
	require.False(t, second.WaitingForLock, "no longer waiting once it gave up")
	require.Zero(t, second.Processed(), "nothing processed")
	require.True(t, strings.HasPrefix(worker.ShardMessage(second, 0), v1alpha1.ShardBusyMessage+": gave up"),
		"message %q", worker.ShardMessage(second, 0))
	require.Equal(t, int64(50), rep.Completed, "the first process committed everything, once")
	require.EqualValues(t, 50, f.committed(t))
}

// TestShardLeaseTakenOverMidRun: a shard whose lease another process took
// over (it expired: the shard seemed gone) stops at its next chunk with
// ErrShardBusy, committing nothing more and reporting no completion; the
// new holder finishes the shard, and each key is committed once.
func TestShardLeaseTakenOverMidRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	cfg := worker.ShardConfig{Run: run("uid-taken"), Source: worker.NewStaticSource("items", keyItems("acct", 100)), ChunkSize: 10}
	var successor *ledger.ShardLease
	calls := 0
	first := cfg
	first.Progress = func(worker.Report) {
		if calls++; calls != 3 { // after the second chunk
			return
		}
		// Expired, then taken: retried, since the first process's keeper
		// may renew it in between (as a live process does).
		successor = f.store.ShardLease("uid-taken", 0)
		require.Eventually(t, func() bool {
			mustExec(t, f.pool, `UPDATE runledger.shard_lease SET expires_at = now() - interval '1 second' WHERE run_uid = 'uid-taken'`)
			return successor.Acquire(ctx, 0, nil) == nil
		}, 10*time.Second, 10*time.Millisecond)
	}
	rep := worker.RunShard(ctx, f.store, first)
	require.ErrorIs(t, rep.Err, ledger.ErrShardBusy)
	require.False(t, rep.Done)
	require.EqualValues(t, 20, rep.Completed, "the two chunks before the take-over")
	require.EqualValues(t, 20, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger`), "nothing after it")

	successor.Release()
	again := worker.RunShard(ctx, f.store, cfg)
	require.NoError(t, again.Err)
	require.True(t, again.Done)
	require.EqualValues(t, 100, again.Completed, "the earlier commits count as the run's own")
	require.EqualValues(t, 100, f.committed(t))
}

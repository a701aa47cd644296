package worker_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// Issue #44's case, at test scale: a 2-shard query batch run against an HA
// pair's DSN (both hosts, target_session_attrs=read-write) while the primary
// fails over. The survivor's ledger must prove the counts the shards report.
const (
	failoverItems = 20000
	failoverChunk = 100
	// failoverAhead: items the primary commits while the standby's WAL is
	// held, before the crash (dozens of chunks, so that a lost tail is
	// never a matter of timing).
	failoverAhead = 4000
)

const failoverSchema = `
CREATE TABLE src AS SELECT 'acct-' || i AS account, '2024-06' AS period, i AS amount FROM generate_series(1, %d) i;
-- no unique key: an effect run twice is two rows, not a failed item
CREATE TABLE invoices (account text NOT NULL, period text NOT NULL, amount numeric NOT NULL);`

const failoverQuery = `SELECT account AS entity, period AS occurrence, jsonb_build_object('amount', amount)::text AS payload FROM src`

// failoverRetry rides out the failover (a promotion takes well under a
// second here) without the default's growing waits.
var failoverRetry = worker.Backoff{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: 2 * time.Minute}

// fault is what happens to the primary mid-run.
type fault int

const (
	// crash: the standby's WAL held (a network hiccup) while the primary
	// commits more chunks, the primary killed (-9), the standby promoted.
	crash fault = iota
	// switchover: planned: the same hiccup, then the primary stopped
	// cleanly once the standby has everything, the standby promoted.
	switchover
)

// TestFailoverCountsAreTheSurvivorsLedger (issue #44.6): whatever the
// failover, the counts the shards report are what the surviving server's
// ledger proves for the run, and the effect ran exactly once for each of
// its rows (an SQL effect: one row of invoices per ledger row; a
// processor: every committed key delivered, a key delivered again only
// with its idempotency key). With asynchronous replication a crash loses
// the primary's last commits: the shards must not report them.
func TestFailoverCountsAreTheSurvivorsLedger(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers; the pooler adds nothing to a failover")
	for _, tc := range []struct {
		name      string
		sync      bool
		fault     fault
		processor bool
	}{
		{name: "async-crash-sql"},
		{name: "async-crash-processor", processor: true},
		{name: "sync-crash-sql", sync: true},
		{name: "sync-crash-processor", sync: true, processor: true},
		{name: "async-switchover-sql", fault: switchover},
		{name: "async-switchover-processor", fault: switchover, processor: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := pgtest.NewHAPair(t, pgtest.HAOptions{Sync: tc.sync})
			db := h.NewDatabase(t)
			mustExec(t, pgtest.Pool(t, h.Primary().DSN(db)), fmt.Sprintf(failoverSchema, failoverItems))
			plan := &worker.Plan{Run: ledger.Run{Namespace: "default", Name: "failover", UID: "uid-failover"}, Shards: 2,
				Source: worker.NewQuerySource(failoverQuery), ChunkSize: failoverChunk, MaxFailedItems: failoverItems}
			var rec *recorder
			if tc.processor {
				rec = newRecorder()
				srv := httptest.NewServer(rec.handler())
				t.Cleanup(srv.Close)
				plan.Processor = worker.NewHTTPProcessor(srv.URL, 10*time.Second)
			} else {
				plan.Effect = invoiceEffect
			}
			r := startFailoverRun(t, h.DSN(db), plan)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r.waitProcessed(t, failoverItems/10)
			require.NoError(t, h.WaitReplayed(ctx), "the standby has the fixed batch and the first chunks")
			h.HoldWAL()
			if tc.sync {
				// Nothing commits now: wait until a commit waits for the standby.
				waitSyncRep(t, h.Primary().DSN("postgres"))
			} else {
				r.waitProcessed(t, r.processed()+failoverAhead)
			}
			atFault := r.processed()
			switch tc.fault {
			case crash:
				require.NoError(t, h.CrashPrimary(ctx))
				require.NoError(t, h.Promote(ctx))
			case switchover:
				require.NoError(t, h.Switchover(ctx))
			}
			res := r.wait(t)
			t.Logf("processed %d when the primary went; %d retries: %s", atFault, r.retries.Load(), r.firstRetry())

			survivor := pgtest.Pool(t, h.Standby().DSN(db))
			proof := proveOnSurvivor(t, survivor, plan.Run)
			for _, sh := range res.Shards {
				require.NoError(t, sh.Err, "shard %d", sh.Shard)
				require.True(t, sh.Done, "shard %d done", sh.Shard)
			}
			reported := v1alpha1.ItemCounts{Total: res.Total, Completed: res.Completed, AlreadyHandled: res.AlreadyHandled, Failed: res.Failed}
			proven := v1alpha1.ItemCounts{Total: proof.Total, Completed: proof.Completed, AlreadyHandled: proof.AlreadyHandled, Failed: proof.Failed}
			assert.Equal(t, proven, reported,
				"the shards' counts are what the survivor's ledger proves; %d items of the batch have no verdict there (lost with the primary)", proof.Missing)
			rows := queryInt(t, survivor, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, plan.Run.UID)
			assert.Equal(t, rows, res.Completed, "completed == the run's ledger rows on the survivor")
			assert.True(t, proof.Proven(), "every item of the batch has a proven verdict: %+v", proof)
			require.True(t, res.Proven, "the run's counts were proven by the ledger")
			changes, reproven := 0, 0
			for _, sh := range res.Shards {
				changes, reproven = max(changes, sh.ServerChanges), reproven+sh.Reproven
			}
			assert.NotZero(t, changes, "the shards noticed the ledger's new server")
			if !tc.sync && tc.fault == crash {
				assert.NotZero(t, reproven, "a shard processed again what the failover lost")
			}
			if tc.processor {
				assertDeliveries(t, survivor, rec, plan.Run.UID)
			} else {
				assertEffectsOncePerRow(t, survivor, plan.Run.UID)
			}
		})
	}
}

// failoverRun is a run of a plan's two shards in the background, Prepare
// included (on a standby it may have to wait too).
type failoverRun struct {
	done    chan failoverResult
	shards  [2]atomic.Int64 // items processed so far, per shard
	retries atomic.Int64
	retaken atomic.Int64 // the lease found gone and taken again (said, and said again by the retry of a chunk that found it)
	mu      sync.Mutex
	first   string // the first retry's log line
}

type failoverResult struct {
	worker.RunResult
	prepareErr error
}

// startFailoverRun starts the run; the test's end stops it (and waits for
// it) before the servers go.
func startFailoverRun(t *testing.T, dsn string, plan *worker.Plan) *failoverRun {
	r := &failoverRun{done: make(chan failoverResult, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	t.Cleanup(func() { cancel(); <-finished })
	go func() {
		defer close(finished)
		store, closeStore, err := worker.Prepare(ctx, plan, worker.PrepareConfig{
			DSN: dsn, Parallel: 2, SkipMigrate: true, Retry: failoverRetry, Log: r.logger()})
		if err != nil {
			r.done <- failoverResult{prepareErr: err}
			return
		}
		defer closeStore()
		r.done <- failoverResult{RunResult: worker.RunShards(ctx, store, plan, []int{0, 1}, worker.ShardsConfig{
			Parallel: 2, Retry: failoverRetry, Log: r.logger(),
			Progress: func(rep worker.Report) { r.shards[rep.Shard].Store(rep.Processed()) },
		})}
	}()
	return r
}

// logger counts the shards' retries and keeps the first.
func (r *failoverRun) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		if strings.Contains(args, ledger.ErrLeaseTakenAgain.Error()) {
			r.retaken.Add(1)
		}
		if !strings.Contains(args, "retrying") {
			return
		}
		if r.retries.Add(1) == 1 {
			r.mu.Lock()
			r.first = args
			r.mu.Unlock()
		}
	}, funcr.Options{})
}

func (r *failoverRun) firstRetry() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first
}

func (r *failoverRun) processed() int64 { return r.shards[0].Load() + r.shards[1].Load() }

// waitProcessed waits until the shards have processed n items, failing if
// the run ends first.
func (r *failoverRun) waitProcessed(t *testing.T, n int64) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for r.processed() < n {
		select {
		case res := <-r.done:
			r.done <- res
			t.Fatalf("the run ended before the failover: processed %d of the %d wanted: %+v (prepare: %v)", r.processed(), n, res.ItemCounts, res.prepareErr)
		case <-deadline:
			t.Fatalf("the shards processed %d items in a minute, not %d", r.processed(), n)
		case <-tick.C:
		}
	}
}

// wait waits for the run's result; Prepare must have succeeded.
func (r *failoverRun) wait(t *testing.T) worker.RunResult {
	t.Helper()
	select {
	case res := <-r.done:
		require.NoError(t, res.prepareErr, "preparing the run")
		return res.RunResult
	case <-time.After(3 * time.Minute):
		require.FailNow(t, "the run did not end within 3 minutes of the failover", "processed %d", r.processed())
		return worker.RunResult{}
	}
}

// waitSyncRep waits until a commit on the primary waits for its
// synchronous standby.
func waitSyncRep(t *testing.T, dsn string) {
	t.Helper()
	pool := pgtest.Pool(t, dsn)
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`) > 0
	}, time.Minute, 5*time.Millisecond, "a commit waits for the synchronous standby")
	pool.Close() // before the primary goes: its sessions would be retried
}

// proveOnSurvivor reads what the survivor's ledger proves of run, and logs
// a few of the keys it cannot prove.
func proveOnSurvivor(t *testing.T, pool *pgxpool.Pool, run ledger.Run) ledger.RunProof {
	t.Helper()
	store := ledger.NewStore(pool)
	runs, err := store.FindRuns(context.Background(), run.Namespace, run.Name)
	require.NoError(t, err)
	require.Len(t, runs, 1, "the survivor holds the run's fixed batch")
	var missing []string
	proof, err := store.ProveRun(context.Background(), runs[0], nil, func(k ledger.KeyProof, v ledger.KeyVerdict) error {
		if v.Verdict != ledger.ProofCompleted && v.Verdict != ledger.ProofAlreadyHandled && len(missing) < 5 {
			missing = append(missing, fmt.Sprintf("%s %s (%s)", k.Key, v.Verdict, v.Problem))
		}
		return nil
	})
	require.NoError(t, err)
	if len(missing) > 0 {
		t.Logf("keys the survivor does not prove (first %d): %s", len(missing), strings.Join(missing, "; "))
	}
	return proof
}

// assertEffectsOncePerRow: invoices holds exactly the run's committed keys,
// each once (EXCEPT ALL counts the copies: set operations, not a join the
// planner would run as nested loops on tables it has no statistics of).
func assertEffectsOncePerRow(t *testing.T, pool *pgxpool.Pool, uid string) {
	t.Helper()
	assert.Zero(t, queryInt(t, pool, `SELECT count(*) FROM (SELECT 1 FROM invoices GROUP BY account, period HAVING count(*) > 1) d`), "an effect ran twice")
	assert.Zero(t, queryInt(t, pool, `SELECT count(*) FROM (SELECT entity, occurrence FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'
  EXCEPT ALL SELECT account, period FROM invoices) d`, uid), "a ledger row without its effect")
	assert.Zero(t, queryInt(t, pool, `SELECT count(*) FROM (SELECT account, period FROM invoices
  EXCEPT ALL SELECT entity, occurrence FROM runledger.ledger WHERE state = 'committed') d`), "an effect without its ledger row")
}

// assertDeliveries: the keys the processor accepted are the keys the
// survivor's ledger holds for the run, and a key delivered more than once
// always came with the same idempotency key.
func assertDeliveries(t *testing.T, pool *pgxpool.Pool, rec *recorder, uid string) {
	t.Helper()
	_, sent, oks := rec.snapshot()
	rec.mu.Lock()
	idems := map[ledger.Key][]string{}
	for idem, k := range rec.keys {
		idems[k] = append(idems[k], idem)
	}
	rec.mu.Unlock()
	redelivered := 0
	for k, ids := range idems {
		assert.Len(t, ids, 1, "key %s delivered under several idempotency keys: %v", k, ids)
		if sent[ids[0]] > 1 {
			redelivered++
		}
	}
	t.Logf("processor: %d keys delivered, %d of them more than once", len(idems), redelivered)
	rows, err := pool.Query(context.Background(), `SELECT entity, occurrence FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, uid)
	require.NoError(t, err)
	defer rows.Close()
	notDelivered, held := 0, 0
	for rows.Next() {
		held++
		var k ledger.Key
		require.NoError(t, rows.Scan(&k.Entity, &k.Occurrence))
		if ids := idems[k]; len(ids) == 0 || oks[ids[0]] == 0 {
			notDelivered++
		}
	}
	require.NoError(t, rows.Err())
	assert.Zero(t, notDelivered, "ledger rows whose key the processor never accepted")
	accepted := 0
	for _, ids := range idems {
		if oks[ids[0]] > 0 {
			accepted++
		}
	}
	assert.Equal(t, held, accepted, "every key the processor accepted is a ledger row of the run on the survivor (a commit the failover lost is delivered again)")
}

// TestFailoverSessionOnStandbyIsRetried (issue #44.4): a worker whose
// sessions land on a standby (a connection string that names only it: a
// Service still pointing at the old replica) meets 25006
// read_only_sql_transaction; it retries with back-off, fails no item, and
// once the standby is promoted the run ends exact.
func TestFailoverSessionOnStandbyIsRetried(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers")
	h := pgtest.NewHAPair(t, pgtest.HAOptions{})
	db := h.NewDatabase(t)
	const n = 1000
	mustExec(t, pgtest.Pool(t, h.Primary().DSN(db)), fmt.Sprintf(failoverSchema, n))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, h.WaitReplayed(ctx))
	plan := &worker.Plan{Run: ledger.Run{Namespace: "default", Name: "on-standby", UID: "uid-on-standby"}, Shards: 2,
		Source: worker.NewQuerySource(failoverQuery), Effect: invoiceEffect, ChunkSize: failoverChunk, MaxFailedItems: n}
	r := startFailoverRun(t, h.Standby().DSN(db), plan)

	// The shards either retry (what #44.4 asks) or end: poll for either.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for r.retries.Load() == 0 {
		select {
		case res := <-r.done:
			if res.prepareErr != nil {
				t.Fatalf("on a standby the run ended instead of retrying: preparing it failed (bad input: %t): %v", worker.IsInputError(res.prepareErr), res.prepareErr)
			}
			var errs []string
			for _, sh := range res.Shards {
				errs = append(errs, fmt.Sprintf("shard %d: err %v, %d failures %v", sh.Shard, sh.Err, len(sh.Failures), firstFailure(sh)))
			}
			t.Fatalf("on a standby the run ended instead of retrying: %+v\n%s", res.ItemCounts, strings.Join(errs, "\n"))
		case <-ctx.Done():
			t.Fatalf("the shards neither retried nor ended: processed %d", r.processed())
		case <-tick.C:
		}
	}
	t.Logf("retrying on the standby: %s", r.firstRetry())
	require.Contains(t, r.firstRetry(), "25006", "retried for the standby's refusal")
	require.NoError(t, h.Promote(ctx))
	res := r.wait(t)
	for _, sh := range res.Shards {
		require.NoError(t, sh.Err, "shard %d", sh.Shard)
		require.True(t, sh.Done, "shard %d done", sh.Shard)
	}
	require.Equal(t, v1alpha1.ItemCounts{Total: n, Completed: n}, res.ItemCounts)
	survivor := pgtest.Pool(t, h.Standby().DSN(db))
	require.EqualValues(t, n, queryInt(t, survivor, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, plan.Run.UID))
	assertEffectsOncePerRow(t, survivor, plan.Run.UID)
}

func firstFailure(r worker.Report) string {
	if len(r.Failures) == 0 {
		return ""
	}
	f := r.Failures[0]
	return fmt.Sprintf("(first: %s/%s: %s)", f.Entity, f.Occurrence, f.Error)
}

// TestShardWaitsForTheStandbyToHaveItsProof (issue #44.2): once proven, a
// shard on an asynchronous primary waits (ShardConfig.StandbyWait) for its
// standby to have the proof and says whether it had: confirmed when the
// standby streams, notConfirmed when its WAL is held, as long as the wait;
// the shard succeeds either way, with the ledger's counts.
func TestShardWaitsForTheStandbyToHaveItsProof(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers")
	h := pgtest.NewHAPair(t, pgtest.HAOptions{})
	db := h.NewDatabase(t)
	store := ledger.NewStore(pgtest.Pool(t, h.DSN(db)))
	shard := func(uid string, wait time.Duration) worker.Report {
		rep := worker.RunShard(context.Background(), store, worker.ShardConfig{Run: run(uid),
			Source: worker.NewStaticSource("items", keyItems(uid, 50)), ChunkSize: 10, StandbyWait: wait})
		require.NoError(t, rep.Err)
		require.True(t, rep.Done && rep.Proven, "%+v", rep)
		require.Equal(t, v1alpha1.ItemCounts{Total: 50, Completed: 50}, rep.ItemCounts)
		return rep
	}
	require.Equal(t, worker.OnStandbyConfirmed, shard("streams", time.Minute).OnStandby)

	h.HoldWAL()
	start := time.Now()
	require.Equal(t, worker.OnStandbyNotConfirmed, shard("held", 700*time.Millisecond).OnStandby)
	require.GreaterOrEqual(t, time.Since(start), 700*time.Millisecond)
	require.Empty(t, shard("no-wait", -1).OnStandby, "a negative wait asks nothing")
	h.ReleaseWAL()
	require.Equal(t, worker.OnStandbyConfirmed, shard("released", time.Minute).OnStandby)
}

// TestShardSaysItWaitsForTheStandby: a proven shard still waiting for its
// standby after 10 s says so in its status (Report.WaitingForStandby, its
// message StandbyWaitMessage), where kubectl shows it, instead of showing no
// progress and no reason; its last report says what it found.
func TestShardSaysItWaitsForTheStandby(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers")
	h := pgtest.NewHAPair(t, pgtest.HAOptions{})
	db := h.NewDatabase(t)
	store := ledger.NewStore(pgtest.Pool(t, h.DSN(db)))
	h.HoldWAL()
	var mu sync.Mutex
	var waiting []string
	rep := worker.RunShard(context.Background(), store, worker.ShardConfig{Run: run("said"),
		Source: worker.NewStaticSource("items", keyItems("said", 50)), ChunkSize: 10, StandbyWait: 11 * time.Second,
		Progress: func(r worker.Report) {
			if r.WaitingForStandby {
				mu.Lock()
				waiting = append(waiting, worker.ShardMessage(r, 0))
				mu.Unlock()
			}
		}})
	require.NoError(t, rep.Err)
	require.True(t, rep.Done && rep.Proven, "%+v", rep)
	require.Equal(t, v1alpha1.ItemCounts{Total: 50, Completed: 50}, rep.ItemCounts)
	require.Equal(t, worker.OnStandbyNotConfirmed, rep.OnStandby)
	require.False(t, rep.WaitingForStandby, "no longer waiting once it reported")
	require.Equal(t, "done", worker.ShardMessage(rep, 0))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, waiting, 1, "one report when the wait is said")
	require.True(t, strings.HasPrefix(waiting[0], v1alpha1.StandbyWaitMessage+": the shard's counts are proven"), "message %q", waiting[0])
}

// TestFailoverDuringTheStandbyWaitIsProvenAgain: a shard proven on an
// asynchronous primary whose standby does not have the proof yet (its WAL
// held) waits for it; the primary fails over meanwhile to that standby,
// which never received the shard's commits. The shard must not report what
// it proved on the lost server: it proves its counts again on the server
// there is now, processes what was lost, and reports what the survivor
// holds. (The soak's seed 20261204 saw a run Succeeded with 6252 completed
// and 2198 rows on the survivor: its shards had reported after the wait.)
func TestFailoverDuringTheStandbyWaitIsProvenAgain(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers")
	// held: the standby streams and its WAL is held (a network hiccup);
	// cut: the standby is cut off (the primary then lists no walsender,
	// only the standby's slot, as the soak saw after the primary's restart);
	// pooled: held, the shards behind a PgBouncer (transaction mode) that is
	// pointed at the promoted server after the failover, as an operator, or
	// the virtual address or DNS name a failover manager moves, does: the
	// shards' sessions with it stay open, so no new session of their pools
	// reaches the promoted server and only the wait's own reads of the
	// server tell it changed.
	for _, tc := range []struct {
		name        string
		cut, pooled bool
	}{{name: "held"}, {name: "cut", cut: true}, {name: "pooled", pooled: true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			failoverDuringTheStandbyWait(t, tc.cut, tc.pooled)
		})
	}
}

// assertSurvivorHoldsAll: every shard of the run ended done, having
// reported what the survivor's ledger proves, and that is all items of the
// batch completed, each effect once; it returns a pool of the survivor.
func assertSurvivorHoldsAll(t *testing.T, dsn string, plan *worker.Plan, res worker.RunResult, items int64) *pgxpool.Pool {
	t.Helper()
	survivor := pgtest.Pool(t, dsn)
	for _, sh := range res.Shards {
		require.NoError(t, sh.Err, "shard %d", sh.Shard)
		require.True(t, sh.Done, "shard %d done", sh.Shard)
	}
	rows := queryInt(t, survivor, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, plan.Run.UID)
	require.Equal(t, rows, res.Completed, "completed == the run's rows on the survivor")
	reported := v1alpha1.ItemCounts{Total: res.Total, Completed: res.Completed, AlreadyHandled: res.AlreadyHandled, Failed: res.Failed}
	proof := proveOnSurvivor(t, survivor, plan.Run)
	proven := v1alpha1.ItemCounts{Total: proof.Total, Completed: proof.Completed, AlreadyHandled: proof.AlreadyHandled, Failed: proof.Failed}
	require.Equal(t, proven, reported, "the counts are what the survivor's ledger proves (%d items of the batch have no verdict there)", proof.Missing)
	require.Equal(t, v1alpha1.ItemCounts{Total: items, Completed: items}, reported, "what the failover lost was processed again")
	assertEffectsOncePerRow(t, survivor, plan.Run.UID)
	return survivor
}

// failoverSetup is a primary and its asynchronous standby, a database whose
// source table holds items rows, a pool of the primary, and a plan named
// name reading them in 2 shards with the SQL effect.
func failoverSetup(t *testing.T, items int, name string) (*pgtest.HAPair, string, *pgxpool.Pool, *worker.Plan) {
	t.Helper()
	h := pgtest.NewHAPair(t, pgtest.HAOptions{})
	db := h.NewDatabase(t)
	primary := pgtest.Pool(t, h.Primary().DSN(db))
	mustExec(t, primary, fmt.Sprintf(failoverSchema, items))
	plan := &worker.Plan{Run: ledger.Run{Namespace: "default", Name: name, UID: "uid-" + name}, Shards: 2,
		Source: worker.NewQuerySource(failoverQuery), ChunkSize: failoverChunk, MaxFailedItems: items, Effect: invoiceEffect}
	return h, db, primary, plan
}

func failoverDuringTheStandbyWait(t *testing.T, cut, pooled bool) {
	const items = 6000
	h, db, primary, plan := failoverSetup(t, items, "failover-wait")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newFailover(ctx, t, h, db, pooled)
	r := startFailoverRun(t, f.dsn, plan)
	r.waitProcessed(t, 4*failoverChunk)
	require.NoError(t, h.WaitReplayed(ctx), "the standby has the fixed batch, the shards' leases and their first chunks")
	if cut {
		h.DisconnectStandby()
	} else {
		h.HoldWAL() // the standby gets nothing of the rest of the run
	}
	r.waitProcessed(t, items-2*failoverChunk) // a shard reports its last chunk with its proof
	// The shards are proven and ask the primary whether a standby has
	// their proof (a session's query stays in pg_stat_activity while idle).
	require.Eventually(t, func() bool {
		return queryInt(t, primary, `SELECT count(DISTINCT application_name) FROM pg_stat_activity
			WHERE query LIKE '%pg_stat_replication AS r%' AND pid <> pg_backend_pid()`) > 0
	}, time.Minute, 5*time.Millisecond, "a shard waits for the standby to have its proof")
	primary.Close()
	f.crashFailover(ctx, t)
	assertSurvivorHoldsAll(t, h.Standby().DSN(db), plan, r.wait(t), items)
}

// failover is a crash failover of an HA pair, which the run reaches
// directly (the pair's DSN, naming both servers) or behind a PgBouncer in
// transaction mode that a failover manager's hook pauses before it and
// points at the promoted server after it: the run's sessions with the
// pooler stay open, and see no error of the failover.
type failover struct {
	h       *pgtest.HAPair
	bouncer *pgtest.PgBouncer // nil: directly
	dsn     string            // database db's, as the run reaches it
	// noPause: the hook does not pause the pooler first (a PAUSE waits
	// for the transactions in flight to end).
	noPause bool
}

func newFailover(ctx context.Context, t *testing.T, h *pgtest.HAPair, db string, pooled bool) *failover {
	t.Helper()
	f := &failover{h: h, dsn: h.DSN(db)}
	if pooled {
		b, err := pgtest.StartPgBouncer(ctx, h.Primary())
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Stop() })
		f.bouncer, f.dsn = b, b.SuperuserDSN(db)
	}
	return f
}

// crashFailover crashes the primary and promotes the standby (pausing the
// pooler before, pointing it at the standby after).
func (f *failover) crashFailover(ctx context.Context, t *testing.T) {
	t.Helper()
	if f.bouncer != nil && !f.noPause {
		require.NoError(t, f.bouncer.Pause(ctx))
	}
	require.NoError(t, f.h.CrashPrimary(ctx))
	require.NoError(t, f.h.Promote(ctx))
	if f.bouncer != nil {
		require.NoError(t, f.bouncer.Retarget(ctx, f.h.Standby()))
	}
}

// TestFailoverThatLostTheLeaseTakesItAgain: a run that started within the
// replication lag (the standby's WAL held from before its start) loses all
// of it in a crash failover: its fixed batch, its shards' leases and their
// chunks. On the promoted server the shards' next transactions find no
// lease: nobody else holds it, so each shard takes it again (the pool
// reached another server since it last renewed it) instead of stopping as
// if another process ran the shard, fixes the batch again and reports what
// the survivor holds. (The soak's failovers met RL001 there, then "being
// processed by another process": `runledger run` failed the shard.)
func TestFailoverThatLostTheLeaseTakesItAgain(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "its own pair of servers")
	// pooled: behind a PgBouncer paused, pointed at the promoted server and
	// resumed by the failover (failover). Here the shards' pools open new
	// sessions after the failover, which the pool's watch sees; a refusal
	// on sessions that all outlived it is told by the server's life
	// (TestShardLeaseLostInAFailoverBehindAPooler).
	for _, pooled := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "pooled"}[pooled], func(t *testing.T) {
			t.Parallel()
			failoverThatLostTheLease(t, pooled)
		})
	}
}

func failoverThatLostTheLease(t *testing.T, pooled bool) {
	const items = 6000
	h, db, primary, plan := failoverSetup(t, items, "failover-lease")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newFailover(ctx, t, h, db, pooled)
	require.NoError(t, h.WaitReplayed(ctx), "the standby has the source table")
	h.HoldWAL() // and nothing of the run
	r := startFailoverRun(t, f.dsn, plan)
	r.waitProcessed(t, 10*failoverChunk)
	// The shards' next effects wait for this lock until the crash: mid-run
	// then however slowly the crash comes (on a busy host they finished
	// first, and proved their counts again on the survivor, taking their
	// leases afresh rather than again). Their transactions wait in it, so
	// the pooler is not paused first: a PAUSE would wait for them.
	f.noPause = true
	gate, err := pgx.Connect(ctx, h.Primary().DSN(db))
	require.NoError(t, err)
	_, err = gate.Exec(ctx, `BEGIN; LOCK TABLE invoices IN SHARE MODE`)
	require.NoError(t, err)
	primary.Close()
	f.crashFailover(ctx, t)
	_ = gate.Close(ctx)
	res := r.wait(t)

	survivor := assertSurvivorHoldsAll(t, h.Standby().DSN(db), plan, res, items)
	require.NotZero(t, r.retaken.Load(), "a shard took its lease again (%d retries, the first: %s)", r.retries.Load(), r.firstRetry())
	require.Zero(t, queryInt(t, survivor, `SELECT count(*) FROM runledger.shard_lease WHERE run_uid = $1`, plan.Run.UID), "the leases taken again were given back")
}

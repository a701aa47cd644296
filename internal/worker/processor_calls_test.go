package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
	"github.com/runledger/runledger/pkg/processor"
)

// callServer is a processor over real HTTP whose every call is decided by
// decide: how long it takes (it ends early when the worker hangs up), and
// either a status other than 200 or one result per item. It records each
// call's items, what it answered ok, and the most calls in flight at once.
type callServer struct {
	decide func(call int, items []processor.Item) (delay time.Duration, status int, results []processor.Result)

	mu        sync.Mutex
	calls     [][]processor.Item
	oks       map[string]int        // idempotency key -> times answered ok
	keys      map[string]ledger.Key // idempotency key -> business key
	inFlight  int
	maxFlight int
}

func newCallServer(t *testing.T, decide func(int, []processor.Item) (time.Duration, int, []processor.Result)) (*callServer, string) {
	s := &callServer{decide: decide, oks: map[string]int{}, keys: map[string]ledger.Key{}}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func (s *callServer) serve(w http.ResponseWriter, r *http.Request) {
	var req processor.Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	call := len(s.calls)
	s.calls = append(s.calls, req.Items)
	s.inFlight++
	s.maxFlight = max(s.maxFlight, s.inFlight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	delay, status, results := s.decide(call, req.Items)
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
		return
	}
	if status != http.StatusOK {
		http.Error(w, "boom", status)
		return
	}
	s.mu.Lock()
	for i, it := range req.Items {
		s.keys[it.Key] = ledger.Key{Entity: it.Entity, Occurrence: it.Occurrence}
		if results[i].OK {
			s.oks[it.Key]++
		}
	}
	s.mu.Unlock()
	_ = json.NewEncoder(w).Encode(processor.Response{Results: results})
}

// bySuffix answers each item by its occurrence: -fail refused, -retry
// retry, ok.
func bySuffix(items []processor.Item) []processor.Result {
	out := make([]processor.Result, len(items))
	for i, it := range items {
		switch {
		case strings.HasSuffix(it.Occurrence, "-fail"):
			out[i] = processor.Refuse(fmt.Errorf("card declined"))
		case strings.HasSuffix(it.Occurrence, "-retry"):
			out[i] = processor.Retry(fmt.Errorf("try later"))
		default:
			out[i] = processor.OK()
		}
	}
	return out
}

func holds(items []processor.Item, occurrence string) bool {
	for _, it := range items {
		if it.Occurrence == occurrence {
			return true
		}
	}
	return false
}

func callsConfig(uid, url string, items []ledger.Item, chunk, perCall, inFlight int) worker.ShardConfig {
	cfg := processorConfig(uid, url, items, 5*time.Second)
	cfg.ChunkSize, cfg.ItemsPerCall, cfg.CallsInFlight = chunk, perCall, inFlight
	return cfg
}

// TestProcessorCalls_OutOfOrder: a chunk's calls in flight at once, the
// earlier ones answering last: each call carries at most ItemsPerCall
// items, at most CallsInFlight calls are in flight, each item gets its own
// call's verdict (odd calls refuse all theirs, naming themselves), and the
// idempotency keys are those of one call per chunk (IdempotencyKey).
func TestProcessorCalls_OutOfOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var occ []string
	for i := range 60 {
		suffix := map[int]string{1: "-fail", 3: "-retry"}[i%7]
		occ = append(occ, fmt.Sprintf("%02d%s", i, suffix))
	}
	srv, url := newCallServer(t, func(call int, items []processor.Item) (time.Duration, int, []processor.Result) {
		delay := time.Duration(3-call%4) * 15 * time.Millisecond
		if call%2 == 0 {
			return delay, http.StatusOK, bySuffix(items)
		}
		out := make([]processor.Result, len(items))
		for i := range out {
			out[i] = processor.Refuse(fmt.Errorf("refused by call %d", call))
		}
		return delay, http.StatusOK, out
	})
	reports, sum := runShards(t, f, callsConfig("uid-order", url, occItems(occ...), 25, 4, 3))
	require.EqualValues(t, sum.Completed, f.committed(t), "completed == committed rows")

	srv.mu.Lock()
	defer srv.mu.Unlock()
	require.Equal(t, 3, srv.maxFlight, "at most CallsInFlight at once, and that many")
	callOf := map[string]int{}
	for c, items := range srv.calls {
		require.LessOrEqual(t, len(items), 4)
		for _, it := range items {
			require.Equal(t, worker.IdempotencyKey(ledger.Key{Entity: it.Entity, Occurrence: it.Occurrence}, 0), it.Key)
			callOf[it.Occurrence] = c
		}
	}
	failures := map[string]string{}
	for _, fl := range reports[0].Failures {
		failures[fl.Occurrence] = fl.Error
	}
	for _, o := range occ {
		c, ok := callOf[o]
		require.True(t, ok, "%s was sent", o)
		switch {
		case c%2 == 1:
			require.Equal(t, fmt.Sprintf("processor: refused by call %d", c), failures[o], o)
		case strings.HasSuffix(o, "-fail"):
			require.Equal(t, "processor: card declined", failures[o], o)
		case strings.HasSuffix(o, "-retry"):
			require.Equal(t, "processor: try later (retryable)", failures[o], o)
		default:
			require.NotContains(t, failures, o)
		}
	}
	require.Equal(t, v1alpha1.ItemCounts{Total: 60, Completed: int64(60 - len(failures)), Failed: int64(len(failures))}, sum)
	for k, n := range srv.oks {
		require.Equal(t, 1, n, "%v accepted once", srv.keys[k])
	}
}

// TestProcessorCalls_OneOfSeveralFails: a call that keeps failing as a
// whole fails its chunk as one call did: after the retries every item of
// the chunk is Failed with that call's error and none commits, those of the
// chunk's calls that answered ok included (their answers commit nothing:
// delivery is at least once); the other chunks complete; the same run with
// the processor fixed completes the chunk.
func TestProcessorCalls_OneOfSeveralFails(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var mu sync.Mutex
	broken := true
	decide := func(_ int, items []processor.Item) (time.Duration, int, []processor.Result) {
		mu.Lock()
		defer mu.Unlock()
		if broken && holds(items, "13") {
			return 5 * time.Millisecond, http.StatusInternalServerError, nil
		}
		return time.Millisecond, http.StatusOK, bySuffix(items)
	}
	srv, url := newCallServer(t, decide)
	var occ []string
	for i := range 30 {
		occ = append(occ, fmt.Sprintf("%02d", i))
	}
	cfg := callsConfig("uid-one-fails", url, occItems(occ...), 10, 5, 2)
	reports, sum := runShards(t, f, cfg)
	require.Equal(t, int64(30), sum.Total)
	require.EqualValues(t, sum.Completed, f.committed(t))
	failed := map[string]bool{}
	for _, fl := range reports[0].Failures {
		failed[fl.Occurrence] = true
		require.Contains(t, fl.Error, "calling the processor: call ")
		require.Contains(t, fl.Error, "500 Internal Server Error: boom")
	}
	require.Len(t, failed, 10, "the failed call's chunk, all of it")
	require.True(t, failed["13"])
	srv.mu.Lock()
	okd := 0
	for k := range srv.oks {
		if failed[srv.keys[k].Occurrence] {
			okd++
		}
	}
	srv.mu.Unlock()
	require.Positive(t, okd, "the failed chunk's other call answered ok, and committed nothing")
	require.Equal(t, v1alpha1.ItemCounts{Total: 30, Completed: 20, Failed: 10}, sum)

	mu.Lock()
	broken = false
	mu.Unlock()
	_, sum = runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 30, Completed: 30}, sum)
	require.EqualValues(t, 30, f.committed(t))
}

// TestProcessorCalls_TimeoutInOne: one call of a chunk gets no answer
// within the timeout: it is abandoned (the processor sees the worker hang
// up), the chunk commits nothing, and its next try sends the chunk again
// and completes every item, each committed once.
func TestProcessorCalls_TimeoutInOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var mu sync.Mutex
	hung := 0
	srv, url := newCallServer(t, func(_ int, items []processor.Item) (time.Duration, int, []processor.Result) {
		mu.Lock()
		defer mu.Unlock()
		if holds(items, "13") && hung == 0 {
			hung++
			return time.Minute, http.StatusOK, bySuffix(items)
		}
		return time.Millisecond, http.StatusOK, bySuffix(items)
	})
	var occ []string
	for i := range 30 {
		occ = append(occ, fmt.Sprintf("%02d", i))
	}
	cfg := callsConfig("uid-timeout", url, occItems(occ...), 15, 5, 3)
	// Long enough for the prompt calls on a busy host, short beside the hung one's minute.
	cfg.Processor = worker.NewHTTPProcessor(url, 3*time.Second)
	start := time.Now()
	_, sum := runShards(t, f, cfg)
	require.Less(t, time.Since(start), 30*time.Second, "the hung call was abandoned at its timeout")
	require.Equal(t, v1alpha1.ItemCounts{Total: 30, Completed: 30}, sum)
	require.EqualValues(t, 30, f.committed(t))
	srv.mu.Lock()
	defer srv.mu.Unlock()
	sent13 := 0
	for _, c := range srv.calls {
		if holds(c, "13") {
			sent13++
		}
	}
	require.Equal(t, 2, sent13, "the hung call's items were sent again")
	for k, n := range srv.oks {
		// The hung call's chunk is sent again whole: its other calls'
		// items twice (at least once), the others once.
		require.LessOrEqual(t, n, 2, "%v", srv.keys[k])
	}
}

// TestProcessorCalls_Cancel: a shard stopped while a chunk's calls are in
// flight and do not answer within the drain timeout: the chunk commits
// nothing, the report is interrupted, and its counts are the ledger's.
func TestProcessorCalls_Cancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	_, url := newCallServer(t, func(_ int, items []processor.Item) (time.Duration, int, []processor.Result) {
		mu.Lock()
		defer mu.Unlock()
		if holds(items, "25") { // the third chunk's: the shard is stopped during it
			cancel()
			return time.Minute, http.StatusOK, bySuffix(items)
		}
		return time.Millisecond, http.StatusOK, bySuffix(items)
	})
	var occ []string
	for i := range 50 {
		occ = append(occ, fmt.Sprintf("%02d", i))
	}
	cfg := callsConfig("uid-cancel", url, occItems(occ...), 10, 3, 2)
	cfg.DrainTimeout = 200 * time.Millisecond
	rep := worker.RunShard(ctx, f.store, cfg)
	require.True(t, rep.Interrupted)
	require.Equal(t, int64(20), rep.Completed, "the two chunks before it")
	require.EqualValues(t, rep.Completed, f.committed(t), "completed == committed rows: the stopped chunk committed nothing")
}

// TestProcessorCalls_Randomized: runs of random shards, chunk sizes, calls
// per chunk and calls in flight over keys some of which another run holds
// and some of which repeat, against a processor that answers each item ok,
// refused or retry at random, sometimes fails or delays a whole call, and
// answers out of order. Each run's counts are the ledger's: its completed
// items are exactly its committed rows, each accepted by the processor, and
// every key another run held is already handled, never sent.
func TestProcessorCalls_Randomized(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 48))
	f := newFixture(t)
	var mu sync.Mutex
	srv, url := newCallServer(t, func(_ int, items []processor.Item) (time.Duration, int, []processor.Result) {
		mu.Lock()
		defer mu.Unlock()
		delay := time.Duration(rng.IntN(5)) * time.Millisecond
		if rng.IntN(10) == 0 {
			return delay, http.StatusServiceUnavailable, nil
		}
		out := make([]processor.Result, len(items))
		for i := range out {
			switch rng.IntN(6) {
			case 0:
				out[i] = processor.Refuse(fmt.Errorf("no"))
			case 1:
				out[i] = processor.Retry(fmt.Errorf("later"))
			default:
				out[i] = processor.OK()
			}
		}
		return delay, http.StatusOK, out
	})
	heldByOther := map[ledger.Key]bool{}
	var held []ledger.Item
	for i := range 40 {
		if rng.IntN(4) == 0 {
			it := ledger.Item{Key: ledger.Key{Entity: "acct", Occurrence: fmt.Sprintf("%03d", i)}, Payload: json.RawMessage(`{"amount": 1}`)}
			held, heldByOther[it.Key] = append(held, it), true
		}
	}
	if len(held) > 0 {
		_, err := f.store.CommitChunk(context.Background(), run("uid-other"), held, ledger.ChunkOptions{})
		require.NoError(t, err)
	}
	for round := range 4 {
		var occ []string
		for range 20 + rng.IntN(80) {
			occ = append(occ, fmt.Sprintf("%03d", rng.IntN(120)))
		}
		uid := fmt.Sprintf("uid-random-%d", round)
		cfg := callsConfig(uid, url, occItems(occ...), 1+rng.IntN(30), 1+rng.IntN(8), 1+rng.IntN(4))
		cfg.Shards = 1 + rng.IntN(3)
		_, sum := runShards(t, f, cfg)
		require.EqualValues(t, len(occ), sum.Total, "round %d", round)
		require.EqualValues(t, sum.Completed, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, uid),
			"round %d: completed == the run's committed rows", round)
		rows, err := f.pool.Query(context.Background(), `SELECT entity, occurrence FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, uid)
		require.NoError(t, err)
		srv.mu.Lock()
		for rows.Next() {
			var k ledger.Key
			require.NoError(t, rows.Scan(&k.Entity, &k.Occurrence))
			require.False(t, heldByOther[k], "round %d: %v, held by another run, committed again", round, k)
			require.Positive(t, srv.oks[worker.IdempotencyKey(k, 0)], "round %d: %v committed without an ok", round, k)
		}
		for _, c := range srv.calls {
			for _, it := range c {
				require.False(t, heldByOther[ledger.Key{Entity: it.Entity, Occurrence: it.Occurrence}], "round %d: a key another run holds was sent", round)
			}
		}
		srv.mu.Unlock()
		require.NoError(t, rows.Err())
		rows.Close()
		f.committed(t) // no business key with two committed rows
	}
}

// TestProcessorCalls_Plan: a processor run's chunk is spec.chunkSize (no
// longer cut to maxItemsPerCall), its calls bounded by maxItemsPerCall and
// maxCallsInFlight, the API's defaults where they are not set.
func TestProcessorCalls_Plan(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		spec                                 v1alpha1.ProcessorSpec
		chunkSize                            int32
		wantChunk, wantPerCall, wantInFlight int
	}{
		{v1alpha1.ProcessorSpec{Image: "p"}, 0, v1alpha1.DefaultChunkSize, v1alpha1.DefaultMaxItemsPerCall, v1alpha1.DefaultMaxCallsInFlight},
		{v1alpha1.ProcessorSpec{Image: "p", MaxItemsPerCall: 7, MaxCallsInFlight: 5}, 50, 50, 7, 5},
		{v1alpha1.ProcessorSpec{Image: "p", MaxItemsPerCall: 500, MaxCallsInFlight: 1}, 20, 20, 500, 1},
	} {
		prun := &v1alpha1.ProcessingRun{Spec: v1alpha1.ProcessingRunSpec{
			Batch:     v1alpha1.BatchSpec{Items: specItems("acct", 1)},
			ChunkSize: tt.chunkSize,
			Effect:    &v1alpha1.EffectSpec{Processor: &tt.spec},
		}}
		prun.Name = "plan"
		plan, err := worker.NewPlan(context.Background(), prun, nil, worker.Limits{})
		require.NoError(t, err)
		cfg := plan.ShardConfig(0, 0)
		require.Equal(t, tt.wantChunk, cfg.ChunkSize)
		require.Equal(t, tt.wantPerCall, cfg.ItemsPerCall)
		require.Equal(t, tt.wantInFlight, cfg.CallsInFlight)
		require.NotNil(t, cfg.Processor)
	}
}

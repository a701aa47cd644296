package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// callsProcessor records the calls of a chunk made in several
// (ChunkOptions.ItemsPerCall, CallsInFlight): each call's items, how many
// were in flight at most, the order the calls answered in. answer decides a
// call: its delay, its verdicts (nil: by suffix, as funcProcessor) or its
// error; a call waits out its delay unless its context ends first.
type callsProcessor struct {
	answer func(call int, items []ledger.Claim) (time.Duration, []ledger.Verdict, error)

	mu        sync.Mutex
	calls     [][]ledger.Key // by the order the calls started
	answered  []int          // the calls, in the order they answered
	inFlight  int
	maxFlight int
	cancelled int // calls that saw their context end
}

func (p *callsProcessor) Process(ctx context.Context, _ ledger.Run, items []ledger.Claim) ([]ledger.Verdict, error) {
	p.mu.Lock()
	call := len(p.calls)
	keys := make([]ledger.Key, len(items))
	for i, it := range items {
		keys[i] = it.Key
	}
	p.calls = append(p.calls, keys)
	p.inFlight++
	p.maxFlight = max(p.maxFlight, p.inFlight)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight--
		p.answered = append(p.answered, call)
		p.mu.Unlock()
	}()
	delay, verdicts, err := p.answer(call, items)
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		p.mu.Lock()
		p.cancelled++
		p.mu.Unlock()
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	if verdicts == nil {
		verdicts = bySuffix(items)
	}
	return verdicts, nil
}

// bySuffix answers as funcProcessor does: -fail refused, -retry retry, ok.
func bySuffix(items []ledger.Claim) []ledger.Verdict {
	out := make([]ledger.Verdict, len(items))
	for i, it := range items {
		switch {
		case strings.HasSuffix(it.Occurrence, "-fail"):
			out[i] = ledger.Verdict{Error: "card declined"}
		case strings.HasSuffix(it.Occurrence, "-retry"):
			out[i] = ledger.Verdict{Retryable: true, Error: "try later"}
		default:
			out[i] = ledger.Verdict{OK: true}
		}
	}
	return out
}

func (p *callsProcessor) snapshot() (calls [][]ledger.Key, answered []int, inFlight, maxFlight, cancelled int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]ledger.Key(nil), p.calls...), append([]int(nil), p.answered...), p.inFlight, p.maxFlight, p.cancelled
}

// TestProcessorCalls_AnsweredOutOfOrder: a chunk's items go in calls of at
// most ItemsPerCall consecutive items, at most CallsInFlight at once; calls
// that answer in another order than they were sent still give each item
// the verdict of its own call: here every odd call refuses all its items
// naming itself, so a verdict taken from another call would show.
func TestProcessorCalls_AnsweredOutOfOrder(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	s := ledger.NewStore(worker)
	var occ []string
	for i := range 23 {
		switch i % 5 {
		case 1:
			occ = append(occ, fmt.Sprintf("%02d-fail", i))
		case 3:
			occ = append(occ, fmt.Sprintf("%02d-retry", i))
		default:
			occ = append(occ, fmt.Sprintf("%02d", i))
		}
	}
	p := &callsProcessor{answer: func(call int, items []ledger.Claim) (time.Duration, []ledger.Verdict, error) {
		delay := time.Duration(6-call) * 15 * time.Millisecond // the first calls answer last
		if call%2 == 0 {
			return delay, nil, nil
		}
		out := make([]ledger.Verdict, len(items))
		for i := range out {
			out[i] = ledger.Verdict{Error: fmt.Sprintf("refused by call %d", call)}
		}
		return delay, out, nil
	}}
	chunk := keyed(occ...)
	res := commit(t, s, runNamed("a"), chunk, ledger.ChunkOptions{Processor: p, ItemsPerCall: 4, CallsInFlight: 3})

	calls, answered, inFlight, maxFlight, _ := p.snapshot()
	require.Len(t, calls, 6, "23 items in calls of at most 4")
	require.Zero(t, inFlight, "no call outlives CommitChunk")
	require.Equal(t, 3, maxFlight, "at most CallsInFlight at once, and that many")
	require.NotEqual(t, []int{0, 1, 2, 3, 4, 5}, answered, "the calls answered out of order")
	callOf := map[ledger.Key]int{}
	var sent []ledger.Key
	for c, keys := range calls {
		require.LessOrEqual(t, len(keys), 4)
		for _, k := range keys {
			callOf[k] = c
		}
		sent = append(sent, keys...)
	}
	require.Len(t, sent, len(chunk), "each item in one call")

	var committed int
	for i, r := range res {
		c, ok := callOf[chunk[i].Key]
		require.True(t, ok, "item %s was sent", chunk[i].Occurrence)
		o := chunk[i].Occurrence
		switch {
		case c%2 == 1:
			require.Equal(t, ledger.Failed, r.Outcome, o)
			require.ErrorContains(t, r.Err, fmt.Sprintf("processor: refused by call %d", c), o)
		case strings.HasSuffix(o, "-fail"):
			require.Equal(t, ledger.Failed, r.Outcome, o)
			require.ErrorContains(t, r.Err, "processor: card declined", o)
			require.NotErrorIs(t, r.Err, ledger.ErrRetryItem, o)
		case strings.HasSuffix(o, "-retry"):
			require.Equal(t, ledger.Failed, r.Outcome, o)
			require.ErrorIs(t, r.Err, ledger.ErrRetryItem, o)
		default:
			require.Equal(t, ledger.Completed, r.Outcome, o)
			require.Equal(t, 1, countRows(t, owner, "acct", o, "committed"), o)
			committed++
		}
		if r.Outcome == ledger.Failed {
			require.Zero(t, countRows(t, owner, "acct", o, "committed"), "%s: a refused key is taken back", o)
		}
	}
	require.Positive(t, committed)
	require.EqualValues(t, committed, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`), "only what the processor accepted")
}

// TestProcessorCalls_OneFails: one call of several failing as a whole
// fails the chunk as a single call does (a retryable *ProcessorError that
// names the call, nothing committed); the calls in flight are cancelled,
// none starts after it, and all have returned when CommitChunk does.
func TestProcessorCalls_OneFails(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	for _, inFlight := range []int{1, 3} {
		t.Run(fmt.Sprintf("in flight %d", inFlight), func(t *testing.T) {
			p := &callsProcessor{answer: func(_ int, items []ledger.Claim) (time.Duration, []ledger.Verdict, error) {
				switch items[0].Occurrence { // which of the chunk's calls
				case "occ-000010":
					return 20 * time.Millisecond, nil, errors.New("status 500: boom")
				case "occ-000000":
					return 0, nil, nil
				}
				return time.Minute, nil, nil // cancelled, or never started
			}}
			run := runNamed(fmt.Sprintf("fails-%d", inFlight))
			start := time.Now()
			_, err := s.CommitChunk(context.Background(), run, items(run.UID, 0, 50), ledger.ChunkOptions{Processor: p, ItemsPerCall: 10, CallsInFlight: inFlight})
			require.Less(t, time.Since(start), 30*time.Second, "the calls in flight were cancelled")
			var perr *ledger.ProcessorError
			require.ErrorAs(t, err, &perr)
			require.True(t, ledger.IsRetryable(err))
			require.ErrorContains(t, err, "calling the processor: call 2 of 5 (items 11-20 of 50): status 500: boom")
			require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, run.UID), "nothing of the chunk commits")
			calls, _, inFlightNow, _, cancelled := p.snapshot()
			require.Zero(t, inFlightNow, "no call outlives CommitChunk")
			// The first call answers at once, freeing its slot for one more.
			require.Equal(t, inFlight+1, len(calls), "no call starts after the failure")
			require.Equal(t, len(calls)-2, cancelled, "the calls in flight beside it are cancelled")
		})
	}
}

// TestProcessorCalls_TimeoutInOne: a call that gets no answer within its
// own timeout (the Processor's, as the worker's HTTP client has) fails the
// chunk like any failed call; the same chunk sent again, answered in time,
// commits every item once.
func TestProcessorCalls_TimeoutInOne(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	var slow sync.Once
	p := &callsProcessor{answer: func(_ int, items []ledger.Claim) (time.Duration, []ledger.Verdict, error) {
		hang := false
		if items[0].Occurrence == "occ-000020" { // the chunk's third call
			slow.Do(func() { hang = true })
		}
		if hang {
			return time.Minute, nil, nil
		}
		return time.Millisecond, nil, nil
	}}
	timed := timeoutProcessor{p: p, timeout: 100 * time.Millisecond}
	run := runNamed("timeout")
	chunk := items("acct", 0, 40)
	opts := ledger.ChunkOptions{Processor: timed, ItemsPerCall: 10, CallsInFlight: 2}
	_, err := s.CommitChunk(context.Background(), run, chunk, opts)
	var perr *ledger.ProcessorError
	require.ErrorAs(t, err, &perr)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "call 3 of 4")
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, run.UID))

	res := commit(t, s, run, chunk, opts)
	require.Equal(t, tally{completed: 40}, count(res))
	require.EqualValues(t, 40, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, run.UID))
}

// timeoutProcessor bounds each call of p by timeout, as the worker's HTTP
// client does.
type timeoutProcessor struct {
	p       ledger.Processor
	timeout time.Duration
}

func (t timeoutProcessor) Process(ctx context.Context, run ledger.Run, items []ledger.Claim) ([]ledger.Verdict, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	v, err := t.p.Process(ctx, run, items)
	if err != nil {
		return nil, fmt.Errorf("no answer within the timeout of %s: %w", t.timeout, err)
	}
	return v, nil
}

// TestProcessorCalls_Cancel: the caller's context ending while calls are in
// flight ends them all: CommitChunk returns the context's error once every
// call has returned, and nothing of the chunk commits.
func TestProcessorCalls_Cancel(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 10)
	p := &callsProcessor{answer: func(int, []ledger.Claim) (time.Duration, []ledger.Verdict, error) {
		started <- struct{}{}
		return time.Minute, nil, nil
	}}
	go func() {
		<-started
		<-started
		cancel()
	}()
	run := runNamed("cancel")
	_, err := s.CommitChunk(ctx, run, items("acct", 0, 60), ledger.ChunkOptions{Processor: p, ItemsPerCall: 10, CallsInFlight: 2})
	require.ErrorIs(t, err, context.Canceled)
	calls, _, inFlight, _, cancelled := p.snapshot()
	require.Zero(t, inFlight, "no call outlives CommitChunk")
	require.Len(t, calls, 2, "no call starts once the caller gave up")
	require.Equal(t, 2, cancelled)
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, run.UID))
}

// TestProcessorCalls_Randomized: chunks of random keys, some held by
// another run, some repeated, sent in calls of random sizes and
// concurrency to a processor that answers each item ok, refused or retry
// at random after a random delay, and sometimes fails a whole call. After
// every CommitChunk: a failed one committed nothing; otherwise each item's
// verdict is what its own call answered for it in that try (ok: Completed,
// and committed; refused or retry: Failed, and not committed), a key
// another run holds is AlreadyHandled with that run as its holder and was
// never sent, and the ledger's rows of the run are exactly its Completed
// keys.
func TestProcessorCalls_Randomized(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	pool := newPool(t)
	s := ledger.NewStore(pool)
	other := runNamed("other")
	var held []ledger.Item
	for i := range 40 {
		if rng.IntN(4) == 0 {
			held = append(held, ledger.Item{Key: ledger.Key{Entity: "r", Occurrence: fmt.Sprintf("k%03d", i)}})
		}
	}
	if len(held) > 0 {
		commit(t, s, other, held, ledger.ChunkOptions{})
	}
	isHeld := map[ledger.Key]bool{}
	for _, it := range held {
		isHeld[it.Key] = true
	}

	run := runNamed("random")
	committed := map[ledger.Key]bool{}
	for round := range 12 {
		var chunk []ledger.Item
		for range 1 + rng.IntN(40) {
			chunk = append(chunk, ledger.Item{Key: ledger.Key{Entity: "r", Occurrence: fmt.Sprintf("k%03d", rng.IntN(60))}})
		}
		var mu sync.Mutex
		answered := map[ledger.Key]ledger.Verdict{} // this try's answers
		seeds := make([]uint64, 64)
		for i := range seeds {
			seeds[i] = rng.Uint64()
		}
		p := &callsProcessor{answer: func(call int, items []ledger.Claim) (time.Duration, []ledger.Verdict, error) {
			r := rand.New(rand.NewPCG(seeds[call%len(seeds)], uint64(call)))
			delay := time.Duration(r.IntN(4)) * time.Millisecond
			if r.IntN(8) == 0 {
				return delay, nil, errors.New("status 503")
			}
			out := make([]ledger.Verdict, len(items))
			mu.Lock()
			defer mu.Unlock()
			for i, it := range items {
				switch r.IntN(4) {
				case 0:
					out[i] = ledger.Verdict{Error: "no"}
				case 1:
					out[i] = ledger.Verdict{Retryable: true, Error: "later"}
				default:
					out[i] = ledger.Verdict{OK: true}
				}
				answered[it.Key] = out[i]
			}
			return delay, out, nil
		}}
		opts := ledger.ChunkOptions{Processor: p, ItemsPerCall: 1 + rng.IntN(8), CallsInFlight: 1 + rng.IntN(4)}
		before := scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, run.UID)
		res, err := s.CommitChunk(context.Background(), run, chunk, opts)
		calls, _, inFlight, _, _ := p.snapshot()
		require.Zero(t, inFlight, "round %d: no call outlives CommitChunk", round)
		for _, c := range calls {
			require.LessOrEqual(t, len(c), opts.ItemsPerCall, "round %d", round)
			for _, k := range c {
				require.False(t, isHeld[k], "round %d: %v, held by another run, was sent", round, k)
				require.False(t, committed[k], "round %d: %v, committed by this run, was sent", round, k)
			}
		}
		if err != nil {
			var perr *ledger.ProcessorError
			require.ErrorAs(t, err, &perr, "round %d", round)
			require.Equal(t, before, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, run.UID), "round %d: a failed call commits nothing", round)
			continue
		}
		firsts := map[ledger.Key]ledger.Result{}
		for i, r := range res {
			k := chunk[i].Key
			firstRes, repeat := firsts[k]
			if !repeat {
				firsts[k] = r
			}
			switch {
			case repeat && firstRes.Outcome == ledger.Failed:
				require.Equal(t, ledger.Failed, r.Outcome, "round %d: %v repeated: failed like its first copy", round, k)
			case repeat:
				require.Equal(t, ledger.HolderSameChunk, r.Holder, "round %d: %v repeated", round, k)
			case isHeld[k]:
				require.Equal(t, ledger.AlreadyHandled, r.Outcome, "round %d: %v", round, k)
				require.Equal(t, other.UID, r.HolderUID, "round %d: %v: its holder", round, k)
			case committed[k]:
				require.Equal(t, ledger.Completed, r.Outcome, "round %d: %v", round, k)
				require.Equal(t, ledger.HolderSameRun, r.Holder, "round %d: %v", round, k)
			default:
				v, ok := answered[k]
				require.True(t, ok, "round %d: %v, claimed, was sent", round, k)
				if v.OK {
					require.Equal(t, ledger.Completed, r.Outcome, "round %d: %v", round, k)
					committed[k] = true
				} else {
					require.Equal(t, ledger.Failed, r.Outcome, "round %d: %v", round, k)
					require.Equal(t, v.Retryable, errors.Is(r.Err, ledger.ErrRetryItem), "round %d: %v", round, k)
				}
			}
		}
		require.EqualValues(t, len(committed), scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, run.UID),
			"round %d: the ledger holds exactly the run's Completed keys", round)
		for k := range committed {
			require.Equal(t, 1, countRows(t, pool, k.Entity, k.Occurrence, "committed"), "round %d: %v", round, k)
		}
	}
}

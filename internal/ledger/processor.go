package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Processor processes the items a chunk's transaction has just claimed,
// before it commits (spec.effect.processor; the worker's HTTP client is one).
// It answers one Verdict per item, in order. An error means the call as a
// whole failed (no answer, a malformed one): nothing of the chunk commits.
type Processor interface {
	Process(ctx context.Context, run Run, claims []Claim) ([]Verdict, error)
}

// Claim is an item as a chunk's transaction claimed it, with the generation
// of its key's processing.
type Claim struct {
	Item
	// Generation counts the key's committed rows before the one the claim
	// makes: 0 for the key's first; for a Supersede claim, the rows retired
	// before the one it retires, and that one (ledger_retired: the history
	// pruning leaves). With the key it names the logical work: the same on
	// every retry, attempt and run that claims the key in that generation,
	// another once a Supersede has committed a new one. It counts what the
	// ledger holds, not which rows: a failover that lost a Supersede's row
	// lost its record too, so the generation processed again (under a new
	// row id) has the same number, and so has the one after it.
	Generation int64
}

// Verdict is a processor's answer for one item.
type Verdict struct {
	// OK: the item is processed; its key commits with the chunk.
	OK bool
	// Retryable (with OK false): try the item again later in the run.
	Retryable bool
	// Error says why the item was not processed.
	Error string
}

// ProcessorError is a processor call that failed as a whole (refused
// connection, timeout, a status other than 200, a redirect, a malformed
// answer or one past its size limit, a wrong number of results). It is transient: IsRetryable says so, and nothing of the
// chunk was committed.
type ProcessorError struct{ Err error }

func (e *ProcessorError) Error() string { return "calling the processor: " + e.Err.Error() }
func (e *ProcessorError) Unwrap() error { return e.Err }

// refusedError is the processor's ok: false for one item (FailureClass).
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// ErrRetryItem marks the error of an item the processor asked to retry
// ({"ok": false, "retryable": true}): the item was not committed, and the
// caller may send it again.
var ErrRetryItem = errors.New("retryable")

// process calls p with the items this transaction has newly claimed (out[i]
// Completed by this call: never an item another run holds, nor one this run
// committed earlier), in calls bounded by c, and takes back, in the same
// transaction, the claims of the items it did not accept. The accepted keys
// stay claimed, hence locked against every other writer, until the caller
// commits.
func process(ctx context.Context, tx pgx.Tx, run Run, items []Item, out []Result, p Processor, c calls) ([]Result, error) {
	var sent []int
	for i, r := range out {
		if r.Outcome == Completed && r.Holder == HolderNone {
			sent = append(sent, i)
		}
	}
	if len(sent) == 0 {
		return out, nil
	}
	batch := make([]Claim, len(sent))
	for j, i := range sent {
		batch[j] = Claim{Item: items[i], Generation: out[i].generation}
	}
	verdicts, err := c.send(ctx, p, run, batch)
	if err != nil {
		return nil, &ProcessorError{Err: err}
	}

	var entities, occurrences []string
	var restore []int64
	for j, i := range sent {
		v := verdicts[j]
		if v.OK {
			continue
		}
		entities = append(entities, items[i].Entity)
		occurrences = append(occurrences, items[i].Occurrence)
		if out[i].supersededRow != 0 {
			restore = append(restore, out[i].supersededRow)
		}
		why := v.Error
		if why == "" {
			why = "refused (no error given)"
		}
		itemErr := errors.New(why)
		if v.Retryable {
			itemErr = fmt.Errorf("%s (%w)", why, ErrRetryItem)
		}
		out[i] = Result{Key: items[i].Key, Outcome: Failed, Err: fmt.Errorf("processor: %w", &refusedError{err: itemErr})}
	}
	if len(entities) == 0 {
		return out, nil
	}
	var deleted int64
	if err := tx.QueryRow(ctx, sqlTakeBack, entities, occurrences, restore).Scan(&deleted); err != nil {
		return nil, fmt.Errorf("taking back %d claims the processor did not accept: %w", len(entities), err)
	}
	if deleted != int64(len(entities)) {
		return nil, fmt.Errorf("taking back the claims the processor did not accept: took back %d rows for %d keys", deleted, len(entities))
	}
	return out, nil
}

// calls bounds a chunk's calls of its processor (ChunkOptions.ItemsPerCall,
// ChunkOptions.CallsInFlight).
type calls struct{ perCall, inFlight int }

// send sends batch to p in calls of at most c.perCall consecutive items, at
// most c.inFlight of them at once, and returns one verdict per item, in
// order: each item's is the answer of the one call that carried it. The
// first call to fail as a whole (no answer, a malformed one, a wrong number
// of results) fails them all, as one call's failure fails the chunk: no
// call starts after it, the calls in flight are cancelled, and every call
// has returned before send does (none outlives the chunk's transaction).
func (c calls) send(ctx context.Context, p Processor, run Run, batch []Claim) ([]Verdict, error) {
	size := c.perCall
	if size <= 0 || size >= len(batch) {
		return callOnce(ctx, p, run, batch)
	}
	n := (len(batch) + size - 1) / size
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	verdicts := make([]Verdict, len(batch))
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed error
	)
	slots := make(chan struct{}, max(c.inFlight, 1))
	started := 0
	for k := range n {
		slots <- struct{}{}
		if ctx.Err() != nil { // a call failed, or the caller gave up
			<-slots
			break
		}
		started++
		lo, hi := k*size, min((k+1)*size, len(batch))
		wg.Go(func() {
			defer func() { <-slots }()
			v, err := callOnce(ctx, p, run, batch[lo:hi])
			if err != nil {
				mu.Lock()
				if failed == nil { // the first; the others are mostly its cancellation
					failed = fmt.Errorf("call %d of %d (items %d-%d of %d): %w", k+1, n, lo+1, hi, len(batch), err)
					cancel()
				}
				mu.Unlock()
				return
			}
			copy(verdicts[lo:hi], v)
		})
	}
	wg.Wait()
	switch {
	case failed != nil:
		return nil, failed
	case started < n: // the caller gave up before every call started
		return nil, fmt.Errorf("the chunk's calls stopped after %d of %d: %w", started, n, context.Cause(ctx))
	}
	return verdicts, nil
}

// callOnce is one call of p, which must answer one verdict per item.
func callOnce(ctx context.Context, p Processor, run Run, batch []Claim) ([]Verdict, error) {
	verdicts, err := p.Process(ctx, run, batch)
	if err == nil && len(verdicts) != len(batch) {
		err = fmt.Errorf("it answered %d results for %d items", len(verdicts), len(batch))
	}
	return verdicts, err
}

// parseRowID reads a row id sent as text.
func parseRowID(b []byte) (int64, error) {
	id, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reading a row id: %w", err)
	}
	return id, nil
}

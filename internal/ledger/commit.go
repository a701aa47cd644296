package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// errHolderVanished: the insert skipped a key because a committed row held it,
// yet no committed row holds it when asked right after (it was deleted). The
// item was not committed by this call; it is reported Failed, never as
// already handled.
var errHolderVanished = errors.New("key conflicted with a committed row that no longer exists; not committed, retry")

// CommitChunk commits items for run through the one insert path and returns
// one Result per item, in order.
//
// The chunk is claimed by one set-based INSERT ... ON CONFLICT DO NOTHING whose
// arbiter is the business-key rule, followed (when opts.Effect is set) by the
// effect over exactly the newly claimed items, in one transaction. If that
// transaction fails for a reason tied to some items (a foreign key in the
// effect, a malformed payload, a check constraint), the bad items are isolated
// by bisection under savepoints in a second transaction: the good items commit
// and each bad item is Failed with its own error.
//
// A key repeated within items is one logical occurrence: it is committed once
// and its repeats are AlreadyHandled with HolderSameChunk (or Failed like their
// first copy, if that failed).
//
// A non-nil error means the chunk's fate is unknown or nothing of it was
// committed: a retryable condition (IsRetryable; retry the same chunk, rows
// committed by an earlier try come back as Completed with HolderSameRun) or a
// cancelled context. Item-level failures never surface as this error.
func (s *Store) CommitChunk(ctx context.Context, run Run, items []Item, opts ChunkOptions) ([]Result, error) {
	if run.UID == "" {
		return nil, errors.New("committing chunk: run UID is empty; it identifies the writer of every row")
	}
	if len(items) == 0 {
		return nil, nil
	}
	unique, indexOf := dedupe(items)

	res, err := s.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
		return claim(ctx, tx, run, unique, opts)
	})
	if err != nil {
		if IsRetryable(err) || ctx.Err() != nil {
			return nil, fmt.Errorf("committing chunk of %d items: %w", len(items), err)
		}
		if isStatementLevel(err) || len(unique) == 1 {
			res = failAll(unique, err)
		} else if res, err = s.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
			return isolate(ctx, tx, run, unique, opts)
		}); err != nil {
			return nil, fmt.Errorf("committing chunk of %d items item by item: %w", len(items), err)
		}
	}
	return spread(items, indexOf, res), nil
}

// inTx runs fn in a transaction prepared for opts and commits it.
func (s *Store) inTx(ctx context.Context, opts ChunkOptions, fn func(pgx.Tx) ([]Result, error)) ([]Result, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("beginning transaction: %w", err)
	}
	// After a successful Commit this is a no-op; after a failure the server
	// discards the transaction anyway when the connection goes.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if opts.Effect != "" {
		if _, err := tx.Exec(ctx, sqlCreateClaimed); err != nil {
			return nil, fmt.Errorf("preparing table claimed: %w", err)
		}
	}
	res, err := fn(tx)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("committing: %w", err)
	}
	return res, nil
}

// isolate claims items under savepoints, halving every failing group until
// each failure is pinned to a single item (or to a statement-level error that
// every item shares). The returned error is only for conditions that condemn
// the whole transaction (retryable, cancelled).
func isolate(ctx context.Context, tx pgx.Tx, run Run, items []Item, opts ChunkOptions) ([]Result, error) {
	out := make([]Result, len(items))
	var walk func(lo, hi int, knownBad bool) error
	walk = func(lo, hi int, knownBad bool) error {
		part := items[lo:hi]
		if !knownBad || len(part) == 1 {
			sp, err := tx.Begin(ctx) // SAVEPOINT
			if err != nil {
				return fmt.Errorf("creating savepoint: %w", err)
			}
			res, err := claim(ctx, sp, run, part, opts)
			if err == nil {
				if err := sp.Commit(ctx); err != nil { // RELEASE SAVEPOINT
					return fmt.Errorf("releasing savepoint: %w", err)
				}
				copy(out[lo:hi], res)
				return nil
			}
			if rbErr := sp.Rollback(ctx); rbErr != nil {
				return fmt.Errorf("rolling back to savepoint: %w", errors.Join(rbErr, err))
			}
			if IsRetryable(err) || ctx.Err() != nil {
				return err
			}
			if len(part) == 1 || isStatementLevel(err) {
				copy(out[lo:hi], failAll(part, err))
				return nil
			}
		}
		mid := lo + (hi-lo)/2
		if err := walk(lo, mid, false); err != nil {
			return err
		}
		return walk(mid, hi, false)
	}
	// The whole chunk is known to fail: start by splitting it.
	if err := walk(0, len(items), true); err != nil {
		return nil, err
	}
	return out, nil
}

// claim runs the insert path for items (all keys distinct) on tx: supersede
// (if asked), insert, effect, then attribution of the keys it did not claim.
func claim(ctx context.Context, tx pgx.Tx, run Run, items []Item, opts ChunkOptions) ([]Result, error) {
	entities, occurrences, payloads := columns(items)

	var superseded map[Key]bool
	if opts.OnExisting == Supersede {
		rows, err := tx.Query(ctx, sqlSupersede, entities, occurrences, run.UID)
		if err != nil {
			return nil, fmt.Errorf("superseding existing rows: %w", err)
		}
		if superseded, err = collectKeys(rows); err != nil {
			return nil, fmt.Errorf("superseding existing rows: %w", err)
		}
	}

	insert := sqlInsert
	if opts.Effect != "" {
		insert = sqlInsertClaimed
		if _, err := tx.Exec(ctx, sqlClearClaimed); err != nil {
			return nil, fmt.Errorf("clearing table claimed: %w", err)
		}
	}
	rows, err := tx.Query(ctx, insert, entities, occurrences, payloads,
		run.Namespace, run.Name, run.UID, run.Shard, run.Attempt)
	if err != nil {
		return nil, fmt.Errorf("inserting into ledger: %w", err)
	}
	claimed, err := collectKeys(rows)
	if err != nil {
		return nil, fmt.Errorf("inserting into ledger: %w", err)
	}

	if opts.Effect != "" && len(claimed) > 0 {
		if _, err := tx.Exec(ctx, opts.Effect); err != nil {
			return nil, fmt.Errorf("running effect: %w", err)
		}
	}

	var held map[Key]Holder
	if len(claimed) < len(items) {
		skipped := make([]Key, 0, len(items)-len(claimed))
		for _, it := range items {
			if !claimed[it.Key] {
				skipped = append(skipped, it.Key)
			}
		}
		if held, err = holders(ctx, tx, run.UID, skipped); err != nil {
			return nil, err
		}
	}

	out := make([]Result, len(items))
	for i, it := range items {
		r := Result{Key: it.Key}
		switch h, ok := held[it.Key]; {
		case claimed[it.Key]:
			r.Outcome, r.Superseded = Completed, superseded[it.Key]
		case ok && h == HolderSameRun:
			r.Outcome, r.Holder = Completed, h
		case ok:
			r.Outcome, r.Holder = AlreadyHandled, h
		default:
			r.Outcome, r.Err = Failed, fmt.Errorf("claiming %s: %w", it.Key, errHolderVanished)
		}
		out[i] = r
	}
	return out, nil
}

// interpret is the one place where an item's error becomes an outcome: only
// the expected business-key conflict means "already handled"; every other
// error is a failure, kept with its cause.
func interpret(k Key, err error) Result {
	if IsExpectedBusinessKeyConflict(err) {
		return Result{Key: k, Outcome: AlreadyHandled, Holder: HolderOtherRun}
	}
	return Result{Key: k, Outcome: Failed, Err: fmt.Errorf("item %s: %w", k, err)}
}

func failAll(items []Item, err error) []Result {
	out := make([]Result, len(items))
	for i, it := range items {
		out[i] = interpret(it.Key, err)
	}
	return out
}

func columns(items []Item) (entities, occurrences []string, payloads []*string) {
	entities = make([]string, len(items))
	occurrences = make([]string, len(items))
	payloads = make([]*string, len(items))
	for i, it := range items {
		entities[i], occurrences[i] = it.Entity, it.Occurrence
		if it.Payload != nil {
			p := string(it.Payload)
			payloads[i] = &p
		}
	}
	return entities, occurrences, payloads
}

func collectKeys(rows pgx.Rows) (map[Key]bool, error) {
	out := make(map[Key]bool)
	var k Key
	_, err := pgx.ForEachRow(rows, []any{&k.Entity, &k.Occurrence}, func() error {
		out[k] = true
		return nil
	})
	return out, err
}

// dedupe returns the distinct items sorted by key (first copy wins) and, for
// every input position, the index of its key in that list.
//
// The order matters: every transaction claims keys in the same (ascending)
// order, so two writers whose chunks overlap wait on each other in one
// direction only and do not deadlock on the unique index.
func dedupe(items []Item) (unique []Item, indexOf []int) {
	seen := make(map[Key]int, len(items))
	unique = make([]Item, 0, len(items))
	for _, it := range items {
		if _, ok := seen[it.Key]; !ok {
			seen[it.Key] = len(unique)
			unique = append(unique, it)
		}
	}
	slices.SortFunc(unique, func(a, b Item) int {
		return cmp.Or(strings.Compare(a.Entity, b.Entity), strings.Compare(a.Occurrence, b.Occurrence))
	})
	for i, it := range unique {
		seen[it.Key] = i
	}
	indexOf = make([]int, len(items))
	for i, it := range items {
		indexOf[i] = seen[it.Key]
	}
	return unique, indexOf
}

// spread maps the results of the distinct items back onto every input
// position. The first copy of a key carries its outcome; its repeats become
// AlreadyHandled (HolderSameChunk), or Failed like their first copy.
func spread(items []Item, indexOf []int, res []Result) []Result {
	out := make([]Result, len(items))
	done := make([]bool, len(res))
	for i, j := range indexOf {
		switch {
		case !done[j]:
			out[i], done[j] = res[j], true
		case res[j].Outcome == Failed:
			out[i] = res[j]
		default:
			out[i] = Result{Key: items[i].Key, Outcome: AlreadyHandled, Holder: HolderSameChunk}
		}
	}
	return out
}

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
// The chunk is claimed in one transaction by one set-based statement that
// looks up which keys a committed row already holds and inserts the others
// (sqlClaim), followed (when opts.Effect is set) by the effect over exactly
// the newly claimed items. If a concurrent writer committed one of the keys
// after that lookup, the business-key rule rejects the insert; the chunk is
// then claimed again with INSERT ... ON CONFLICT DO NOTHING, whose arbiter is
// that rule. If the transaction fails for a reason tied to some items (a
// foreign key in the effect, a malformed payload, a check constraint), the bad
// items are isolated by bisection under savepoints in another transaction: the
// good items commit and each bad item is Failed with its own error.
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
	// settle runs the processor, if any, over what a claim claimed, in the
	// claim's transaction.
	settle := func(tx pgx.Tx, res []Result, err error) ([]Result, error) {
		if err != nil || opts.Processor == nil {
			return res, err
		}
		return process(ctx, tx, run, unique, res, opts.Processor)
	}

	res, err := s.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
		res, err := claim(ctx, tx, run, unique, opts, lookupFirst)
		return settle(tx, res, err)
	})
	if IsExpectedBusinessKeyConflict(err) {
		// A writer committed one of the keys after the lookup's snapshot.
		res, err = s.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
			res, err := claim(ctx, tx, run, unique, opts, arbitrate)
			return settle(tx, res, err)
		})
	}
	if err != nil {
		if IsRetryable(err) || ctx.Err() != nil {
			return nil, fmt.Errorf("committing chunk of %d items: %w", len(items), err)
		}
		if isStatementLevel(err) || len(unique) == 1 {
			res = failAll(unique, err)
		} else if res, err = s.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
			res, err := isolate(ctx, tx, run, unique, opts)
			return settle(tx, res, err)
		}); err != nil {
			return nil, fmt.Errorf("committing chunk of %d items item by item: %w", len(items), err)
		}
	}
	return spread(items, indexOf, res), nil
}

// inTx runs fn in a transaction prepared for opts and commits it.
func (s *Store) inTx(ctx context.Context, opts ChunkOptions, fn func(pgx.Tx) ([]Result, error)) ([]Result, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: sqlBeginChunk(opts.sqlBounds(), opts.Effect != "")})
	if err != nil {
		return nil, fmt.Errorf("beginning transaction: %w", err)
	}
	// After a successful Commit this is a no-op; after a failure the server
	// discards the transaction anyway when the connection goes.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

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
			res, err := claim(ctx, sp, run, part, opts, arbitrate)
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
	if opts.Effect != "" {
		// A later group's effect may have taken back an earlier group's claims.
		if err := claimsHeld(ctx, tx, run, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// claimMode is how claim inserts.
type claimMode int

const (
	// lookupFirst: sqlClaim, one statement that skips the keys a committed row
	// holds as of its snapshot and plainly inserts the others. It fails with
	// the expected business-key conflict if a concurrent writer got in between.
	lookupFirst claimMode = iota
	// arbitrate: sqlInsert (ON CONFLICT DO NOTHING, absorbing exactly the
	// rule's conflicts), then sqlHolders for the keys it skipped.
	arbitrate
)

// supersede marks the committed rows of items' keys that other runs hold
// superseded: which items had one, and the row superseded for each.
func supersede(ctx context.Context, tx pgx.Tx, run Run, items []Item, entities, occurrences []string) ([]bool, []int64, error) {
	superseded := make([]bool, len(items))
	supersededRow := make([]int64, len(items))
	var idErr error
	rows, err := tx.Query(ctx, sqlSupersede, entities, occurrences, run.UID)
	if err == nil {
		err = forEachKey(rows, items, func(i int, rest [][]byte) {
			superseded[i] = true
			if supersededRow[i], err = parseRowID(rest[0]); err != nil {
				idErr = err
			}
		})
	}
	if err == nil {
		err = idErr
	}
	if err != nil {
		return nil, nil, fmt.Errorf("superseding existing rows: %w", err)
	}
	return superseded, supersededRow, nil
}

// claimStatement is the claim's statement: the fast path's look-up first or
// the arbiter's plain ON CONFLICT, each with or without the effect's table.
func claimStatement(mode claimMode, effect bool) string {
	switch {
	case mode == lookupFirst && !effect:
		return sqlClaim
	case mode == lookupFirst:
		return sqlClaimEffect
	case !effect:
		return sqlInsert
	default:
		return sqlInsertEffect
	}
}

// claim runs the insert path for items (keys distinct and sorted) on tx:
// supersede (if asked), insert, attribution of the keys it did not claim, then
// the effect.
func claim(ctx context.Context, tx pgx.Tx, run Run, items []Item, opts ChunkOptions, mode claimMode) ([]Result, error) {
	entities, occurrences, payloads := columns(items)
	out := make([]Result, len(items)) // Outcome 0: not resolved yet
	for i, it := range items {
		out[i].Key = it.Key
	}
	// held attributes item i, which this call did not claim, to the run whose
	// committed row holds it.
	held := func(i int, holder []byte) {
		if out[i].Outcome != 0 {
			return
		}
		if out[i].Holder = holderOf(holder, run.UID); out[i].Holder == HolderSameRun {
			out[i].Outcome = Completed
		} else {
			out[i].Outcome = AlreadyHandled
		}
	}

	var superseded []bool
	var supersededRow []int64 // the row superseded for item i, if any
	if opts.OnExisting == Supersede {
		var err error
		if superseded, supersededRow, err = supersede(ctx, tx, run, items, entities, occurrences); err != nil {
			return nil, err
		}
	}

	insert := claimStatement(mode, opts.Effect != "")
	if opts.Effect != "" {
		if _, err := tx.Exec(ctx, sqlClearClaimed); err != nil {
			return nil, fmt.Errorf("clearing table claimed: %w", err)
		}
	}
	claimed := 0
	claimedBy := func(i int) {
		out[i].Outcome, out[i].Superseded = Completed, superseded != nil && superseded[i]
		if supersededRow != nil {
			out[i].supersededRow = supersededRow[i]
		}
		claimed++
	}
	rows, err := tx.Query(ctx, insert, entities, occurrences, payloads,
		run.Namespace, run.Name, run.UID, run.Shard, run.Attempt)
	switch {
	case err != nil: // reported below
	case mode == lookupFirst: // rows: the skipped keys, with their holders
		err = forEachSkipped(rows, len(items), func(i int, sameRun bool) {
			out[i].Outcome, out[i].Holder = AlreadyHandled, HolderOtherRun
			if sameRun {
				out[i].Outcome, out[i].Holder = Completed, HolderSameRun
			}
		})
		if err == nil { // the statement inserted every key it did not skip
			for i := range out {
				if out[i].Outcome == 0 {
					claimedBy(i)
				}
			}
		}
	default: // rows: the inserted keys
		err = forEachKey(rows, items, func(i int, _ [][]byte) { claimedBy(i) })
	}
	if err != nil {
		return nil, fmt.Errorf("inserting into ledger: %w", err)
	}

	var skipped []Key
	for _, r := range out {
		if r.Outcome == 0 {
			skipped = append(skipped, r.Key)
		}
	}
	if len(skipped) > 0 {
		rows, err := queryHolders(ctx, tx, skipped)
		if err == nil {
			err = forEachKey(rows, items, func(i int, rest [][]byte) { held(i, rest[0]) })
		}
		if err != nil {
			return nil, fmt.Errorf("attributing skipped keys: %w", err)
		}
	}

	if opts.Effect != "" && claimed > 0 {
		if err := runEffect(ctx, tx, opts); err != nil {
			return nil, err
		}
		if err := claimsHeld(ctx, tx, run, out); err != nil {
			return nil, err
		}
	}

	for i, r := range out {
		if r.Outcome == 0 {
			out[i].Outcome, out[i].Err = Failed, fmt.Errorf("claiming %s: %w", r.Key, errHolderVanished)
		}
	}
	return out, nil
}

// runEffect runs the caller's effect with the session's planner settings
// under the run's bounds (in force since BEGIN), inside a block that refuses
// transaction control (effectBlock), checks the constraints it deferred, and
// restores the session's settings, the ledger's and the run's bounds (isolate
// claims again in the same transaction), whatever the effect set.
func runEffect(ctx context.Context, tx pgx.Tx, opts ChunkOptions) error {
	if _, err := tx.Exec(ctx, sqlBeforeEffect); err != nil {
		return fmt.Errorf("preparing effect: %w", err)
	}
	bounded, cancel := answerBy(ctx, opts.EffectTimeout, opts.NetworkTimeout)
	_, err := tx.Exec(bounded, effectBlock(opts.Effect))
	err = noAnswer(ctx, bounded, err)
	cancel()
	if err != nil {
		if IsTransactionControl(err) {
			return fmt.Errorf("running effect: %w: %w", ErrEffectTransactionControl, err)
		}
		if IsExpectedBusinessKeyConflict(err) {
			// The effect's own write broke the rule: PostgreSQL's text only, so
			// that no caller reads the chunk's items as already handled.
			return fmt.Errorf("running effect: %w: %s", ErrEffectBrokeRule, err.Error())
		}
		return fmt.Errorf("running effect: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlAfterEffect(opts.sqlBounds())); err != nil {
		return fmt.Errorf("checking the effect's deferred constraints: %w", err)
	}
	return nil
}

// claimsHeld checks, after an effect, that every key out counts as Completed
// still has a committed row of run, in one statement.
func claimsHeld(ctx context.Context, tx pgx.Tx, run Run, out []Result) error {
	var entities, occurrences []string
	for _, r := range out {
		if r.Outcome == Completed {
			entities, occurrences = append(entities, r.Key.Entity), append(occurrences, r.Key.Occurrence)
		}
	}
	if len(entities) == 0 {
		return nil
	}
	var held int
	if err := tx.QueryRow(ctx, sqlClaimsHeld, entities, occurrences, run.UID).Scan(&held); err != nil {
		return fmt.Errorf("checking the chunk's claims after the effect: %w", err)
	}
	if held != len(entities) {
		return fmt.Errorf("%d of %d claimed keys have no committed row after the effect: %w", len(entities)-held, len(entities), ErrEffectTookBackClaims)
	}
	return nil
}

// ErrEffectTookBackClaims: the effect deleted (took back) committed rows its
// own transaction had claimed; the chunk's items fail and nothing commits.
var ErrEffectTookBackClaims = errors.New("the effect took back its chunk's claims (every claimed key must keep its committed row)")

// ErrEffectBrokeRule: the effect itself wrote a ledger row that the
// business-key rule refused. That says nothing about the chunk's keys: its
// items fail, never already handled.
var ErrEffectBrokeRule = errors.New("the effect wrote a ledger row the business-key rule refused (an effect never writes the ledger)")

// ErrEffectTransactionControl: the effect tried to COMMIT, ROLLBACK or open
// a savepoint, which would commit the claim without the rest of the effect or
// let the effect commit without the claim.
var ErrEffectTransactionControl = errors.New("the effect may not end the ledger's transaction or open a savepoint (COMMIT, ROLLBACK, SAVEPOINT)")

// PrepareEffect prepares the effect statement (without running it) next to
// the table "claimed" it reads, in a transaction rolled back at once, so that
// a syntax error or a missing table shows before the first commit. An error
// of the statement itself is PostgreSQL's (see RefusedStatement).
func (s *Store) PrepareEffect(ctx context.Context, effect string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, sqlCreateClaimed); err != nil {
		return fmt.Errorf("preparing table claimed: %w", err)
	}
	_, err = tx.Prepare(ctx, "", effect)
	return err
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

// columns turns items into the statement's array parameters. A nil payload
// is sent as NULL.
func columns(items []Item) (entities, occurrences []string, payloads [][]byte) {
	entities = make([]string, len(items))
	occurrences = make([]string, len(items))
	payloads = make([][]byte, len(items))
	for i, it := range items {
		entities[i], occurrences[i], payloads[i] = it.Entity, it.Occurrence, it.Payload
	}
	return entities, occurrences, payloads
}

// forEachKey reads rows whose first two columns are a key, finds each key in
// items (sorted, distinct) and calls fn with its position and the row's other
// columns (raw; valid during the call only). A key that was not sent is an
// error: it would mean a statement answered about rows it was not asked for.
func forEachKey(rows pgx.Rows, items []Item, fn func(i int, rest [][]byte)) error {
	defer rows.Close()
	for rows.Next() {
		v := rows.RawValues()
		if len(v) < 2 || v[0] == nil || v[1] == nil {
			return fmt.Errorf("reading keys: got %d columns, want a non-NULL entity and occurrence first", len(v))
		}
		i, found := slices.BinarySearchFunc(items, v, func(it Item, v [][]byte) int {
			return cmp.Or(strings.Compare(it.Entity, string(v[0])), strings.Compare(it.Occurrence, string(v[1])))
		})
		if !found {
			return fmt.Errorf("reading keys: the server returned %s/%s, which was not sent", v[0], v[1])
		}
		fn(i, v[2:])
	}
	return rows.Err()
}

// forEachSkipped reads the rows of sqlClaim, (position from 1, holder is the
// same run) for each key it skipped, and calls fn with the key's index in the
// chunk of n items. A position outside the chunk, or a NULL, is an error: it
// would mean the statement answered about rows it was not asked for.
func forEachSkipped(rows pgx.Rows, n int, fn func(i int, sameRun bool)) error {
	var pos int64
	var sameRun bool
	_, err := pgx.ForEachRow(rows, []any{&pos, &sameRun}, func() error {
		if pos < 1 || pos > int64(n) {
			return fmt.Errorf("position %d is outside the chunk of %d", pos, n)
		}
		fn(int(pos-1), sameRun)
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading skipped keys: %w", err)
	}
	return nil
}

// compareKeys orders keys by entity, then occurrence, bytewise.
func compareKeys(a, b Key) int {
	return cmp.Or(strings.Compare(a.Entity, b.Entity), strings.Compare(a.Occurrence, b.Occurrence))
}

// dedupe returns the distinct items sorted by key (first copy wins) and, for
// every input position, the index of its key in that list; indexOf is nil when
// items already are distinct and sorted (unique is then items itself), as the
// query source delivers them.
//
// The order matters: every transaction claims keys in the same (ascending)
// order, so two writers whose chunks overlap wait on each other in one
// direction only and do not deadlock on the unique index.
func dedupe(items []Item) (unique []Item, indexOf []int) {
	if isStrictlySorted(items) {
		return items, nil
	}
	// Sort positions rather than items: ties broken by position keep the first
	// copy of a key first.
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(compareKeys(items[a].Key, items[b].Key), cmp.Compare(a, b))
	})
	unique = make([]Item, 0, len(items))
	indexOf = make([]int, len(items))
	for n, i := range order {
		if n == 0 || items[i].Key != items[order[n-1]].Key {
			unique = append(unique, items[i])
		}
		indexOf[i] = len(unique) - 1
	}
	return unique, indexOf
}

func isStrictlySorted(items []Item) bool {
	for i := 1; i < len(items); i++ {
		if compareKeys(items[i-1].Key, items[i].Key) >= 0 {
			return false
		}
	}
	return true
}

// spread maps the results of the distinct items back onto every input
// position. The first copy of a key carries its outcome; its repeats become
// AlreadyHandled (HolderSameChunk), or Failed like their first copy.
func spread(items []Item, indexOf []int, res []Result) []Result {
	if indexOf == nil {
		return res
	}
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

package ledger

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// that rule. With opts.ExpectFresh the first statement is a plain INSERT
// without the lookup (sqlInsertFresh); if the rule rejects it, the chunk is
// claimed as above. If the transaction fails for a reason tied to some items (a
// foreign key in the effect, a malformed payload, a check constraint), the bad
// items are isolated by bisection under savepoints in another transaction: the
// good items commit and each bad item is Failed with its own error.
//
// A key repeated within items is one logical occurrence: it is committed once
// (its first copy) and its repeats are AlreadyHandled with HolderSameChunk (or
// Failed like their first copy, if that failed). When another run holds it
// (and opts.OnExisting is not Supersede), every copy's payload is compared
// with the holding row's: the first copy's PayloadChanged says whether any
// differs, whichever copy came first.
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
	var copies []*string
	if opts.OnExisting != Supersede { // a Supersede run compares no payload
		copies = laterCopies(items, unique, indexOf)
	}
	if err := s.prepareEffect(ctx, &opts); err != nil {
		return nil, fmt.Errorf("committing chunk of %d items: %w", len(items), err)
	}
	// settle runs the processor, if any, over what a claim claimed, in the
	// claim's transaction.
	settle := func(tx pgx.Tx, res []Result, err error) ([]Result, error) {
		if err != nil || opts.Processor == nil {
			return res, err
		}
		return process(ctx, tx, run, unique, res, opts.Processor, calls{perCall: opts.ItemsPerCall, inFlight: opts.CallsInFlight})
	}

	first := lookupFirst
	if opts.ExpectFresh && opts.OnExisting != Supersede {
		first = insertFresh
	}
	res, err := s.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
		res, err := claim(ctx, tx, run, unique, copies, opts, first)
		return settle(tx, res, err)
	})
	if IsExpectedBusinessKeyConflict(err) {
		// A writer committed one of the keys after the lookup's snapshot: the
		// fast path once more, whose new snapshot sees that writer's rows (two
		// writers of the same keys: the second skips them all in one
		// statement), then the arbiter, which always ends.
		for _, mode := range []claimMode{lookupFirst, arbitrate} {
			res, err = s.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
				res, err := claim(ctx, tx, run, unique, copies, opts, mode)
				return settle(tx, res, err)
			})
			if !IsExpectedBusinessKeyConflict(err) {
				break
			}
		}
	}
	if err != nil {
		if IsRetryable(err) || ctx.Err() != nil {
			return nil, fmt.Errorf("committing chunk of %d items: %w", len(items), err)
		}
		if isStatementLevel(err) || len(unique) == 1 || errors.Is(err, ErrEffectSandbox) {
			res = failAll(unique, err)
		} else if res, err = s.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
			res, err := isolate(ctx, tx, run, unique, copies, opts)
			return settle(tx, res, err)
		}); errors.Is(err, ErrEffectSandbox) {
			res = failAll(unique, err)
		} else if err != nil {
			return nil, fmt.Errorf("committing chunk of %d items item by item: %w", len(items), err)
		}
	}
	return spread(items, indexOf, proven(run, res)), nil
}

// prepareEffect readies opts for its effect, if any: the sandbox it runs
// in, and the session it runs in.
func (s *Store) prepareEffect(ctx context.Context, opts *ChunkOptions) error {
	if opts.Effect == "" {
		return nil
	}
	sb, err := s.effectSandbox(ctx)
	if err != nil {
		return err
	}
	opts.sandbox = sb
	opts.pooled = BehindPooler(s.pool)
	opts.userPath = userSearchPath(s.pool)
	return nil
}

// inTx runs fn in a transaction prepared for opts and commits it. An effect's
// transaction creates the session's table "claimed" if need be, and lets the
// effect role read it the first time on the connection.
func (s *Store) inTx(ctx context.Context, opts ChunkOptions, fn func(pgx.Tx) ([]Result, error)) ([]Result, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquiring connection: %w", err)
	}
	defer conn.Release()
	begin := chunkBegin{bounds: opts.sqlBounds(), effect: opts.Effect != "", pooled: BehindPooler(s.pool)}
	if begin.pooled {
		begin.appName = s.pool.Config().ConnConfig.RuntimeParams["application_name"]
	}
	granted := true
	if begin.effect {
		// Behind a pooler, "claimed" and its grant are every transaction's.
		if granted = !begin.pooled && conn.Conn().PgConn().CustomData()[claimedGranted] == true; !granted {
			begin.grant = opts.sandbox.role
		}
	}
	if opts.Lease != nil {
		begin.lease = opts.Lease.sqlHold()
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: sqlBeginChunk(begin)})
	if isShardLeaseLost(err) && opts.Lease != nil { // the BEGIN's own statements: no user code has run yet
		conn.Release() // refused may take the lease again, on a session of the pool
		return nil, fmt.Errorf("beginning transaction: %w", opts.Lease.refused(ctx))
	}
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
	// A COMMIT waits for a synchronous standby's answer with no bound of
	// the server's own (an old primary a failover left behind waits for
	// ever): after the lock timeout and the network timeout the chunk's
	// outcome is unknown and it is sent again; what the old primary kept
	// alone, the shard's proof settles.
	committing, cancel := answerBy(ctx, opts.lockTimeout(), opts.NetworkTimeout)
	err = noAnswer(ctx, committing, tx.Commit(committing))
	cancel()
	if err != nil {
		if opts.Effect != "" && IsAppendOnlyViolation(err) {
			// Only user code the effect left to run at COMMIT as the login
			// writes the ledger from a trigger (00007) or at COMMIT (00013).
			return nil, fmt.Errorf("committing: %w: user code it left to run at COMMIT (a deferred trigger, a cursor WITH HOLD) wrote runledger's tables: %w", ErrEffectSandbox, err)
		}
		return nil, fmt.Errorf("committing: %w", err)
	}
	if opts.Lease != nil { // its BEGIN renewed the lease, for good now
		opts.Lease.Renewed()
	}
	if begin.effect && !begin.pooled {
		// A trigger the effect left to fire at COMMIT ran as the login: its
		// settings are undone, and the session goes if it left anything else
		// behind for the next transaction. (Behind a pooler, the next
		// transaction may have another server connection: each chunk's
		// resets its own first, sqlBeginChunk.)
		if intact, err := sessionIntact(ctx, conn.Conn().PgConn(), sqlSessionIntact); err != nil || !intact {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
			return res, nil
		}
	}
	if !granted && !begin.pooled { // a rolled back transaction took its table and grant back with it
		conn.Conn().PgConn().CustomData()[claimedGranted] = true
	}
	return res, nil
}

// claimedGranted marks a connection whose session has the table "claimed",
// readable by the effect role.
const claimedGranted = "runledger.claimedGranted"

// isolate claims items (copies: their later copies', laterCopies) under
// savepoints, halving every failing group until each failure is pinned to a
// single item (or to a statement-level error that every item shares). The
// returned error is only for conditions that condemn the whole transaction
// (retryable, cancelled).
func isolate(ctx context.Context, tx pgx.Tx, run Run, items []Item, copies []*string, opts ChunkOptions) ([]Result, error) {
	out := make([]Result, len(items))
	var walk func(lo, hi int, knownBad bool) error
	walk = func(lo, hi int, knownBad bool) error {
		part := items[lo:hi]
		if !knownBad || len(part) == 1 {
			sp, err := tx.Begin(ctx) // SAVEPOINT
			if err != nil {
				return fmt.Errorf("creating savepoint: %w", err)
			}
			if opts.Effect != "" { // what an earlier part claimed (and its effect saw) stays until COMMIT
				if _, err := sp.Exec(ctx, sqlClearClaimed); err != nil {
					return errors.Join(fmt.Errorf("clearing table claimed: %w", err), sp.Rollback(ctx))
				}
			}
			res, err := claim(ctx, sp, run, part, copiesIn(copies, lo, hi), opts, arbitrate)
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
			if IsRetryable(err) || ctx.Err() != nil || errors.Is(err, ErrEffectSandbox) {
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
	// insertFresh: sqlInsertFresh, a plain insert of every key with no
	// lookup (ChunkOptions.ExpectFresh). It fails with the expected
	// business-key conflict if any key is held.
	insertFresh
)

// claimStatement is the claim's statement: the plain insert of a chunk
// expected fresh, the fast path's look-up first (comparing the keys' later
// copies too when there are any) or the arbiter's plain ON CONFLICT, each
// with or without the effect's table.
func claimStatement(mode claimMode, effect, copies bool) string {
	switch {
	case mode == insertFresh && !effect:
		return sqlInsertFresh
	case mode == insertFresh:
		return sqlInsertFreshEffect
	case mode == lookupFirst && copies && !effect:
		return sqlClaimCopies
	case mode == lookupFirst && copies:
		return sqlClaimCopiesEffect
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

// supersedeRounds bounds how often one claim supersedes again the keys that
// a concurrent Supersede run committed between its supersede and its insert.
const supersedeRounds = 4

// claim runs the insert path for items (keys distinct and sorted; copies:
// their later copies' payloads, laterCopies) on tx: supersede (if asked),
// insert, attribution of the keys it did not claim, then the effect.
//
// A Supersede run's round can find a key held by another run's committed row
// that its supersede did not see: a concurrent Supersede run retired the row
// it found and committed its own meanwhile (READ COMMITTED re-checks the row
// it waited for, not the one that replaced it). Such keys go round again, in
// the same transaction, whose next statements see the new row.
func claim(ctx context.Context, tx pgx.Tx, run Run, items []Item, copies []*string, opts ChunkOptions, mode claimMode) ([]Result, error) {
	c := &claimer{tx: tx, run: run, items: items, copies: copies, opts: opts, out: make([]Result, len(items))}
	for i, it := range items {
		c.out[i].Key = it.Key
	}
	if opts.OnExisting == Supersede {
		c.supersededRow = make([]int64, len(items))
		c.generation = make([]int64, len(items))
	}
	for round := 0; ; round++ {
		if err := c.round(ctx, mode); err != nil {
			return nil, err
		}
		if opts.OnExisting != Supersede || round+1 == supersedeRounds || !c.reopenHeldByOthers() {
			break
		}
		mode = arbitrate // the rule arbitrates from now on: no conflict aborts the rounds
	}

	// No check after the effect that the chunk's claims are still held: the
	// effect cannot take them back (the sandbox, migrations/00007).
	if opts.Effect != "" && c.claimed > 0 {
		if err := runEffect(ctx, tx, opts); err != nil {
			return nil, err
		}
	}

	for i, r := range c.out {
		if r.Outcome == 0 {
			c.out[i].Outcome, c.out[i].Err = Failed, fmt.Errorf("claiming %s: %w", r.Key, errHolderVanished)
		}
	}
	return c.out, nil
}

// claimer is one claim's state across its rounds.
type claimer struct {
	tx            pgx.Tx
	run           Run
	items         []Item
	copies        []*string // items' later copies (laterCopies), nil: none
	opts          ChunkOptions
	out           []Result // Outcome 0: not resolved yet
	supersededRow []int64  // Supersede: the row superseded for item i, if any
	generation    []int64  // Supersede: item i's new row's Claim.Generation
	claimed       int
}

// held attributes item i, which this call did not claim, to the run whose
// committed row holds it (read back in this transaction: the proof), and
// says whether that row's payload differs from the item's (another run's
// row only).
func (c *claimer) held(i int, holder string, changed bool) {
	if c.out[i].Outcome != 0 {
		return
	}
	c.out[i].HolderUID = holder
	if c.out[i].Holder = holderOf([]byte(holder), c.run.UID); c.out[i].Holder == HolderSameRun {
		c.out[i].Outcome = Completed
	} else {
		c.out[i].Outcome, c.out[i].PayloadChanged = AlreadyHandled, changed
	}
}

func (c *claimer) claimedBy(i int) {
	c.out[i].Outcome = Completed
	if c.supersededRow != nil {
		c.out[i].supersededRow = c.supersededRow[i]
		c.out[i].generation = c.generation[i]
		c.out[i].Superseded = c.supersededRow[i] != 0
	}
	c.claimed++
}

// reopenHeldByOthers makes the keys another run holds unresolved again and
// reports whether there were any.
func (c *claimer) reopenHeldByOthers() bool {
	found := false
	for i, r := range c.out {
		if r.Outcome == AlreadyHandled {
			c.out[i] = Result{Key: r.Key}
			found = true
		}
	}
	return found
}

// round claims the unresolved items once: supersede (if asked), insert,
// attribution of the keys it did not claim.
func (c *claimer) round(ctx context.Context, mode claimMode) error {
	if c.opts.OnExisting == Supersede {
		_, open := unresolved(c.items, c.out)
		entities, occurrences, _ := columns(open)
		var idErr error
		rows, err := c.tx.Query(ctx, sqlSupersede, entities, occurrences, c.run.UID)
		if err == nil {
			err = forEachKey(rows, c.items, func(i int, rest [][]byte) {
				if rest[0] == nil { // a key this run committed before
					c.held(i, c.run.UID, false)
					return
				}
				if c.supersededRow[i], err = parseRowID(rest[0]); err != nil {
					idErr = err
				}
				if retired, err := strconv.ParseInt(string(rest[1]), 10, 64); err != nil {
					idErr = fmt.Errorf("reading the key's retired rows: %w", err)
				} else {
					c.generation[i] = retired + 1 // the rows retired before, and the one retired now
				}
			})
		}
		if err == nil {
			err = idErr
		}
		if err != nil {
			return fmt.Errorf("superseding existing rows: %w", err)
		}
	}

	// The insert is sent the keys still open (a Supersede run's own keys are
	// settled above); todo maps its positions back to items.
	todo, sub := unresolved(c.items, c.out)
	copies := c.copiesOf(todo, len(sub))
	insert := claimStatement(mode, c.opts.Effect != "", copies != nil)
	var err error
	if len(sub) > 0 {
		entities, occurrences, payloads := columns(sub)
		args := []any{entities, occurrences, payloads, c.run.Namespace, c.run.Name, c.run.UID, c.run.Shard, c.run.Attempt}
		if mode == lookupFirst && copies != nil {
			args = append(args, copies)
		}
		var rows pgx.Rows
		rows, err = c.tx.Query(ctx, insert, args...)
		switch {
		case err != nil: // reported below
		case mode == insertFresh: // no rows: every key was inserted, or the statement failed
			rows.Close()
			if err = rows.Err(); err == nil {
				for j := range sub {
					c.claimedBy(todo.at(j))
				}
			}
		case mode == lookupFirst: // rows: the skipped keys, with their holders
			err = forEachSkipped(rows, len(sub), func(j int, holder string, changed bool) { c.held(todo.at(j), holder, changed) })
			if err == nil { // the statement inserted every key it did not skip
				for j := range sub {
					if i := todo.at(j); c.out[i].Outcome == 0 {
						c.claimedBy(i)
					}
				}
			}
		default: // rows: the inserted keys
			err = forEachKey(rows, sub, func(j int, _ [][]byte) { c.claimedBy(todo.at(j)) })
		}
	}
	if err != nil {
		return fmt.Errorf("inserting into ledger: %w", err)
	}

	if at, skipped := unresolved(c.items, c.out); len(skipped) > 0 {
		if err := c.attribute(ctx, at, skipped); err != nil {
			return fmt.Errorf("attributing skipped keys: %w", err)
		}
	}
	return nil
}

// attribute finds the holders of the keys the arbiter's insert skipped (at
// their positions in c.items); a Skip run also learns whose payload differs
// (sqlHoldersPayload), a Supersede run supersedes them in its next round
// instead.
func (c *claimer) attribute(ctx context.Context, at positions, skipped []Item) error {
	var rows pgx.Rows
	var err error
	if c.opts.OnExisting == Supersede {
		keys := make([]Key, len(skipped))
		for j, it := range skipped {
			keys[j] = it.Key
		}
		rows, err = queryHolders(ctx, c.tx, sqlHolders, keys, c.run.UID)
	} else {
		entities, occurrences, payloads := columns(skipped)
		args := []any{entities, occurrences, payloads, c.run.UID}
		q := sqlHoldersPayload
		if copies := c.copiesOf(at, len(skipped)); copies != nil {
			q, args = sqlHoldersPayloadCopies, append(args, copies)
		}
		if rows, err = c.tx.Query(ctx, q, args...); err != nil {
			err = fmt.Errorf("looking up committed keys: %w", err)
		}
	}
	if err != nil {
		return err
	}
	var bad error
	err = forEachKey(rows, c.items, func(i int, rest [][]byte) {
		changed, err := payloadChangedColumn(rest)
		if err != nil {
			bad = err
			return
		}
		c.held(i, string(rest[0]), changed)
	})
	return cmp.Or(err, bad)
}

// payloadChangedColumn reads the optional boolean after a holder's uid
// (sqlHoldersPayload), raw in the binary or the text format: absent or NULL
// is false.
func payloadChangedColumn(rest [][]byte) (bool, error) {
	if len(rest) < 2 || rest[1] == nil {
		return false, nil
	}
	switch string(rest[1]) {
	case "t", "\x01":
		return true, nil
	case "f", "\x00":
		return false, nil
	}
	return false, fmt.Errorf("reading holders: payload comparison %q is no boolean", rest[1])
}

// copiesOf returns the later copies (c.copies) of the n items at positions
// at: nil when none of them has any.
func (c *claimer) copiesOf(at positions, n int) []*string {
	if c.copies == nil || at == nil {
		return c.copies
	}
	var out []*string
	for j := range n {
		if p := c.copies[at.at(j)]; p != nil {
			if out == nil {
				out = make([]*string, n)
			}
			out[j] = p
		}
	}
	return out
}

// copiesIn is copies[lo:hi], or nil when there are none.
func copiesIn(copies []*string, lo, hi int) []*string {
	if copies == nil {
		return nil
	}
	return copies[lo:hi]
}

// positions maps the positions of a sub-list of items back to items; nil is
// the identity (the sub-list is items itself).
type positions []int

func (p positions) at(j int) int {
	if p == nil {
		return j
	}
	return p[j]
}

// unresolved returns the items whose outcome is not resolved yet, and their
// positions in items (nil, without a copy, when none is resolved yet: the
// usual case).
func unresolved(items []Item, out []Result) (positions, []Item) {
	n := 0
	for _, r := range out {
		if r.Outcome == 0 {
			n++
		}
	}
	if n == len(items) { // the first round: no copy of the chunk
		return nil, items
	}
	pos, sub := make(positions, 0, n), make([]Item, 0, n)
	for i, r := range out {
		if r.Outcome == 0 {
			pos, sub = append(pos, i), append(sub, items[i])
		}
	}
	return pos, sub
}

// runEffect runs the caller's effect in its sandbox (sqlRunEffect: as the
// effect role, which may not write the ledger and cannot switch back to the
// worker's login; no transaction control), with the session's planner
// settings under the run's bounds (in force since BEGIN), then restores the
// session's settings, the ledger's and the run's bounds (isolate claims
// again in the same transaction), whatever the effect set, and checks that
// it left the session as it found it (sqlSandboxIntact).
func runEffect(ctx context.Context, tx pgx.Tx, opts ChunkOptions) error {
	before, err := tx.Conn().PgConn().Exec(ctx, sqlBeforeEffect(opts.userPath)).ReadAll()
	if err != nil {
		return fmt.Errorf("preparing effect: %w", err)
	}
	statements, err := countResult(before[0])
	if err != nil {
		return fmt.Errorf("preparing effect: %w", err)
	}
	bounded, cancel := answerBy(ctx, opts.EffectTimeout, opts.NetworkTimeout)
	tag, err := tx.Exec(bounded, sqlRunEffect(opts.Effect), opts.sandbox.fn, opts.sandbox.owner)
	err = noAnswer(ctx, bounded, err)
	cancel()
	if err != nil {
		if IsTransactionControl(err) {
			return &UserCodeError{Doing: "running effect", Err: fmt.Errorf("%w: %w", ErrEffectTransactionControl, err)}
		}
		if anyPgError(err, isRuleCheck) {
			// The effect's own write broke the rule: that says nothing about
			// the chunk's keys.
			return &UserCodeError{Doing: "running effect", Err: fmt.Errorf("%w: %w", ErrEffectBrokeRule, err)}
		}
		return &UserCodeError{Doing: "running effect", Err: err}
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("running effect: %w: runledger.run_effect is no longer the SECURITY DEFINER function of role %s without SET clauses that the worker checked at start; nothing of the chunk commits", ErrEffectSandbox, opts.sandbox.role)
	}
	// The simple protocol: the statements after an effect use none of the
	// driver's prepared statements, which the effect may have replaced.
	results, err := tx.Conn().PgConn().Exec(ctx, sqlAfterEffect(opts.sqlBounds())).ReadAll()
	if err != nil {
		return fmt.Errorf("restoring the session after the effect: %w", err)
	}
	intact, err := intactResult(results)
	if err != nil {
		return fmt.Errorf("restoring the session after the effect: %w", err)
	}
	if !intact.unprepared {
		// Not transactional: no later statement may run on this session
		// (behind a pooler, whose server connection outlives it, they go by
		// name first).
		if opts.pooled {
			_ = deallocateFromSQL(ctx, tx.Conn().PgConn())
		}
		_ = tx.Conn().Close(context.WithoutCancel(ctx))
		return fmt.Errorf("running effect: %w: it PREPAREd a statement (which could stand in for one of the worker's); the connection is closed and nothing of the chunk commits", ErrEffectSandbox)
	}
	if !intact.claimed {
		return fmt.Errorf("running effect: %w: the session's table claimed is no longer the worker's own, of the shape it gave it (DISCARD TEMP, a table of the effect's in its place, a constraint, index or column added); nothing of the chunk commits", ErrEffectSandbox)
	}
	if !intact.noHoldCursor {
		return fmt.Errorf("running effect: %w: it declared a cursor WITH HOLD (PostgreSQL runs its query to the end at COMMIT, outside the sandbox, as the login); nothing of the chunk commits", ErrEffectSandbox)
	}
	if !intact.noTempLeftovers {
		if _, err := tx.Conn().PgConn().Exec(ctx, sqlDiscardTemp(opts.pooled, opts.sandbox.role)).ReadAll(); err != nil {
			// A temporary table with trigger events pending: a constraint
			// trigger re-deferred to COMMIT, where it would run as the login.
			return fmt.Errorf("running effect: %w: its temporary objects cannot be dropped (a trigger left to fire at COMMIT, outside the sandbox?); nothing of the chunk commits: %w", ErrEffectSandbox, err)
		}
	}
	if intact.driverStatements < statements {
		// It DEALLOCATEd the driver's statements (none of its own replaces
		// them: unprepared): the driver forgets them too, and prepares
		// again what it sends next.
		if err := tx.Conn().DeallocateAll(ctx); err != nil {
			return fmt.Errorf("restoring the driver's statements the effect deallocated: %w", err)
		}
	}
	return nil
}

// countResult reads a count(*), the one row of res.
func countResult(res *pgconn.Result) (int64, error) {
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		return 0, fmt.Errorf("counting the driver's statements: %d rows", len(res.Rows))
	}
	return strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
}

// deallocateFromSQL deallocates, by name, the statements user code PREPAREd
// on conn's session (by the simple protocol: the driver's own statements
// may have been replaced). Not DEALLOCATE ALL: a pooler's own prepared
// statements (PgBouncer's max_prepared_statements) live there too.
func deallocateFromSQL(ctx context.Context, conn *pgconn.PgConn) error {
	res, err := conn.Exec(ctx, sqlPreparedFromSQL).ReadAll()
	if err != nil {
		return fmt.Errorf("listing the statements user code prepared: %w", err)
	}
	var b strings.Builder
	for _, r := range res {
		for _, row := range r.Rows {
			b.WriteString("DEALLOCATE " + pgx.Identifier{string(row[0])}.Sanitize() + "; ")
		}
	}
	if b.Len() == 0 {
		return nil
	}
	if _, err := conn.Exec(ctx, b.String()).ReadAll(); err != nil {
		return fmt.Errorf("deallocating the statements user code prepared: %w", err)
	}
	return nil
}

// sessionIntact runs sqlSessionIntact (q) on conn, by the simple protocol.
func sessionIntact(ctx context.Context, conn *pgconn.PgConn, q string) (bool, error) {
	results, err := conn.Exec(ctx, q).ReadAll()
	if err != nil {
		return false, err
	}
	intact, err := intactResult(results)
	return intact.claimed && intact.unprepared && intact.noHoldCursor && intact.noTempLeftovers && intact.nothingLeft, err
}

// sandboxState is sqlSandboxIntact's row: what the effect left as it was.
type sandboxState struct {
	claimed          bool  // the session's table claimed is the worker's own, of its shape
	unprepared       bool  // no statement PREPAREd from SQL
	noHoldCursor     bool  // no cursor WITH HOLD
	driverStatements int64 // the driver's prepared statements (sqlDriverStatements)
	noTempLeftovers  bool  // no temporary object but claimed (sqlNoTempLeftovers)
	// nothingLeft (sqlSessionIntact only): no advisory lock, no listener.
	nothingLeft bool
}

// intactResult reads sqlSandboxIntact's row (or sqlSessionIntact's, one
// column more), the last result of results.
func intactResult(results []*pgconn.Result) (sandboxState, error) {
	if len(results) == 0 {
		return sandboxState{}, errors.New("the sandbox check returned nothing")
	}
	last := results[len(results)-1]
	if len(last.Rows) != 1 || len(last.Rows[0]) < 5 || len(last.Rows[0]) > 6 {
		return sandboxState{}, fmt.Errorf("the sandbox check returned %d rows", len(last.Rows))
	}
	row := last.Rows[0]
	n, err := strconv.ParseInt(string(row[3]), 10, 64)
	if err != nil {
		return sandboxState{}, fmt.Errorf("the sandbox check's statement count: %w", err)
	}
	return sandboxState{claimed: string(row[0]) == "t", unprepared: string(row[1]) == "t", noHoldCursor: string(row[2]) == "t",
		driverStatements: n, noTempLeftovers: string(row[4]) == "t", nothingLeft: len(row) == 5 || string(row[5]) == "t"}, nil
}

// ErrEffectSandbox: the effect tried to leave its sandbox, or the sandbox
// changed since the worker checked it. Every item of the chunk fails and
// nothing of it commits.
var ErrEffectSandbox = errors.New("the effect left its sandbox")

// ErrEffectBrokeRule: the effect itself wrote a ledger row that the
// business-key rule refused. That says nothing about the chunk's keys: its
// items fail, never already handled.
var ErrEffectBrokeRule = errors.New("the effect wrote a ledger row the business-key rule refused (an effect never writes the ledger)")

// ErrEffectTransactionControl: the effect tried to COMMIT, ROLLBACK or open
// a savepoint, which would commit the claim without the rest of the effect or
// let the effect commit without the claim.
var ErrEffectTransactionControl = errors.New("the effect may not end the ledger's transaction or open a savepoint (COMMIT, ROLLBACK, SAVEPOINT)")

// PrepareEffect checks that the ledger has the effect's sandbox
// (ErrNoEffectSandbox otherwise) and prepares the effect statement (without
// running it) next to the table "claimed" it reads, in a transaction rolled
// back at once, so that a syntax error or a missing table shows before the
// first commit. An error of the statement itself is PostgreSQL's (see
// RefusedStatement).
func (s *Store) PrepareEffect(ctx context.Context, effect string) error {
	if _, err := s.effectSandbox(ctx); err != nil {
		return err
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: sqlBeginPinned})
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, sqlCreateClaimed+`; `+sqlUserPath(userSearchPath(s.pool))); err != nil {
		return fmt.Errorf("preparing table claimed: %w", err)
	}
	_, err = tx.Prepare(ctx, "", effect)
	return err
}

// failAll fails every item with err. An error is never a verdict of
// "already handled", whatever it says: that verdict needs the committed row
// holding the key, read back (claim's held), and an error carries none. A
// conflict with the rule that reaches here had no holder to show for it (the
// arbiter path absorbs every conflict it can attribute), so it fails too.
func failAll(items []Item, err error) []Result {
	out := make([]Result, len(items))
	for i, it := range items {
		out[i] = Result{Key: it.Key, Outcome: Failed, Err: fmt.Errorf("item %s: %w", it.Key, err)}
	}
	return out
}

// errUnproven: a verdict of "already handled" (or "completed by this run
// before") without the committed row that proves it. claim never gives one;
// CommitChunk checks every result all the same (proven), so that no path,
// now or later, can make an item already handled on an error's say-so.
var errUnproven = errors.New("no committed row holding the key was read back to prove the verdict; not committed")

// proven checks the invariant of every outcome: AlreadyHandled carries the
// run uid of the committed row of another run that holds the key (read back
// in the claiming transaction), or the chunk's earlier copy of the key
// (HolderSameChunk, set by spread); Completed by an earlier commit of this run
// carries this run's uid. Any other verdict becomes Failed.
func proven(run Run, res []Result) []Result {
	for i, r := range res {
		var ok bool
		switch {
		case r.Outcome == AlreadyHandled:
			ok = r.Holder == HolderOtherRun && r.HolderUID != "" && r.HolderUID != run.UID
		case r.Outcome == Completed && r.Holder == HolderSameRun:
			ok = r.HolderUID == run.UID
		case r.Outcome == Completed:
			ok = r.Holder == HolderNone
		default:
			ok = r.Outcome == Failed
		}
		if !ok {
			res[i] = Result{Key: r.Key, Outcome: Failed, Err: fmt.Errorf("item %s (%s, holder %q): %w", r.Key, r.Outcome, r.HolderUID, errUnproven)}
		}
	}
	return res
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

// forEachSkipped reads the rows of sqlClaim, (holder's run uid, positions
// from 1 of the keys it holds, those of them whose payload differs), and
// calls fn with each key's index in the chunk of n items, the uid of the run
// whose committed row holds it and whether its payload differs. A position
// outside the chunk, a changed position the holder does not hold, or a NULL
// holder, is an error: it would mean the statement answered about rows it
// was not asked for.
func forEachSkipped(rows pgx.Rows, n int, fn func(i int, holder string, changed bool)) error {
	var holder string
	var pos, changedPos []int64
	_, err := pgx.ForEachRow(rows, []any{&holder, &pos, &changedPos}, func() error {
		for _, p := range pos {
			if p < 1 || p > int64(n) {
				return fmt.Errorf("position %d is outside the chunk of %d", p, n)
			}
		}
		if holder == "" {
			return errors.New("a skipped key's holder has no run uid")
		}
		changed := make(map[int64]bool, len(changedPos))
		for _, p := range changedPos {
			if !slices.Contains(pos, p) {
				return fmt.Errorf("position %d has a changed payload but is not among its holder's", p)
			}
			changed[p] = true
		}
		for _, p := range pos {
			fn(int(p-1), holder, changed[p])
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading skipped keys: %w", err)
	}
	return nil
}

// compareKeys orders keys by occurrence, then entity, bytewise: the rule's
// column order, so a chunk's inserts walk its index in order.
func compareKeys(a, b Key) int {
	return cmp.Or(strings.Compare(a.Occurrence, b.Occurrence), strings.Compare(a.Entity, b.Entity))
}

// dedupe returns the distinct items sorted by key (first copy wins) and, for
// every input position, the index of its key in that list; indexOf is nil when
// items already are distinct and sorted (unique is then items itself), as the
// query source delivers them.
//
// The order matters: every transaction claims keys in the same (ascending)
// order, so two writers whose chunks overlap wait on each other in one
// direction only and do not deadlock on the unique index. (A worker of a
// release that ordered by entity first (v0.1.0) and one of this release
// whose chunks overlap may deadlock during an upgrade: PostgreSQL aborts one
// (40P01), which is retried like any other deadlock.)
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

// laterCopies returns, for each of unique's items (dedupe's, of items), the
// payloads of its key's later copies in items that differ from its own
// bytes, each once, as the text of a PostgreSQL text[] (sqlCopiesChanged);
// nil for an item without such copies, and nil altogether when no item has
// any (items distinct, or repeats with the same payload: the usual case).
func laterCopies(items, unique []Item, indexOf []int) []*string {
	if indexOf == nil {
		return nil
	}
	var out []*string
	var lists [][]byte
	type seen struct {
		j       int
		payload string
		none    bool
	}
	first := make([]bool, len(unique))
	var had map[seen]bool
	for i, j := range indexOf {
		p, u := items[i].Payload, unique[j].Payload
		if !first[j] {
			first[j] = true // dedupe keeps the first copy by position
			continue
		}
		if (p == nil) == (u == nil) && bytes.Equal(p, u) {
			continue
		}
		k := seen{j: j, payload: string(p), none: p == nil}
		if had[k] {
			continue
		}
		if out == nil {
			out, lists, had = make([]*string, len(unique)), make([][]byte, len(unique)), map[seen]bool{}
		}
		had[k] = true
		lists[j] = appendArrayElement(append(lists[j], ','), p)
	}
	for j, l := range lists {
		if l != nil {
			s := "{" + string(l[1:]) + "}"
			out[j] = &s
		}
	}
	return out
}

// appendArrayElement appends p as an element of a PostgreSQL array's text:
// NULL for no payload, else quoted, its quotes and backslashes escaped.
func appendArrayElement(b, p []byte) []byte {
	if p == nil {
		return append(b, "NULL"...)
	}
	b = append(b, '"')
	for _, c := range p {
		if c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, c)
	}
	return append(b, '"')
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

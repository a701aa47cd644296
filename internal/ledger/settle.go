package ledger

import (
	"context"
	"errors"
	"fmt"
)

// Group is one key of a chunk as its caller knows it: the item the claim is
// sent, the later copies whose payloads the claim compares besides it, and
// what a lookup already found of the key's committed row.
type Group struct {
	Item   Item
	Copies []Item
	// Held is what the batch's fetch found (HolderNone: not known held; a
	// key another run holds with a payload it could not compare is not
	// known held: the claim compares it).
	Held Held
	// Unchecked: nothing looked the key up (a static batch): Settle asks
	// the ledger first (PreloadItems), to save the claim's work.
	Unchecked bool
}

// appendTo appends the group's item and its copies to compare to out.
func (g Group) appendTo(out []Item) []Item {
	return append(append(out, g.Item), g.Copies...)
}

// Decision is a key's final outcome, decided by the ledger.
type Decision struct {
	Outcome Outcome
	// PayloadChanged: already handled by another run, a copy's payload
	// differing from the committed row's (also set on the Failed verdict
	// of SettleOptions.FailOnPayloadChange).
	PayloadChanged bool
	// Err and Class are a Failed key's error and its class (FailureClass).
	Err   error
	Class string
}

// ErrPayloadChanged is the failure of an item already handled by another
// run whose payload differs from the committed row's, under
// spec.onPayloadChange: Fail.
var ErrPayloadChanged = errors.New("already handled by another run, whose committed row has a different payload (spec.onPayloadChange: Fail); nothing was written")

// Retry is the caller's back-off: it runs try until try succeeds, fails
// with an error retryable rejects, or the caller's policy gives up (then its
// error wraps try's last). step names what is retried, for the caller's log.
type Retry func(step string, retryable func(error) bool, try func(attempt int) error) error

// once is the Retry of a caller without one: a single try.
func once(_ string, _ func(error) bool, try func(int) error) error { return try(1) }

// SettleOptions are CommitChunk's options and what decides a verdict.
type SettleOptions struct {
	ChunkOptions
	// FailOnPayloadChange (spec.onPayloadChange: Fail): a key already
	// handled by another run with another payload is Failed
	// (ErrPayloadChanged) instead of AlreadyHandled.
	FailOnPayloadChange bool
	// Retry is the caller's back-off (nil: one try).
	Retry Retry
	// Stop, if set, says why the caller was asked to stop (nil: it was
	// not): no claim starts then, and a chunk whose processor retries were
	// cut short is not decided, its error returned.
	Stop func() error
}

// stop is opts.Stop's answer.
func (o SettleOptions) stop() error {
	if o.Stop == nil {
		return nil
	}
	return o.Stop()
}

// Settled is a chunk's decisions, one per Group in order.
type Settled struct {
	Decisions []Decision
	// ClaimFoundHeld: the claim met a key committed already (by another
	// run, or by this one earlier), which its caller's lookups had not
	// found.
	ClaimFoundHeld bool
}

// errRetryItems is a try of the claim in which the processor asked to retry
// some items: the same try, after the back-off, sends them again.
type errRetryItems struct {
	n   int
	why error
}

func (e *errRetryItems) Error() string {
	return fmt.Sprintf("the processor asked to retry %d items, e.g. %v", e.n, e.why)
}
func (e *errRetryItems) Unwrap() error { return e.why }

// retryableOrItems retries what IsRetryable retries, and items the
// processor asked to retry.
func retryableOrItems(err error) bool {
	var items *errRetryItems
	return IsRetryable(err) || errors.As(err, &items)
}

// Settle decides the verdict of every group of a chunk, in one place: it
// asks who holds the keys nothing looked up (the preload: it only saves
// work), claims those not known held through CommitChunk (the guarantee),
// sends again, within opts.Retry, the items the processor asked to retry,
// reads which keys of a processor call that kept failing this run
// committed after all (a COMMIT whose answer was lost), and returns each
// key's final outcome: Completed (this run's row, now or earlier),
// AlreadyHandled (another run's, PayloadChanged if a copy differs) or
// Failed (its error and class). What the preload finds is recorded in
// groups.
func (s *Store) Settle(ctx context.Context, run Run, groups []Group, opts SettleOptions) (Settled, error) {
	if opts.Retry == nil {
		opts.Retry = once
	}
	fresh := opts.ExpectFresh
	if err := s.preloadGroups(ctx, run.UID, groups, &fresh, opts.Retry); err != nil {
		return Settled{}, err
	}
	claim := toClaim(groups, opts.OnExisting)
	opts.ExpectFresh = fresh
	results, err := s.claimWithRetries(ctx, run, claim, opts)
	if err != nil {
		return Settled{}, err
	}
	out := Settled{Decisions: make([]Decision, len(groups))}
	for _, r := range results {
		out.ClaimFoundHeld = out.ClaimFoundHeld || r.Holder == HolderOtherRun || r.Holder == HolderSameRun
	}
	for i, g := range groups {
		r, sent := results[g.Item.Key]
		out.Decisions[i] = decide(g.Held, r, sent, opts.FailOnPayloadChange)
	}
	return out, nil
}

// decide is the verdict of a key whose claim had result r (sent) or that a
// lookup found held (not sent).
func decide(held Held, r Result, sent bool, failOnPayloadChange bool) Decision {
	var v Decision
	switch {
	case !sent && held.Holder == HolderSameRun:
		v.Outcome = Completed
	case !sent:
		v = Decision{Outcome: AlreadyHandled, PayloadChanged: held.Payload == PayloadDiffers}
	case r.Outcome == Failed:
		return Decision{Outcome: Failed, Err: r.Err, Class: FailureClass(r.Err)}
	default:
		v = Decision{Outcome: r.Outcome, PayloadChanged: r.Outcome == AlreadyHandled && r.PayloadChanged}
	}
	return OnPayloadChange(v, failOnPayloadChange)
}

// OnPayloadChange is v, Failed (ErrPayloadChanged) if it is already handled
// with another payload and failOnPayloadChange says so.
func OnPayloadChange(v Decision, failOnPayloadChange bool) Decision {
	if v.PayloadChanged && failOnPayloadChange && v.Outcome == AlreadyHandled {
		v.Outcome, v.Err, v.Class = Failed, ErrPayloadChanged, ClassPayloadChanged
	}
	return v
}

// Know records what a lookup found of the group's key, and says whether the
// claim may still expect it fresh: a key another run holds whose payload
// the lookup could not compare stays unknown, for the claim to compare, and
// the claim should not expect it fresh.
func (g *Group) Know(h Held) (fresh bool) {
	switch {
	case h.Holder == HolderNone:
	case h.Holder == HolderOtherRun && h.Payload == PayloadUnknown:
		return false
	default:
		g.Held = h
	}
	return true
}

// preloadGroups asks who holds the unchecked groups' keys.
func (s *Store) preloadGroups(ctx context.Context, runUID string, groups []Group, fresh *bool, retry Retry) error {
	var items []Item
	for _, g := range groups {
		if g.Unchecked {
			items = g.appendTo(items)
		}
	}
	if len(items) == 0 {
		return nil
	}
	return retry("preloading committed keys", IsRetryable, func(int) error {
		h, err := s.PreloadItems(ctx, runUID, items)
		if err != nil {
			return err
		}
		for i := range groups {
			if v, ok := h[groups[i].Item.Key]; ok && groups[i].Unchecked {
				*fresh = groups[i].Know(v) && *fresh
			}
		}
		return nil
	})
}

// toClaim are the groups no lookup settled, each with its copies to compare
// (a Supersede run compares none, and claims every key but its own).
func toClaim(groups []Group, onExisting OnExisting) []Item {
	n := 0
	for _, g := range groups {
		if g.Held.Holder == HolderNone || onExisting == Supersede && g.Held.Holder != HolderSameRun {
			n += 1 + len(g.Copies)
		}
	}
	out := make([]Item, 0, n) // none for a chunk found all held
	for _, g := range groups {
		switch h := g.Held.Holder; {
		case onExisting == Supersede && h != HolderSameRun:
			out = append(out, g.Item)
		case h == HolderNone:
			out = g.appendTo(out)
		}
	}
	return out
}

// claimWithRetries commits items (CommitChunk), with the caller's retries.
// Items a processor asked to retry are sent again after the back-off; once
// the retries are spent, they, or the items of calls that kept failing,
// are Failed with the processor's error, unless the ledger shows this run
// committed them (a try whose COMMIT lost its answer). opts.ExpectFresh
// holds for the first try only: a retry may find rows an earlier one
// committed.
func (s *Store) claimWithRetries(ctx context.Context, run Run, items []Item, opts SettleOptions) (map[Key]Result, error) {
	results := make(map[Key]Result, len(items))
	if len(items) == 0 {
		return results, nil
	}
	if err := opts.stop(); err != nil {
		return nil, err // stop before starting a claim
	}
	pending := items
	err := opts.Retry("committing", retryableOrItems, func(attempt int) error {
		o := opts.ChunkOptions
		o.ExpectFresh = opts.ExpectFresh && attempt == 1
		res, err := s.CommitChunk(ctx, run, pending, o)
		if err != nil {
			return err
		}
		if len(res) != len(pending) {
			return fmt.Errorf("the ledger returned %d results for %d items", len(res), len(pending))
		}
		var again []Item
		var why error
		for i, r := range res {
			if r.Holder != HolderSameChunk { // a copy sent to compare its payload: its first carries the key's result
				results[r.Key] = r
			}
			if r.Outcome == Failed && errors.Is(r.Err, ErrRetryItem) {
				again, why = append(again, pending[i]), r.Err
			}
		}
		pending = again
		if len(again) > 0 {
			return &errRetryItems{n: len(again), why: why}
		}
		return nil
	})
	var perr *ProcessorError
	var asked *errRetryItems
	switch {
	case err == nil:
		return results, nil
	case !errors.As(err, &perr) && !errors.As(err, &asked), opts.stop() != nil:
		return nil, err
	}
	return s.settleGivenUp(ctx, run, pending, results, perr, opts.Retry)
}

// settleGivenUp decides the items whose processor retries were spent: those
// this run committed after all (a COMMIT whose answer was lost) are
// Completed; the others keep the processor's refusal (retries exhausted),
// or fail with perr, the call that kept failing.
func (s *Store) settleGivenUp(ctx context.Context, run Run, pending []Item, results map[Key]Result, perr *ProcessorError, retry Retry) (map[Key]Result, error) {
	keys := make([]Key, len(pending))
	for i, it := range pending {
		keys[i] = it.Key
	}
	var held map[Key]Holder
	err := retry("reading which keys this run committed", IsRetryable, func(int) error {
		var err error
		held, err = s.Preload(ctx, run.UID, keys)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, it := range pending {
		r, ok := results[it.Key]
		switch {
		case held[it.Key] == HolderSameRun:
			results[it.Key] = Result{Key: it.Key, Outcome: Completed, Holder: HolderSameRun}
		case perr != nil && (!ok || !errors.Is(r.Err, ErrRetryItem)):
			results[it.Key] = Result{Key: it.Key, Outcome: Failed, Err: perr}
		}
	}
	return results, nil
}

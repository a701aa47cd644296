package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// tries is a Retry of at most n tries without a wait; it records the steps
// it ran and every error it retried.
type tries struct {
	n       int
	mu      sync.Mutex
	steps   []string
	retried []error
}

func (r *tries) retry(step string, retryable func(error) bool, try func(int) error) error {
	r.mu.Lock()
	r.steps = append(r.steps, step)
	r.mu.Unlock()
	var err error
	for attempt := 1; attempt <= r.n; attempt++ {
		if err = try(attempt); err == nil || !retryable(err) {
			return err
		}
		r.mu.Lock()
		r.retried = append(r.retried, err)
		r.mu.Unlock()
	}
	return fmt.Errorf("%s: gave up: %w", step, err)
}

// retryUntil asks to retry the "-retry" items of its first calls, until
// call number okFrom (0: always); it records what each call was sent.
type retryUntil struct {
	okFrom int
	mu     sync.Mutex
	calls  [][]string
}

func (p *retryUntil) Process(_ context.Context, _ ledger.Run, items []ledger.Claim) ([]ledger.Verdict, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sent []string
	out := make([]ledger.Verdict, len(items))
	for i, it := range items {
		sent = append(sent, it.Occurrence)
		out[i] = ledger.Verdict{OK: true}
		if strings.HasSuffix(it.Occurrence, "-retry") && (p.okFrom == 0 || len(p.calls)+1 < p.okFrom) {
			out[i] = ledger.Verdict{Retryable: true, Error: "try later"}
		}
	}
	p.calls = append(p.calls, sent)
	return out, nil
}

// groupsOf are its as groups nothing looked up yet.
func groupsOf(its []ledger.Item) (out []ledger.Group) {
	for _, it := range its {
		out = append(out, ledger.Group{Item: it})
	}
	return out
}

func outcomes(s ledger.Settled) (out []ledger.Outcome) {
	for _, d := range s.Decisions {
		out = append(out, d.Outcome)
	}
	return out
}

// settling is a ledger a worker login writes, and its owner's pool.
func settling(t *testing.T) (*pgxpool.Pool, *ledger.Store) {
	t.Helper()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	return owner, ledger.NewStore(worker)
}

// TestSettle_ProcessorRetries: the items a processor asks to retry are sent
// again by the ledger, alone, through the caller's back-off, under an error
// of their own, not one dressed as a failed processor call (which
// IsRetryable would retry for any caller); once accepted they are
// Completed, and once the tries are spent Failed as retries exhausted.
func TestSettle_ProcessorRetries(t *testing.T) {
	t.Parallel()
	owner, s := settling(t)
	ctx := context.Background()

	p := &retryUntil{okFrom: 2}
	r := &tries{n: 3}
	got, err := s.Settle(ctx, runNamed("settle-retry"), groupsOf(keyed("1", "2-retry", "3")),
		ledger.SettleOptions{ChunkOptions: ledger.ChunkOptions{Processor: p}, Retry: r.retry})
	require.NoError(t, err)
	require.Equal(t, []ledger.Outcome{ledger.Completed, ledger.Completed, ledger.Completed}, outcomes(got))
	require.Equal(t, [][]string{{"1", "2-retry", "3"}, {"2-retry"}}, p.calls, "only the item asked to retry is sent again")
	require.Len(t, r.retried, 1)
	var perr *ledger.ProcessorError
	require.NotErrorAs(t, r.retried[0], &perr, "the processor's call did not fail")
	require.False(t, ledger.IsRetryable(r.retried[0]), "an item to retry is not a transient database error")
	require.ErrorContains(t, r.retried[0], "the processor asked to retry 1 items, e.g. processor: try later")

	p = &retryUntil{} // never accepts
	r = &tries{n: 3}
	got, err = s.Settle(ctx, runNamed("settle-exhausted"), groupsOf(keyed("4", "5-retry")),
		ledger.SettleOptions{ChunkOptions: ledger.ChunkOptions{Processor: p}, Retry: r.retry})
	require.NoError(t, err)
	require.Equal(t, []ledger.Outcome{ledger.Completed, ledger.Failed}, outcomes(got))
	require.Equal(t, ledger.ClassProcessorRetriesExhausted, got.Decisions[1].Class)
	require.ErrorIs(t, got.Decisions[1].Err, ledger.ErrRetryItem)
	require.Len(t, p.calls, 3)
	require.Equal(t, []string{"committing", "reading which keys this run committed"}, r.steps, "the tries spent, the ledger reads what this run committed")
	require.Zero(t, countRows(t, owner, "acct", "5-retry", "committed"))
}

// TestSettle_CallThatKeepsFailing: a processor whose every call fails as a
// whole fails the items it was sent (processor-unavailable), and commits
// nothing.
func TestSettle_CallThatKeepsFailing(t *testing.T) {
	t.Parallel()
	owner, s := settling(t)
	p := &funcProcessor{err: errors.New("connection refused")}
	r := &tries{n: 2}
	got, err := s.Settle(context.Background(), runNamed("settle-down"), groupsOf(keyed("1", "2")),
		ledger.SettleOptions{ChunkOptions: ledger.ChunkOptions{Processor: p}, Retry: r.retry})
	require.NoError(t, err)
	for _, d := range got.Decisions {
		require.Equal(t, ledger.Failed, d.Outcome)
		require.Equal(t, ledger.ClassProcessorUnavailable, d.Class)
		require.ErrorContains(t, d.Err, "calling the processor: connection refused")
	}
	require.Len(t, p.sentKeys(), 4, "two tries of two items")
	require.Zero(t, countRows(t, owner, "acct", "1", "committed"))
}

// TestSettle_WhatTheCallerKnows: a key the fetch found held is decided
// without a claim (this run's: completed; another run's with another
// payload: already handled, or failed under onPayloadChange: Fail); a key
// nothing looked up is preloaded, and one another run holds is never sent;
// a stopped caller starts no claim.
func TestSettle_WhatTheCallerKnows(t *testing.T) {
	t.Parallel()
	owner, s := settling(t)
	ctx := context.Background()
	holder := keyed("held")
	commit(t, s, runNamed("holder"), holder, ledger.ChunkOptions{})

	p := &funcProcessor{}
	r := &tries{n: 1}
	groups := []ledger.Group{
		{Item: keyed("mine")[0], Held: ledger.Held{Holder: ledger.HolderSameRun}},
		{Item: keyed("theirs")[0], Held: ledger.Held{Holder: ledger.HolderOtherRun, Payload: ledger.PayloadDiffers}},
		{Item: holder[0], Unchecked: true},
		{Item: keyed("new")[0], Unchecked: true},
	}
	got, err := s.Settle(ctx, runNamed("settle-known"), groups,
		ledger.SettleOptions{ChunkOptions: ledger.ChunkOptions{Processor: p}, Retry: r.retry, FailOnPayloadChange: true})
	require.NoError(t, err)
	require.Equal(t, []ledger.Outcome{ledger.Completed, ledger.Failed, ledger.AlreadyHandled, ledger.Completed}, outcomes(got))
	require.Equal(t, ledger.ClassPayloadChanged, got.Decisions[1].Class)
	require.ErrorIs(t, got.Decisions[1].Err, ledger.ErrPayloadChanged)
	require.True(t, got.Decisions[1].PayloadChanged)
	require.False(t, got.Decisions[2].PayloadChanged)
	require.Equal(t, []ledger.Key{keyed("new")[0].Key}, p.sentKeys(), "only the key nobody holds reaches the processor")
	require.False(t, got.ClaimFoundHeld, "the preload found the held key: the claim did not meet it")

	stop := errors.New("asked to stop")
	_, err = s.Settle(ctx, runNamed("settle-stopped"), groupsOf(keyed("later")),
		ledger.SettleOptions{Stop: func() error { return stop }}) // no Retry: one try
	require.ErrorIs(t, err, stop)
	require.Zero(t, countRows(t, owner, "acct", "later", "committed"))
}

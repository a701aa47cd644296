package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/runledger/runledger/internal/ledger"
)

// Backoff is the retry policy for retryable database errors (ledger.IsRetryable:
// connection loss or timeout, server restart, serialization failure, too many
// connections, lock or statement timeout, a session that may only read): exponential back-off with jitter, bounded in attempts and in
// total time.
type Backoff struct {
	Initial     time.Duration // first wait (default 100ms)
	Max         time.Duration // longest wait (default 10s)
	MaxAttempts int           // attempts in all, the first included (default 40)
	MaxElapsed  time.Duration // give up once this much time has passed (default 2m)
}

// DefaultBackoff: about two minutes of retries, enough to ride out a database
// failover or restart.
var DefaultBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second, MaxAttempts: 40, MaxElapsed: 2 * time.Minute}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoff.Max
	}
	if b.MaxAttempts <= 0 {
		b.MaxAttempts = DefaultBackoff.MaxAttempts
	}
	if b.MaxElapsed <= 0 {
		b.MaxElapsed = DefaultBackoff.MaxElapsed
	}
	return b
}

// delay is the wait before retry number n (1-based): Initial·2^(n-1), capped
// at Max, with "equal jitter" (half fixed, half random) so that shards that
// failed together do not retry in lockstep.
func (b Backoff) delay(n int) time.Duration {
	d := b.Initial
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	return half + rand.N(half+1)
}

// errGaveUp marks the error of a retry loop that ran out of attempts or time.
var errGaveUp = errors.New("giving up")

// Do runs fn until it succeeds, fails with a non-retryable error, or the
// policy is exhausted. stop is the caller's context: once it is done (the
// caller was asked to stop, or its deadline passed), fn's error is final and
// the waits end early; an expired deadline that is not stop's (pgx's
// connect_timeout) is retried like any connection failure. fn receives its
// attempt number (1-based). onRetry, if set, is told about each retryable
// failure before the wait.
func (b Backoff) Do(stop context.Context, what string, onRetry func(attempt int, wait time.Duration, err error), fn func(attempt int) error) error {
	return b.DoWhile(stop, what, ledger.IsRetryable, onRetry, fn)
}

// DoWhile is Do for errors other than the database's: retryable says which
// of fn's errors are worth another try (the one back-off helper of the
// worker and its command: the Kubernetes API's errors use it too).
func (b Backoff) DoWhile(stop context.Context, what string, retryable func(error) bool, onRetry func(attempt int, wait time.Duration, err error), fn func(attempt int) error) error {
	b = b.withDefaults()
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := fn(attempt)
		if err == nil || !retryable(err) {
			return err
		}
		if stopped(stop) {
			return fmt.Errorf("%s: stopped, not retrying: %w", what, errors.Join(cmp.Or(context.Cause(stop), context.DeadlineExceeded), err))
		}
		wait := b.delay(attempt)
		if attempt >= b.MaxAttempts || time.Since(start)+wait > b.MaxElapsed {
			return fmt.Errorf("%s: %w after %d attempts in %s: %w", what, errGaveUp, attempt, time.Since(start).Round(time.Millisecond), err)
		}
		if onRetry != nil {
			onRetry(attempt, wait, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-stop.Done():
			t.Stop()
			return fmt.Errorf("%s: stopped while waiting to retry: %w", what, errors.Join(context.Cause(stop), err))
		case <-t.C:
		}
	}
}

// stopped reports whether the caller's context is done. A connection's I/O
// deadline, set from the context's, can fire a moment before the context's
// own timer marks it done: a deadline that has passed counts as done.
func stopped(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(d)
}

// stopCause is why the caller's context is done (stopped), nil while it is
// not.
func stopCause(ctx context.Context) error {
	if !stopped(ctx) {
		return nil
	}
	return cmp.Or(context.Cause(ctx), context.DeadlineExceeded)
}

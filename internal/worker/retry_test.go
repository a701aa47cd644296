package worker

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffDelay(t *testing.T) {
	t.Parallel()
	b := Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}.withDefaults()
	for _, tt := range []struct {
		retry    int
		min, max time.Duration
	}{
		{1, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, 200 * time.Millisecond},
		{3, 200 * time.Millisecond, 400 * time.Millisecond},
		{5, 800 * time.Millisecond, 1600 * time.Millisecond},
		{6, time.Second, 2 * time.Second}, // capped at Max
		{60, time.Second, 2 * time.Second},
	} {
		for range 50 {
			d := b.delay(tt.retry)
			require.GreaterOrEqual(t, d, tt.min, "retry %d", tt.retry)
			require.LessOrEqual(t, d, tt.max, "retry %d", tt.retry)
		}
	}
}

func TestBackoffDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fast := Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxAttempts: 4, MaxElapsed: time.Minute}

	calls := 0
	err := fast.Do(ctx, "reading", nil, func(int) error {
		if calls++; calls < 3 {
			return io.ErrUnexpectedEOF // retryable: the connection broke
		}
		return nil
	})
	require.NoError(t, err, "succeeds on the third attempt")
	require.Equal(t, 3, calls)

	calls = 0
	permanent := errors.New("syntax error")
	err = fast.Do(ctx, "reading", nil, func(int) error { calls++; return permanent })
	require.ErrorIs(t, err, permanent, "a permanent error is returned at once")
	require.Equal(t, 1, calls)

	calls = 0
	var retries []int
	err = fast.Do(ctx, "reading", func(attempt int, _ time.Duration, _ error) { retries = append(retries, attempt) },
		func(int) error { calls++; return io.ErrUnexpectedEOF })
	require.ErrorIs(t, err, errGaveUp, "bounded")
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "with the last cause")
	require.Contains(t, err.Error(), "reading: giving up after 4 attempts")
	require.Equal(t, 4, calls)
	require.Equal(t, []int{1, 2, 3}, retries)

	stop, cancel := context.WithCancel(ctx)
	cancel()
	slow := Backoff{Initial: time.Hour, Max: time.Hour, MaxAttempts: 5, MaxElapsed: 10 * time.Hour}
	start := time.Now()
	err = slow.Do(stop, "reading", nil, func(int) error { return io.ErrUnexpectedEOF })
	require.ErrorIs(t, err, context.Canceled, "a stop ends the wait")
	require.Less(t, time.Since(start), time.Second)
}

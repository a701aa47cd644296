package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
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

// TestBackoffDo_ConnectTimeoutIsRetried: a server that accepts TCP and never
// answers makes pgx's connect_timeout expire; that deadline is not the
// caller's, so the connection is tried again while the caller's context is
// alive.
func TestBackoffDo_ConnectTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	host, port, _ := strings.Cut(pgtest.SilentServer(t), ":")
	dsn := fmt.Sprintf("host=%s port=%s user=app dbname=app sslmode=disable connect_timeout=1", host, port)
	b := Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxAttempts: 2, MaxElapsed: time.Minute}
	calls := 0
	var retried []error
	err := b.Do(context.Background(), "connecting", func(_ int, _ time.Duration, err error) { retried = append(retried, err) },
		func(int) error { calls++; return connect(context.Background(), dsn) })
	require.ErrorIs(t, err, errGaveUp, "retried until the policy ran out: %v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded, "with the connect timeout as its cause")
	require.Equal(t, 2, calls)
	require.Len(t, retried, 1)
}

// TestBackoffDo_CallerStopIsFinal: once the caller's own context is done
// (cancelled, or its deadline passed), the error is final at once, however
// retryable it looks.
func TestBackoffDo_CallerStopIsFinal(t *testing.T) {
	t.Parallel()
	host, port, _ := strings.Cut(pgtest.SilentServer(t), ":")
	dsn := fmt.Sprintf("host=%s port=%s user=app dbname=app sslmode=disable connect_timeout=60", host, port)
	b := Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxAttempts: 10, MaxElapsed: time.Hour}
	cancelled, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	expiring, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	stopped, cancel3 := context.WithCancel(context.Background())
	for _, tt := range []struct {
		name string
		stop context.Context
		fn   func(ctx context.Context) error
		want error
	}{
		{"cancelled while connecting", cancelled, func(ctx context.Context) error { return connect(ctx, dsn) }, context.Canceled},
		{"deadline passed while connecting", expiring, func(ctx context.Context) error { return connect(ctx, dsn) }, context.DeadlineExceeded},
		{"cancelled before a retryable error", stopped, func(context.Context) error { cancel3(); return io.ErrUnexpectedEOF }, context.Canceled},
		// A cancel request sent for the caller's context comes back as 57014,
		// like a statement_timeout: the context says which it was.
		{"cancelled, then the query reported cancelled", stopped, func(context.Context) error {
			return &pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}
		}, context.Canceled},
	} {
		calls, retries := 0, 0
		err := b.Do(tt.stop, "connecting", func(int, time.Duration, error) { retries++ },
			func(int) error { calls++; return tt.fn(tt.stop) })
		require.ErrorIs(t, err, tt.want, tt.name)
		require.Equal(t, 1, calls, "%s: not tried again", tt.name)
		require.Zero(t, retries, "%s: no retry announced", tt.name)
	}
}

// TestBackoffDo_RejectedConnectionIsNotRetried: a wrong password (a real
// one, refused by the server) is tried once: retrying it only risks locking
// the account. The same for a database that does not exist.
func TestBackoffDo_RejectedConnectionIsNotRetried(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "logs in with a wrong password, which the test PgBouncer (auth_type trust) passes on as its own login's failure")
	dsn := pgtest.NewDatabase(t)
	b := Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxAttempts: 20, MaxElapsed: time.Minute}
	for name, dsn := range map[string]string{
		"wrong password":   pgtest.PasswordDSN(t, dsn, "wrong-password"),
		"no such database": strings.Replace(dsn, "dbname=", "dbname=nope_", 1),
	} {
		calls, retries := 0, 0
		err := b.Do(context.Background(), "connecting", func(int, time.Duration, error) { retries++ },
			func(int) error { calls++; return connect(context.Background(), dsn) })
		require.Error(t, err, name)
		_, rejected := ledger.ConnectionRejected(err)
		require.True(t, rejected, "%s: %v", name, err)
		require.Equal(t, 1, calls, "%s: tried once", name)
		require.Zero(t, retries, "%s: never retried", name)
	}
	require.NoError(t, connect(context.Background(), pgtest.PasswordDSN(t, dsn, pgtest.PasswordUserPassword)), "the right password works")
}

func connect(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// TestBackoffDoWhile: the caller's predicate, not the database's classifier,
// says what is retried.
func TestBackoffDoWhile(t *testing.T) {
	transient, final := errors.New("transient"), errors.New("final")
	policy := Backoff{Initial: time.Millisecond, Max: time.Millisecond, MaxAttempts: 10, MaxElapsed: time.Minute}
	retryable := func(err error) bool { return errors.Is(err, transient) }

	var calls int
	err := policy.DoWhile(context.Background(), "x", retryable, nil, func(n int) error {
		calls++
		if n < 3 {
			return transient
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, calls, "retried while the predicate said so")

	calls = 0
	err = policy.DoWhile(context.Background(), "x", retryable, nil, func(int) error { calls++; return final })
	require.ErrorIs(t, err, final)
	require.Equal(t, 1, calls, "not retried")

	calls = 0
	err = policy.DoWhile(context.Background(), "x", retryable, nil, func(int) error { calls++; return transient })
	require.ErrorIs(t, err, transient)
	require.Equal(t, 10, calls, "until the attempts are spent")
}

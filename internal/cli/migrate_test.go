package cli

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/ledger/ledgertest"
	"github.com/runledger/runledger/internal/pgtest"
)

func TestMigrationWaitLine(t *testing.T) {
	b := func(pid int32, name string, open time.Duration) ledger.MigrationBlocker {
		return ledger.MigrationBlocker{PID: pid, ApplicationName: name, OpenFor: open}
	}
	tests := []struct {
		name     string
		blockers []ledger.MigrationBlocker
		want     string
	}{
		{"one, its age seen", []ledger.MigrationBlocker{b(7, "runledger worker/ns/june/0", 192*time.Second+400*time.Millisecond)},
			`waiting for 1 session(s) to end their transactions (pid 7 "runledger worker/ns/june/0", transaction open for 3m12s)`},
		{"another login's: no age", []ledger.MigrationBlocker{b(8, "", -1)}, `(pid 8 "")`},
		{"five shown, the rest counted", []ledger.MigrationBlocker{b(1, "a", 0), b(2, "b", 0), b(3, "c", 0), b(4, "d", 0), b(5, "e", 0), b(6, "f", 0), b(7, "g", 0)},
			`waiting for 7 session(s) to end their transactions (pid 1 "a", transaction open for 0s; pid 2 "b", transaction open for 0s; pid 3 "c", transaction open for 0s; pid 4 "d", transaction open for 0s; pid 5 "e", transaction open for 0s; and 2 more)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := migrationWaitLine(tt.blockers)
			require.Contains(t, got, tt.want)
			require.True(t, strings.HasPrefix(got, "runledger migrate: waiting for "), got)
			require.Contains(t, got, "an index CONCURRENTLY, which waits for every transaction older than the build; runs go on meanwhile")
		})
	}
}

// lockedBuffer is a bytes.Buffer written by one goroutine and read by another.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestMigrateSaysWhatItWaitsFor: while 00016 builds its index CONCURRENTLY
// behind a transaction a shard holds open (as v0.1.0's shards do for as long
// as they run), `runledger migrate` says which session it waits for, then
// applies once the transaction ends. Not parallel: it sets the environment.
func TestMigrateSaysWhatItWaitsFor(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := ledger.Migrate(ctx, pool)
	require.NoError(t, err)
	ledgertest.DownTo(t, pool, 15)
	defer func(d time.Duration) { migrationWaitReport = d }(migrationWaitReport)
	migrationWaitReport = 100 * time.Millisecond

	shard, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer shard.Release()
	_, err = shard.Exec(ctx, `SET application_name = 'v0.1.0 worker'`)
	require.NoError(t, err)
	tx, err := shard.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM runledger.ledger`)
	require.NoError(t, err)

	t.Setenv(envDatabaseURL, dsn)
	c := newMigrateCommand()
	var stdout, stderr lockedBuffer
	c.SetOut(&stdout)
	c.SetErr(&stderr)
	c.SetArgs(nil)
	done := make(chan error, 1)
	go func() { done <- c.ExecuteContext(ctx) }()
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), `"v0.1.0 worker", transaction open for`) },
		time.Minute, 50*time.Millisecond, "migrate says what it waits for")
	require.Empty(t, stdout.String(), "nothing applied while it waits")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	require.Equal(t, fmt.Sprintf("migrations applied: %d\n", ledgertest.MigrationsAfter(t, 15)), stdout.String(), "00016 and every later one")
	line := strings.SplitN(stderr.String(), "\n", 2)[0]
	require.Regexp(t, `^runledger migrate: waiting for 1 session\(s\) to end their transactions \(pid \d+ "v0.1.0 worker", transaction open for \d+`, line)
	require.NotContains(t, stderr.String(), dsn, "no connection string")
}

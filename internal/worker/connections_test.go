package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// TestRefusedConnectionIsRetriedAndReported: the database refuses the
// worker's login a connection (its CONNECTION LIMIT is reached: 53300, too
// many connections). The shard waits and says so in its report (the
// status message the controller shows), then runs once connections are
// free again: every item committed once, nothing lost.
func TestRefusedConnectionIsRetriedAndReported(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "PgBouncer holds a client it has no server connection for, instead of passing PostgreSQL's refusal (53300) on")
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	owner := pgtest.Pool(t, dsn)
	cfg := owner.Config().ConnConfig
	role := "limited_" + cfg.Database
	mustExec(t, owner, `CREATE ROLE `+role+` LOGIN CONNECTION LIMIT 2`)
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = owner.Exec(context.Background(), `DROP ROLE `+role)
	})
	require.NoError(t, ledger.GrantWorker(ctx, owner, role))
	roleDSN := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, role, cfg.Database)

	// Two sessions of the role take its every connection.
	var blockers []*pgx.Conn
	for range 2 {
		c, err := pgx.Connect(ctx, roleDSN)
		require.NoError(t, err)
		blockers = append(blockers, c)
	}
	var once sync.Once
	free := func() {
		once.Do(func() {
			for _, c := range blockers {
				_ = c.Close(context.Background())
			}
		})
	}
	t.Cleanup(free)

	pool, err := ledger.Open(ctx, roleDSN, v1alpha1.MaxConnectionsOf(1))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var mu sync.Mutex
	var messages []string
	rep := worker.RunShard(ctx, ledger.NewStore(pool), worker.ShardConfig{
		Run: run("uid-refused"), Source: worker.NewStaticSource("items", keyItems("acct", 40)), ChunkSize: 10,
		Retry: worker.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: time.Minute},
		Progress: func(r worker.Report) {
			mu.Lock()
			messages = append(messages, worker.ShardMessage(r, 0))
			mu.Unlock()
			if r.WaitingForConnection {
				go func() { time.Sleep(300 * time.Millisecond); free() }()
			}
		},
	})
	require.NoError(t, rep.Err)
	require.True(t, rep.Done)
	require.False(t, rep.WaitingForConnection, "no longer waiting once it ran")
	require.Equal(t, v1alpha1.ItemCounts{Total: 40, Completed: 40}, rep.ItemCounts)
	require.EqualValues(t, 40, queryInt(t, owner, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed' AND run_uid = 'uid-refused'`))
	require.NotEmpty(t, messages)
	require.Equal(t, v1alpha1.DatabaseRefusingMessage+": the database refuses new connections (too many connections, SQLSTATE 53300); retrying", messages[0],
		"the first report says why nothing moves")
	require.Equal(t, "done", messages[len(messages)-1])
}

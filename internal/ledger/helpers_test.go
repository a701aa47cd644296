package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

func newPool(t *testing.T) *pgxpool.Pool { return pgtest.NewPool(t) }

// directPool is a pool on pool's database that reaches PostgreSQL itself,
// behind the pooler too (pgtest.EnvPooler): for a session an earlier
// release's worker held, which refused poolers.
func directPool(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	return pgtest.Pool(t, pgtest.Direct(t, pool.Config().ConnString()))
}

// onOwnPools runs fn n times at once, each on a pool of two connections of
// its own to dsn (as n processes would), and returns their errors by caller.
func onOwnPools(ctx context.Context, dsn string, n int, fn func(i int, pool *pgxpool.Pool) error, opts ...ledger.Option) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			pool, err := ledger.Open(ctx, dsn, 2, opts...)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			errs[i] = fn(i, pool)
		})
	}
	wg.Wait()
	return errs
}

func runNamed(uid string) ledger.Run {
	return ledger.Run{Namespace: "default", Name: "run-" + uid, UID: uid, Shard: 0, Attempt: 0}
}

func items(entity string, from, to int) []ledger.Item {
	out := make([]ledger.Item, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, ledger.Item{
			Key:     ledger.Key{Entity: entity, Occurrence: fmt.Sprintf("occ-%06d", i)},
			Payload: json.RawMessage(fmt.Sprintf(`{"amount": %d}`, i)),
		})
	}
	return out
}

// commit retries retryable errors as every caller of CommitChunk must.
func commit(t *testing.T, s *ledger.Store, run ledger.Run, its []ledger.Item, opts ledger.ChunkOptions) []ledger.Result {
	t.Helper()
	for attempt := 0; ; attempt++ {
		res, err := s.CommitChunk(context.Background(), run, its, opts)
		if err == nil {
			require.Len(t, res, len(its), "one result per item")
			return res
		}
		require.True(t, ledger.IsRetryable(err) && attempt < 20, "CommitChunk: %v", err)
		time.Sleep(time.Duration(attempt+1) * 10 * time.Millisecond)
	}
}

type tally struct{ completed, already, failed, sameRun, superseded int }

func count(res []ledger.Result) tally {
	var c tally
	for _, r := range res {
		switch r.Outcome {
		case ledger.Completed:
			c.completed++
			if r.Holder == ledger.HolderSameRun {
				c.sameRun++
			}
			if r.Superseded {
				c.superseded++
			}
		case ledger.AlreadyHandled:
			c.already++
		case ledger.Failed:
			c.failed++
		}
	}
	return c
}

func countRows(t *testing.T, pool *pgxpool.Pool, entity, occurrence, state string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM runledger.ledger WHERE entity = $1 AND occurrence = $2 AND state = $3`,
		entity, occurrence, state).Scan(&n))
	return n
}

func scalar[T any](t *testing.T, pool *pgxpool.Pool, sql string, args ...any) T {
	t.Helper()
	var v T
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&v), "query: %s", sql)
	return v
}

// requireOneCommittedPerKey asserts the invariant over the whole table.
func requireOneCommittedPerKey(t *testing.T, pool *pgxpool.Pool, wantKeys int) {
	t.Helper()
	dups := scalar[int64](t, pool, `SELECT count(*) FROM (SELECT 1 FROM runledger.ledger WHERE state = 'committed'
		GROUP BY entity, occurrence HAVING count(*) > 1) d`)
	require.Zero(t, dups, "no key may have two committed rows")
	require.EqualValues(t, wantKeys, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed'`),
		"committed rows == distinct keys")
}

// workerRole creates a login role (the server trusts it) that owns nothing,
// gives it a worker's privileges the way `runledger migrate --grant-to` does,
// and returns a pool of that role on the database of owner, and its name.
func workerRole(t *testing.T, owner *pgxpool.Pool) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	db := owner.Config().ConnConfig.Database
	role := "worker_" + db
	mustExec(t, owner, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = owner.Exec(context.Background(), `DROP ROLE `+role)
	})
	require.NoError(t, ledger.GrantWorker(ctx, owner, role))
	cfg := owner.Config().ConnConfig
	return pgtest.Pool(t, fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, role, db)), role
}

// pooledHAPair is a primary and its asynchronous standby with a migrated
// database db, a PgBouncer in front of the primary (a failover's hook
// points it at the promoted server: Retarget), and a pool of 2 of the
// database through it.
func pooledHAPair(ctx context.Context, t *testing.T) (*pgtest.HAPair, string, *pgtest.PgBouncer, *pgxpool.Pool) {
	t.Helper()
	h := pgtest.NewHAPair(t, pgtest.HAOptions{})
	db := h.NewDatabase(t)
	b, err := pgtest.StartPgBouncer(ctx, h.Primary())
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Stop() })
	pool, err := ledger.Open(ctx, b.SuperuserDSN(db), 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return h, db, b, pool
}

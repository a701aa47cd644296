package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestFixBatch_RunIdentity is issue #43.5 where a run's batch header is
// fixed: a uid the ledger recorded for one namespace/name, fixed again under
// another (a copied manifest keeps metadata.uid), fails naming both runs,
// whether the header was there already or is being written by a transaction
// still open (the insert of the header then waits for it, and does nothing:
// ON CONFLICT DO NOTHING). The same run's shards, starting together, pass.
func TestFixBatch_RunIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	mustExec(t, pool, batchSource)
	s := ledger.NewStore(pool)
	for _, c := range []struct {
		source string
		fix    func(ledger.Run) error
	}{
		{ledger.BatchSourceStatic, func(r ledger.Run) error { _, err := s.FixStaticBatch(ctx, r, 3, 2, "digest"); return err }},
		{ledger.BatchSourceQuery, func(r ledger.Run) error { _, err := s.FixQueryBatch(ctx, r, batchQuery()); return err }},
	} {
		t.Run(c.source, func(t *testing.T) {
			uid := "uid-" + c.source
			run := ledger.Run{Namespace: "billing", Name: "june", UID: uid}
			copied := ledger.Run{Namespace: "accounts", Name: "july", UID: uid}
			require.NoError(t, c.fix(run))
			require.NoError(t, c.fix(run), "the same run again")
			requireIdentityMismatch(t, c.fix(copied), uid)
			require.Equal(t, "billing/june", scalar[string](t, pool, `SELECT run_namespace || '/' || run_name FROM runledger.batch_run WHERE run_uid = $1`, uid))

			for _, racer := range []ledger.Run{run, copied} {
				uid := uid + "-" + racer.Name
				racer.UID = uid
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, `INSERT INTO runledger.batch_run (run_uid, run_namespace, run_name, source, shards, items, digest)
VALUES ($1, 'billing', 'june', $2, 3, 2, 'digest')`, uid, c.source)
				require.NoError(t, err)
				done := make(chan error, 1)
				go func() { done <- c.fix(racer) }()
				waitForALockWait(t, pool)
				require.NoError(t, tx.Commit(ctx))
				select {
				case err = <-done:
				case <-time.After(30 * time.Second):
					t.Fatal("the fix still waits after the header's transaction committed")
				}
				if racer.Name == run.Name {
					require.NoError(t, err, "a shard of the same run, started together")
				} else {
					requireIdentityMismatch(t, err, uid)
				}
				require.Equal(t, "billing/june", scalar[string](t, pool, `SELECT run_namespace || '/' || run_name FROM runledger.batch_run WHERE run_uid = $1`, uid))
			}
		})
	}
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`), "nothing committed")
}

// requireIdentityMismatch: err says that uid is another run's, naming
// both the run the ledger recorded and the one given.
func requireIdentityMismatch(t *testing.T, err error, uid string) {
	t.Helper()
	require.Error(t, err, "uid %s is billing/june's: accounts/july cannot take it over", uid)
	require.ErrorContains(t, err, "billing/june")
	require.ErrorContains(t, err, "accounts/july")
	require.ErrorContains(t, err, uid)
}

// waitForALockWait returns once a session of pool's database waits for a
// lock (the fix, for the open transaction's header).
func waitForALockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		return scalar[int64](t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, 20*time.Second, 10*time.Millisecond, "the fix waits for the open transaction's header")
}

package worker_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/worker"
)

// loseCommits makes the ledger forget what shard of run uid committed so
// far, with the effects of those commits, as the surviving server of a
// failover does with the tail its asynchronous standby never received.
func loseCommits(t *testing.T, f *fixture, uid string, shard int) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`) // the ledger's append-only trigger: WAL never replayed has no trigger either
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `DELETE FROM effects AS e USING runledger.ledger AS l
WHERE l.run_uid = $1 AND l.shard = $2 AND e.entity = l.entity AND e.occurrence = l.occurrence`, uid, shard)
	require.NoError(t, err)
	tag, err := tx.Exec(ctx, `DELETE FROM runledger.ledger WHERE run_uid = $1 AND shard = $2`, uid, shard)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return tag.RowsAffected()
}

// TestShardProvesItsCounts_LostCommits is issue #44.1: a shard's commits
// acknowledged and then lost (a failover to an asynchronous standby that
// had not received them) are not reported completed: before it reports
// success the shard has the ledger prove its counts, finds the lost items
// and processes them again, so that its completed count is the ledger's
// rows and each item's effect ran once on the database that survived. On
// the old code the shard reported every item completed, the lost ones too.
func TestShardProvesItsCounts_LostCommits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		src  func(t *testing.T, f *fixture) worker.Source
	}{
		{"static", func(*testing.T, *fixture) worker.Source {
			items := keyItems("acct", 600)
			return worker.NewStaticSource("items", append(items, items[:20]...))
		}},
		{"query", func(t *testing.T, f *fixture) worker.Source {
			src := worker.NewQuerySource(`SELECT 'acct-' || i AS entity, '2024-06' AS occurrence FROM generate_series(0, 599) i, generate_series(1, 1 + (i < 20)::int)`)
			require.NoError(t, src.Check(context.Background(), f.store))
			return src
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			mustExec(t, f.pool, `CREATE TABLE effects (entity text NOT NULL, occurrence text NOT NULL)`)
			uid := "uid-lost-commits-" + tc.name
			var lost int64
			progress := 0
			cfg := worker.ShardConfig{Run: run(uid), Shards: 2, Source: tc.src(t, f), ChunkSize: 40,
				Effect: `INSERT INTO effects (entity, occurrence) SELECT entity, occurrence FROM claimed`,
				Progress: func(r worker.Report) {
					if r.Shard == 0 && r.Reproven == 0 {
						if progress++; progress == 5 { // after a few chunks of the first pass
							lost = loseCommits(t, f, uid, 0)
						}
					}
				}}
			reports, sum := runShards(t, f, cfg)
			require.NotZero(t, lost, "commits were lost")
			require.Equal(t, v1alpha1.ItemCounts{Total: 620, Completed: 600, AlreadyHandled: 20}, sum)
			require.Equal(t, 1, reports[0].Reproven, "shard 0 processed its batch again once")
			require.Zero(t, reports[1].Reproven, "shard 1 lost nothing")
			require.GreaterOrEqual(t, reports[0].Reprocessed, lost, "every item whose row was lost processed again (a key's copies with it)")
			require.Zero(t, reports[1].Reprocessed)
			require.False(t, reports[1].ProvenByKey, "shard 1: the same server life, counts the ledger agrees with: proven by counts")
			for _, r := range reports {
				require.True(t, r.Proven, "shard %d's counts are the ledger's", r.Shard)
				require.Equal(t, r.Completed, ledgerRows(t, f, uid, r.Shard), "shard %d: completed == its rows in the ledger", r.Shard)
			}
			require.EqualValues(t, 600, f.committed(t))
			require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM (SELECT FROM effects GROUP BY entity, occurrence HAVING count(*) <> 1) AS d`), "an effect ran twice")
			require.EqualValues(t, 600, queryInt(t, f.pool, `SELECT count(*) FROM effects`), "every item's effect ran once")
		})
	}
}

// TestShardProvesItsCounts_LostBatch is issue #44.2's other loss: the
// batch itself fixed just before a failover that lost it with the commits
// since. The shard fixes the batch again, whole, processes it again and
// ends with the ledger's counts, each effect once; another attempt reads
// that batch. On the old code the shard stopped as bad input ("deleted by
// hand"), which fails a run in a cluster for good.
func TestShardProvesItsCounts_LostBatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mustExec(t, f.pool, `CREATE TABLE effects (entity text NOT NULL, occurrence text NOT NULL)`)
	const uid = "uid-lost-batch"
	src := worker.NewQuerySource(`SELECT 'acct-' || i AS entity, '2024-06' AS occurrence FROM generate_series(0, 299) i`)
	require.NoError(t, src.Check(context.Background(), f.store))
	progress := 0
	cfg := worker.ShardConfig{Run: run(uid), Source: src, ChunkSize: 40,
		Effect: `INSERT INTO effects (entity, occurrence) SELECT entity, occurrence FROM claimed`}
	first := cfg
	first.Progress = func(worker.Report) {
		if progress++; progress == 4 {
			loseCommits(t, f, uid, 0)
			ctx := context.Background()
			tx, err := f.pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `DELETE FROM runledger.batch WHERE batch_id = (SELECT id FROM runledger.batch_run WHERE run_uid = $1)`, uid)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `DELETE FROM runledger.batch_run WHERE run_uid = $1`, uid)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
		}
	}
	rep := worker.RunShard(context.Background(), f.store, first)
	require.NoError(t, rep.Err, "the shard fixed its batch again rather than stopping")
	require.True(t, rep.Done && rep.Proven, "%+v", rep)
	require.Equal(t, 1, rep.Reproven, "one pass more")
	require.Equal(t, v1alpha1.ItemCounts{Total: 300, Completed: 300}, rep.ItemCounts)
	require.Equal(t, rep.Completed, ledgerRows(t, f, uid, 0), "a proven count is the ledger's")
	_, sum := runShards(t, f, cfg) // another attempt reads the batch fixed again
	require.Equal(t, v1alpha1.ItemCounts{Total: 300, Completed: 300}, sum)
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM (SELECT FROM effects GROUP BY entity, occurrence HAVING count(*) <> 1) AS d`), "an effect ran twice")
	require.EqualValues(t, 300, queryInt(t, f.pool, `SELECT count(*) FROM effects`), "every item's effect ran once")
}

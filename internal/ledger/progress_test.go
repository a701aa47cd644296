package ledger_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// TestPublishProgress: each shard's row is upserted, an older attempt never
// overwrites a newer one's; the answer names the lowest other shard that is
// live (not done, written within liveFor); RunProgress reads them all with
// their age; a worker login granted by migrate --grant-to may do all of it;
// prune deletes a pruned run's rows.
func TestPublishProgress(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	ctx := context.Background()
	workerPool, _ := workerRole(t, owner)
	s := ledger.NewStore(workerPool)
	const live = 8 * time.Second
	row := func(shard, attempt int, completed int64, done bool) ledger.ShardProgress {
		return ledger.ShardProgress{Shard: shard, Attempt: attempt, ItemCounts: v1alpha1.ItemCounts{Total: 10, Completed: completed},
			Message: "processing", Done: done}
	}
	publish := func(p ledger.ShardProgress) (bool, int) {
		t.Helper()
		written, lowest, err := s.PublishProgress(ctx, "uid-p", p, live)
		require.NoError(t, err)
		return written, lowest
	}

	written, lowest := publish(row(2, 0, 1, false))
	require.True(t, written)
	require.Equal(t, -1, lowest, "alone on the board: no other shard")
	_, lowest = publish(row(3, 0, 1, false))
	require.Equal(t, 2, lowest, "shard 2 is the reporter")
	_, lowest = publish(row(1, 0, 4, false))
	require.Equal(t, 2, lowest, "the lowest other: shard 1 itself is lower, the reporter")
	_, lowest = publish(row(3, 0, 2, false))
	require.Equal(t, 1, lowest)

	// Shard 1 is done: shard 2 takes over. Shard 2's row goes stale (its
	// worker died): shard 3 takes over.
	publish(row(1, 0, 10, true))
	_, lowest = publish(row(3, 0, 3, false))
	require.Equal(t, 2, lowest)
	mustExec(t, owner, `UPDATE runledger.shard_progress SET updated_at = now() - interval '9 seconds' WHERE run_uid = 'uid-p' AND shard = 2`)
	_, lowest = publish(row(3, 0, 4, false))
	require.Equal(t, -1, lowest)

	// A replaced pod still finishing (attempt 0) never overwrites attempt 1.
	written, _ = publish(row(3, 1, 5, false))
	require.True(t, written)
	written, _ = publish(row(3, 0, 9, false))
	require.False(t, written, "an older attempt's row is not written")

	// Another run's rows are not this run's.
	_, lowestOther, err := s.PublishProgress(ctx, "uid-other", row(5, 0, 1, false), live)
	require.NoError(t, err)
	require.Equal(t, -1, lowestOther)

	rows, err := s.RunProgress(ctx, "uid-p")
	require.NoError(t, err)
	require.Len(t, rows, 3)
	for i, want := range []ledger.ShardProgress{row(1, 0, 10, true), row(2, 0, 1, false), row(3, 1, 5, false)} {
		got := rows[i]
		require.GreaterOrEqual(t, got.Age, time.Duration(0))
		if want.Shard == 2 {
			require.GreaterOrEqual(t, got.Age, 9*time.Second, "the database's clock")
		} else {
			require.Less(t, got.Age, 9*time.Second)
		}
		got.Age = 0
		require.Equal(t, want, got)
	}

	// A message is kept within its bound.
	long := row(4, 0, 0, false)
	long.Message = strings.Repeat("é", 1000)
	publish(long)
	rows, err = s.RunProgress(ctx, "uid-p")
	require.NoError(t, err)
	require.LessOrEqual(t, len(rows[3].Message), ledger.MaxProgressMessageBytes)

	// The worker may not delete the rows; prune (the owner) deletes those
	// of a pruned run, and only those.
	_, err = workerPool.Exec(ctx, `DELETE FROM runledger.shard_progress`)
	require.ErrorContains(t, err, "permission denied")
	mustExec(t, owner, `INSERT INTO runledger.batch_run (run_uid, run_namespace, run_name, source, shards, items, created_at)
VALUES ('uid-p', 'ns', 'p', 'static', 5, 0, now() - interval '2 days')`)
	_, err = ledger.NewStore(owner).PruneBatches(ctx, time.Now().Add(-24*time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 0, scalar[int64](t, owner, `SELECT count(*) FROM runledger.shard_progress WHERE run_uid = 'uid-p'`))
	require.EqualValues(t, 1, scalar[int64](t, owner, `SELECT count(*) FROM runledger.shard_progress WHERE run_uid = 'uid-other'`))
}

// TestPublishProgress_NotFromTrigger: like the other tables runledger
// writes, no statement run from inside a trigger (an effect's) writes a
// progress row.
func TestPublishProgress_NotFromTrigger(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, `CREATE TABLE forge (x int);
CREATE FUNCTION forge_progress() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runledger.shard_progress (run_uid, shard, attempt, total, completed, already_handled, failed, payload_changed, message, done)
    VALUES ('victim', 0, 0, 1, 1, 0, 0, 0, 'forged', true);
    RETURN NEW;
END $$;
CREATE TRIGGER forge AFTER INSERT ON forge FOR EACH ROW EXECUTE FUNCTION forge_progress()`)
	_, err := pool.Exec(context.Background(), `INSERT INTO forge VALUES (1)`)
	require.Error(t, err)
	require.EqualValues(t, 0, scalar[int64](t, pool, `SELECT count(*) FROM runledger.shard_progress`))
}

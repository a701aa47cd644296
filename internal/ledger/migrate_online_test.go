package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/ledger/ledgertest"
	"github.com/runledger/runledger/internal/pgtest"
)

// offlineMigration is the one migration that needs the ledger to itself
// (it rebuilds the rule's index; CHANGELOG.md's upgrade note says what to do).
const offlineMigration = 5

// maxShardStall is how long a migration may hold up a running shard.
const maxShardStall = time.Second

// TestMigrationsOnline: every migration after 00005 applies while a shard
// runs (reading its sorted batch, its worker committing chunk after chunk),
// and no chunk of that shard waits more than a second meanwhile. A
// migration that takes a lock the shard's statements queue behind (an
// index built without CONCURRENTLY, a constraint validated at once, a
// rewrite) fails here: build indexes concurrently, add constraints NOT
// VALID and validate them in a later statement.
func TestMigrationsOnline(t *testing.T) {
	t.Parallel()
	var versions []int64
	for _, s := range ledgertest.Provider(t, pgtest.Pool(t, pgtest.NewDatabase(t))).ListSources() {
		if s.Version > offlineMigration {
			versions = append(versions, s.Version)
		}
	}
	require.NotEmpty(t, versions, "migrations after 00005")
	for _, v := range versions {
		t.Run(fmt.Sprintf("%05d", v), func(t *testing.T) {
			t.Parallel()
			migrateWhileAShardRuns(t, v)
		})
	}
}

func migrateWhileAShardRuns(t *testing.T, version int64) {
	dsn := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// The ledger as the release before this migration left it, with rows.
	provider := downToForThisRelease(t, pool, version-1)
	s := ledger.NewStore(pool)
	commit(t, s, runNamed("earlier"), items("e", 0, 200), ledger.ChunkOptions{})

	// A running shard: reading its sorted batch, its worker committing.
	mustExec(t, pool, batchSource)
	run := runNamed("in-flight")
	h, err := s.FixQueryBatch(ctx, run, batchQuery())
	require.NoError(t, err)
	r, err := s.OpenBatch(ctx, h, run.UID, 0, true)
	require.NoError(t, err)
	_, _, err = r.Fetch(ctx, 0, 5, true)
	require.NoError(t, err)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var worst time.Duration
	var chunks int
	var chunkErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			chunkCtx, chunkCancel := context.WithTimeout(ctx, 20*time.Second)
			started := time.Now()
			_, err := s.CommitChunk(chunkCtx, run, items(fmt.Sprintf("w%d-", i), 0, 10), ledger.ChunkOptions{})
			took := time.Since(started)
			chunkCancel()
			if err != nil {
				chunkErr = err
				return
			}
			chunks++
			worst = max(worst, took)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond) // the shard is going
	started := time.Now()
	_, err = provider.UpByOne(ctx)
	migrated := time.Since(started)
	time.Sleep(300 * time.Millisecond) // and goes on after
	close(stop)
	wg.Wait()
	require.NoError(t, err, "migration %05d while a shard runs", version)
	require.NoError(t, chunkErr, "the shard's chunks while migration %05d applies", version)
	require.Less(t, migrated, 30*time.Second, "migration %05d waited on the running shard", version)
	require.Less(t, worst, maxShardStall, "a chunk of the running shard waited %s on migration %05d", worst, version)
	t.Logf("migration %05d: %s with a shard running; %d chunks, the slowest %s", version, migrated, chunks, worst)
	_, _, err = r.Fetch(ctx, 5, 5, true)
	require.NoError(t, err, "the shard reads on")
}

// retiredKeysMigration creates runledger.ledger_retired, batchSortedMigration
// runledger.batch_sorted and batch_sorted_shard.
const (
	retiredKeysMigration = 9
	batchSortedMigration = 17
)

// downToForThisRelease is ledgertest.DownTo(version) for a test that runs
// this release's statements on the older ledger, as a stand-in for that
// release's shard: they read a run's retired keys (00009), so on a ledger
// before it the table stands in, empty, as 00009 creates it (IF NOT
// EXISTS). A worker migrates its ledger before it runs, so never meets one.
func downToForThisRelease(t *testing.T, pool *pgxpool.Pool, version int64) *goose.Provider {
	t.Helper()
	provider := ledgertest.DownTo(t, pool, version)
	if version < retiredKeysMigration {
		mustExec(t, pool, `CREATE TABLE runledger.ledger_retired (
    run_uid text NOT NULL, occurrence text NOT NULL, entity text NOT NULL,
    PRIMARY KEY (run_uid, occurrence, entity))`)
	}
	if version < batchSortedMigration { // a shard sorts its batch there (as 00017 creates them)
		mustExec(t, pool, `CREATE UNLOGGED TABLE runledger.batch_sorted (
    batch_id bigint NOT NULL, shard integer NOT NULL, block integer NOT NULL, positions bigint[] NOT NULL,
    seqs bigint[] NOT NULL, entities text[] NOT NULL, occurrences text[] NOT NULL, payloads text[] NOT NULL,
    PRIMARY KEY (batch_id, shard, block));
CREATE UNLOGGED TABLE runledger.batch_sorted_shard (
    batch_id bigint NOT NULL, shard integer NOT NULL, items bigint NOT NULL, sorted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (batch_id, shard))`)
	}
	return provider
}

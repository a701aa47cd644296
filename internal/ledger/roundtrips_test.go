package ledger_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// countingConn counts the writes a client makes to the server: each is one
// message batch, hence at most one round trip.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// onePool opens a pool of one connection on a fresh database whose writes to
// the server are counted.
func onePool(t *testing.T) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	writes := &atomic.Int64{}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, writes
}

// TestPreload_OneRoundTrip: a preload of a chunk is one set-based round trip,
// its transaction and planner setting included, and says who holds each
// committed key.
func TestPreload_OneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, writes := onePool(t)
	s := ledger.NewStore(pool)
	chunk := items("acct", 0, 10_000)
	_, err := s.CommitChunk(ctx, runNamed("run-a"), chunk[:100], ledger.ChunkOptions{})
	require.NoError(t, err)
	_, err = s.CommitChunk(ctx, runNamed("run-b"), chunk[100:150], ledger.ChunkOptions{})
	require.NoError(t, err)
	keys := make([]ledger.Key, len(chunk))
	for i, it := range chunk {
		keys[i] = it.Key
	}

	_, err = s.Preload(ctx, "run-a", keys) // prepares the statements once per connection
	require.NoError(t, err)
	before := writes.Load()
	got, err := s.Preload(ctx, "run-a", keys)
	require.NoError(t, err)
	require.Equal(t, int64(1), writes.Load()-before, "a warmed-up preload must be one round trip")

	require.Len(t, got, 150, "exactly the committed keys come back")
	for i, k := range keys[:150] {
		want := ledger.HolderSameRun
		if i >= 100 {
			want = ledger.HolderOtherRun
		}
		require.Equal(t, want, got[k], "holder of %s", k)
	}
}

// TestPreload_FailureLeavesNoTransactionOpen: a preload whose lookup fails (a
// key PostgreSQL cannot store) returns the error, and the pooled connection
// does not carry its aborted transaction into the next caller's work.
func TestPreload_FailureLeavesNoTransactionOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := onePool(t)
	s := ledger.NewStore(pool)

	_, err := s.Preload(ctx, "run-a", []ledger.Key{{Entity: "acct\x00", Occurrence: "1"}})
	require.ErrorContains(t, err, "preloading 1 keys: ")
	require.ErrorContains(t, err, "22021", "the server's error (invalid byte sequence) must be kept")

	res, err := s.CommitChunk(ctx, runNamed("run-a"), items("acct", 0, 3), ledger.ChunkOptions{})
	require.NoError(t, err, "the next use of the pool must not inherit an aborted transaction")
	for _, r := range res {
		require.Equal(t, ledger.Completed, r.Outcome, "item %s", r.Key)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM runledger.ledger`).Scan(&n))
	require.Equal(t, 3, n, "the chunk after a failed preload must be committed")
}

// TestCommitChunk_ThreeRoundTrips: a chunk without conflicts costs three
// round trips once the statements are prepared: begin (with the transaction's
// setting), the claim, commit.
func TestCommitChunk_ThreeRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, writes := onePool(t)
	s := ledger.NewStore(pool)
	run := runNamed("run-a")
	_, err := s.CommitChunk(ctx, run, items("warm-up", 0, 10), ledger.ChunkOptions{})
	require.NoError(t, err)

	for _, tc := range []struct {
		name  string
		chunk []ledger.Item
	}{
		{"new keys", items("acct", 0, 1000)},
		{"the same keys again", items("acct", 0, 1000)},
		{"half of them held", items("acct", 500, 1500)},
	} {
		before := writes.Load()
		res, err := s.CommitChunk(ctx, run, tc.chunk, ledger.ChunkOptions{})
		require.NoError(t, err, tc.name)
		require.Equal(t, int64(3), writes.Load()-before, "%s: round trips", tc.name)
		for _, r := range res {
			require.Equal(t, ledger.Completed, r.Outcome, "%s: item %s", tc.name, r.Key)
		}
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM runledger.ledger WHERE entity = 'acct'`).Scan(&n))
	require.Equal(t, 1500, n)
}

// TestCommitChunk_EffectRoundTrips: with an effect, a chunk costs seven
// round trips: begin (with the table "claimed", empty at every transaction's
// start), the claim, the effect's planner setting, the effect in its sandbox
// (which fires the constraints it deferred), the ledger's settings together
// with the check that the effect left the session intact, commit, the same
// check after COMMIT (a trigger left to fire there). No check of the chunk's
// claims after the effect: the sandbox cannot take them back.
func TestCommitChunk_EffectRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, writes := onePool(t)
	s := ledger.NewStore(pool)
	_, err := pool.Exec(ctx, `CREATE TABLE notes (entity text, occurrence text, PRIMARY KEY (entity, occurrence))`)
	require.NoError(t, err)
	opts := ledger.ChunkOptions{Effect: `INSERT INTO notes SELECT entity, occurrence FROM claimed`}
	_, err = s.CommitChunk(ctx, runNamed("run-a"), items("warm-up", 0, 10), opts)
	require.NoError(t, err)

	before := writes.Load()
	res, err := s.CommitChunk(ctx, runNamed("run-a"), items("acct", 0, 1000), opts)
	require.NoError(t, err)
	require.Equal(t, int64(7), writes.Load()-before, "round trips")
	require.Equal(t, tally{completed: 1000}, count(res))
}

// TestClaimFresh_EffectRoundTrips: a fresh range the server claims with an
// effect costs the round trips of a chunk's claim with one (above), and
// the effect sees only the range's items.
func TestClaimFresh_EffectRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, writes := onePool(t)
	mustExec(t, pool, `CREATE TABLE src (entity text, occurrence text, payload text);
INSERT INTO src SELECT 'e' || lpad(i::text, 4, '0'), 'o', NULL FROM generate_series(0, 99) i;
CREATE TABLE notes (entity text, occurrence text, PRIMARY KEY (entity, occurrence))`)
	run := runNamed("fresh-effect")
	r := freshBatch(t, pool, run, "occurrence, entity")
	opts := ledger.ChunkOptions{Effect: `INSERT INTO notes SELECT entity, occurrence FROM claimed`}
	claim := func(pos int64, n int) {
		t.Helper()
		got, err := r.ClaimFresh(ctx, run, pos, n, v1alpha1.MaxKeyPartBytes, batchitem.DefaultMaxPayloadBytes, opts)
		require.NoError(t, err)
		require.True(t, got.Claimed)
	}
	claim(0, 10) // prepares the statements
	before := writes.Load()
	claim(10, 40)
	require.Equal(t, int64(7), writes.Load()-before, "round trips")
	require.EqualValues(t, 50, scalar[int64](t, pool, `SELECT count(*) FROM notes`), "the effect ran once per claimed item")
}

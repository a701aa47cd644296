package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

func TestCommitChunk_RerunIsAlreadyHandled(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	chunk := items("acct", 0, 500)

	first := count(commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{}))
	require.Equal(t, tally{completed: 500}, first)

	// The same chunk by another run: everything is already handled.
	second := count(commit(t, s, runNamed("run-b"), chunk, ledger.ChunkOptions{}))
	require.Equal(t, tally{already: 500}, second)

	// The same chunk by the same run (a retried attempt): its own rows count as
	// completed, marked as held by the same run, and nothing new is written.
	again := count(commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{}))
	require.Equal(t, tally{completed: 500, sameRun: 500}, again)
	requireOneCommittedPerKey(t, pool, 500)
	require.EqualValues(t, 500, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`), "no row was added by the reruns")
}

func TestCommitChunk_DuplicatesWithinChunk(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	chunk := append(items("acct", 0, 3), items("acct", 1, 3)...) // occ 1 and 2 twice
	res := commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{})
	require.Equal(t, tally{completed: 3, already: 2}, count(res))
	require.Equal(t, ledger.HolderSameChunk, res[3].Holder, "a repeat is attributed to its own chunk")
	require.Equal(t, ledger.Completed, res[1].Outcome, "the first copy carries the outcome")
	for i, r := range res {
		require.Equal(t, chunk[i].Key, r.Key, "results are in input order")
	}
	requireOneCommittedPerKey(t, pool, 3)
}

// TestCommitChunk_UnsortedChunkAndPayloads: results come back in input order
// whatever the order of the keys, each row keeps its own payload, and an item
// without a payload stores NULL.
func TestCommitChunk_UnsortedChunkAndPayloads(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	chunk := items("acct", 0, 200)
	slices.Reverse(chunk)
	chunk = append(chunk[:100:100], items("acct-b", 0, 100)...) // two entities, then shuffled
	chunk[7].Payload = nil
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(chunk), func(i, j int) { chunk[i], chunk[j] = chunk[j], chunk[i] })

	// Some keys already held by another run, some by an earlier attempt of this one.
	commit(t, s, runNamed("run-x"), chunk[10:20], ledger.ChunkOptions{})
	commit(t, s, runNamed("run-a"), chunk[30:35], ledger.ChunkOptions{})

	res := commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{})
	for i, r := range res {
		require.Equal(t, chunk[i].Key, r.Key, "results are in input order")
		switch {
		case i >= 10 && i < 20:
			require.Equal(t, ledger.AlreadyHandled, r.Outcome, "item %d is held by another run", i)
			require.Equal(t, ledger.HolderOtherRun, r.Holder)
		case i >= 30 && i < 35:
			require.Equal(t, ledger.Completed, r.Outcome, "item %d was committed by an earlier attempt", i)
			require.Equal(t, ledger.HolderSameRun, r.Holder)
		default:
			require.Equal(t, ledger.Completed, r.Outcome, "item %d", i)
			require.Equal(t, ledger.HolderNone, r.Holder, "item %d was claimed by this call", i)
		}
	}
	for i, it := range chunk {
		var payload *string
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT payload::text FROM runledger.ledger
			WHERE entity = $1 AND occurrence = $2 AND state = 'committed'`, it.Entity, it.Occurrence).Scan(&payload))
		if it.Payload == nil {
			require.Nil(t, payload, "item %d has no payload: NULL is stored", i)
			continue
		}
		require.NotNil(t, payload, "item %d", i)
		require.JSONEq(t, string(it.Payload), *payload, "item %d keeps its own payload", i)
	}
	requireOneCommittedPerKey(t, pool, 200)
}

// TestCommitChunk_WriterBetweenLookupAndInsert: the fast path looks up held
// keys and inserts the others in one statement. A key that no committed row
// held as of its snapshot, but that another writer is inserting, makes the
// insert wait for that writer. If the writer commits, the rule rejects the
// insert and the chunk is claimed again through the arbiter: that key is
// AlreadyHandled, held by the other run, and every other key commits. If the
// writer rolls back, the chunk claims the key.
func TestCommitChunk_WriterBetweenLookupAndInsert(t *testing.T) {
	t.Parallel()
	for _, writerCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("writer commits=%v", writerCommits), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := newPool(t)
			s := ledger.NewStore(pool)
			chunk := items("acct", 0, 100)

			other, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = other.Rollback(ctx) }()
			_, err = other.Exec(ctx, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
				VALUES ($1, $2, 'default', 'run-x', 'run-x', 0, 0)`, chunk[50].Entity, chunk[50].Occurrence)
			require.NoError(t, err)
			var otherPID int
			require.NoError(t, other.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID))

			type outcome struct {
				res []ledger.Result
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := s.CommitChunk(ctx, runNamed("run-a"), chunk, ledger.ChunkOptions{})
				done <- outcome{res, err}
			}()
			require.Eventually(t, func() bool {
				var waiting int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, otherPID).Scan(&waiting)
				return err == nil && waiting > 0
			}, 30*time.Second, 10*time.Millisecond, "the chunk's insert waits for the other writer")
			if writerCommits {
				require.NoError(t, other.Commit(ctx))
			} else {
				require.NoError(t, other.Rollback(ctx))
			}

			got := <-done
			require.NoError(t, got.err)
			require.Len(t, got.res, len(chunk))
			if writerCommits {
				require.Equal(t, tally{completed: 99, already: 1}, count(got.res))
				require.Equal(t, ledger.AlreadyHandled, got.res[50].Outcome, "the other writer's key")
				require.Equal(t, ledger.HolderOtherRun, got.res[50].Holder)
			} else {
				require.Equal(t, tally{completed: 100}, count(got.res), "the rolled-back key is claimed too")
			}
			requireOneCommittedPerKey(t, pool, 100)
			require.EqualValues(t, 100, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`), "no row twice, none lost")
		})
	}
}

// TestCommitChunk_WriterBetweenEveryLookup: after a conflict the fast path
// tries once more with a new snapshot; a second writer that gets in between
// that lookup and its insert too sends the chunk to the arbiter, which ends
// it: both writers' keys are AlreadyHandled, every other key commits once.
func TestCommitChunk_WriterBetweenEveryLookup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	chunk := items("acct", 0, 100)

	// writer inserts key i in a transaction left open; it returns the
	// transaction and its backend's pid.
	writer := func(i int, run string) (pgx.Tx, int) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
			VALUES ($1, $2, 'default', $3, $3, 0, 0)`, chunk[i].Entity, chunk[i].Occurrence, run)
		require.NoError(t, err)
		var pid int
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		return tx, pid
	}
	waitsFor := func(pid int) {
		require.Eventually(t, func() bool {
			var waiting int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, pid).Scan(&waiting)
			return err == nil && waiting > 0
		}, 30*time.Second, 10*time.Millisecond, "the chunk's insert waits for writer %d", pid)
	}
	first, firstPID := writer(30, "run-x")
	second, secondPID := writer(60, "run-y")

	type outcome struct {
		res []ledger.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := s.CommitChunk(ctx, runNamed("run-a"), chunk, ledger.ChunkOptions{})
		done <- outcome{res, err}
	}()
	waitsFor(firstPID) // the first try's insert, at key 30
	require.NoError(t, first.Commit(ctx))
	waitsFor(secondPID) // the second try skips key 30 and waits at key 60
	require.NoError(t, second.Commit(ctx))

	got := <-done
	require.NoError(t, got.err)
	require.Len(t, got.res, len(chunk))
	require.Equal(t, tally{completed: 98, already: 2}, count(got.res))
	for i, run := range map[int]string{30: "run-x", 60: "run-y"} {
		require.Equal(t, ledger.AlreadyHandled, got.res[i].Outcome, "key %d", i)
		require.Equal(t, run, got.res[i].HolderUID, "key %d: held by the writer that committed it", i)
	}
	requireOneCommittedPerKey(t, pool, 100)
	require.EqualValues(t, 100, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`), "no row twice, none lost")
}

// TestCommitChunk_Race: 8 writers on 8 connections commit overlapping key sets
// at once. The unique index alone arbitrates.
// TestCommitChunk_Race: writers of overlapping keys, with and without
// ExpectFresh (a guess that is wrong for every shared key another writer
// got first).
func TestCommitChunk_Race(t *testing.T) {
	t.Parallel()
	for _, fresh := range []bool{false, true} {
		t.Run(fmt.Sprintf("ExpectFresh=%v", fresh), func(t *testing.T) {
			t.Parallel()
			commitRace(t, ledger.ChunkOptions{ExpectFresh: fresh})
		})
	}
}

func commitRace(t *testing.T, opts ledger.ChunkOptions) {
	pool := newPool(t)
	s := ledger.NewStore(pool)
	const writers, perWriter, shared, chunkSize = 8, 5000, 2500, 1000
	results := make([]tally, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			// Half of every writer's items are shared by all writers, half are
			// its own; shared keys come in a different order per writer.
			its := items("shared", 0, shared)
			if w%2 == 1 {
				for i, j := 0, len(its)-1; i < j; i, j = i+1, j-1 {
					its[i], its[j] = its[j], its[i]
				}
			}
			its = append(its, items(fmt.Sprintf("own-%d", w), 0, perWriter-shared)...)
			run := runNamed(fmt.Sprintf("writer-%d", w))
			for from := 0; from < len(its); from += chunkSize {
				c := count(commit(t, s, run, its[from:min(from+chunkSize, len(its))], opts))
				results[w].completed += c.completed
				results[w].already += c.already
				results[w].failed += c.failed
			}
		})
	}
	wg.Wait()

	distinct := shared + writers*(perWriter-shared)
	var sum tally
	for _, r := range results {
		sum.completed += r.completed
		sum.already += r.already
		sum.failed += r.failed
	}
	require.Zero(t, sum.failed, "no item may fail")
	require.Equal(t, distinct, sum.completed, "Σcompleted == distinct keys")
	require.Equal(t, writers*perWriter, sum.completed+sum.already, "Σcompleted + ΣalreadyHandled == attempts")
	requireOneCommittedPerKey(t, pool, distinct)
}

// TestCommitChunk_StalePreload: a preload taken before another writer commits
// says "not handled"; acting on it still yields one row per key.
func TestCommitChunk_StalePreload(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	chunk := items("acct", 0, 100)
	keys := make([]ledger.Key, len(chunk))
	for i, it := range chunk {
		keys[i] = it.Key
	}
	pre, err := s.Preload(context.Background(), "run-b", keys)
	require.NoError(t, err)
	require.Empty(t, pre, "nothing is handled yet")

	commit(t, s, runNamed("run-a"), chunk[:60], ledger.ChunkOptions{}) // the world moves on

	// run-b acts on its stale preload and tries everything.
	require.Equal(t, tally{completed: 40, already: 60}, count(commit(t, s, runNamed("run-b"), chunk, ledger.ChunkOptions{})))
	requireOneCommittedPerKey(t, pool, 100)

	fresh, err := s.Preload(context.Background(), "run-a", keys)
	require.NoError(t, err)
	require.Len(t, fresh, 100)
	require.Equal(t, ledger.HolderSameRun, fresh[chunk[0].Key])
	require.Equal(t, ledger.HolderOtherRun, fresh[chunk[99].Key])
}

const effectSchema = `
CREATE TABLE accounts (account text PRIMARY KEY);
CREATE TABLE invoices (
    account text NOT NULL REFERENCES accounts,
    period  text NOT NULL,
    amount  numeric NOT NULL,
    PRIMARY KEY (account, period)
);`

const invoiceEffect = `INSERT INTO invoices (account, period, amount)
SELECT entity, occurrence, (payload->>'amount')::numeric FROM claimed`

// TestCommitChunk_Effect: the effect runs once per newly claimed item, in the
// same transaction; a foreign-key failure for some items leaves exactly those
// Failed with their own error and commits the others with their effect.
// TestCommitChunk_Effect: the effect runs over exactly the newly claimed
// items, with and without ExpectFresh (the second run's guess is wrong for 7
// of its 10 keys).
func TestCommitChunk_Effect(t *testing.T) {
	t.Parallel()
	for _, fresh := range []bool{false, true} {
		t.Run(fmt.Sprintf("ExpectFresh=%v", fresh), func(t *testing.T) {
			t.Parallel()
			commitWithEffect(t, fresh)
		})
	}
}

func commitWithEffect(t *testing.T, fresh bool) {
	pool := newPool(t)
	s := ledger.NewStore(pool)
	mustExec(t, pool, effectSchema)
	var chunk []ledger.Item
	for i := range 10 {
		mustExec(t, pool, `INSERT INTO accounts VALUES ($1) ON CONFLICT DO NOTHING`, fmt.Sprintf("acct-%d", i%7)) // acct-7..9 missing
		chunk = append(chunk, ledger.Item{
			Key:     ledger.Key{Entity: fmt.Sprintf("acct-%d", i), Occurrence: "2026-11"},
			Payload: json.RawMessage(fmt.Sprintf(`{"amount": %d}`, 10*(i+1))),
		})
	}
	opts := ledger.ChunkOptions{Effect: invoiceEffect, ExpectFresh: fresh}

	res := commit(t, s, runNamed("run-a"), chunk, opts)
	require.Equal(t, tally{completed: 7, failed: 3}, count(res))
	for i, r := range res {
		if i < 7 {
			require.Equal(t, ledger.Completed, r.Outcome, "item %d", i)
			continue
		}
		require.Equal(t, ledger.Failed, r.Outcome, "item %d has no account", i)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, r.Err, &pgErr, "item %d keeps PostgreSQL's error", i)
		require.Equal(t, "23503", pgErr.Code, "item %d fails with the foreign-key violation", i)
		require.Contains(t, r.Err.Error(), chunk[i].String(), "the error names the item")
		require.False(t, ledger.IsExpectedBusinessKeyConflict(r.Err))
	}
	require.EqualValues(t, 7, scalar[int64](t, pool, `SELECT count(*) FROM invoices`), "one invoice per completed item")
	require.EqualValues(t, 7, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`), "failed items left no ledger row")
	require.EqualValues(t, 280, scalar[int64](t, pool, `SELECT sum(amount)::bigint FROM invoices`))

	// Again, by another run, after the missing accounts appear: the 7 are
	// already handled and their effect does not run twice (it would violate
	// invoices' primary key); the 3 now complete.
	mustExec(t, pool, `INSERT INTO accounts VALUES ('acct-7'), ('acct-8'), ('acct-9')`)
	require.Equal(t, tally{completed: 3, already: 7}, count(commit(t, s, runNamed("run-b"), chunk, opts)))
	require.EqualValues(t, 10, scalar[int64](t, pool, `SELECT count(*) FROM invoices`))
	require.EqualValues(t, 550, scalar[int64](t, pool, `SELECT sum(amount)::bigint FROM invoices`))
	requireOneCommittedPerKey(t, pool, 10)
}

// TestCommitChunk_EffectStatementError: an effect that cannot run at all fails
// every item with its error and commits nothing.
func TestCommitChunk_EffectStatementError(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	res := commit(t, s, runNamed("run-a"), items("acct", 0, 50), ledger.ChunkOptions{Effect: `INSERT INTO no_such_table SELECT * FROM claimed`})
	require.Equal(t, tally{failed: 50}, count(res))
	require.ErrorContains(t, res[0].Err, `relation "no_such_table" does not exist`)
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`), "nothing of the chunk committed")
}

// TestCommitChunk_BadItemsAreIsolated: a malformed payload and an empty key
// part fail alone; the rest of the chunk commits.
func TestCommitChunk_BadItemsAreIsolated(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	chunk := items("acct", 0, 100)
	chunk[17].Payload = json.RawMessage(`{"amount": `) // not JSON
	chunk[63].Entity = ""                              // violates the check constraint
	res := commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{})
	require.Equal(t, tally{completed: 98, failed: 2}, count(res))
	require.ErrorContains(t, res[17].Err, "invalid input syntax for type json")
	require.ErrorContains(t, res[63].Err, "ledger_entity_check")
	requireOneCommittedPerKey(t, pool, 98)
}

// TestSupersede: deliberate reprocessing retires the old row and commits the
// new one atomically; superseded rows never block; two committed rows for one
// key are impossible even by direct SQL.
func TestSupersede(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	chunk := items("acct", 0, 20)
	commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{})

	sup := ledger.ChunkOptions{OnExisting: ledger.Supersede}
	require.Equal(t, tally{completed: 20, superseded: 20}, count(commit(t, s, runNamed("run-b"), chunk, sup)))
	require.Equal(t, 1, countRows(t, pool, "acct", "occ-000000", "committed"))
	require.Equal(t, 1, countRows(t, pool, "acct", "occ-000000", "superseded"))
	require.Equal(t, "run-b", scalar[string](t, pool,
		`SELECT run_uid FROM runledger.ledger WHERE entity = 'acct' AND occurrence = 'occ-000000' AND state = 'committed'`))

	// A retry of run-b's supersede does not supersede its own rows again.
	require.Equal(t, tally{completed: 20, sameRun: 20}, count(commit(t, s, runNamed("run-b"), chunk, sup)))
	require.EqualValues(t, 40, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`))

	// Direct SQL cannot add a second committed row...
	err := engineError(t, pool, directInsert, "acct", "occ-000000", "committed")
	require.True(t, ledger.IsExpectedBusinessKeyConflict(err), "the rule refused it: %v", err)
	// ...but superseded history never blocks.
	mustExec(t, pool, directInsert, "acct", "occ-000000", "superseded")
	require.Equal(t, 2, countRows(t, pool, "acct", "occ-000000", "superseded"))
}

func TestCommitChunk_RejectsEmptyRunUID(t *testing.T) {
	t.Parallel()
	s := ledger.NewStore(newPool(t))
	_, err := s.CommitChunk(context.Background(), ledger.Run{Name: "x"}, items("a", 0, 1), ledger.ChunkOptions{})
	require.ErrorContains(t, err, "run UID is empty")
}

// TestCommitChunk_ExpectFreshIsOnlyAHint: a chunk sent with ExpectFresh
// whose keys are held after all (by another run, with the same payload or
// not; by the same run, as after a lost COMMIT; twice in the chunk), or
// whose items are bad, gets exactly the verdicts, holders and rows of the
// same chunk sent without it.
func TestCommitChunk_ExpectFreshIsOnlyAHint(t *testing.T) {
	t.Parallel()
	type verdict struct {
		outcome        ledger.Outcome
		holder         ledger.Holder
		holderUID      string
		payloadChanged bool
		errText        string
	}
	for _, tt := range []struct {
		name  string
		chunk func() []ledger.Item
	}{
		{"all fresh", func() []ledger.Item { return items("acct", 100, 140) }},
		{"held by another run, same payloads", func() []ledger.Item { return items("acct", 0, 10) }},
		{"held by another run, payloads changed", func() []ledger.Item {
			c := items("acct", 0, 10)
			for i := range c {
				c[i].Payload = json.RawMessage(`{"amount": -1}`)
			}
			return c
		}},
		{"held by this run (a retry after a lost COMMIT)", func() []ledger.Item { return items("mine", 0, 10) }},
		{"one held key last, after fresh ones", func() []ledger.Item { return append(items("acct", 100, 140), items("acct", 9, 10)...) }},
		{"mixed, with repeats", func() []ledger.Item {
			c := append(items("acct", 5, 15), items("mine", 5, 15)...)
			return append(c, c[3], c[14], items("acct", 200, 210)[4])
		}},
		{"bad items among fresh ones", func() []ledger.Item {
			c := items("acct", 300, 340)
			c[7].Payload = json.RawMessage(`{"amount": `)
			c[21].Entity = ""
			return c
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := map[bool][]verdict{}
			rows := map[bool][]string{}
			for _, fresh := range []bool{false, true} {
				pool := newPool(t)
				s := ledger.NewStore(pool)
				commit(t, s, runNamed("other"), items("acct", 0, 10), ledger.ChunkOptions{})
				commit(t, s, runNamed("me"), items("mine", 0, 10), ledger.ChunkOptions{})
				for _, r := range commit(t, s, runNamed("me"), tt.chunk(), ledger.ChunkOptions{ExpectFresh: fresh}) {
					v := verdict{outcome: r.Outcome, holder: r.Holder, holderUID: r.HolderUID, payloadChanged: r.PayloadChanged}
					if r.Err != nil {
						v.errText = r.Err.Error()
					}
					got[fresh] = append(got[fresh], v)
				}
				keys, err := pool.Query(context.Background(), `SELECT entity || '/' || occurrence || '/' || run_uid || '/' || coalesce(payload::text, '')
					FROM runledger.ledger WHERE state = 'committed' ORDER BY 1`)
				require.NoError(t, err)
				rows[fresh], err = pgx.CollectRows(keys, pgx.RowTo[string])
				require.NoError(t, err)
			}
			require.Equal(t, got[false], got[true], "verdicts with ExpectFresh, item by item")
			require.Equal(t, rows[false], rows[true], "the committed rows with ExpectFresh")
		})
	}
}

// statements records the SQL of every query a pool sends.
type statements struct {
	mu   sync.Mutex
	sent []string
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, d.SQL)
	return ctx
}

func (*statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements sent since the last take.
func (s *statements) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sent := s.sent
	s.sent = nil
	return sent
}

// counting counts the statements of sent that match.
func counting(sent []string, match func(string) bool) int {
	n := 0
	for _, q := range sent {
		if match(q) {
			n++
		}
	}
	return n
}

// TestCommitChunk_ExpectFreshLooksNothingUp: with ExpectFresh, a chunk of
// fresh keys is one plain INSERT, no lookup of the rule's index before it;
// a held key makes it fall back to the lookup.
func TestCommitChunk_ExpectFreshLooksNothingUp(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
	require.NoError(t, err)
	trace := &statements{}
	cfg.ConnConfig.Tracer = trace
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := ledger.NewStore(pool)
	lookups := func(sent []string) int {
		return counting(sent, func(q string) bool { return strings.Contains(q, "LEFT JOIN LATERAL") })
	}
	freshInserts := func(sent []string) int {
		return counting(sent, func(q string) bool { return q == ledger.SQLInsertFresh })
	}

	require.Equal(t, tally{completed: 50}, count(commit(t, s, runNamed("me"), items("acct", 0, 50), ledger.ChunkOptions{ExpectFresh: true})))
	sent := trace.take()
	require.Equal(t, 1, freshInserts(sent), "a fresh chunk with ExpectFresh is one plain insert")
	require.Zero(t, lookups(sent), "and looks nothing up")

	require.Equal(t, tally{completed: 50}, count(commit(t, s, runNamed("me"), items("acct", 50, 100), ledger.ChunkOptions{})))
	sent = trace.take()
	require.Zero(t, freshInserts(sent), "without it, no plain insert")
	require.Equal(t, 1, lookups(sent), "the claim looks the keys up")

	require.Equal(t, tally{completed: 10, already: 10}, count(commit(t, s, runNamed("other"), items("acct", 90, 110), ledger.ChunkOptions{ExpectFresh: true})))
	sent = trace.take()
	require.Equal(t, 1, freshInserts(sent), "a held key: the plain insert is tried")
	require.Equal(t, 1, lookups(sent), "refused by the rule, then the claim looks up once")

	require.Equal(t, tally{completed: 20, superseded: 10}, count(commit(t, s, runNamed("sup"), items("acct", 100, 120), ledger.ChunkOptions{ExpectFresh: true, OnExisting: ledger.Supersede})))
	require.Zero(t, freshInserts(trace.take()), "a Supersede run ignores the hint")
	requireOneCommittedPerKey(t, pool, 120)
}

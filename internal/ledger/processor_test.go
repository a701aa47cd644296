package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// funcProcessor answers each item by its occurrence's suffix: "-fail" is
// refused, "-retry" asked to retry, anything else ok. It records every item
// it was sent.
type funcProcessor struct {
	mu   sync.Mutex
	sent []ledger.Key
	err  error // the call fails as a whole
}

func (p *funcProcessor) Process(_ context.Context, _ ledger.Run, items []ledger.Claim) ([]ledger.Verdict, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, it := range items {
		p.sent = append(p.sent, it.Key)
	}
	if p.err != nil {
		return nil, p.err
	}
	return bySuffix(items), nil
}

func (p *funcProcessor) sentKeys() []ledger.Key {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ledger.Key(nil), p.sent...)
}

func keyed(occurrences ...string) []ledger.Item {
	out := make([]ledger.Item, len(occurrences))
	for i, o := range occurrences {
		out[i] = ledger.Item{Key: ledger.Key{Entity: "acct", Occurrence: o}, Payload: []byte(`{"n": 1}`)}
	}
	return out
}

// TestProcessor_MixedResults: only the keys the processor accepted commit;
// the refused and retryable ones are taken back inside the transaction (a
// worker login, through the append-only trigger) and Failed, a retryable one
// marked as such.
func TestProcessor_MixedResults(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	s := ledger.NewStore(worker)
	p := &funcProcessor{}
	chunk := keyed("1", "2-fail", "3", "4-retry", "5")
	res := commit(t, s, runNamed("a"), chunk, ledger.ChunkOptions{Processor: p})
	require.Equal(t, tally{completed: 3, failed: 2}, count(res))
	require.ErrorContains(t, res[1].Err, "processor: card declined")
	require.NotErrorIs(t, res[1].Err, ledger.ErrRetryItem)
	require.ErrorContains(t, res[3].Err, "processor: try later")
	require.ErrorIs(t, res[3].Err, ledger.ErrRetryItem)
	for i, o := range []string{"1", "2-fail", "3", "4-retry", "5"} {
		want := 1
		if strings.Contains(o, "-") {
			want = 0
		}
		require.Equal(t, want, countRows(t, owner, "acct", o, "committed"), o)
		require.Equal(t, chunk[i].Key, res[i].Key)
	}
	require.EqualValues(t, 3, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`), "nothing else was written")

	// Another run: the committed keys are already handled and never sent;
	// the refused ones are free and sent again.
	p2 := &funcProcessor{}
	res = commit(t, s, runNamed("b"), chunk, ledger.ChunkOptions{Processor: p2})
	require.Equal(t, tally{already: 3, failed: 2}, count(res))
	require.Equal(t, []ledger.Key{chunk[1].Key, chunk[3].Key}, p2.sentKeys())

	// The same run again: its own rows are completed, nothing is sent.
	p3 := &funcProcessor{}
	res = commit(t, s, runNamed("a"), keyed("1", "3", "5"), ledger.ChunkOptions{Processor: p3})
	require.Equal(t, tally{completed: 3, sameRun: 3}, count(res))
	require.Empty(t, p3.sentKeys())
}

// TestProcessor_CallFails: a call that fails as a whole commits nothing and
// is a retryable *ProcessorError.
func TestProcessor_CallFails(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	p := &funcProcessor{err: errors.New("status 500: boom")}
	_, err := s.CommitChunk(context.Background(), runNamed("a"), keyed("1", "2"), ledger.ChunkOptions{Processor: p})
	var perr *ledger.ProcessorError
	require.ErrorAs(t, err, &perr)
	require.True(t, ledger.IsRetryable(err))
	require.ErrorContains(t, err, "calling the processor: status 500: boom")
	require.EqualValues(t, 0, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`))
	require.Len(t, p.sentKeys(), 2)
}

// TestProcessor_SupersedeTakenBack: under onExisting Supersede, a key the
// processor refuses keeps the row it had (restored in the transaction);
// accepted keys supersede theirs.
func TestProcessor_SupersedeTakenBack(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	s := ledger.NewStore(worker)
	chunk := keyed("1", "2-fail", "3-retry")
	require.Equal(t, tally{completed: 3}, count(commit(t, s, runNamed("old"), chunk, ledger.ChunkOptions{})))
	before := ledgerSnapshot(t, owner)

	res := commit(t, s, runNamed("new"), chunk, ledger.ChunkOptions{Processor: &funcProcessor{}, OnExisting: ledger.Supersede})
	require.Equal(t, tally{completed: 1, superseded: 1, failed: 2}, count(res))
	require.EqualValues(t, 1, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'new'`))
	require.EqualValues(t, 2, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'old' AND state = 'committed'`), "the refused keys keep their rows")
	require.EqualValues(t, 1, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'old' AND state = 'superseded'`))
	requireOneCommittedPerKey(t, owner, 3)

	// The restored rows are exactly as they were (only the accepted key's changed).
	after := scalar[string](t, owner, `SELECT coalesce(jsonb_agg(to_jsonb(l) ORDER BY l.id), '[]')::text FROM runledger.ledger AS l WHERE l.occurrence <> '1'`)
	require.Contains(t, before, strings.TrimSuffix(strings.TrimPrefix(after, "["), "]"))
}

// TestProcessor_TakeBackOnlyOwnRows: ledger_take_back touches no row another
// transaction wrote, and the trigger refuses a DELETE of the transaction's
// own rows outside it (an effect's, say).
func TestProcessor_TakeBackOnlyOwnRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	s := ledger.NewStore(worker)
	seedHistory(t, s)
	before := ledgerSnapshot(t, owner)

	var n int64
	require.NoError(t, worker.QueryRow(ctx, `SELECT runledger.ledger_take_back(ARRAY['acct','hist'], ARRAY['occ-000001','occ-000001'], ARRAY(SELECT id FROM runledger.ledger))`).Scan(&n))
	require.Zero(t, n, "committed rows of other transactions are not taken back")
	require.Equal(t, before, ledgerSnapshot(t, owner))

	// An owner's own uncommitted row, deleted outside the function: refused.
	tx, err := owner.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt) VALUES ('x', 'y', 'ns', 'n', 'u', 0, 0)`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SAVEPOINT s; DELETE FROM runledger.ledger WHERE entity = 'x'`)
	requirePgError(t, err, "23001", "runledger.ledger is append-only")
	_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT s`)
	require.NoError(t, err)
	// Through the function, it is taken back.
	require.NoError(t, tx.QueryRow(ctx, `SELECT runledger.ledger_take_back(ARRAY['x'], ARRAY['y'], '{}')`).Scan(&n))
	require.EqualValues(t, 1, n)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, before, ledgerSnapshot(t, owner))
}

// TestProcessor_NonSuperuserOwner: the migrations apply, and a processor's
// refusals are taken back, when the schema's owner is an ordinary role (no
// superuser): ledger_take_back sets its parameter in its body, which needs
// no privilege, not in a SET clause, which did (seen failing in e2e:
// "permission denied to set parameter runledger.take_back").
func TestProcessor_NonSuperuserOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := pgtest.Pool(t, pgtest.NewEmptyDatabase(t))
	cfg := admin.Config().ConnConfig
	role := "owner_" + cfg.Database
	mustExec(t, admin, `CREATE ROLE `+role+` LOGIN NOSUPERUSER`)
	mustExec(t, admin, `ALTER DATABASE `+cfg.Database+` OWNER TO `+role)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `ALTER DATABASE `+cfg.Database+` OWNER TO CURRENT_USER`)
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = admin.Exec(context.Background(), `DROP ROLE `+role)
	})
	owner := pgtest.Pool(t, fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, role, cfg.Database))
	require.False(t, scalar[bool](t, owner, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`))
	_, err := ledger.Migrate(ctx, owner)
	require.NoError(t, err, "an ordinary owner applies every migration")

	wrole := "worker_" + cfg.Database
	mustExec(t, admin, `CREATE ROLE `+wrole+` LOGIN`)
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), `DROP OWNED BY `+wrole)
		_, _ = admin.Exec(context.Background(), `DROP ROLE `+wrole)
	})
	require.NoError(t, ledger.GrantWorker(ctx, owner, wrole))
	worker := pgtest.Pool(t, fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, wrole, cfg.Database))
	res := commit(t, ledger.NewStore(worker), runNamed("a"), keyed("1", "2-fail", "3-retry"), ledger.ChunkOptions{Processor: &funcProcessor{}})
	require.Equal(t, tally{completed: 1, failed: 2}, count(res))
	require.EqualValues(t, 1, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`))
	require.Empty(t, scalar[string](t, worker, `SELECT coalesce(current_setting('runledger.take_back', true), '')`), "the parameter does not outlive the call")
}

// TestProcessor_TakeBackAfterIsolation: when a chunk is claimed item by item
// under savepoints (one item has a malformed payload), its rows carry the
// savepoints' transaction ids; the processor's refusals are still taken back,
// and only the accepted keys commit.
func TestProcessor_TakeBackAfterIsolation(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	s := ledger.NewStore(worker)
	p := &funcProcessor{}
	chunk := keyed("1", "2-fail", "3-bad", "4-retry", "5")
	chunk[2].Payload = []byte(`{not json`)
	res := commit(t, s, runNamed("a"), chunk, ledger.ChunkOptions{Processor: p})
	require.Equal(t, tally{completed: 2, failed: 3}, count(res))
	require.ErrorContains(t, res[1].Err, "processor: card declined")
	require.ErrorContains(t, res[2].Err, "invalid input syntax for type json")
	require.ErrorIs(t, res[3].Err, ledger.ErrRetryItem)
	require.EqualValues(t, 2, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`), "only the accepted keys")
	require.Equal(t, 1, countRows(t, owner, "acct", "1", "committed"))
	require.Equal(t, 1, countRows(t, owner, "acct", "5", "committed"))
}

// TestProcessor_SupersedeTakenBackRetiresNothing is issue #43.6 on the
// ledger: the retired-key record a Supersede writes follows its take-back.
// A refused key's earlier holder is restored and recorded retired from
// nothing; an accepted key's holder is recorded; a record this transaction
// did not write (here one left by hand, as an earlier release may have) is
// kept, and the verdicts of the earlier run still count the keys its own.
func TestProcessor_SupersedeTakenBackRetiresNothing(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	s := ledger.NewStore(worker)
	chunk := keyed("1", "2-fail", "3-retry", "4-fail")
	require.Equal(t, tally{completed: 4}, count(commit(t, s, runNamed("old"), chunk, ledger.ChunkOptions{})))
	mustExec(t, owner, `INSERT INTO runledger.ledger_retired (run_uid, occurrence, entity) VALUES ('old', '4-fail', 'acct')`)

	res := commit(t, s, runNamed("new"), chunk, ledger.ChunkOptions{Processor: &funcProcessor{}, OnExisting: ledger.Supersede})
	require.Equal(t, tally{completed: 1, superseded: 1, failed: 3}, count(res))
	retired := scalar[string](t, owner, `SELECT string_agg(run_uid || ':' || entity || '/' || occurrence, ' ' ORDER BY occurrence) FROM runledger.ledger_retired`)
	require.Equal(t, "old:acct/1 old:acct/4-fail", retired, "only the accepted key's holder was retired; the record from before stays")

	h, err := s.Key(context.Background(), ledger.Key{Entity: "acct", Occurrence: "2-fail"})
	require.NoError(t, err)
	require.Len(t, h.Rows, 1)
	require.Equal(t, "old", h.Rows[0].Run.UID)
	require.Equal(t, "committed", h.Rows[0].State)
	require.Empty(t, h.Retired, "key shows only what happened")

	// The earlier run's keys are still its own: completed, nothing claimed.
	res = commit(t, s, runNamed("old"), chunk, ledger.ChunkOptions{Processor: &funcProcessor{}})
	require.Equal(t, tally{completed: 4, sameRun: 4}, count(res))
	// A refused key is the Supersede run's to claim again (no processor now):
	// then its holder is retired, and recorded.
	res = commit(t, s, runNamed("new"), keyed("2-fail"), ledger.ChunkOptions{OnExisting: ledger.Supersede})
	require.Equal(t, tally{completed: 1, superseded: 1}, count(res))
	require.EqualValues(t, 1, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger_retired WHERE run_uid = 'old' AND occurrence = '2-fail'`))
}

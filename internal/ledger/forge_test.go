package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// forgeFunction creates public.forge_conflict(), a trigger function that
// raises, from PL/pgSQL, the rule's violation with every field a RAISE can
// set (SQLSTATE, constraint, schema, table, column, datatype, detail,
// message) equal to the engine's own.
func forgeFunction(t *testing.T, owner *pgxpool.Pool) {
	t.Helper()
	mustExec(t, owner, `
CREATE FUNCTION public.forge_conflict() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'duplicate key value violates unique constraint "ledger_business_key_uq"'
        USING ERRCODE = 'unique_violation', CONSTRAINT = 'ledger_business_key_uq',
              SCHEMA = 'runledger', TABLE = 'ledger', COLUMN = 'entity', DATATYPE = 'text',
              DETAIL = format('Key (occurrence, entity)=(%s, %s) already exists.', NEW.occurrence, NEW.entity);
END
$$;
GRANT EXECUTE ON FUNCTION public.forge_conflict() TO PUBLIC`)
}

// requireNoneHandled: no item is already handled (nothing committed their
// keys), every one is Failed or Completed.
func requireNoneHandled(t *testing.T, res []ledger.Result, what string) {
	t.Helper()
	for _, r := range res {
		require.NotEqual(t, ledger.AlreadyHandled, r.Outcome, "%s: %s is already handled, yet no committed row holds it", what, r.Key)
	}
}

// TestForgedConflict_DeferredConstraintTrigger (#20.1): the effect writes a
// table whose DEFERRABLE INITIALLY DEFERRED constraint trigger raises the
// rule's violation, forged; it surfaces at the insert path's own SET
// CONSTRAINTS ALL IMMEDIATE. The items fail, none is already handled, nothing
// commits, and a later run commits them. (On the old code every item was
// already handled and nothing held its key.)
func TestForgedConflict_DeferredConstraintTrigger(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	forgeFunction(t, owner)
	mustExec(t, owner, `CREATE TABLE effects (entity text, occurrence text);
GRANT ALL ON effects TO PUBLIC;
CREATE CONSTRAINT TRIGGER effects_forge AFTER INSERT ON effects DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION public.forge_conflict()`)
	s := ledger.NewStore(owner)
	const effect = `INSERT INTO public.effects SELECT entity, occurrence FROM claimed`
	for _, chunk := range [][]ledger.Item{items("deferred", 0, 4), items("deferred1", 0, 1)} {
		res := commit(t, s, runNamed("forger"), chunk, ledger.ChunkOptions{Effect: effect})
		requireNoneHandled(t, res, "deferred forged conflict")
		require.Equal(t, tally{failed: len(chunk)}, count(res), "every item fails: %v", res)
		for _, r := range res {
			require.ErrorContains(t, r.Err, "duplicate key value", "PostgreSQL's own text is kept")
		}
	}
	require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`), "nothing committed")
	res := commit(t, s, runNamed("honest"), append(items("deferred", 0, 4), items("deferred1", 0, 1)...), ledger.ChunkOptions{})
	require.Equal(t, tally{completed: 5}, count(res), "nothing held the keys: a later run commits them")
}

// TestForgedConflict_TriggerOnClaimed (#20.1): an effect installs on the
// session's table "claimed" a trigger that raises the rule's violation,
// forged, inside the next chunk's claim. Whether the insert path refuses the
// trigger or the trigger fires, no item of any chunk is already handled, and
// every key the run reports completed has its committed row.
func TestForgedConflict_TriggerOnClaimed(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	forgeFunction(t, owner)
	one := poolWith(t, owner, map[string]string{"pool_max_conns": "1"}) // every chunk on the same session
	s := ledger.NewStore(one)
	install := `CREATE TRIGGER claimed_forge BEFORE INSERT ON pg_temp.claimed FOR EACH ROW EXECUTE FUNCTION public.forge_conflict()`
	first := commit(t, s, runNamed("installer"), items("claimed0", 0, 3), ledger.ChunkOptions{Effect: install})
	requireNoneHandled(t, first, "the installing chunk")
	for i, chunk := range [][]ledger.Item{items("claimed1", 0, 4), items("claimed2", 0, 1), items("claimed3", 0, 2)} {
		res := commit(t, s, runNamed("victim"), chunk, ledger.ChunkOptions{Effect: `SELECT count(*) FROM claimed`})
		requireNoneHandled(t, res, fmt.Sprintf("chunk %d after the trigger", i))
		for _, r := range res {
			if r.Outcome == ledger.Completed {
				require.Equal(t, 1, countRows(t, owner, r.Key.Entity, r.Key.Occurrence, "committed"), "%s completed: its row", r.Key)
			}
		}
	}
	// Nothing held the keys of a failed chunk: an honest run commits them.
	res := commit(t, ledger.NewStore(owner), runNamed("honest"), append(items("claimed1", 0, 4), items("claimed2", 0, 1)...), ledger.ChunkOptions{})
	requireNoneHandledButByVictim(t, owner, res)
}

// requireNoneHandledButByVictim: an item already handled is held by a
// committed row of run "victim".
func requireNoneHandledButByVictim(t *testing.T, owner *pgxpool.Pool, res []ledger.Result) {
	t.Helper()
	for _, r := range res {
		if r.Outcome == ledger.AlreadyHandled {
			require.Equal(t, "victim", scalar[string](t, owner, `SELECT run_uid FROM runledger.ledger WHERE entity = $1 AND occurrence = $2 AND state = 'committed'`,
				r.Key.Entity, r.Key.Occurrence), "%s", r.Key)
		} else {
			require.Equal(t, ledger.Completed, r.Outcome, "%s: %v", r.Key, r.Err)
		}
	}
}

// supersedeEffect records, per run, every key its effect processed.
func supersedeEffect(run string) string {
	return `INSERT INTO public.effects SELECT '` + run + `', entity, occurrence FROM claimed`
}

// TestSupersede_RerunAfterAnotherRetiredItsRows (#20.3): run S1 supersedes a
// batch, run S2 supersedes S1's rows, then S1 runs again (a retried pod,
// `runledger run` again). The rerun counts every key completed (S1 did
// process it) and touches nothing: no second supersede, no second effect.
// (On the old code the rerun superseded S2's rows and ran its effect again.)
func TestSupersede_RerunAfterAnotherRetiredItsRows(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	mustExec(t, owner, `CREATE TABLE effects (run text, entity text, occurrence text); GRANT ALL ON effects TO PUBLIC`)
	s := ledger.NewStore(owner)
	batch := items("acct", 0, 20)
	require.Equal(t, tally{completed: 20}, count(commit(t, s, runNamed("r0"), batch, ledger.ChunkOptions{})))
	sup := func(run string) ledger.ChunkOptions {
		return ledger.ChunkOptions{OnExisting: ledger.Supersede, Effect: supersedeEffect(run)}
	}
	require.Equal(t, tally{completed: 20, superseded: 20}, count(commit(t, s, runNamed("s1"), batch, sup("s1"))))
	require.Equal(t, tally{completed: 20, superseded: 20}, count(commit(t, s, runNamed("s2"), batch, sup("s2"))))
	before := ledgerSnapshot(t, owner)

	for _, chunk := range [][]ledger.Item{batch, batch[:1], batch[3:7]} {
		res := commit(t, s, runNamed("s1"), chunk, sup("s1"))
		require.Equal(t, tally{completed: len(chunk), sameRun: len(chunk)}, count(res), "s1 processed these keys already")
	}
	require.Equal(t, before, ledgerSnapshot(t, owner), "the rerun touched no ledger row")
	require.Equal(t, int64(20), scalar[int64](t, owner, `SELECT count(*) FROM effects WHERE run = 's1'`), "s1's effect ran once per key")
	require.Equal(t, int64(20), scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 's2' AND state = 'committed'`),
		"s2 still holds every key")

	// Without an effect, and through the arbiter path (a bad item makes the
	// chunk isolate its items), the same.
	bad := append([]ledger.Item{{Key: ledger.Key{Entity: "acct", Occurrence: "zz-bad"}, Payload: []byte(`{oops`)}}, batch[5:9]...)
	res := commit(t, s, runNamed("s1"), bad, ledger.ChunkOptions{OnExisting: ledger.Supersede})
	require.Equal(t, tally{completed: 4, sameRun: 4, failed: 1}, count(res))
	require.Equal(t, before, ledgerSnapshot(t, owner), "the rerun touched no ledger row")
}

// TestSupersede_ConcurrentRunsWithReruns (#20.3): two Supersede runs over the
// same 2,000 keys at once, each run twice more (reruns racing the other
// run). Each run's effect ran exactly once per key, each key has one
// committed row, each run's rows (any state) are its 2,000 keys, and every
// execution of a run reports every key completed.
func TestSupersede_ConcurrentRunsWithReruns(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	mustExec(t, owner, `CREATE TABLE effects (run text, entity text, occurrence text); GRANT ALL ON effects TO PUBLIC`)
	s := ledger.NewStore(owner)
	const n, chunkSize = 2000, 100
	batch := items("acct", 0, n)
	require.Equal(t, tally{completed: n}, count(commit(t, s, runNamed("r0"), batch, ledger.ChunkOptions{})))

	var wg sync.WaitGroup
	results := map[string][]tally{}
	var mu sync.Mutex
	for _, run := range []string{"s1", "s2"} {
		for range 3 { // three executions of each run at once: a retried pod racing the one it replaced
			wg.Go(func() {
				var total tally
				for lo := 0; lo < n; lo += chunkSize {
					c := count(commit(t, s, runNamed(run), batch[lo:lo+chunkSize],
						ledger.ChunkOptions{OnExisting: ledger.Supersede, Effect: supersedeEffect(run)}))
					total.completed += c.completed
					total.already += c.already
					total.failed += c.failed
				}
				mu.Lock()
				results[run] = append(results[run], total)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	for run, ts := range results {
		for _, c := range ts {
			require.Equal(t, tally{completed: n}, c, "run %s: every execution counts every key completed", run)
		}
		require.Equal(t, int64(n), scalar[int64](t, owner, `SELECT count(*) FROM effects WHERE run = $1`, run), "run %s: its effect once per key", run)
		require.Equal(t, int64(n), scalar[int64](t, owner, `SELECT count(DISTINCT (entity, occurrence)) FROM effects WHERE run = $1`, run))
		require.Equal(t, int64(n), scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, run), "run %s: one row per key", run)
	}
	requireOneCommittedPerKey(t, owner, n)
}

// TestAlreadyHandledCarriesItsHolder: every "already handled" verdict names
// the run of the committed row read back for it, on the fast path, on the
// arbiter path (a bad item makes the chunk isolate its items) and in a
// Supersede run; a key this run committed before names the run itself.
func TestAlreadyHandledCarriesItsHolder(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	s := ledger.NewStore(owner)
	commit(t, s, runNamed("a"), items("acct", 0, 4), ledger.ChunkOptions{})
	bad := ledger.Item{Key: ledger.Key{Entity: "acct", Occurrence: "zz-bad"}, Payload: []byte(`{oops`)}
	for _, tc := range []struct {
		name  string
		chunk []ledger.Item
		opts  ledger.ChunkOptions
		run   string
	}{
		{"fast path", items("acct", 0, 6), ledger.ChunkOptions{}, "b"},
		{"arbiter path", append(items("acct", 0, 8), bad), ledger.ChunkOptions{}, "c"},
		{"single item", items("acct", 1, 2), ledger.ChunkOptions{Effect: `SELECT 1`}, "d"},
		{"this run's own", items("acct", 0, 4), ledger.ChunkOptions{}, "a"},
		{"this run's own, effect", items("acct", 0, 4), ledger.ChunkOptions{OnExisting: ledger.Supersede, Effect: `SELECT 1`}, "a"},
	} {
		name := tc.name
		for _, r := range commit(t, s, runNamed(tc.run), tc.chunk, tc.opts) {
			switch {
			case r.Outcome == ledger.AlreadyHandled:
				require.Equal(t, ledger.HolderOtherRun, r.Holder, "%s: %s", name, r.Key)
				require.Equal(t, scalar[string](t, owner, `SELECT run_uid FROM runledger.ledger WHERE entity = $1 AND occurrence = $2 AND state = 'committed'`,
					r.Key.Entity, r.Key.Occurrence), r.HolderUID, "%s: %s names its holder's run", name, r.Key)
				require.NotEqual(t, tc.run, r.HolderUID, name)
			case r.Outcome == ledger.Completed && r.Holder == ledger.HolderSameRun:
				require.Equal(t, tc.run, r.HolderUID, "%s: %s", name, r.Key)
			case r.Outcome == ledger.Completed:
				require.Empty(t, r.HolderUID, "%s: %s claimed by this call", name, r.Key)
			}
		}
	}
}

// TestEffectReadOnlyErrorFailsItsItems: an effect that raises 25006
// (read_only_sql_transaction) itself, forged, from a deferred constraint
// trigger, or by making its own transaction read-only, fails its items:
// the session is not a standby's. (The code that closed every session
// answering 25006 at once passed this too; it failed
// TestForging_Randomized's seed 1796558331157669602, whose effect also left
// prepared statements to repair: the repair met a closed connection,
// retryably, and the chunk was retried for ever.)
func TestEffectReadOnlyErrorFailsItsItems(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	mustExec(t, owner, `
CREATE FUNCTION public.forge_read_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = 'read_only_sql_transaction';
END
$$;
GRANT EXECUTE ON FUNCTION public.forge_read_only() TO PUBLIC;
CREATE TABLE effects (entity text, occurrence text);
CREATE TABLE deferred_effects (entity text, occurrence text);
GRANT ALL ON effects, deferred_effects TO PUBLIC;
CREATE CONSTRAINT TRIGGER deferred_forge AFTER INSERT ON deferred_effects DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION public.forge_read_only()`)
	s := ledger.NewStore(owner)
	for name, effect := range map[string]string{
		"forged":    `DO $$ BEGIN RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = 'read_only_sql_transaction'; END $$`,
		"deferred":  `INSERT INTO public.deferred_effects SELECT entity, occurrence FROM claimed`,
		"read-only": `SET TRANSACTION READ ONLY; INSERT INTO public.effects SELECT entity, occurrence FROM claimed`,
	} {
		chunk := items("ro-"+name, 0, 3)
		res, err := s.CommitChunk(context.Background(), runNamed("ro-"+name), chunk, ledger.ChunkOptions{Effect: effect})
		require.NoError(t, err, "%s: the chunk ends, its items failed", name)
		require.Equal(t, tally{failed: len(chunk)}, count(res), "%s: %v", name, res)
		requireNoneHandled(t, res, name)
	}
	require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`), "nothing committed")
}

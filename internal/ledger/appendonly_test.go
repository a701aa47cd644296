package ledger_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// ledgerSnapshot is every ledger row, every column, in id order.
func ledgerSnapshot(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	return scalar[string](t, pool, `SELECT coalesce(jsonb_agg(to_jsonb(l) ORDER BY l.id), '[]')::text FROM runledger.ledger AS l`)
}

// seedHistory commits, through the insert path: run "victim" 10 keys of
// entity acct; run "old" key hist/1, which run "new" then supersedes. So the
// ledger holds committed rows of other runs and one superseded row whose key
// has a committed row again.
func seedHistory(t *testing.T, s *ledger.Store) {
	t.Helper()
	require.Equal(t, tally{completed: 10}, count(commit(t, s, runNamed("victim"), items("acct", 0, 10), ledger.ChunkOptions{})))
	hist := items("hist", 1, 2)
	require.Equal(t, tally{completed: 1}, count(commit(t, s, runNamed("old"), hist, ledger.ChunkOptions{})))
	require.Equal(t, tally{completed: 1, superseded: 1}, count(commit(t, s, runNamed("new"), hist, ledger.ChunkOptions{OnExisting: ledger.Supersede})))
}

// requireHandledStill: a later run over the seeded keys counts every one as
// already handled, by another run, and commits nothing.
func requireHandledStill(t *testing.T, s *ledger.Store, pool *pgxpool.Pool) {
	t.Helper()
	before := ledgerSnapshot(t, pool)
	keys := append(items("acct", 0, 10), items("hist", 1, 2)...)
	res := commit(t, s, runNamed("later"), keys, ledger.ChunkOptions{})
	require.Equal(t, tally{already: 11}, count(res), "a later run still counts the keys as handled")
	for _, r := range res {
		require.Equal(t, ledger.HolderOtherRun, r.Holder)
	}
	require.Equal(t, before, ledgerSnapshot(t, pool), "the later run wrote nothing")
}

// requirePgError asserts that err is PostgreSQL's error with code and a
// message containing msg.
func requirePgError(t *testing.T, err error, code, msg string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, code, pgErr.Code, "SQLSTATE of %v", err)
	require.Contains(t, pgErr.Message, msg)
	require.Equal(t, code == "23001", ledger.IsAppendOnlyViolation(err), "IsAppendOnlyViolation(%v)", err)
}

// Effects that would undo the guarantee: each touches ledger rows that
// other runs (or this chunk) committed.
var hostileEffects = []struct {
	name, sql string
	// byWorker is what refuses it to a worker login (`migrate --grant-to`):
	// its privileges (42501) or the trigger (23001).
	byWorker string
}{
	{"delete another run's rows", `DELETE FROM runledger.ledger WHERE run_uid = 'victim'`, "42501"},
	{"delete the chunk's own rows", `DELETE FROM runledger.ledger AS l USING claimed AS c WHERE l.entity = c.entity AND l.occurrence = c.occurrence`, "42501"},
	{"re-key a committed row", `UPDATE runledger.ledger SET entity = 'moved' WHERE run_uid = 'victim'`, "42501"},
	{"move a committed row to another run", `UPDATE runledger.ledger SET run_uid = 'mine' WHERE run_uid = 'victim'`, "42501"},
	{"supersede and rewrite the payload", `UPDATE runledger.ledger SET state = 'superseded', superseded_at = now(), payload = '{}' WHERE run_uid = 'victim'`, "42501"},
	{"supersede another run's rows", `UPDATE runledger.ledger SET state = 'superseded', superseded_at = now() WHERE run_uid = 'victim'`, "23001"},
	{"resurrect a superseded row", `UPDATE runledger.ledger SET state = 'committed', superseded_at = NULL WHERE state = 'superseded'`, "23001"},
	{"rewrite a superseded row's time", `UPDATE runledger.ledger SET superseded_at = now() - interval '1 day' WHERE state = 'superseded'`, "23001"},
	{"truncate the ledger", `TRUNCATE runledger.ledger`, "42501"},
	// Superseded then restored, another run's row is a row version this
	// transaction wrote, yet not a row it inserted: take_back must not
	// delete it (a forged replacement would satisfy the deferred check).
	{"supersede, restore and take back another run's rows", `UPDATE runledger.ledger SET state = 'superseded', superseded_at = now() WHERE run_uid = 'victim';
SELECT set_config('runledger.take_back', 'on', true);
UPDATE runledger.ledger SET state = 'committed', superseded_at = NULL WHERE run_uid = 'victim' AND state = 'superseded';
SELECT runledger.ledger_take_back(array_agg(entity), array_agg(occurrence), '{}') FROM runledger.ledger WHERE run_uid = 'victim';
INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
SELECT 'acct', 'occ-' || lpad(i::text, 6, '0'), 'default', 'victim', 'victim', 0, 0 FROM generate_series(0, 9) AS i`, "23001"},
}

// TestAppendOnly_HostileEffect: an effect that deletes, re-keys, resurrects
// or truncates ledger rows fails every item of its chunk with PostgreSQL's
// error (not "already handled"), commits nothing, leaves every ledger row as
// it was, and a later run still counts the keys as handled. It holds for a
// worker login granted by GrantWorker and for the table's owner (here a
// superuser): the effect runs as the effect role, whom PostgreSQL refuses
// the schema itself (42501); the trigger stops the logins themselves
// (TestAppendOnly_DirectStatements).
func TestAppendOnly_HostileEffect(t *testing.T) {
	t.Parallel()
	for _, tt := range hostileEffects {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			owner := newPool(t)
			worker, _ := workerRole(t, owner)
			for _, who := range []struct {
				name, code string
				pool       *pgxpool.Pool
			}{{"worker", "42501", worker}, {"owner", "42501", owner}} {
				t.Run(who.name, func(t *testing.T) {
					s := ledger.NewStore(who.pool)
					if scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`) == 0 {
						seedHistory(t, s)
					}
					before := ledgerSnapshot(t, owner)

					chunk := items("mal", 0, 4)
					res := commit(t, s, runNamed("attacker-"+who.name), chunk, ledger.ChunkOptions{Effect: tt.sql})
					require.Equal(t, tally{failed: 4}, count(res), "every item of the chunk fails")
					for _, r := range res {
						require.Equal(t, ledger.Failed, r.Outcome)
						requirePgError(t, r.Err, who.code, "permission denied for schema runledger")
					}
					require.Equal(t, before, ledgerSnapshot(t, owner), "every ledger row is untouched, none added")
					requireHandledStill(t, s, owner)
				})
			}
		})
	}
}

// TestAppendOnly_DirectStatements: the same statements sent by a login
// outside any effect fail, and change nothing. A worker login granted too
// much (DELETE, UPDATE of every column) is still refused by the trigger; the
// owner may delete a superseded row (pruning history) and nothing else.
func TestAppendOnly_DirectStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := newPool(t)
	worker, role := workerRole(t, owner)
	s := ledger.NewStore(worker)
	seedHistory(t, s)
	before := ledgerSnapshot(t, owner)

	refused := func(pool *pgxpool.Pool, code, msg string) {
		t.Helper()
		for _, tt := range hostileEffects {
			if strings.Contains(tt.sql, "claimed") {
				continue // the effect's table: there is none outside an effect
			}
			_, err := pool.Exec(ctx, tt.sql)
			require.Error(t, err, tt.name)
			if code == "" { // the worker's own grants: as the effect table says
				requirePgError(t, err, tt.byWorker, map[string]string{"42501": "permission denied", "23001": "runledger.ledger is append-only"}[tt.byWorker])
			} else {
				requirePgError(t, err, code, msg)
			}
		}
		_, err := pool.Exec(ctx, `UPDATE runledger.ledger SET payload = '{"amount": 0}' WHERE run_uid = 'victim'`)
		if code == "" {
			requirePgError(t, err, "42501", "permission denied")
		} else {
			requirePgError(t, err, code, msg)
		}
		// Deleting the superseded row: history, but not the worker's to prune.
		_, err = pool.Exec(ctx, `DELETE FROM runledger.ledger WHERE state = 'superseded'`)
		if code == "" {
			requirePgError(t, err, "42501", "permission denied")
		} else {
			requirePgError(t, err, code, msg)
		}
		require.Equal(t, before, ledgerSnapshot(t, owner), "every ledger row is untouched")
	}
	refused(worker, "", "")

	// Granted too much by hand: the trigger still refuses every change.
	mustExec(t, owner, `GRANT DELETE, TRUNCATE, UPDATE ON runledger.ledger TO `+role)
	refused(worker, "23001", "runledger.ledger is append-only")
	mustExec(t, owner, `REVOKE DELETE, TRUNCATE, UPDATE ON runledger.ledger FROM `+role)

	// The owner: the same, except that a superseded row may be deleted.
	for _, tt := range hostileEffects {
		if strings.Contains(tt.sql, "claimed") {
			continue
		}
		_, err := owner.Exec(ctx, tt.sql)
		requirePgError(t, err, "23001", "runledger.ledger is append-only")
	}
	_, err := owner.Exec(ctx, `DELETE FROM runledger.ledger WHERE state = 'committed' AND entity = 'hist'`)
	requirePgError(t, err, "23001", "DELETE of the committed row")
	require.Equal(t, before, ledgerSnapshot(t, owner))
	requireHandledStill(t, s, owner)

	tag, err := owner.Exec(ctx, `DELETE FROM runledger.ledger WHERE state = 'superseded'`)
	require.NoError(t, err, "the owner prunes history")
	require.EqualValues(t, 1, tag.RowsAffected())
	requireHandledStill(t, s, owner) // the key's committed row is what counts
	requireOneCommittedPerKey(t, owner, 11)
}

// TestAppendOnly_SupersedeStillWorks: the one change the triggers allow is
// the insert path's own supersede, through a worker login, also when bad
// items are isolated.
func TestAppendOnly_SupersedeStillWorks(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, role := workerRole(t, owner)
	s := ledger.NewStore(worker)
	require.Equal(t, tally{completed: 5}, count(commit(t, s, runNamed("a"), items("acct", 0, 5), ledger.ChunkOptions{})))
	res := commit(t, s, runNamed("b"), items("acct", 0, 5), ledger.ChunkOptions{OnExisting: ledger.Supersede, Effect: `SELECT 1`})
	require.Equal(t, tally{completed: 5, superseded: 5}, count(res))
	require.EqualValues(t, 5, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE state = 'superseded' AND run_uid = 'a'`))
	requireOneCommittedPerKey(t, owner, 5)

	// With items the effect refuses: isolating them supersedes and inserts
	// under one savepoint after another in one transaction, each checked
	// right after its effect.
	mustExec(t, owner, `CREATE TABLE notes (account text NOT NULL CHECK (account NOT LIKE 'nobody-%'), occurrence text PRIMARY KEY);
GRANT INSERT ON notes TO `+role)
	chunk := noteItems(10, 3, 7)
	require.Equal(t, tally{completed: 10}, count(commit(t, s, runNamed("c"), chunk, ledger.ChunkOptions{})))
	res = commit(t, s, runNamed("d"), chunk, ledger.ChunkOptions{OnExisting: ledger.Supersede, Effect: noteEffect})
	require.Equal(t, tally{completed: 8, superseded: 8, failed: 2}, count(res))
	for _, i := range []int{3, 7} {
		require.ErrorContains(t, res[i].Err, `violates check constraint "notes_account_check"`)
		require.Equal(t, 1, countRows(t, owner, chunk[i].Entity, chunk[i].Occurrence, "committed"), "run c's row still holds a failed item's key")
	}
	require.EqualValues(t, 8, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed' AND run_uid = 'd'`))
	requireOneCommittedPerKey(t, owner, 15)
}

// TestAppendOnly_EffectCannotTakeBackItsClaims: ledger_take_back (a
// processor's refused items) may delete rows of the calling transaction, so an
// effect that called it on its own chunk's claims could commit its own writes
// and leave the keys free for a later run to process again. The effect runs
// in its sandbox, whose role may not call it (nor name anything in schema
// runledger), whoever the worker's login is: the items fail, nothing
// commits, and a later run still counts the seeded keys.
func TestAppendOnly_EffectCannotTakeBackItsClaims(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	mustExec(t, owner, `CREATE TABLE effects (entity text, occurrence text)`)
	const takeBack = `INSERT INTO effects SELECT entity, occurrence FROM claimed;
SELECT runledger.ledger_take_back(array_agg(entity), array_agg(occurrence), '{}') FROM claimed`
	asWorkerThenOwner(t, owner, worker, func(t *testing.T, who string, s *ledger.Store) {
		before := ledgerSnapshot(t, owner)
		res := commit(t, s, runNamed("taker-"+who), items("mal-"+who, 0, 4), ledger.ChunkOptions{Effect: takeBack})
		require.Equal(t, tally{failed: 4}, count(res), "every item of the chunk fails")
		for _, r := range res {
			require.ErrorContains(t, r.Err, "permission denied for schema runledger")
		}
		require.Equal(t, before, ledgerSnapshot(t, owner), "every ledger row is untouched, none added")
		require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM effects`), "the effect's writes rolled back with the claims")
		requireHandledStill(t, s, owner)
	})
}

// TestAppendOnly_EffectCannotWriteTheLedger: an effect that inserts into the
// ledger, a key another run committed or one nobody did, is refused by
// PostgreSQL (its role has no privilege on schema runledger). Its items
// fail, never "already handled" (nothing committed them), and a later run
// may still commit them.
func TestAppendOnly_EffectCannotWriteTheLedger(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	const forge = `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
VALUES ('acct', 'occ-000000', 'default', 'forged', 'forged', 0, 0)`
	asWorkerThenOwner(t, owner, worker, func(t *testing.T, who string, s *ledger.Store) {
		before := ledgerSnapshot(t, owner)
		for _, chunk := range [][]ledger.Item{items("rule-"+who, 0, 4), items("rule1-"+who, 0, 1)} {
			res := commit(t, s, runNamed("forger-"+who), chunk, ledger.ChunkOptions{Effect: forge})
			require.Equal(t, tally{failed: len(chunk)}, count(res), "every item of the chunk fails")
			for _, r := range res {
				require.False(t, ledger.IsExpectedBusinessKeyConflict(r.Err), "not the item's own conflict: %v", r.Err)
				require.ErrorContains(t, r.Err, "permission denied for schema runledger")
			}
		}
		require.Equal(t, before, ledgerSnapshot(t, owner), "every ledger row is untouched, none added")
		res := commit(t, s, runNamed("honest-"+who), items("rule-"+who, 0, 4), ledger.ChunkOptions{})
		require.Equal(t, tally{completed: 4}, count(res), "nothing committed the keys: a later run does")
	})
}

// asWorkerThenOwner runs fn as a subtest per role, a worker login granted by
// GrantWorker and then the table's owner (a superuser, whom only the trigger
// stops), on a ledger holding seedHistory's rows.
func asWorkerThenOwner(t *testing.T, owner, worker *pgxpool.Pool, fn func(t *testing.T, who string, s *ledger.Store)) {
	t.Helper()
	for _, role := range []struct {
		name string
		pool *pgxpool.Pool
	}{{"worker", worker}, {"owner", owner}} {
		t.Run(role.name, func(t *testing.T) {
			s := ledger.NewStore(role.pool)
			if scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`) == 0 {
				seedHistory(t, s)
			}
			fn(t, role.name, s)
		})
	}
}

package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// forgeLater is SQL that inserts committed ledger rows for keys later(0..3),
// under an invented run: had it committed, a later chunk of those keys would
// be "already handled" although nobody processed them.
const forgeLater = `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
SELECT 'later', 'occ-' || lpad(i::text, 6, '0'), 'default', 'invented', 'invented', 0, 0 FROM generate_series(0, 3) AS i`

// requireNotForged: the chunk's items failed with want in their error,
// nothing of it committed, and a later chunk of the keys the user code tried
// to forge commits them as this run's (counts = ledger).
func requireNotForged(t *testing.T, owner *pgxpool.Pool, s *ledger.Store, res []ledger.Result, want string) {
	t.Helper()
	require.Equal(t, tally{failed: len(res)}, count(res), "every item of the chunk fails")
	for _, r := range res {
		require.False(t, ledger.IsExpectedBusinessKeyConflict(r.Err), "never the item's own conflict: %v", r.Err)
		require.ErrorContains(t, r.Err, want)
	}
	require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'invented'`), "nothing forged")
	require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE entity = 'mal'`), "nothing of the chunk committed")
	later := commit(t, s, runNamed("honest"), items("later", 0, 4), ledger.ChunkOptions{})
	require.Equal(t, tally{completed: 4}, count(later), "the later keys are completed by the run that processes them")
	require.EqualValues(t, 4, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'honest' AND state = 'committed'`))
}

// TestSandbox_EffectCannotForgeLaterKeys: an effect that inserts committed
// rows under an invented run. On the old code (the effect ran as the login,
// which may INSERT into the ledger) the later keys became already handled.
func TestSandbox_EffectCannotForgeLaterKeys(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	asWorkerThenOwner(t, owner, worker, func(t *testing.T, who string, s *ledger.Store) {
		res := commit(t, s, runNamed("forger-"+who), items("mal", 0, 4), ledger.ChunkOptions{Effect: forgeLater})
		requireNotForged(t, owner, s, res, "permission denied for schema runledger")
		mustExec(t, owner, `SET session_replication_role = replica; DELETE FROM runledger.ledger WHERE entity = 'later'; RESET session_replication_role`)
	})
}

// TestSandbox_DeferredTriggerCannotForge: a deferred constraint trigger of a
// table the effect writes fires inside the sandbox, as the effect role. On
// the old code it fired at the insert path's SET CONSTRAINTS ALL IMMEDIATE,
// as the login. And a trigger that re-defers a constraint from there, so that
// another fires at COMMIT as the login, is refused there (no statement
// issued from inside a trigger writes the ledger).
func TestSandbox_DeferredTriggerCannotForge(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	mustExec(t, owner, `
CREATE TABLE sink (entity text, occurrence text);
CREATE TABLE relay (x int);
CREATE FUNCTION forge() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+forgeLater+`; RETURN NULL; END $$;
CREATE FUNCTION redefer() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN SET CONSTRAINTS ALL DEFERRED; INSERT INTO relay VALUES (1); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER forge AFTER INSERT ON relay DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION forge()`)
	for _, tt := range []struct{ name, trigger, want string }{
		{"forges when it fires", `forge`, "permission denied for schema runledger"},
		{"re-defers to COMMIT", `redefer`, "from inside a trigger refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mustExec(t, owner, `DROP TRIGGER IF EXISTS deferred ON sink;
CREATE CONSTRAINT TRIGGER deferred AFTER INSERT ON sink DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+tt.trigger+`()`)
			for _, p := range []*pgxpool.Pool{worker, owner} {
				s := ledger.NewStore(p)
				res := commit(t, s, runNamed("forger"), items("mal", 0, 4), ledger.ChunkOptions{Effect: `INSERT INTO sink SELECT entity, occurrence FROM claimed`})
				requireNotForged(t, owner, s, res, tt.want)
				require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM sink`))
				mustExec(t, owner, `SET session_replication_role = replica; DELETE FROM runledger.ledger WHERE entity = 'later'; RESET session_replication_role`)
			}
		})
	}
}

// TestSandbox_ClaimedCarriesNoUserState: the effect may not give the
// session's table "claimed" a trigger, rule or policy, nor change its
// columns (the login owns it; the effect role may only read it); nor put a
// table of its own in its place (DISCARD TEMP drops the login's too): the
// chunk fails, nothing commits, and the next chunk on the same session
// claims through the login's own table. On the old code the effect ran as
// the table's owner, and a trigger it installed fired inside the next
// chunk's claim.
func TestSandbox_ClaimedCarriesNoUserState(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	mustExec(t, owner, `CREATE FUNCTION forge() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+forgeLater+`; RETURN NULL; END $$`)
	for _, tt := range []struct{ name, effect, want string }{
		{"trigger", `CREATE TRIGGER forge AFTER INSERT ON claimed FOR EACH STATEMENT EXECUTE FUNCTION public.forge()`, "permission denied for table claimed"},
		{"rule", `CREATE RULE forge AS ON INSERT TO claimed DO ALSO SELECT 1`, "must be owner of table claimed"},
		{"policy", `ALTER TABLE claimed ENABLE ROW LEVEL SECURITY`, "must be owner of table claimed"},
		{"column", `ALTER TABLE claimed ADD COLUMN extra int DEFAULT 1`, "must be owner of table claimed"},
		{"drop", `DROP TABLE claimed`, "must be owner of table claimed"},
		{"a table of its own", `DISCARD TEMP; CREATE TEMP TABLE claimed (entity text, occurrence text, payload jsonb);
CREATE TRIGGER forge AFTER INSERT ON pg_temp.claimed FOR EACH STATEMENT EXECUTE FUNCTION public.forge()`, "no longer the worker's own"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range []*pgxpool.Pool{worker, owner} {
				one := poolWith(t, p, map[string]string{"pool_max_conns": "1"}) // every chunk on the same session
				s := ledger.NewStore(one)
				res := commit(t, s, runNamed("forger"), items("mal", 0, 4), ledger.ChunkOptions{Effect: tt.effect})
				require.Equal(t, tally{failed: 4}, count(res))
				for _, r := range res {
					require.ErrorContains(t, r.Err, tt.want)
				}
				next := commit(t, s, runNamed("next"), items("later", 0, 4), ledger.ChunkOptions{Effect: `SELECT count(*) FROM claimed`})
				require.Equal(t, tally{completed: 4}, count(next), "the next chunk claims through the login's own table")
				require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'invented'`), "nothing forged")
				mustExec(t, owner, `SET session_replication_role = replica; DELETE FROM runledger.ledger WHERE entity = 'later'; RESET session_replication_role`)
			}
		})
	}
}

// TestSandbox_PreparedStatementClosesTheSession: an effect that PREPAREs a
// statement (which could take the name of one the driver prepared, and run
// as the login) fails its chunk, and the session is closed: the next chunk
// runs on a new one.
func TestSandbox_PreparedStatementClosesTheSession(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	one := poolWith(t, worker, map[string]string{"pool_max_conns": "1"})
	s := ledger.NewStore(one)
	pid := scalar[int32](t, one, `SELECT pg_backend_pid()`)
	res := commit(t, s, runNamed("forger"), items("mal", 0, 4), ledger.ChunkOptions{Effect: `PREPARE stand_in AS SELECT 1`})
	require.Equal(t, tally{failed: 4}, count(res))
	for _, r := range res {
		require.ErrorIs(t, r.Err, ledger.ErrEffectSandbox)
	}
	require.NotEqual(t, pid, scalar[int32](t, one, `SELECT pg_backend_pid()`), "the session was closed")
	require.Zero(t, scalar[int64](t, one, `SELECT count(*) FROM pg_prepared_statements WHERE from_sql`))
	require.Equal(t, tally{completed: 4}, count(commit(t, s, runNamed("next"), items("later", 0, 4), ledger.ChunkOptions{Effect: `SELECT 1`})))
}

// TestSandbox_RefusedWithoutIt: a ledger whose effect sandbox is missing or
// would not keep the effect out (its function still the migrator's, or its
// role privileged) runs no effect at all: PrepareEffect and CommitChunk
// fail with ErrNoEffectSandbox, naming the command that sets it up, and
// nothing commits.
func TestSandbox_RefusedWithoutIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tt := range []struct{ name, sql, want string }{
		{"not given to an effect role", `ALTER FUNCTION runledger.run_effect(text) OWNER TO CURRENT_USER`, "the ledger's owner"},
		{"a role with the schema", `GRANT USAGE ON SCHEMA runledger TO runledger_effect`, "privilege on schema runledger"},
		{"not security definer", `ALTER FUNCTION runledger.run_effect(text) SECURITY INVOKER`, "not SECURITY DEFINER"},
		{"missing", `DROP FUNCTION runledger.run_effect(text)`, "does not exist"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			owner := newPool(t)
			mustExec(t, owner, tt.sql)
			s := ledger.NewStore(owner)
			err := s.PrepareEffect(ctx, `SELECT 1`)
			require.ErrorIs(t, err, ledger.ErrNoEffectSandbox)
			require.ErrorContains(t, err, "runledger migrate --grant-to WORKER --effect-role ROLE")
			require.ErrorContains(t, err, tt.want)
			_, err = s.CommitChunk(ctx, runNamed("a"), items("acct", 0, 3), ledger.ChunkOptions{Effect: `SELECT 1`})
			require.ErrorIs(t, err, ledger.ErrNoEffectSandbox)
			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger`))
		})
	}
}

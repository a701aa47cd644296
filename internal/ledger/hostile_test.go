package ledger_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestFixQueryBatch_QueryCannotHideItsWrites: a batch query runs as the
// worker's login, which may insert into the ledger; only the write check
// stands between it and forged rows. A function the query calls that first
// creates a temporary table named like the statistics view the check reads
// (pg_temp is searched before pg_catalog unless the path names it) and then
// inserts committed ledger rows under an invented run is still caught: the
// batch is refused, nothing is forged, and a later run commits those keys.
// On the old code the check read the empty temporary table, the forged rows
// committed with the batch, and the keys were "already handled".
func TestFixQueryBatch_QueryCannotHideItsWrites(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	mustExec(t, owner, batchSource+`
CREATE FUNCTION hide() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('pg_temp.pg_stat_xact_all_tables') IS NULL THEN -- once per query, not per row
        CREATE TEMP TABLE pg_stat_xact_all_tables (relid oid, schemaname name, relname name,
            n_tup_ins bigint, n_tup_upd bigint, n_tup_del bigint);
        `+forgeLater+`;
    END IF;
    RETURN 1;
END $$;
GRANT SELECT ON src TO PUBLIC`)
	for _, p := range []*pgxpool.Pool{worker, owner} {
		s := ledger.NewStore(p)
		for _, q := range bothWays(batchQuery()) {
			q.SQL = `SELECT entity, occurrence, payload FROM src WHERE hide() = 1`
			_, err := s.FixQueryBatch(context.Background(), runNamed("hider"), q)
			require.ErrorIs(t, err, ledger.ErrBatchQuery, "copied: %v", q.Copy)
			var w *ledger.ForeignWriteError
			require.ErrorAs(t, err, &w)
			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'invented'`), "nothing forged")
			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.batch_run`), "no batch")
		}
	}
	later := commit(t, ledger.NewStore(worker), runNamed("honest"), items("later", 0, 4), ledger.ChunkOptions{})
	require.Equal(t, tally{completed: 4}, count(later), "the later keys are completed by the run that processes them")
}

// atCommitAsLogin is an effect that needs nothing but the TEMP privilege:
// in its own temporary tables it sets up a deferred constraint trigger that
// re-defers a second one, which then fires at COMMIT, outside the sandbox,
// as the worker's login, the owner of the session's table "claimed". There
// it gives "claimed" a shape (reshape) whose SQL the login's next claim on
// that session runs at trigger depth 0, where the login may insert into the
// ledger. prelude runs first, as the effect role.
func atCommitAsLogin(prelude, reshape string) string {
	return prelude + `CREATE FUNCTION pg_temp.forge() RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    IF pg_catalog.pg_trigger_depth() = 0 THEN
        INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
        SELECT 'later', 'occ-' || lpad(i::text, 6, '0'), 'default', 'invented', 'invented', 0, 0 FROM generate_series(0, 3) AS i
        ON CONFLICT (entity, occurrence) WHERE state = 'committed' DO NOTHING;
    END IF;
    RETURN true;
END $f$;
CREATE FUNCTION pg_temp.forge_text(x text) RETURNS text LANGUAGE plpgsql AS $f$ BEGIN PERFORM pg_temp.forge(); RETURN x; END $f$;
CREATE FUNCTION pg_temp.forge_immutable(x text) RETURNS text LANGUAGE sql IMMUTABLE AS $f$ SELECT pg_temp.forge_text(x) $f$;
CREATE FUNCTION pg_temp.reshape() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN ` + reshape + `; RETURN NULL; END $f$;
CREATE FUNCTION pg_temp.redefer() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN SET CONSTRAINTS ALL DEFERRED; INSERT INTO pg_temp.relay VALUES (1); RETURN NULL; END $f$;
CREATE TEMP TABLE sink (x int);
CREATE TEMP TABLE relay (x int);
CREATE CONSTRAINT TRIGGER redefer AFTER INSERT ON pg_temp.sink DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.redefer();
CREATE CONSTRAINT TRIGGER reshape AFTER INSERT ON pg_temp.relay DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.reshape();
INSERT INTO pg_temp.sink VALUES (1)`
}

// TestSandbox_CommitTimeTriggerCannotReshapeClaimed: whatever a trigger
// that fires at COMMIT as the login does to the session's table "claimed"
// (a CHECK constraint, a column with a default, a domain, an expression
// index, a cast into a type of its own, a table of its own in its place),
// the next chunk on the session does not run it: nothing is forged and the
// later keys are completed by the run that processes them. On the old code
// the check after COMMIT looked at the table's owner, triggers, rules and
// policy only, the next claim ran the login's forge at depth 0 and the later
// keys were "already handled" by an invented run.
func TestSandbox_CommitTimeTriggerCannotReshapeClaimed(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	// An operator of the effect role's that says every int2 equals every
	// int4 (the check compares relchecks, an int2, to 0), and a trigger at
	// COMMIT that puts it before the catalog's on the session's path.
	const lie = `CREATE FUNCTION public.yes(int2, int4) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR public.= (LEFTARG = int2, RIGHTARG = int4, FUNCTION = public.yes);
GRANT EXECUTE ON FUNCTION public.yes(int2, int4) TO PUBLIC;
`
	for _, tt := range []struct{ name, prelude, reshape string }{
		{"check constraint", "", `ALTER TABLE pg_temp.claimed ADD CONSTRAINT forge CHECK (pg_temp.forge()) NOT VALID`},
		{"check constraint, an operator of its own on the session's path", lie,
			`PERFORM pg_catalog.set_config('search_path', 'public, pg_catalog', false); ALTER TABLE pg_temp.claimed ADD CONSTRAINT forge CHECK (pg_temp.forge()) NOT VALID`},
		{"column with a default", "", `ALTER TABLE pg_temp.claimed ADD COLUMN forged boolean DEFAULT pg_temp.forge()`},
		{"domain", "", `CREATE DOMAIN pg_temp.forging AS text CHECK (pg_temp.forge()); ALTER TABLE pg_temp.claimed ALTER COLUMN entity TYPE pg_temp.forging`},
		{"expression index", "", `CREATE INDEX ON pg_temp.claimed (pg_temp.forge_immutable(entity))`},
		{"a table of its own", "", `DROP TABLE pg_temp.claimed; CREATE TEMP TABLE claimed (entity text NOT NULL CHECK (pg_temp.forge()), occurrence text NOT NULL, payload jsonb) ON COMMIT DELETE ROWS;
GRANT SELECT ON pg_temp.claimed TO PUBLIC`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mustExec(t, owner, `SET session_replication_role = replica; DELETE FROM runledger.ledger; RESET session_replication_role`)
			one := poolWith(t, worker, map[string]string{"pool_max_conns": "1"}) // every chunk on the same session
			s := ledger.NewStore(one)
			first := commit(t, s, runNamed("forger"), items("mal", 0, 4), ledger.ChunkOptions{Effect: atCommitAsLogin(tt.prelude, tt.reshape)})
			requireNoneHandled(t, first, "the reshaping chunk")
			next := commit(t, s, runNamed("next"), items("next", 0, 4), ledger.ChunkOptions{Effect: `SELECT count(*) FROM claimed`})
			require.Equal(t, tally{completed: 4}, count(next), "the next chunk claims through a table of the ledger's shape: %v", next)
			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'invented'`), "nothing forged")
			later := commit(t, s, runNamed("honest"), items("later", 0, 4), ledger.ChunkOptions{Effect: `SELECT count(*) FROM claimed`})
			require.Equal(t, tally{completed: 4}, count(later), "the later keys are completed by the run that processes them")
		})
	}
}

// forgeFn is a function of the effect role's, in its temporary schema, that
// inserts committed ledger rows for keys later(0..3) under an invented run,
// once (it answers true).
const forgeFn = `CREATE FUNCTION pg_temp.forge() RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
    SELECT 'later', 'occ-' || lpad(i::text, 6, '0'), 'default', 'invented', 'invented', 0, 0 FROM generate_series(0, 3) AS i
    ON CONFLICT (entity, occurrence) WHERE state = 'committed' DO NOTHING;
    RETURN true;
END $f$;
`

// TestSandbox_HoldableCursorDoesNotRunAsLogin: PostgreSQL runs a cursor
// declared WITH HOLD to its end while the transaction commits, outside the
// sandbox and outside any trigger, as the login. An effect (or a trigger it
// leaves to fire at COMMIT, or a batch query's function) that declares one
// over a function that inserts committed ledger rows forges nothing: the
// chunk's items fail (or the batch is refused), nothing of it commits, and
// the later keys are completed by the run that processes them. On the old
// code the forged rows committed with the chunk (or the batch).
func TestSandbox_HoldableCursorDoesNotRunAsLogin(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	const declare = `DECLARE forging CURSOR WITH HOLD FOR SELECT pg_temp.forge()`
	// A trigger re-deferred to COMMIT on a temporary table of the effect's
	// is refused before COMMIT (#43): the temporary objects an effect
	// leaves are dropped right after it, and a table with trigger events
	// pending cannot be.
	const pendingAtCommit = "a trigger left to fire at COMMIT"
	for _, tt := range []struct{ name, effect, want string }{
		{"declared by the effect", forgeFn + declare, "WITH HOLD"},
		{"declared at COMMIT by a trigger it re-deferred", atCommitAsLogin("", `EXECUTE '`+declare+`'`), pendingAtCommit},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mustExec(t, owner, `SET session_replication_role = replica; DELETE FROM runledger.ledger; RESET session_replication_role`)
			one := poolWith(t, worker, map[string]string{"pool_max_conns": "1"})
			s := ledger.NewStore(one)
			res := commit(t, s, runNamed("forger"), items("mal", 0, 4), ledger.ChunkOptions{Effect: tt.effect})
			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'invented'`), "nothing forged")
			requireNotForged(t, owner, s, res, tt.want)
		})
	}
	t.Run("erasing failure records at COMMIT", func(t *testing.T) {
		mustExec(t, owner, `INSERT INTO runledger.item_failure (run_uid, entity, occurrence, run_namespace, run_name, shard, attempt, pass, chunk, items, class, error)
VALUES ('earlier', 'acct', 'o', 'default', 'earlier', 0, 0, 'p', 0, 1, 'input', 'a failure to keep')`)
		erase := `CREATE FUNCTION pg_temp.erase() RETURNS boolean LANGUAGE plpgsql AS $f$ BEGIN DELETE FROM runledger.item_failure; RETURN true; END $f$;
`
		s := ledger.NewStore(poolWith(t, worker, map[string]string{"pool_max_conns": "1"}))
		res := commit(t, s, runNamed("eraser"), items("mal", 0, 4), ledger.ChunkOptions{
			Effect: atCommitAsLogin(erase, `EXECUTE 'DECLARE erasing CURSOR WITH HOLD FOR SELECT pg_temp.erase()'`)})
		require.EqualValues(t, 1, scalar[int64](t, owner, `SELECT count(*) FROM runledger.item_failure`), "the failure record stays")
		require.Equal(t, tally{failed: 4}, count(res))
		for _, r := range res {
			require.ErrorContains(t, r.Err, pendingAtCommit)
		}
	})
	t.Run("declared by a batch query's function", func(t *testing.T) {
		mustExec(t, owner, `SET session_replication_role = replica; DELETE FROM runledger.ledger; RESET session_replication_role`)
		mustExec(t, owner, batchSource+`GRANT SELECT ON src TO PUBLIC;
CREATE FUNCTION public.forge() RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
    SELECT 'later', 'occ-' || lpad(i::text, 6, '0'), 'default', 'invented', 'invented', 0, 0 FROM generate_series(0, 3) AS i
    ON CONFLICT (entity, occurrence) WHERE state = 'committed' DO NOTHING;
    RETURN true;
END $f$;
CREATE FUNCTION public.declare_forging() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_cursors WHERE name = 'forging') THEN
        EXECUTE 'DECLARE forging CURSOR WITH HOLD FOR SELECT public.forge()';
    END IF;
    RETURN 1;
END $f$`)
		for _, p := range []*pgxpool.Pool{worker, owner} {
			s := ledger.NewStore(poolWith(t, p, map[string]string{"pool_max_conns": "1"}))
			q := batchQuery()
			q.SQL = `SELECT entity, occurrence, payload FROM src WHERE declare_forging() = 1`
			_, err := s.FixQueryBatch(context.Background(), runNamed("cursor"), q)
			require.ErrorIs(t, err, ledger.ErrBatchQuery)
			require.ErrorContains(t, err, "WITH HOLD")
			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'invented'`), "nothing forged")
			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.batch_run`), "no batch")
		}
	})
}

// TestFixQueryBatch_KeysDoNotFollowTheSessionsFormats: a query's key
// columns become text in the batch; that text must not depend on the
// session's output settings, or two values become one key (float8 under
// extra_float_digits = 0: 0.3 and 0.1 + 0.2 both '0.3', the second then
// "already handled") and the same value becomes another key in a session
// set otherwise (a date under DateStyle 'SQL, DMY', an interval under
// IntervalStyle 'sql_standard'), processed again by the next run. On the
// old code the batch held what the session's settings printed.
func TestFixQueryBatch_KeysDoNotFollowTheSessionsFormats(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "gives the session its output formats as startup options, which PgBouncer refuses (the batch sets its own either way)")
	owner := newPool(t)
	mustExec(t, owner, `CREATE TABLE typed (f float8, d date, i interval);
INSERT INTO typed VALUES (0.3, '2024-06-01', '1 day 2 hours'), (0.1::float8 + 0.2::float8, '2024-06-01', '1 day 2 hours')`)
	odd := poolWith(t, owner, map[string]string{"options": "'-c extra_float_digits=0 -c DateStyle=SQL,DMY -c IntervalStyle=sql_standard'"})
	require.Equal(t, "0.3", scalar[string](t, odd, `SELECT (0.1::float8 + 0.2::float8)::text`), "the session prints floats rounded")
	s := ledger.NewStore(odd)
	for _, tt := range []struct {
		uid, sql string
		copied   bool
	}{
		{"floats", `SELECT f AS entity, 'o' AS occurrence FROM typed`, false},
		{"dates", `SELECT d AS entity, i AS occurrence FROM typed LIMIT 1`, false},
		{"floats-copied", `SELECT f AS entity, 'o' AS occurrence FROM typed`, true},
		{"dates-copied", `SELECT d AS entity, i AS occurrence FROM typed LIMIT 1`, true},
	} {
		q := ledger.BatchQuery{SQL: tt.sql, Shards: 1, Copy: tt.copied}
		_, err := s.FixQueryBatch(context.Background(), runNamed(tt.uid), q)
		require.NoError(t, err, tt.uid)
	}
	keys := func(uid string) []string {
		rows, err := owner.Query(context.Background(), `SELECT e || '/' || o FROM runledger.batch AS b JOIN runledger.batch_run AS r ON r.id = b.batch_id,
    unnest(b.entities, b.occurrences) AS u(e, o) WHERE r.run_uid = $1 ORDER BY 1`, uid)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	for _, suffix := range []string{"", "-copied"} {
		require.Equal(t, []string{"0.3/o", "0.30000000000000004/o"}, keys("floats"+suffix), "two values, two keys")
		require.Equal(t, []string{"2024-06-01/1 day 02:00:00"}, keys("dates"+suffix), "the text of a session with the server's defaults")
	}
}

// TestSandbox_CommitTimeTriggerLeavesNoSettings: a trigger an effect left
// to fire at COMMIT runs as the login outside the sandbox and may set the
// session's settings for good (set_config(..., false)). None of them
// reaches the next chunk on the session: not client_encoding (LATIN1 would
// make the server read the next chunk's UTF-8 keys as other text, stored
// as other keys: the real key processed again by a later run), nor
// default_transaction_isolation. On the old code the key was stored as
// "cafÃ©-Î©".
func TestSandbox_CommitTimeTriggerLeavesNoSettings(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	one := poolWith(t, worker, map[string]string{"pool_max_conns": "1"})
	s := ledger.NewStore(one)
	first := commit(t, s, runNamed("setter"), items("mal", 0, 4), ledger.ChunkOptions{Effect: atCommitAsLogin("",
		`PERFORM pg_catalog.set_config('client_encoding', 'LATIN1', false); PERFORM pg_catalog.set_config('default_transaction_isolation', 'serializable', false)`)})
	requireNoneHandled(t, first, "the setting chunk")
	key := ledger.Key{Entity: "café-Ω", Occurrence: "2026-12"}
	next := commit(t, s, runNamed("next"), []ledger.Item{{Key: key}}, ledger.ChunkOptions{Effect: `SELECT count(*) FROM claimed`})
	require.Equal(t, tally{completed: 1}, count(next))
	require.EqualValues(t, 1, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE entity = $1 AND occurrence = $2 AND state = 'committed'`, key.Entity, key.Occurrence),
		"the key is stored as it was sent")
	require.Equal(t, "read committed", scalar[string](t, one, `SELECT current_setting('default_transaction_isolation')`))
	require.Equal(t, "UTF8", scalar[string](t, one, `SELECT current_setting('client_encoding')`))
}

// TestSandbox_EffectLeftoversHold: what an effect may leave behind on its
// session (objects named like runledger's or the catalog's, functions and
// operators that would stand in for built-ins, settings, listeners,
// advisory locks, dropped prepared statements) changes nothing the ledger
// says about the chunks that follow on that session, in a Skip and in a
// Supersede run: their keys are committed by them, with their effect run
// once each, and nothing is "already handled" that no committed row holds.
func TestSandbox_EffectLeftoversHold(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	mustExec(t, owner, `CREATE TABLE sink (run text, entity text, occurrence text); GRANT ALL ON sink TO PUBLIC`)
	for i, effect := range []string{
		// Relations named like runledger's and the catalog's, in pg_temp.
		`CREATE TEMP TABLE ledger (entity text, occurrence text, state text, run_uid text, id bigint);
INSERT INTO pg_temp.ledger SELECT 'next', 'occ-' || lpad(i::text, 6, '0'), 'committed', 'invented', 1 FROM generate_series(0, 3) AS i;
CREATE TEMP TABLE ledger_retired (run_uid text, occurrence text, entity text);
CREATE TEMP TABLE batch_run (run_uid text); CREATE TEMP TABLE batch (batch_id bigint);
CREATE TEMP VIEW pg_prepared_statements AS SELECT false AS from_sql;
CREATE TEMP VIEW pg_cursors AS SELECT false AS is_holdable;
CREATE TEMP VIEW pg_roles AS SELECT 'x'::name AS rolname, 0::oid AS oid`,
		// Functions and operators of the effect role's that would stand in
		// for built-ins the ledger's statements call.
		`CREATE FUNCTION public.unnest(text[], text[], text[]) RETURNS TABLE (a text, b text, c text) LANGUAGE sql AS $f$ SELECT 'next', 'occ-000000', NULL::text $f$;
CREATE FUNCTION public.unnest(text[], text[]) RETURNS TABLE (a text, b text) LANGUAGE sql AS $f$ SELECT 'next', 'occ-000000' $f$;
CREATE FUNCTION public.to_regclass(text) RETURNS regclass LANGUAGE sql AS $f$ SELECT 'pg_catalog.pg_class'::regclass $f$;
CREATE FUNCTION public.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.always)`,
		// Settings, for the session (RESET ALL undoes them) and for good (a
		// custom setting's placeholder), listeners, advisory locks.
		`SELECT set_config('search_path', 'public, pg_catalog', false), set_config('client_encoding', 'LATIN1', false),
       set_config('runledger.occurrence', 'forged', false), set_config('default_transaction_read_only', 'on', false),
       set_config('enable_indexscan', 'off', false), pg_advisory_lock(1), pg_advisory_unlock_all();
LISTEN runledger; DISCARD PLANS; DISCARD SEQUENCES`,
		// The driver's prepared statements dropped: later chunks fail or
		// commit, never are told another run handled them.
		`DEALLOCATE ALL`,
	} {
		one := poolWith(t, worker, map[string]string{"pool_max_conns": "1"}) // every chunk on the same session
		s := ledger.NewStore(one)
		mustExec(t, owner, `SET session_replication_role = replica; DELETE FROM runledger.ledger; RESET session_replication_role; DELETE FROM sink`)
		first := commit(t, s, runNamed("leaver"), items("mal", 0, 4), ledger.ChunkOptions{Effect: effect})
		require.Equal(t, tally{completed: 4}, count(first), "attack %d commits, leaving its state on the session: %v", i, first)
		for _, opts := range []struct {
			run string
			on  ledger.OnExisting
		}{{"skip", ledger.Skip}, {"supersede", ledger.Supersede}} {
			res := commit(t, s, runNamed(opts.run), items("next", 0, 4), ledger.ChunkOptions{OnExisting: opts.on,
				Effect: `INSERT INTO public.sink SELECT '` + opts.run + `', entity, occurrence FROM claimed`})
			c := count(res)
			require.Zero(t, c.already, "attack %d, %s: %v", i, opts.run, res)
			require.EqualValues(t, c.completed, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND state = 'committed'`, opts.run),
				"attack %d, %s: the counts are the ledger's: %v", i, opts.run, res)
			require.EqualValues(t, c.completed, scalar[int64](t, owner, `SELECT count(*) FROM sink WHERE run = $1`, opts.run), "attack %d, %s: the effect once per key", i, opts.run)
		}
		require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'invented'`), "attack %d: nothing forged", i)
	}
}

// TestAppendOnly_OwnerCheckReadsTheCatalog: the append-only trigger lets
// only a member of the ledger's owner delete a superseded row, and finds
// the owner in the catalog, not in a temporary table named pg_class that a
// login granted DELETE by mistake creates first (pg_temp is searched before
// pg_catalog unless the path names it). On the old code the login deleted
// another run's superseded history.
func TestAppendOnly_OwnerCheckReadsTheCatalog(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, role := workerRole(t, owner)
	mustExec(t, owner, `GRANT DELETE ON runledger.ledger TO `+role)
	s := ledger.NewStore(owner)
	commit(t, s, runNamed("r0"), items("acct", 0, 2), ledger.ChunkOptions{})
	commit(t, s, runNamed("s1"), items("acct", 0, 2), ledger.ChunkOptions{OnExisting: ledger.Supersede})
	require.EqualValues(t, 2, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE state = 'superseded'`))
	_, err := worker.Exec(context.Background(), `CREATE TEMP TABLE pg_class (oid oid, relowner oid);
INSERT INTO pg_temp.pg_class SELECT 'runledger.ledger'::regclass, r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user;
DELETE FROM runledger.ledger WHERE state = 'superseded'`)
	require.True(t, ledger.IsAppendOnlyViolation(err), "refused: %v", err)
	require.EqualValues(t, 2, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE state = 'superseded'`), "the history stays")
}

// TestFixQueryBatch_QueryCannotPrepare: a batch query runs as the login; a
// statement it PREPAREs (which outlives its transaction) could take the name
// of one the driver prepares later on that pooled session. The batch is
// refused, and the session closed. On the old code the batch was fixed and
// the statement stayed on the session.
func TestFixQueryBatch_QueryCannotPrepare(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	mustExec(t, owner, batchSource+`
CREATE FUNCTION prep() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_prepared_statements WHERE name = 'stand_in') THEN
        EXECUTE 'PREPARE stand_in AS SELECT 1';
    END IF;
    RETURN 1;
END $f$`)
	for _, q := range bothWays(batchQuery()) {
		conns := "1"
		if q.Copy {
			conns = "2" // the query's session and the copy's
		}
		one := poolWith(t, owner, map[string]string{"pool_max_conns": conns})
		q.SQL = `SELECT entity, occurrence, payload FROM src WHERE prep() = 1`
		_, err := ledger.NewStore(one).FixQueryBatch(context.Background(), runNamed("prep"), q)
		require.ErrorIs(t, err, ledger.ErrBatchQuery, "copied: %v", q.Copy)
		require.ErrorContains(t, err, "PREPARE")
		require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.batch_run`), "no batch")
		if !q.Copy {
			require.Zero(t, scalar[int64](t, one, `SELECT count(*) FROM pg_prepared_statements WHERE from_sql`), "the session went")
		}
	}
}

// bothWays is q as one statement fixes it and as it is copied from the
// query's session (its shards then Go's, the default's: q's own shard
// function is the server's only).
func bothWays(q ledger.BatchQuery) []ledger.BatchQuery {
	copied := q
	copied.ShardOf, copied.Copy = nil, true
	return []ledger.BatchQuery{q, copied}
}

// TestSandbox_EffectLeavesNothingOnTheSession: what an effect keeps on its
// session beyond its transaction is gone before the ledger's next
// statement, the next chunk's effect or another run meets it, whether the
// chunk commits or not: a session-level advisory lock on the migration
// lock's key (every worker that starts, of any run, would wait for it
// without bound, and so would runledger migrate), a listener, temporary
// objects of its own (the next chunk's effect would find a temporary table
// before public's), and the driver's prepared statements (DEALLOCATE ALL:
// the next statement by name would fail, after the chunk committed). On
// the old code the lock was still held (Migrate waited until its deadline)
// and the listener and the temporary table were still there.
func TestSandbox_EffectLeavesNothingOnTheSession(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	mustExec(t, owner, `CREATE TABLE sink (entity text, occurrence text); GRANT ALL ON sink TO PUBLIC`)
	db := owner.Config().ConnConfig.Database
	for _, leave := range []struct{ name, effect string }{
		{"advisory lock", `SELECT pg_advisory_lock(4547329604037615713), pg_advisory_lock(7) FROM claimed LIMIT 1`},
		{"listener", `LISTEN runledger_effect_leftover`},
		{"temporary objects", `CREATE TEMP TABLE sink AS SELECT entity, occurrence FROM claimed`},
		{"temporary view and type", `CREATE TEMP VIEW leftover AS SELECT 1 AS one`},
		{"driver statements", `DEALLOCATE ALL`},
	} {
		t.Run(leave.name, func(t *testing.T) {
			one := poolWith(t, worker, map[string]string{"pool_max_conns": "1"}) // every statement on the same session
			s := ledger.NewStore(one)
			run := runNamed("leaver-" + strings.ReplaceAll(leave.name, " ", "-"))
			// A chunk first, so the driver has statements prepared on the session.
			first := commit(t, s, run, items("warm-"+leave.name, 0, 3), ledger.ChunkOptions{Effect: `INSERT INTO public.sink SELECT entity, occurrence FROM claimed`})
			require.Equal(t, tally{completed: 3}, count(first))
			res := commit(t, s, run, items("leave-"+leave.name, 0, 3), ledger.ChunkOptions{Effect: leave.effect})
			require.Equal(t, tally{completed: 3}, count(res), "%v", res)

			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM pg_locks AS l JOIN pg_database AS d ON d.oid = l.database
WHERE l.locktype = 'advisory' AND d.datname = $1`, db), "no session of the run holds an advisory lock")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := ledger.Migrate(ctx, owner)
			require.NoError(t, err, "a migrator does not wait for a lock the effect took")
			require.Zero(t, scalar[int64](t, one, `SELECT count(*) FROM pg_listening_channels()`), "the session listens on nothing")
			require.Zero(t, scalar[int64](t, one, `SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema() AND relkind NOT IN ('t', 'i') AND relname <> 'claimed'`),
				"the session holds no temporary object of the effect's")
			// The next chunk, its effect and the ledger's statements after it
			// on the same session: each committed once, the effect's writes in
			// public.sink, not in a temporary table of the same name.
			next := commit(t, s, run, items("next-"+leave.name, 0, 3), ledger.ChunkOptions{Effect: `INSERT INTO sink SELECT entity, occurrence FROM claimed`})
			require.Equal(t, tally{completed: 3}, count(next), "%v", next)
			require.EqualValues(t, 3, scalar[int64](t, owner, `SELECT count(*) FROM public.sink WHERE entity LIKE $1`, "next-"+leave.name+"%"))
			_, err = s.RunHasFailures(context.Background(), run.UID)
			require.NoError(t, err, "the ledger's next statement on the session")
		})
	}
}

package ledger

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// All SQL of the ledger lives here. Arrays travel as text[]; payloads are cast
// to jsonb by the server, so a malformed payload fails in PostgreSQL (22P02)
// and is isolated like any other bad item.

// The arbiter of every insert names the business-key rule by its columns and
// predicate: (entity, occurrence) WHERE state = 'committed'. PostgreSQL infers
// exactly the partial unique index ledger_business_key_uq from it, so only
// conflicts with that rule are absorbed by DO NOTHING; a violation of any other
// constraint still raises. (`ON CONFLICT ON CONSTRAINT ledger_business_key_uq`
// is not an alternative: a partial unique index is not a constraint, and
// PostgreSQL rejects the statement.)
const arbiter = `ON CONFLICT (entity, occurrence) WHERE state = 'committed' DO NOTHING`

// The chunk's items arrive as arrays: $1 entities, $2 occurrences, $3 payloads
// (text, NULL allowed); $4..$8 are the run's identity.
const (
	insertIntoLedger = `INSERT INTO ` + Schema + `.ledger
        (entity, occurrence, state, run_namespace, run_name, run_uid, shard, attempt, payload)`
	insertInto = insertIntoLedger + `
    SELECT k.entity, k.occurrence, 'committed', $4, $5, $6, $7, $8, k.payload::jsonb`
	chunkKeys = `ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[])) AS k(entity, occurrence, payload)`
	// copyClaimed copies the newly inserted rows (CTE ins) into the session's
	// temporary table "claimed", which the caller's effect reads.
	copyClaimed = `,
copied AS (
    INSERT INTO pg_temp.claimed (entity, occurrence, payload)
    SELECT entity, occurrence, payload FROM ins
)`
)

// sqlClaim is the fast path. In one statement it looks up, per key, the
// committed row that holds it (one probe of the rule's index, as in
// sqlHolders) and inserts exactly the keys no committed row held, with a plain
// INSERT. It returns only the keys it skipped, as (the holding row's run uid,
// the positions in the chunk from 1 of the keys it holds); every other key
// was inserted, since a plain INSERT inserts all its rows or fails the
// statement.
//
// Each key costs one index probe, like the bare INSERT ... ON CONFLICT it
// replaces, and the holders of the skipped keys come with it. The lookup sees
// the statement's snapshot: a key that a concurrent writer commits after that
// snapshot is not skipped, and its insert violates the rule. That violation,
// identified by IsExpectedBusinessKeyConflict, makes the caller redo the chunk
// with sqlInsert, whose arbiter absorbs such conflicts. The rule decides
// either way.
//
// The answer is kept small on purpose: the positions of the skipped keys,
// grouped by the run that holds them (measured against the alternatives in
// docs/insert-path.md).
var (
	sqlClaim = claimWith(false) + claimInsert + `
)` + claimResult
	// With the effect, the inserted rows are also copied into "claimed". (A
	// data-modifying WITH query runs to completion whether or not the main
	// query reads it; sqlClaim's insert has no RETURNING.)
	sqlClaimEffect = claimWith(false) + claimInsert + `
    RETURNING entity, occurrence, payload
)` + copyClaimed + claimResult
	// sqlClaimCopies and sqlClaimCopiesEffect also compare the keys' later
	// copies in the chunk ($9, sqlCopiesChanged).
	sqlClaimCopies = claimWith(true) + claimInsert + `
)` + claimResult
	sqlClaimCopiesEffect = claimWith(true) + claimInsert + `
    RETURNING entity, occurrence, payload
)` + copyClaimed + claimResult
	claimInsert = `
ins AS (
    ` + insertInto + `
    FROM k
    WHERE k.holder IS NULL`
	// One row per holding run: its uid, the positions of the keys it holds
	// and of those among them whose payload differs (NULL: none). The holder
	// is the proof of "already handled" (or, $6, of "completed earlier by
	// this run"), read in this very statement.
	claimResult = `
SELECT holder, pg_catalog.array_agg(n), pg_catalog.array_agg(n) FILTER (WHERE changed) FROM k WHERE holder IS NOT NULL GROUP BY holder`
)

// claimWith is the claim's lookup of the chunk's keys, k; with copies, it
// compares their later copies too ($9) in the CASE that compares the first,
// a statement of its own so that a chunk without any (nearly every one)
// pays nothing for them. (ROWS FROM: the multi-array unnest is that, which
// PostgreSQL expands only unqualified.)
func claimWith(copies bool) string {
	keys, changed := `ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[])) WITH ORDINALITY AS k(entity, occurrence, payload, n)`, sqlPayloadChanged
	if copies {
		keys = `ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($9::text[]))
        WITH ORDINALITY AS k(entity, occurrence, payload, copies, n)`
		changed += ` OR ` + sqlCopiesChanged
	}
	return `
WITH k AS (
    SELECT k.n, k.entity, k.occurrence, k.payload, ` + heldFor("$6") + ` AS holder,
           CASE WHEN ` + othersRow("$6") + ` THEN ` + changed + ` END AS changed
    FROM ` + keys + `
    LEFT JOIN LATERAL (
        SELECT l.run_uid, l.payload
        FROM ` + Schema + `.ledger AS l
        WHERE l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'
        LIMIT 1
    ) AS h ON true` + ownRetired("$6", "k") + `
),`
}

// sqlInsertFresh is the claim of a chunk whose keys the caller expects
// unheld (ChunkOptions.ExpectFresh): a plain INSERT, no lookup, nothing back.
// Its own unique check is then the only probe of the rule's index per key,
// where sqlClaim probes to look up and again to insert (docs/insert-path.md).
// A key held after all makes the rule reject the statement
// (IsExpectedBusinessKeyConflict) and the chunk is claimed again by
// sqlClaim: the statement inserts every key or none, so a wrong guess costs
// time, never a verdict.
const (
	sqlInsertFresh = insertInto + `
    FROM ` + chunkKeys
	sqlInsertFreshEffect = `
WITH ins AS (
    ` + sqlInsertFresh + `
    RETURNING entity, occurrence, payload
)
INSERT INTO pg_temp.claimed (entity, occurrence, payload)
SELECT entity, occurrence, payload FROM ins`
)

// sqlInsert is the arbiter path: the chunk's keys inserted with ON CONFLICT DO
// NOTHING, returning the keys it inserted; a key it did not return is held by
// a committed row already (see sqlHolders for whose). It serves when the fast
// path met a concurrent writer, and for the savepoint-per-part retries that
// isolate bad items.
const (
	sqlInsert       = insertWith + insertResult
	sqlInsertEffect = insertWith + copyClaimed + insertResult
	insertWith      = `
WITH ins AS (
    ` + insertInto + `
    FROM ` + chunkKeys + `
    ` + arbiter + `
    RETURNING entity, occurrence, payload
)`
	insertResult = `
SELECT entity, occurrence FROM ins`
)

// The ledger's lookups (sqlClaim, sqlHolders, sqlSupersede) must probe the
// rule's index once per key. PostgreSQL plans a sequential scan per key instead
// when it believes the ledger is (nearly) empty, as it is when the first
// writers start; every key of a chunk then scans every row that concurrent
// writers add meanwhile (docs/insert-path.md). Their transactions therefore run with sequential scans disabled
// (sqlIndexProbesOnly), which leaves the index probe the only plan; the
// caller's effect runs with the session's own setting (sqlPlannerDefaults).
//
// Bitmap scans go too: on a ledger never analysed, supersede's update by
// primary key was planned as a BitmapAnd with a bitmap of the whole rule
// index (every committed row), not a probe (TestInsertPathPlansAreOChunk).
//
// And JIT: a chunk of 10,000 keys costs the planner over jit_above_cost, and
// compiling the claim took about 12 ms of its 70 (docs/insert-path.md) for
// plain probes and inserts that compiled code does not speed up.
const (
	sqlNoSeqScan       = `SET LOCAL enable_seqscan = off`
	sqlNoBitmapScan    = `SET LOCAL enable_bitmapscan = off`
	sqlNoJIT           = `SET LOCAL jit = off`
	sqlIndexProbesOnly = sqlNoSeqScan + `; ` + sqlNoBitmapScan + `; ` + sqlNoJIT
	sqlPlannerDefaults = `SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL enable_bitmapscan TO DEFAULT; SET LOCAL jit TO DEFAULT`
)

// sqlPinnedSearchPath: the ledger's own statements resolve nothing in a
// schema anyone may create in (public, before PostgreSQL 15): an
// exact-signature public.unnest(text[], text[], text[]) would beat the
// polymorphic built-in otherwise. Their tables are schema-qualified; pg_temp
// listed last keeps a temporary relation from shadowing a catalog's (functions
// and operators are never looked up there). The effect runs with the
// session's own (sqlPlannerDefaults).
const sqlPinnedSearchPath = `SET LOCAL search_path = pg_catalog, pg_temp`

// sqlBeginPinned and sqlBeginPinnedReadOnly begin a transaction of the
// ledger's own statements under sqlPinnedSearchPath, in one round trip:
// the only way the ledger sends a statement outside a chunk's transaction
// or a pipeline that pins the path itself (Store.pinned). A statement
// outside a transaction would run under whatever path its session has: the
// role's default, or, behind a pooler, what another client left on the
// server connection.
const (
	sqlBeginPinned         = `BEGIN; ` + sqlPinnedSearchPath
	sqlBeginPinnedReadOnly = `BEGIN READ ONLY; ` + sqlPinnedSearchPath
)

// sqlBeforeEffect runs right before the caller's effect: the session's own
// planner setting (see sqlIndexProbesOnly) and the user's search_path
// (sqlUserPath). The run's bounds (sqlBounds) are in force since the
// transaction began. It first counts the driver's statements
// (sqlDriverStatements), under the ledger's path still.
func sqlBeforeEffect(userPath string) string {
	return sqlDriverStatements + `; ` + sqlPlannerDefaults + `; ` + sqlUserPath(userPath)
}

// sqlBounds bounds every statement that follows it in the transaction
// (transaction-local): each runs at most statement (statement_timeout) and
// waits at most lock for any lock (lock_timeout): a key another transaction
// inserted or superseded and has not committed, a row or table an effect
// needs. A bound of 0 (none given) keeps the session's own value, or def*
// where the session has none (0 would wait for ever). Either one expiring is
// retryable (55P03, 57014: classify.go).
func sqlBounds(statement, lock, defStatement, defLock time.Duration) string {
	return strings.Join(sqlBoundList(statement, lock, defStatement, defLock), `; `)
}

// sqlBoundList is sqlBounds as separate statements, for a pipeline.
func sqlBoundList(statement, lock, defStatement, defLock time.Duration) []string {
	return []string{sqlBound("statement_timeout", statement, defStatement), sqlBound("lock_timeout", lock, defLock)}
}

func sqlBound(name string, d, def time.Duration) string {
	if d > 0 {
		return `SET LOCAL ` + name + ` = ` + milliseconds(d)
	}
	return `SELECT pg_catalog.set_config('` + name + `', '` + milliseconds(def) + `', true) WHERE pg_catalog.current_setting('` + name + `') = '0'`
}

// milliseconds is d as a setting's value, at least 1 (0 means no bound).
func milliseconds(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }

// sqlRunEffect runs the caller's effect in the effect's sandbox,
// runledger.run_effect (migrations/00007_effect_sandbox.sql): a SECURITY
// DEFINER function of the unprivileged effect role, which EXECUTEs it (no
// transaction control there: COMMIT, ROLLBACK, SAVEPOINT, a procedure that
// commits are refused) and fires the constraints it deferred, as that role.
// It runs only if the function is still the one the worker checked at start
// ($1, sqlEffectSandbox): SECURITY DEFINER, owned by the effect role ($2),
// no SET clause; it returns no row otherwise. The effect's text is in the
// statement, dollar-quoted with a tag it does not contain, so that
// pg_stat_activity shows what runs; it is the same for every chunk. It is
// parsed under the user's search_path (sqlBeforeEffect), where an earlier
// effect of the transaction may have left a domain pg_temp.oid: every name
// of its own is qualified (TestUserPathStatementsNameOnlyTheCatalog).
func sqlRunEffect(effect string) string {
	n := 0
	for strings.Contains(effect, effectTag(n)) {
		n++
	}
	return `SELECT ` + Schema + `.run_effect(` + effectTag(n) + effect + effectTag(n) + `)
FROM pg_catalog.pg_proc AS p
WHERE p.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid AND p.prosecdef AND p.proconfig IS NULL
  AND p.proowner OPERATOR(pg_catalog.=) $2::pg_catalog.oid`
}

func effectTag(n int) string { return "$runledger_effect" + strconv.Itoa(n) + "$" }

// sqlEffectSandbox reads the effect's sandbox: the function's oid, its
// owner (the effect role) and what disqualifies it. The role must not be a
// superuser, the ledger's or the schema's owner or a member of either, nor a
// member of the worker's login (current_user), and must have no privilege
// on schema runledger (then it names none of its tables or functions, and
// cannot alter its own function there). No row: not migrated.
const sqlEffectSandbox = `
SELECT p.oid, r.oid, r.rolname,
       p.prosecdef AND p.proconfig IS NULL,
       r.rolsuper,
       r.oid = n.nspowner OR pg_catalog.pg_has_role(r.oid, n.nspowner, 'MEMBER')
           OR pg_catalog.pg_has_role(r.oid, t.relowner, 'MEMBER'),
       pg_catalog.pg_has_role(r.oid, current_user, 'MEMBER'),
       pg_catalog.has_schema_privilege(r.oid, n.oid, 'USAGE') OR pg_catalog.has_schema_privilege(r.oid, n.oid, 'CREATE')
FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
JOIN pg_catalog.pg_class AS t ON t.relnamespace = n.oid AND t.relname = 'ledger'
WHERE n.nspname = '` + Schema + `' AND p.proname = 'run_effect'
  AND p.proargtypes = '25'::pg_catalog.oidvector`

// sqlSetEffectRole gives the sandbox to the effect role (an identifier,
// already quoted) in one transaction (` + "`runledger migrate --effect-role`" + `).
// PostgreSQL lets a function change owner only to a role that may create in
// its schema: the role gets CREATE for the transaction only. The migrator
// (CURRENT_USER, who may run workers too) keeps EXECUTE; the worker login
// gets it with --grant-to.
func sqlSetEffectRole(role string) string {
	return `GRANT CREATE ON SCHEMA ` + Schema + ` TO ` + role + `;
ALTER FUNCTION ` + Schema + `.run_effect(text) OWNER TO ` + role + `;
REVOKE ALL ON SCHEMA ` + Schema + ` FROM ` + role + `;
REVOKE ALL ON FUNCTION ` + Schema + `.run_effect(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ` + Schema + `.run_effect(text) TO CURRENT_USER`
}

// sqlGrantClaimed lets the effect role (quoted) read the session's table
// "claimed", once per connection: the table lives as long as the session.
func sqlGrantClaimed(role string) string { return `GRANT SELECT ON pg_temp.claimed TO ` + role }

// sqlSandboxIntact says, right after an effect and before the ledger runs
// anything else on the session, whether the effect left it as it was:
//   - "claimed" is still the worker's own table, of exactly the shape
//     sqlCreateClaimed gave it. Nothing the claim's insert into it (or the
//     clearing DELETE) could run: no trigger, rule or policy, no CHECK
//     constraint, no index (an expression calls functions), no child table,
//     and its three columns of the catalog's types with no default or
//     generation. An effect may DISCARD TEMP and create a "claimed" of its
//     own; a trigger it leaves to fire at COMMIT runs as the login, the
//     table's owner, and may reshape it: whatever the next chunk's claim ran
//     would run as the login at trigger depth 0, where the login may write
//     the ledger;
//   - no statement was PREPAREd from SQL (an effect could replace one of the
//     driver's prepared statements by name, with a statement that would
//     then run as the worker). Not transactional: the connection is closed;
//   - no cursor is declared WITH HOLD: PostgreSQL runs the rest of its query
//     at COMMIT, outside the sandbox and any trigger, as the login (the
//     ledger refuses writes at COMMIT too: migrations/00013);
//   - how many of the driver's statements are left (sqlDriverStatements);
//   - whether the session holds no temporary object but "claimed"
//     (sqlNoTempLeftovers).
//
// It runs under sqlPinnedSearchPath (after COMMIT too: sqlSessionIntact), so
// that no operator of the session's path answers for the catalog's.
const sqlSandboxIntact = `SELECT
    coalesce((SELECT c.relowner = r.oid AND c.relkind = 'r' AND c.relpersistence = 't'
                     AND NOT c.relhastriggers AND NOT c.relhasrules AND NOT c.relrowsecurity
                     AND c.relchecks = 0 AND NOT c.relhasindex AND NOT c.relhassubclass AND c.reloftype = 0
                     AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute AS a
                          WHERE a.attrelid = c.oid AND a.attnum > 0) = 3
                     AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute AS a
                          WHERE a.attrelid = c.oid AND NOT a.attisdropped AND NOT a.atthasdef AND a.attgenerated = ''
                            AND (a.attnum, a.attname, a.atttypid) IN (
                                (1, 'entity', 'pg_catalog.text'::pg_catalog.regtype::pg_catalog.oid),
                                (2, 'occurrence', 'pg_catalog.text'::pg_catalog.regtype::pg_catalog.oid),
                                (3, 'payload', 'pg_catalog.jsonb'::pg_catalog.regtype::pg_catalog.oid))) = 3
              FROM pg_catalog.pg_class AS c, pg_catalog.pg_roles AS r
              WHERE c.oid = pg_catalog.to_regclass('pg_temp.claimed') AND r.rolname = current_user), false),
    NOT EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS s WHERE s.from_sql),
    NOT EXISTS (SELECT FROM pg_catalog.pg_cursors AS k WHERE k.is_holdable),
    (` + sqlDriverStatements + `),` + sqlNoTempLeftovers

// sqlDriverStatements counts the driver's prepared statements on the
// session (by the protocol, not from SQL). Read before an effect and after
// it (sqlSandboxIntact's last column), it tells whether the effect
// DEALLOCATEd any: the driver would send the next chunk's statements by
// names the server no longer knows, failing a run whose work committed.
const sqlDriverStatements = `SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_statements WHERE NOT from_sql`

// sqlNoTempLeftovers says whether the session's temporary schema holds
// nothing but "claimed": no table, view, sequence, type, domain, function
// or operator the effect created (each records its dependency on the
// schema: one probe of pg_depend's index, not a scan of four catalogs), where the transaction's next effect (isolate runs it again, on
// the items of another part of the chunk) or the next chunk's, with the
// user's search_path, would meet it first: an unqualified table name of
// theirs would write into the effect's temporary table, committed with the
// items and gone with the session. Anything there, and the temporary
// objects go (sqlDiscardTemp).
const sqlNoTempLeftovers = `
    NOT EXISTS (SELECT FROM pg_catalog.pg_depend AS d
                WHERE d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass AND d.refobjid = pg_catalog.pg_my_temp_schema()
                  AND (d.classid, d.objid) IS DISTINCT FROM ('pg_catalog.pg_class'::pg_catalog.regclass, pg_catalog.to_regclass('pg_temp.claimed')))`

// sqlPreparedFromSQL lists the statements PREPAREd from SQL on the session
// (user code's; the driver's come by the protocol).
const sqlPreparedFromSQL = `SELECT name FROM pg_catalog.pg_prepared_statements WHERE from_sql`

// sqlHoldCursors names the cursors WITH HOLD the session has (the user's
// query of a batch declared them: they would run at its COMMIT), and the
// statements PREPAREd from SQL (they outlive the transaction, and one could
// take the name of a statement the driver prepares later on the session).
const sqlHoldCursors = `SELECT
    coalesce((SELECT pg_catalog.string_agg(k.name, ', ' ORDER BY k.name) FROM pg_catalog.pg_cursors AS k WHERE k.is_holdable), ''),
    coalesce((SELECT pg_catalog.string_agg(p.name, ', ' ORDER BY p.name) FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql), '')`

// sqlSessionIntact resets the session after an effect's COMMIT and checks
// it (sqlSandboxIntact, under the ledger's search_path for its one implicit
// transaction). A trigger the effect left to fire at COMMIT ran as the
// login, outside the sandbox, and may have set the session's settings for
// good: a client_encoding of LATIN1 would make the server read the next
// chunk's UTF-8 keys as other text and commit them as other keys (the real
// ones processed again by a later run); a search_path, a role,
// synchronous_commit. sqlResetSession undoes them all before the next
// transaction.
//
// It also checks that the session holds no temporary object but "claimed"
// (sqlNoTempLeftovers: a trigger left to fire at COMMIT may have made one),
// no advisory lock (a transaction's are gone at COMMIT: any left is a
// session's, which every run that takes the same key, the migration lock's
// say, would wait for) and listens on no channel. Anything left, and the
// connection is closed.
const sqlSessionIntact = sqlResetSession + `; ` + sqlPinnedSearchPath + `; ` + sqlSandboxIntact + `,
    NOT EXISTS (SELECT FROM pg_catalog.pg_locks AS l WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid())
    AND NOT EXISTS (SELECT FROM pg_catalog.pg_listening_channels() AS c)`

// sqlResetSession undoes whatever session state the user's SQL (an effect, a
// batch query) set, by SET, SET ROLE, SET SESSION AUTHORIZATION or
// set_config(..., false): back to the values the session started with, so
// that nothing it set reaches the ledger's next statements, the next chunk's
// effect or the next user of the pooled connection. RESET ALL leaves the role
// and the session user alone, hence those first. It also drops the
// transaction's SET LOCAL values, so the ledger sets its own again after it.
const sqlResetSession = `RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL`

// sqlAfterEffect runs right after the caller's effect, in one round trip.
// It resets the session (sqlResetSession), which drops the run's bounds too,
// so it sets them again (sqlBounds) before anything else runs, and defers
// again the ledger's one deferred check, that a superseded key has a
// committed row again (migrations/00003_append_only.sql), which the sandbox
// fired with the effect's own (an effect that supersedes rows fails its
// items): a later claim in the same transaction (isolate) supersedes before
// it inserts. Its last statement is sqlSandboxIntact.
//
// Before that it scrubs what a session keeps beyond the transaction, which
// the next transaction on the connection (another chunk, behind a pooler
// another run's) would meet: the session's advisory locks (any the effect
// took; the ledger's own are its transactions') and its listeners. Its
// temporary objects, if sqlSandboxIntact finds any, go next
// (sqlDiscardTemp).
func sqlAfterEffect(bounds string) string {
	return sqlResetSession + `; ` + bounds + `; SET CONSTRAINTS ` + Schema + `.ledger_superseded_replaced DEFERRED; ` +
		sqlIndexProbesOnly + `; ` + sqlPinnedSearchPath + `; ` + sqlScrubSession + `; ` + sqlSandboxIntact
}

// sqlDiscardTemp drops every temporary object of the session, those the
// effect left with the rest, and makes "claimed" again for the rest of the
// transaction (the session's, straight to PostgreSQL; the transaction's,
// behind a pooler), granted to role (quoted): one more round trip, only
// after an effect that left temporary objects (sqlNoTempLeftovers).
func sqlDiscardTemp(pooled bool, role string) string {
	create := sqlCreateClaimed
	if pooled {
		create = sqlCreateClaimedTx
	}
	return `DISCARD TEMP; ` + create + `; ` + sqlGrantClaimed(role)
}

// sqlScrubSession releases the session's advisory locks and stops its
// listening (sqlAfterEffect).
const sqlScrubSession = `SELECT pg_catalog.pg_advisory_unlock_all(); UNLISTEN *`

// How the ledger's transactions begin, each in one round trip. A chunk's
// transaction begins with its planner setting and the run's bounds
// (sqlBounds; and, for an effect, the table "claimed") in one simple query;
// the preload's read-only one is sent in one pipeline with its lookup and
// COMMIT.
const (
	sqlBeginReadOnly = `BEGIN READ ONLY`
	sqlBeginWrite    = `BEGIN`
	sqlCommit        = `COMMIT`
	sqlRollback      = `ROLLBACK`
)

// chunkBegin is how a chunk's transaction begins (sqlBeginChunk).
type chunkBegin struct {
	bounds string // sqlBounds
	lease  string // sqlHoldShardLease, or "": renewed and row-locked first
	effect bool   // with the table "claimed"
	// grant names the effect role (quoted) that may read "claimed" from
	// then on; "" once the session's table has been granted.
	grant string
	// pooled: behind a transaction pooler, whose server connection may have
	// served another session's transaction last: its session is reset first
	// (what a trigger an effect left to fire at COMMIT set there: a role,
	// synchronous_commit), its application_name (appName) set again for the
	// transaction, and "claimed" is the transaction's own.
	pooled  bool
	appName string
}

// sqlBeginChunk begins a chunk's transaction under its bounds, with the
// ledger's search_path, as b says.
func sqlBeginChunk(b chunkBegin) string {
	// The level the claim is written for, whatever the session's default
	// (a role's setting, or one left on a pooler's server connection).
	q := `BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE; `
	if b.pooled {
		q += sqlResetSession + `; `
		if b.appName != "" {
			q += `SET LOCAL application_name = ` + quoteLiteral(b.appName) + `; `
		}
	}
	q += sqlIndexProbesOnly + `; ` + sqlPinnedSearchPath + `; ` + b.bounds
	if b.lease != "" {
		q += `; ` + b.lease
	}
	switch {
	case b.effect && b.pooled:
		q += `; ` + sqlCreateClaimedTx + `; ` + sqlGrantClaimed(b.grant)
	case b.effect:
		q += `; ` + sqlCreateClaimed
		if b.grant != "" {
			q += `; ` + sqlGrantClaimed(b.grant)
		}
	}
	return q
}

// sqlCreateClaimed makes the per-session table the effect reads, owned by
// the worker's login: the effect role may only read it (sqlGrantClaimed),
// never give it a trigger, rule, policy or column. It is created in every
// effect chunk's BEGIN (a no-op once it exists) and lives as long as the
// session; ON COMMIT DELETE ROWS empties it at every commit (what a rolled
// back transaction put there goes with it), so every transaction starts
// with it empty; sqlClearClaimed empties it between the parts of one
// transaction (isolate).
//
// Behind a transaction pooler the next transaction may run on another
// server connection: each effect chunk's transaction has a "claimed" of its
// own (sqlCreateClaimedTx: any table of that name the server connection has
// goes first, the new one goes at COMMIT), granted in the same BEGIN.
const (
	sqlCreateClaimed   = `CREATE TEMP TABLE IF NOT EXISTS claimed (` + claimedColumns + `) ON COMMIT DELETE ROWS`
	sqlCreateClaimedTx = `DROP TABLE IF EXISTS pg_temp.claimed; CREATE TEMP TABLE claimed (` + claimedColumns + `) ON COMMIT DROP`
	claimedColumns     = `
    entity     pg_catalog.text  NOT NULL,
    occurrence pg_catalog.text  NOT NULL,
    payload    pg_catalog.jsonb
`
	sqlClearClaimed = `DELETE FROM pg_temp.claimed`
)

// sqlSupersede marks the committed rows of the given keys superseded, except
// for the keys this same run $3 has ever committed (a row of the run in any
// state: its own committed row, or one another Supersede run retired since).
// Such a key is done for this run: within one run each key is processed at
// most once, so it is neither superseded again nor claimed again. It runs in
// the chunk's transaction right before the insert, so the old row is retired
// and the new one committed atomically.
//
// It answers one row per key it settled: (entity, occurrence, the id of the
// row it superseded, the key's committed rows retired before that one), or
// (entity, occurrence, NULL, NULL) for a key this run committed before (the
// row of the run read back in this statement, its proof). The rows retired
// before are ledger_retired's records of the key, in the statement's
// snapshot (the record of this row, its trigger's, comes after): with the
// retired row, the new row's generation (Claim.Generation). Keys it does not name have no committed row, or one that a
// concurrent writer retired meanwhile: the insert decides.
//
// Like sqlHolders, it finds the committed row by one probe of the rule's
// index per key and the run's retired row by one probe of ledger_retired's
// primary key (migrations/00009), each a LATERAL subquery with LIMIT 1 (a
// probe per key, never a scan of the run's rows), then updates by primary
// key, so its cost follows the chunk, not the ledger or the run. The two lookups share the statement's
// snapshot. Under READ COMMITTED a row updated concurrently is re-checked
// against state and run_uid before it is touched.
const sqlSupersede = `
WITH k AS (
    SELECT k.entity, k.occurrence, h.id, coalesce(h.run_uid = $3, false) OR r.one IS NOT NULL AS mine
    FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS k(entity, occurrence)
    LEFT JOIN LATERAL (
        SELECT c.id, c.run_uid
        FROM ` + Schema + `.ledger AS c
        WHERE c.entity = k.entity AND c.occurrence = k.occurrence AND c.state = 'committed'
        LIMIT 1
    ) AS h ON true
    LEFT JOIN LATERAL (
        SELECT 1 AS one
        FROM ` + Schema + `.ledger_retired AS r
        WHERE r.run_uid = $3 AND r.occurrence = k.occurrence AND r.entity = k.entity
        LIMIT 1
    ) AS r ON true
),
up AS (
    UPDATE ` + Schema + `.ledger AS l
    SET state = 'superseded', superseded_at = pg_catalog.now()
    WHERE l.id = ANY (ARRAY(SELECT k.id FROM k WHERE k.id IS NOT NULL AND NOT k.mine))
      -- Not "state = 'committed'", the rule index's predicate: on a ledger
      -- the planner thinks small, that let it walk the whole rule index
      -- filtering on id instead of probing the primary key
      -- (TestInsertPathPlansAreOChunk). The same rows (the CHECK allows two
      -- states), re-checked the same way.
      AND l.state <> 'superseded' AND l.run_uid <> $3
    RETURNING l.entity, l.occurrence, l.id, (
        SELECT pg_catalog.count(*) FROM ` + Schema + `.ledger_retired AS g
        WHERE g.occurrence = l.occurrence AND g.entity = l.entity
    ) AS retired
)
SELECT entity, occurrence, id::text, retired::text FROM up
UNION ALL
SELECT entity, occurrence, NULL, NULL FROM k WHERE mine`

// sqlTakeBack takes back, inside the claiming transaction, the claims of the
// keys a processor did not accept ($1 entities, $2 occurrences): the rows
// this transaction inserted for them are deleted, and the rows it superseded
// for them ($3 ids) are committed again, and their retired-key records go
// (00019: the record this transaction wrote when it superseded them). Only
// the transaction's own rows: migrations/00004_take_back.sql. It returns
// the rows deleted.
const sqlTakeBack = `SELECT ` + Schema + `.ledger_take_back($1::text[], $2::text[], $3::bigint[])`

// sqlHolders says which committed rows hold the given keys, and whose they
// are for run $3 (heldFor: a key the run committed itself is the run's, even
// if another run's Supersede retired that row since). It serves the preload
// and the attribution of keys a Supersede run's insert skipped.
//
// It probes the rule's index once per key: its cost follows the number of keys
// asked, never the size of the ledger. The LATERAL subquery with LIMIT 1 (the
// rule allows one committed row per key anyway) is what guarantees that plan:
// PostgreSQL cannot flatten it into a join, and a plain join of a few thousand
// keys is planned as a hash join over a sequential scan of the whole ledger
// once the chunk is a sizeable fraction of the table, which made attribution
// cost as much as the insert itself.
var sqlHolders = `
SELECT k.entity, k.occurrence, ` + heldFor("$3") + `
FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS k(entity, occurrence)
CROSS JOIN LATERAL (
    SELECT l.run_uid
    FROM ` + Schema + `.ledger AS l
    WHERE l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'
    LIMIT 1
) AS h` + ownRetired("$3", "k")

// sqlHoldersPayload is sqlHolders for the keys a Skip run's arbiter insert
// skipped ($3 their payloads, $4 the run's uid), with whether the payload
// of the holding row of another run differs (sqlPayloadChanged; NULL for
// the run's own rows). The insert cast every payload already.
// sqlHoldersPayloadCopies compares the keys' later copies too ($5, as
// sqlClaimCopies' $9), which the insert did not cast.
var (
	sqlHoldersPayload = `
SELECT k.entity, k.occurrence, ` + heldFor("$4") + `, CASE WHEN ` + othersRow("$4") + ` THEN ` + sqlPayloadChanged + ` END` +
		holdingRowsPayload(`ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[])) AS k(entity, occurrence, payload)`) + ownRetired("$4", "k")
	sqlHoldersPayloadCopies = `
SELECT k.entity, k.occurrence, ` + heldFor("$4") + `, CASE WHEN ` + othersRow("$4") + ` THEN ` + sqlPayloadChanged + ` OR ` + sqlCopiesChanged + ` END` +
		holdingRowsPayload(`ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($5::text[]))
    AS k(entity, occurrence, payload, copies)`) + ownRetired("$4", "k")
)

// sqlPreload is sqlHolders for the preload of run $4's items ($3 their
// payloads), with what their text says of the holding row's payload
// (sqlPayloadSameText, NULL for the run's own rows): it runs before any
// item is validated by the database, so it casts nothing.
var sqlPreload = `
SELECT k.entity, k.occurrence, ` + heldFor("$4") + `, CASE WHEN ` + othersRow("$4") + ` THEN ` + sqlPayloadSameText + ` END` +
	holdingRowsPayload(`ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[])) AS k(entity, occurrence, payload)`) + ownRetired("$4", "k")

// holdingRowsPayload is the FROM of sqlHoldersPayload and sqlPreload:
// sqlHolders' one probe of the rule's index per key, with the holding row's
// payload, for keys given with their payloads (keys, as k).
func holdingRowsPayload(keys string) string {
	return `
FROM ` + keys + `
CROSS JOIN LATERAL (
    SELECT l.run_uid, l.payload
    FROM ` + Schema + `.ledger AS l
    WHERE l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'
    LIMIT 1
) AS h`
}

// A key a run committed itself is the run's own work, done, whoever's row
// holds it now: another run's Supersede may have retired the run's row
// since (ledger_retired records it, migrations/00009), and within one run
// each key is processed at most once. So every lookup of a key's holder for
// a run (the claim, the preload, the arbiter's attribution, a fetch of a
// batch, the already handled items of a run) reads the holder through
// heldFor: the run's own uid for such a key, else the committed row's
// (h.run_uid). ownRetired joins what it needs, as m.own: one probe of
// ledger_retired's primary key per key (k) another run's row holds, none
// for a key no row or the run's own row holds (the condition on h gates the
// probe, in a subquery the LIMIT keeps from being flattened), and none at
// all when the run has no retired key (a sub-select PostgreSQL runs once
// per statement, in the statement's snapshot; an already handled batch's
// fetch took a quarter less time without the probes). othersRow is true
// for a key another run's row holds that is not the run's own.
func ownRetired(run, k string) string {
	return `
LEFT JOIN LATERAL (
    SELECT true AS own
    FROM ` + Schema + `.ledger_retired AS r
    WHERE h.run_uid <> ` + run + ` AND (SELECT EXISTS (SELECT FROM ` + Schema + `.ledger_retired AS rr WHERE rr.run_uid = ` + run + `))
      AND r.run_uid = ` + run + ` AND r.occurrence = ` + k + `.occurrence AND r.entity = ` + k + `.entity
    LIMIT 1
) AS m ON true`
}

func heldFor(run string) string { return `CASE WHEN m.own THEN ` + run + ` ELSE h.run_uid END` }

func othersRow(run string) string { return `h.run_uid <> ` + run + ` AND m.own IS NULL` }

// sqlPayloadChanged says whether an item's payload (k.payload, text sent by
// the worker) differs from the committed row's (h.payload, jsonb): jsonb
// equality, so key order, white space and a number's spelling do not count,
// and no payload is a JSON null (the static sources make a null payload
// none, a query may return either). The cast fails like the insert's would
// (a payload jsonb cannot hold: 22P02, 22P05), and the item is isolated and
// fails.
const sqlPayloadChanged = `nullif(h.payload, 'null'::jsonb) IS DISTINCT FROM nullif(k.payload::jsonb, 'null'::jsonb)`

// sqlCopiesChanged is sqlPayloadChanged for the item's later copies in the
// chunk (k.copies: the text of a text[] of the payloads other than the
// item's, NULL payloads none; NULL: no such copy), so that a key's verdict
// does not depend on which of its copies came first. A copy's cast fails
// like the item's.
const sqlCopiesChanged = `CASE WHEN k.copies IS NULL THEN false ELSE EXISTS (
               SELECT FROM pg_catalog.unnest(k.copies::text[]) AS c(payload)
               WHERE nullif(h.payload, 'null'::jsonb) IS DISTINCT FROM nullif(c.payload::jsonb, 'null'::jsonb)) END`

// sqlPayloadSameText is what a lookup can say of k.payload against h.payload
// without casting it (a cast error would fail the whole lookup, where the
// insert path isolates the one item): false (same) when its text is the
// committed row's as jsonb prints it (the text of a query's jsonb column
// is), true (changed) when it is none and the row holds a value, else NULL
// (unknown: the claim compares, sqlPayloadChanged). NULL payloads are JSON
// nulls, as there. sqlBatchPayloadSameText is the same of b.payload.
const (
	sqlPayloadSameText = `CASE WHEN coalesce(h.payload::text, 'null') = coalesce(k.payload, 'null') THEN false
            WHEN k.payload IS NULL THEN nullif(h.payload, 'null'::jsonb) IS NOT NULL END`
	sqlBatchPayloadSameText = `CASE WHEN coalesce(h.payload::text, 'null') = coalesce(b.payload, 'null') THEN false
            WHEN b.payload IS NULL THEN nullif(h.payload, 'null'::jsonb) IS NOT NULL END`
)

// Migrate's statements. The advisory lock is session-level: goose runs each
// migration in a transaction of its own, all under the one lock; behind a
// pooler it is a transaction's, held by a transaction of its own
// (migrationLock).
const (
	// A migrator polls for the lock (migrationLockPoll) rather than wait
	// in one statement, whose snapshot a CREATE INDEX CONCURRENTLY of the
	// migrator holding the lock would wait for: neither would end.
	// Qualified and typed: they run on goose's session before its path
	// is pinned (sqlPinSession), and an untyped parameter would let
	// PostgreSQL prefer a public.pg_try_advisory_lock(double precision) or
	// (text) over the catalog's bigint one.
	sqlMigrationLock     = `SELECT pg_catalog.pg_try_advisory_lock($1::bigint)`
	sqlMigrationXactLock = `SELECT pg_catalog.pg_try_advisory_xact_lock($1::bigint)`
	sqlMigrationUnlock   = `SELECT pg_catalog.pg_advisory_unlock($1::bigint)`
	sqlSchemaExists      = `SELECT pg_catalog.to_regnamespace($1::text) IS NOT NULL`
	sqlCreateSchema      = `CREATE SCHEMA IF NOT EXISTS ` + Schema
	// sqlPinSession pins the path of goose's session, straight to
	// PostgreSQL, for the migrations and goose's own statements (which
	// name pg_tables unqualified: pg_temp would be searched first). Behind
	// a pooler each migration's transaction may have another server
	// connection; there only the catalog's exact signatures are in them.
	sqlPinSession   = `SET search_path = pg_catalog, pg_temp`
	sqlUnpinSession = `RESET search_path`
)

// sqlMigrationLockHolders: the sessions of this database that hold the
// migration lock, a bigint key: its high ($1) and low ($2) 32 bits, objsubid
// 1 (PostgreSQL's pg_locks), with how long their transaction has been open
// (-1: not visible to this login).
const sqlMigrationLockHolders = `
SELECT l.pid, coalesce(a.application_name, ''),
       coalesce(extract(epoch FROM pg_catalog.clock_timestamp() - a.xact_start), -1)::float8
FROM pg_catalog.pg_locks AS l
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = $1::pg_catalog.oid AND l.objid = $2::pg_catalog.oid
  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = pg_catalog.current_database())
ORDER BY l.pid`

// sqlMigrationBlockers: the sessions that a migrator (a session named $1)
// waiting for a lock waits for, longest-open transaction first. Another
// login's transaction start is visible only to members of pg_read_all_stats
// (then NULL: no age). The asking session is never one: an index build
// CONCURRENTLY waits for every older snapshot, this statement's own too when
// it is open then, and naming it would say the migrator waits for itself.
// Only this database's migrator: a migration of another database on the
// server waits for sessions of its own.
const sqlMigrationBlockers = `
SELECT DISTINCT b.pid, coalesce(b.application_name, ''),
       coalesce(extract(epoch FROM pg_catalog.clock_timestamp() - b.xact_start), -1)::float8 AS open_for
FROM pg_catalog.pg_stat_activity w
CROSS JOIN LATERAL pg_catalog.unnest(pg_catalog.pg_blocking_pids(w.pid)) AS k(pid)
JOIN pg_catalog.pg_stat_activity b ON b.pid = k.pid
WHERE w.application_name = $1 AND w.wait_event_type = 'Lock' AND w.pid <> pg_catalog.pg_backend_pid()
  AND w.datname = pg_catalog.current_database() AND b.pid <> pg_catalog.pg_backend_pid()
ORDER BY open_for DESC, b.pid`

// A run's batch (migrations/00002_batch.sql): what a query source returned,
// fixed once per run. The first shard to start materialises it under
// sqlLockBatch with one statement (sqlFixQueryBatch) that runs the user's
// query and writes the header and the items, packed in blocks per shard; each
// shard then sorts its own items once into batch_sorted (sqlSortShard) and
// reads them by position (sqlFetchSorted).
const (
	// sqlLockBatch serialises the materialisers of one run, so that shards
	// starting together run the query once; the header's primary key, not
	// this lock, keeps the batch from being written twice. It is the
	// materialising transaction's (nothing of it outlives the transaction on
	// a pooler's server connection), and conflicts with the session lock of
	// the same key that earlier releases took (mixed releases during an
	// upgrade still wait for each other).
	// The wait is bounded (sqlBatchLockWait): a materialiser may hold the
	// lock for as long as its query runs, no longer.
	sqlLockBatch = `SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('runledger.batch/' || $1, 0))`

	sqlBatchHeader = `
SELECT id, source, shards, items, coalesce(digest, ''), created_at, pruned_at, run_namespace, run_name
FROM ` + Schema + `.batch_run WHERE run_uid = $1::text`

	// sqlBatchWorkMem gives the user's query (its own ORDER BY, a hash
	// join) and the packing's hash table room to stay in memory, for the
	// materialising transaction only; the batch's statement itself sorts
	// nothing.
	sqlBatchWorkMem = `SET LOCAL work_mem = '256MB'`

	// sqlBatchWrites lists the rows the session has written per table and
	// not yet reported to the statistics system, the batch's own tables
	// excepted: catalogs included, so DDL shows too. Read before and after
	// the batch's statement, the difference is what the user's query wrote
	// (a function it called): the query runs in a read-write transaction (it
	// feeds the batch's insert), and this is how "a batch query cannot write"
	// still holds. (Sequences are not tables: a nextval() goes unnoticed.)
	// It names the catalog by schema and runs under sqlPinnedSearchPath: a
	// temporary table the query created named like the view would otherwise
	// be read instead (pg_temp comes first unless the path lists it), and
	// hide every write, the ledger's included.
	sqlBatchWrites = `
SELECT s.relid::bigint, s.schemaname || '.' || s.relname, s.n_tup_ins, s.n_tup_upd, s.n_tup_del
FROM pg_catalog.pg_stat_xact_all_tables AS s
WHERE s.n_tup_ins + s.n_tup_upd + s.n_tup_del > 0
  AND s.relid NOT IN (
    SELECT c.oid FROM pg_catalog.pg_class AS c WHERE c.oid IN ('` + Schema + `.batch'::pg_catalog.regclass, '` + Schema + `.batch_run'::pg_catalog.regclass)
    UNION ALL
    SELECT c.reltoastrelid FROM pg_catalog.pg_class AS c WHERE c.oid IN ('` + Schema + `.batch'::pg_catalog.regclass, '` + Schema + `.batch_run'::pg_catalog.regclass)
  )`

	// sqlFixStaticBatch records a static batch's size and digest the first
	// time; its items are not copied (the spec, ConfigMap or file holds them).
	// $1 run uid, $2 namespace, $3 name, $4 shards, $5 items, $6 digest.
	sqlFixStaticBatch = `
INSERT INTO ` + Schema + `.batch_run (run_uid, run_namespace, run_name, source, shards, items, digest)
VALUES ($1, $2, $3, 'static', $4, $5, $6)
ON CONFLICT (run_uid) DO NOTHING`

	// sqlBatchShardSize counts a shard's items: its blocks' seqs (the
	// primary key's range of the shard).
	sqlBatchShardSize = `SELECT coalesce(pg_catalog.sum(pg_catalog.cardinality(seqs)), 0) FROM ` + Schema + `.batch WHERE batch_id = $1 AND shard = $2`

	// sqlPruneCandidates lists the runs whose batch was created before $1
	// and is not pruned yet, oldest first, with their shard counts.
	sqlPruneCandidates = `
SELECT run_uid, run_namespace, run_name, shards FROM ` + Schema + `.batch_run
WHERE created_at < $1 AND pruned_at IS NULL
ORDER BY created_at, run_uid`

	// sqlTryShardLocks takes, for the rest of the transaction, the shard
	// locks $1 (shardLockKey's) that no session holds, and says whether it
	// got them all: no worker of a release before the lease runs those
	// shards, nor starts before the transaction ends.
	sqlTryShardLocks = `SELECT coalesce(pg_catalog.bool_and(pg_catalog.pg_try_advisory_xact_lock(k)), true) FROM pg_catalog.unnest($1::bigint[]) AS k`

	// sqlTakeRunLeases takes, for the pruning transaction, the lease of
	// every one of run $1's $2 shards that is free or expired, and answers
	// how many it could not take: shards in flight. A chunk in flight holds
	// its shard's row: the take waits for it. A worker starting meanwhile
	// waits for the prune's transaction, then finds the tombstone.
	sqlTakeRunLeases = `
WITH taken AS (
    INSERT INTO ` + Schema + `.shard_lease AS l (run_uid, shard, holder, expires_at)
    SELECT $1, s, 'runledger prune', pg_catalog.now() FROM pg_catalog.generate_series(0, $2::integer - 1) AS s
    ON CONFLICT (run_uid, shard) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
    WHERE l.expires_at <= pg_catalog.now()
    RETURNING 1
)
SELECT $2::integer - pg_catalog.count(*)::integer FROM taken`

	// sqlPruneBatch deletes the blocks of run $1's batch and its shards'
	// sorted copies and leases, the run's failure records and its shards'
	// progress rows, and keeps its header as a tombstone (pruned_at), so
	// that a worker of a pruned run fails instead of materialising its batch
	// again. It returns the batches pruned (0 or 1), the items and the
	// failure records deleted.
	sqlPruneBatch = `
WITH old AS (
    UPDATE ` + Schema + `.batch_run SET pruned_at = pg_catalog.now()
    WHERE run_uid = $1 AND pruned_at IS NULL
    RETURNING id
), gone AS (
    DELETE FROM ` + Schema + `.batch AS b USING old WHERE b.batch_id = old.id
    RETURNING pg_catalog.cardinality(b.seqs) AS items
), failures AS (
    DELETE FROM ` + Schema + `.item_failure AS f WHERE f.run_uid = $1 AND EXISTS (SELECT FROM old)
    RETURNING 1
), progress AS (
    DELETE FROM ` + Schema + `.shard_progress AS p WHERE p.run_uid = $1 AND EXISTS (SELECT FROM old)
), sorted AS (
    DELETE FROM ` + Schema + `.batch_sorted AS s USING old WHERE s.batch_id = old.id
), sorted_shards AS (
    DELETE FROM ` + Schema + `.batch_sorted_shard AS s USING old WHERE s.batch_id = old.id
), leases AS (
    DELETE FROM ` + Schema + `.shard_lease AS l WHERE l.run_uid = $1 AND EXISTS (SELECT FROM old)
)

SELECT (SELECT pg_catalog.count(*) FROM old), (SELECT coalesce(pg_catalog.sum(items), 0) FROM gone), (SELECT pg_catalog.count(*) FROM failures)`
)

// A shard's reader (migrations/00017_batch_sorted.sql): its items sorted
// once into blocks of batchSortedBlock consecutive positions, then read by
// position, one short transaction per fetch, on any connection.
const (
	// batchSortedBlock is the number of positions per block of a sorted
	// copy: a fetch reads the blocks its positions span, so small enough to
	// read little beyond a fetch, large enough that a block's arrays are
	// one TOASTed value rather than many rows.
	batchSortedBlock = 1024

	// sqlSortedShard is the header of a shard's sorted copy: its items, or
	// no row when there is no copy (never sorted, deleted, or emptied with
	// the unlogged tables by a crash).
	sqlSortedShard = `SELECT items FROM ` + Schema + `.batch_sorted_shard WHERE batch_id = $1 AND shard = $2`

	// sqlSortWorkMem lets a shard's sort and its blocks' hash table stay in
	// memory, for the sorting transaction only.
	sqlSortWorkMem = `SET LOCAL work_mem = '64MB'`

	// sqlDiscardSorted deletes a shard's sorted copy, header first in the
	// same transaction.
	sqlDiscardSorted = `
WITH h AS (
    DELETE FROM ` + Schema + `.batch_sorted_shard WHERE batch_id = $1 AND shard = $2
)
DELETE FROM ` + Schema + `.batch_sorted WHERE batch_id = $1 AND shard = $2`
)

// The sort, the order check and the fetches of a shard. The fetches: the
// items of shard $2 of batch $1 at positions $3 to $3 + $4 - 1, in order
// (the blocks those positions span, one probe of the primary key's range
// each), from the sorted copy or, for a shard in key order already, from
// the batch itself. The probe fetches give each the run holding its key
// (the preload, one probe of the rule's index per row as in sqlHolders)
// and, for another run's, whether the payloads match, as of the fetch; the
// plain ones look nothing up (the claim will: see worker.queryStream, which
// picks one per fetch).
var (
	sortedBlock = strconv.Itoa(batchSortedBlock)

	// sqlSortShard writes shard $2 of batch $1 into batch_sorted in key
	// order (the rule's column order, occurrence then entity, as
	// compareKeys: byte order, NULL key parts first, repeats of a key in
	// query order), each item with its position in that order from 0, and
	// the copy's header in the same statement. The batch is fixed and seq
	// breaks every tie, so every sort gives the same positions: a reader
	// resumes at the position it reached, whichever copy it reads. A copy
	// another sorter wrote first is kept (the second writes nothing). The
	// blocks' arrays are built in any order (hashed, no per-block sort);
	// each item carries its position, by which the fetch orders.
	sqlSortShard = `
WITH blocks AS (
    INSERT INTO ` + Schema + `.batch_sorted (batch_id, shard, block, positions, seqs, entities, occurrences, payloads)
    SELECT $1, $2, (s.pos / ` + sortedBlock + `)::integer, pg_catalog.array_agg(s.pos), pg_catalog.array_agg(s.seq), pg_catalog.array_agg(s.entity), pg_catalog.array_agg(s.occurrence), pg_catalog.array_agg(s.payload)
    FROM (
        SELECT u.seq, u.entity, u.occurrence, u.payload,
               pg_catalog.row_number() OVER (ORDER BY u.occurrence COLLATE "C" NULLS FIRST, u.entity COLLATE "C" NULLS FIRST, u.seq) - 1 AS pos
        FROM ` + Schema + `.batch AS k
        CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(k.seqs), pg_catalog.unnest(k.entities), pg_catalog.unnest(k.occurrences), pg_catalog.unnest(k.payloads)) AS u(seq, entity, occurrence, payload)
        WHERE k.batch_id = $1 AND k.shard = $2
        OFFSET 0
    ) AS s
    GROUP BY s.pos / ` + sortedBlock + `
    ON CONFLICT DO NOTHING
    RETURNING pg_catalog.cardinality(positions) AS n
)
INSERT INTO ` + Schema + `.batch_sorted_shard (batch_id, shard, items)
SELECT $1, $2, coalesce(pg_catalog.sum(n), 0) FROM blocks
ON CONFLICT DO NOTHING`

	// sqlBatchOrder tells whether shard $2 of batch $1 is in key order
	// where it lies (its blocks in block order, each block's items in the
	// order of its arrays), as sqlSortShard would order it: per block, in
	// block order, its item count, its first and last items' keys and seqs,
	// and whether its items ascend strictly by (occurrence, entity, seq) in
	// byte order; the reader compares each block's last item with the next
	// block's first (BatchReader.inOrder). A NULL key part counts as out of
	// order. Each item is compared with the next one of its block, the
	// arrays unnested side by side in the target list (streamed; unnest in
	// FROM would store each block's pairs first, half as fast again), and a
	// block stops at its first pair out of order. Each array is read once
	// (|| '{}' returns it detoasted, in a subquery OFFSET 0 keeps: every
	// reference to the column would decompress it again, which made the
	// check twice as slow on a batch out of order).
	sqlBatchOrder = `
SELECT k.block, pg_catalog.cardinality(a.s), a.o[1], a.e[1], a.s[1], a.o[pg_catalog.cardinality(a.s)], a.e[pg_catalog.cardinality(a.s)], a.s[pg_catalog.cardinality(a.s)],
       NOT EXISTS (
           SELECT FROM (
               SELECT pg_catalog.unnest(a.o[:pg_catalog.cardinality(a.s) - 1]) AS po, pg_catalog.unnest(a.e[:pg_catalog.cardinality(a.s) - 1]) AS pe, pg_catalog.unnest(a.s[:pg_catalog.cardinality(a.s) - 1]) AS ps,
                      pg_catalog.unnest(a.o[2:]) AS o, pg_catalog.unnest(a.e[2:]) AS e, pg_catalog.unnest(a.s[2:]) AS s
           ) AS u
           WHERE ((u.po COLLATE "C", u.pe COLLATE "C", u.ps) < (u.o COLLATE "C", u.e COLLATE "C", u.s)) IS NOT TRUE
       )
FROM ` + Schema + `.batch AS k
CROSS JOIN LATERAL (
    SELECT k.occurrences || '{}'::text[] AS o, k.entities || '{}'::text[] AS e, k.seqs || '{}'::bigint[] AS s
    OFFSET 0
) AS a
WHERE k.batch_id = $1 AND k.shard = $2
ORDER BY k.block`

	// The fetches of a sorted copy, and of a shard read in place.
	sqlFetchSortedProbe  = sqlFetchProbe(sqlSortedRange, "$5", "$6")
	sqlFetchSortedPlain  = sqlFetchPlain(sqlSortedRange)
	sqlFetchInPlaceProbe = sqlFetchProbe(sqlInPlaceRange, "$7", "$8")
	sqlFetchInPlacePlain = sqlFetchPlain(sqlInPlaceRange)

	sqlSortedRange = `
    SELECT u.pos, u.seq, u.entity, u.occurrence, u.payload
    FROM ` + Schema + `.batch_sorted AS k
    CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(k.positions), pg_catalog.unnest(k.seqs), pg_catalog.unnest(k.entities), pg_catalog.unnest(k.occurrences), pg_catalog.unnest(k.payloads)) AS u(pos, seq, entity, occurrence, payload)
    WHERE k.batch_id = $1 AND k.shard = $2
      AND k.block BETWEEN ($3::bigint / ` + sortedBlock + `)::integer AND (($3::bigint + $4::integer - 1) / ` + sortedBlock + `)::integer
      AND u.pos >= $3::bigint
    ORDER BY u.pos
    LIMIT $4::integer`

	// sqlInPlaceRange reads positions $3 to $3 + $4 - 1 of a shard in key
	// order where it lies: $5 are the shard's blocks those positions span
	// (consecutive among its blocks), $6 each one's first position
	// (BatchReader.inPlace); an item's position is its block's first plus
	// its place in the block's arrays. The blocks are one range of the
	// primary key, as a sorted copy's are. A block's first position is
	// looked up once per block (OFFSET 0 keeps it out of the per-item
	// expressions, where it made the fetch a third slower).
	sqlInPlaceRange = `
    SELECT p.start + u.ord - 1 AS pos, u.seq, u.entity, u.occurrence, u.payload
    FROM ` + Schema + `.batch AS k
    CROSS JOIN LATERAL (SELECT ($6::bigint[])[pg_catalog.array_position($5::bigint[], k.block)] AS start OFFSET 0) AS p
    CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(k.seqs), pg_catalog.unnest(k.entities), pg_catalog.unnest(k.occurrences), pg_catalog.unnest(k.payloads)) WITH ORDINALITY AS u(seq, entity, occurrence, payload, ord)
    WHERE k.batch_id = $1 AND k.shard = $2
      AND k.block BETWEEN ($5::bigint[])[1] AND ($5::bigint[])[pg_catalog.cardinality($5::bigint[])]
      AND p.start + u.ord - 1 BETWEEN $3::bigint AND $3::bigint + $4::integer - 1`
)

// The claim of a fresh range on the server (BatchReader.ClaimFresh): the
// items of rng's positions go from the batch to the ledger in one plain
// INSERT, never through the worker, but only when every one of them passes
// freshRangeGood, which rejects every item rowEntry (internal/worker) would
// fail and some it would not; otherwise nothing is inserted and the worker
// claims the positions as it always does. A held key (or one repeated in
// the range) makes the rule reject the statement, as sqlInsertFresh's; a
// payload that is not JSON fails its cast: either way nothing commits.
var (
	sqlClaimFreshSorted        = sqlClaimFresh(sqlSortedRange, 5, sortedWhole, false)
	sqlClaimFreshSortedEffect  = sqlClaimFresh(sqlSortedRange, 5, sortedWhole, true)
	sqlClaimFreshInPlace       = sqlClaimFresh(sqlInPlaceRange, 7, "", false)
	sqlClaimFreshInPlaceEffect = sqlClaimFresh(sqlInPlaceRange, 7, "", true)
	sortedWhole                = `
               AND EXISTS (SELECT FROM ` + Schema + `.batch_sorted_shard AS c WHERE c.batch_id = $1 AND c.shard = $2)`
)

// sqlClaimFresh claims rng's rows (whose parameters come first): its
// parameters from $p on are the run's (namespace, name, uid, shard,
// attempt), then the largest key part and payload in bytes. The batch must
// be there as a fetch finds it (its header, not pruned, and whole, a
// further condition of the copy rng reads): a fetch says what went. It returns how
// many rows it inserted (0 or the range's count), the range's count, and
// the key at the range's last position; with effect, the rows it inserted
// go to the session's table "claimed" too, for the effect (copyClaimed).
// The payload is parsed once (doc),
// and only a payload that is exactly the text of its jsonb value passes: no
// name given twice, no lone surrogate escape, no syntax the strict reader
// refuses. A key part passes when its length in bytes is within the limit
// and it holds a printable ASCII character (so is not blank); a UTF8
// database holds only valid UTF-8 and no text holds a NUL.
func sqlClaimFresh(rng string, p int, whole string, effect bool) string {
	arg := func(i int) string { return "$" + strconv.Itoa(p+i) }
	returning, copied := "1", ""
	if effect {
		returning, copied = "entity, occurrence, payload", copyClaimed
	}
	return `
WITH r AS MATERIALIZED (
    SELECT b.pos, b.entity, b.occurrence, b.payload, b.payload::jsonb AS doc
    FROM (` + rng + `) AS b
), ok AS (
    SELECT pg_catalog.count(*) AS n,
           pg_catalog.current_setting('server_encoding') = 'UTF8' AND pg_catalog.bool_and(` + freshRangeGood(arg(5), arg(6)) + `)
               AND EXISTS (SELECT FROM ` + Schema + `.batch_run AS h WHERE h.id = $1 AND h.pruned_at IS NULL)` + whole + ` AS good
    FROM r
), ins AS (
    ` + insertIntoLedger + `
    SELECT r.entity, r.occurrence, 'committed', ` + arg(0) + `, ` + arg(1) + `, ` + arg(2) + `, ` + arg(3) + `, ` + arg(4) + `, r.doc
    FROM r, ok
    WHERE ok.good AND ok.n = $4::integer
    RETURNING ` + returning + `
)` + copied + `
SELECT (SELECT pg_catalog.count(*) FROM ins), ok.n, l.entity, l.occurrence
FROM ok LEFT JOIN r AS l ON l.pos = $3::bigint + ok.n - 1`
}

// freshRangeGood is the check of one row r of sqlClaimFresh, stricter than
// the worker's (rowEntry): maxKey and maxPayload are its parameters.
func freshRangeGood(maxKey, maxPayload string) string {
	return `r.entity IS NOT NULL AND r.occurrence IS NOT NULL
               AND pg_catalog.octet_length(r.entity) BETWEEN 1 AND ` + maxKey + `::integer
               AND pg_catalog.octet_length(r.occurrence) BETWEEN 1 AND ` + maxKey + `::integer
               AND r.entity ~ '[!-~]' AND r.occurrence ~ '[!-~]'
               AND (r.payload IS NULL OR pg_catalog.octet_length(r.payload) <= ` + maxPayload + `::integer AND r.doc::text = r.payload)`
}

// sqlFetchProbe is a fetch of rng's rows (pos, seq, entity, occurrence,
// payload) in position order, each with whether the reading run holds its
// key (NULL: nobody does; not the holder's id, which was 40 bytes of
// BenchmarkWorker's settled row's 100) and, for another run's, whether the
// payloads match. A row the lookup settles (the run's own key, or another
// run's with the same payload) comes without its payload unless
// heldPayloads (a Supersede run claims such keys again): nothing reads it,
// and the payload is most of what an already handled batch's fetch sends.
// run is the reading run's parameter.
func sqlFetchProbe(rng, run, heldPayloads string) string {
	return `
SELECT f.seq, f.entity, f.occurrence,
       CASE WHEN (f.holder = ` + run + ` OR NOT f.changed) AND NOT ` + heldPayloads + `::boolean THEN NULL ELSE f.payload END,
       f.holder = ` + run + `, f.changed
FROM (
    SELECT b.pos, b.seq, b.entity, b.occurrence, b.payload, ` + heldFor(run) + ` AS holder,
           CASE WHEN ` + othersRow(run) + ` THEN ` + sqlBatchPayloadSameText + ` END AS changed
    FROM (` + rng + `) AS b
    LEFT JOIN LATERAL (
        SELECT l.run_uid, l.payload
        FROM ` + Schema + `.ledger AS l
        WHERE l.entity = b.entity AND l.occurrence = b.occurrence AND l.state = 'committed'
        LIMIT 1
    ) AS h ON true` + ownRetired(run, "b") + `
) AS f
ORDER BY f.pos`
}

// sqlFetchPlain is a fetch of rng's rows in position order that looks
// nothing up (the claim will).
func sqlFetchPlain(rng string) string {
	return `
SELECT b.seq, b.entity, b.occurrence, b.payload, NULL::boolean, NULL::boolean
FROM (` + rng + `) AS b
ORDER BY b.pos`
}

// sqlBeforeBatchQuery prepares the materialising transaction: its work_mem,
// the run's bounds on the query and the statements after it (sqlBounds),
// and the ledger's search_path for its own statements before the query
// (sqlUserPath gives the query the user's).
func sqlBeforeBatchQuery(bounds string) string {
	return sqlBatchWorkMem + `; ` + bounds + `; ` + sqlKeyFormats + `; ` + sqlPinnedSearchPath
}

// sqlKeyFormats fixes, for the query's transaction, the settings that decide
// how a value prints as text, which its key parts become in the batch: under
// the session's own, two values could print as one key (float8 under
// extra_float_digits = 0) and one value as another key in another session
// (a date under DateStyle SQL, an interval, a bytea). Output only: the
// query reads its input as the session does (DateStyle's field order is
// left as it is); TimeZone, which changes what the query means, is the
// session's (a timestamptz key is refused: QuerySource.Check).
const sqlKeyFormats = `SET LOCAL extra_float_digits = 1; SET LOCAL DateStyle = 'ISO'; SET LOCAL IntervalStyle = 'postgres'; SET LOCAL bytea_output = 'hex'`

// sqlUserPath gives the user's SQL, for the rest of the transaction, the
// search_path the session would have had without the ledger's pin
// (userSearchPath: the connection string's, the role's, the database's or
// the server's), so that its names resolve as its author wrote them. ""
// (a pool Open did not make): the session's own reset value.
func sqlUserPath(path string) string {
	if path == "" {
		return `SET LOCAL search_path TO DEFAULT`
	}
	return `SELECT pg_catalog.set_config('search_path', ` + quoteLiteral(path) + `, true)`
}

// sqlAfterBatchQuery resets the session after the user's query
// (sqlResetSession), sets the run's bounds again for the rest of the
// transaction, and the ledger's search_path (the user's query ran as the
// worker login and may have created objects that would stand in for the
// catalog's: sqlBatchWrites).
func sqlAfterBatchQuery(bounds string) string {
	return sqlResetSession + `; ` + bounds + `; ` + sqlPinnedSearchPath
}

// sqlBatchLockWait bounds, for the materialising transaction, the wait for
// the batch lock (sqlLockBatch) to the query's own bound plus a lock wait;
// the query's bounds (sqlBeforeBatchQuery) replace it once the lock is taken.
func sqlBatchLockWait(query, lock time.Duration) string {
	return `SET LOCAL lock_timeout = ` + milliseconds(cmp.Or(query, DefaultQueryTimeout)+cmp.Or(lock, DefaultLockTimeout))
}

// sqlBeginPrune begins a run's prune, bounded like a batch's query (the
// session's bounds, or the defaults).
func sqlBeginPrune() string {
	return sqlBeginPinned + `; ` + sqlBounds(0, 0, DefaultQueryTimeout, DefaultLockTimeout)
}

// sqlPruneSuperseded deletes the superseded ledger rows retired before $1:
// history that no rule reads. Only a member of the ledger's owner role may
// (the append-only trigger); committed rows are never deleted.
const sqlPruneSuperseded = `DELETE FROM ` + Schema + `.ledger WHERE state = 'superseded' AND superseded_at < $1`

// sqlFixQueryBatch and sqlBatchRows hold the user's query and run, as one
// statement, under the user's search_path (sqlUserPath), as the query
// was written for: every name of theirs around it is qualified, functions,
// operators (OPERATOR(pg_catalog.x)), types and collations, so that nothing
// the user's schemas hold stands in for the catalog's
// (TestUserPathStatementsNameOnlyTheCatalog).
//
// sqlFixQueryBatch writes the header and, only if this statement wrote it,
// the query's items packed in blocks (sqlBatchRows): a second materialiser
// blocks on the header's primary key until the first commits, then writes
// nothing (and if the first rolled back, it writes the batch itself). It
// returns the number of items it wrote, which goes into the header it wrote
// (sqlSetBatchItems) in the same transaction; 0 if it wrote no header.
// $1 run uid, $2 namespace, $3 name, $4 shards, $5 the query's digest (NULL: none).
func sqlFixQueryBatch(query string, hasPayload bool, shards int, shardOf func(entity, occurrence string) string) string {
	return `
WITH hdr AS (
    INSERT INTO ` + Schema + `.batch_run (run_uid, run_namespace, run_name, source, shards, items, digest)
    VALUES ($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, 'query', $4::integer, 0, $5::pg_catalog.text)
    ON CONFLICT (run_uid) DO NOTHING
    RETURNING id
), ins AS (
    INSERT INTO ` + Schema + `.batch (batch_id, shard, block, seqs, entities, occurrences, payloads)
    SELECT hdr.id, r.* FROM hdr CROSS JOIN (
` + sqlBatchRows(query, hasPayload, shards, shardOf) + `
    ) AS r
    RETURNING pg_catalog.cardinality(seqs) AS items
)
SELECT coalesce(pg_catalog.sum(items), 0::bigint) FROM ins`
}

// sqlInsertObjectBatch writes the header of an object source's batch,
// before its items are copied (the rows' key is the header's id).
// $1 run uid, $2 namespace, $3 name, $4 shards, $5 the source's digest.
const sqlInsertObjectBatch = `
INSERT INTO ` + Schema + `.batch_run (run_uid, run_namespace, run_name, source, shards, items, digest)
VALUES ($1, $2, $3, 'object', $4, 0, $5)
RETURNING id`

// sqlInsertQueryBatch writes the header of a query's batch copied from the
// query's session (copyQueryBatch), before its items. $1 run uid,
// $2 namespace, $3 name, $4 shards, $5 the query's digest (NULL: none).
const sqlInsertQueryBatch = `
INSERT INTO ` + Schema + `.batch_run (run_uid, run_namespace, run_name, source, shards, items, digest)
VALUES ($1, $2, $3, 'query', $4, 0, $5)
RETURNING id`

// sqlCopyBatch copies a batch's blocks, in COPY's binary format, as
// copyPacker writes them.
const sqlCopyBatch = `COPY ` + Schema + `.batch (batch_id, shard, block, seqs, entities, occurrences, payloads) FROM STDIN (FORMAT binary)`

// sqlBatchQueryRows is the user's query as copyQueryBatch reads it: each
// row's key parts and payload as text (NULL where the query gave NULL), in
// the query's order, which numbers the items. Run under the user's
// search_path, like sqlBatchRows, every name of ours qualified.
func sqlBatchQueryRows(query string, hasPayload bool) string {
	payload := "NULL::pg_catalog.text"
	if hasPayload {
		payload = "q.payload::pg_catalog.text"
	}
	return `SELECT q.entity::pg_catalog.text, q.occurrence::pg_catalog.text, ` + payload + `
FROM (
` + query + `
) AS q`
}

// sqlSetObjectBatch records the item count and the objects read ($3, a
// JSON array) of the object batch just copied.
const sqlSetObjectBatch = `UPDATE ` + Schema + `.batch_run SET items = $2, objects = $3::pg_catalog.jsonb WHERE run_uid = $1`

// sqlBatchObjects reads the objects an object batch was read from.
const sqlBatchObjects = `SELECT coalesce(objects, '[]'::pg_catalog.jsonb) FROM ` + Schema + `.batch_run WHERE run_uid = $1`

// sqlObjectCopyBounds lifts the statement bound for the COPY of an object
// batch, whose length is the objects' (a 10 GB object streams for
// minutes); the store's own reads are bounded by their idle timeout.
const sqlObjectCopyBounds = `SET LOCAL statement_timeout = 0`

// sqlSetBatchItems records the item count of the batch just written.
const sqlSetBatchItems = `UPDATE ` + Schema + `.batch_run SET items = $2 WHERE run_uid = $1`

// The bounds of a block of the batch: the items of one shard among
// batchBlockSeqs consecutive seqs (about batchBlockSeqs/shards items), each
// of at most batchItemBytes of key and payload text; a larger item is a block
// of its own. No block then holds more than 64 MiB of text, far from
// PostgreSQL's 1 GB limit on a value, whatever the shards' skew.
const (
	batchBlockSeqs = 4000
	batchItemBytes = 16 << 10
)

// sqlBatchRows is the user's query as the batch's blocks: (shard, block,
// seqs, entities, occurrences, payloads). An item's shard is shardOf over its
// key's text (items with a NULL key part go to shard 0); its seq is its row
// number in the query's output. Blocks are numbered 2*(seq/batchBlockSeqs),
// a large item's own 2*seq+1.
//
// Nothing is sorted: a shard sorts its own items when it reads
// (sqlSortShard), and a block's items need no order, since its
// arrays are built side by side from the same rows. The blocks are grouped
// by one column of a subquery the planner may not flatten (OFFSET 0): it
// then estimates few groups and hashes them, where grouping by two columns,
// or by an expression over the query's, made it sort every item first (see
// docs/insert-path.md, as for bounding a block by a running byte count).
// Column names are prefixed rl_ so as not to collide with the user's.
func sqlBatchRows(query string, hasPayload bool, shards int, shardOf func(entity, occurrence string) string) string {
	payload := "NULL::pg_catalog.text"
	if hasPayload {
		payload = "q.payload::pg_catalog.text"
	}
	n := strconv.Itoa(max(shards, 1)) + `::bigint`
	add, mul, div := ` OPERATOR(pg_catalog.+) `, ` OPERATOR(pg_catalog.*) `, ` OPERATOR(pg_catalog./) `
	size := func(col string) string { return `coalesce(pg_catalog.octet_length(` + col + `), 0)` }
	return `SELECT b.rl_k OPERATOR(pg_catalog.%) ` + n + `, b.rl_k` + div + n + `, pg_catalog.array_agg(b.rl_n), pg_catalog.array_agg(b.rl_e), pg_catalog.array_agg(b.rl_o), pg_catalog.array_agg(b.rl_p)
FROM (
    SELECT CASE WHEN ` + size("r.rl_e") + add + size("r.rl_o") + add + size("r.rl_p") + ` OPERATOR(pg_catalog.>) ` + strconv.Itoa(batchItemBytes) + `
                THEN 2::bigint` + mul + `r.rl_n` + add + `1::bigint ELSE 2::bigint` + mul + `(r.rl_n` + div + strconv.Itoa(batchBlockSeqs) + `::bigint) END` + mul + n + `
               ` + add + `coalesce(` + shardOf("r.rl_e", "r.rl_o") + `, 0::bigint) AS rl_k,
           r.rl_n, r.rl_e, r.rl_o, r.rl_p
    FROM (
        SELECT q.entity::pg_catalog.text AS rl_e, q.occurrence::pg_catalog.text AS rl_o, ` + payload + ` AS rl_p, pg_catalog.row_number() OVER () AS rl_n
        FROM (
` + query + `
        ) AS q
    ) AS r
    OFFSET 0
) AS b
GROUP BY b.rl_k`
}

// sqlGrantWorker gives role (an identifier, already quoted) exactly what a
// worker's protocol needs, after taking back whatever it had on runledger's
// tables, in one transaction (`runledger migrate --grant-to`):
//   - the schema, and goose's version table read-only: a worker's Migrate
//     finds nothing to apply without any CREATE privilege;
//   - the ledger: read, insert, and change state and superseded_at only
//     (supersede); no DELETE, no TRUNCATE (the append-only trigger refuses
//     those to everyone anyway);
//   - the batch: read and write a run's batch once, set its header's item
//     count and, for an object batch, the objects read (objects); pruning
//     (DELETE, pruned_at) is the owner's;
//   - a shard's sorted copy of its batch: write, read and delete it (it is
//     derived from the batch, and sorted again when missing);
//   - a shard's lease: take, renew (shard_lease_hold) and give it back;
//   - the failure records: write, replace (every column but the key) and
//     forget a run's; no TRUNCATE; pruning them with their run is the
//     owner's;
//   - its shard's progress row: write and replace it, read its run's;
//     no DELETE (pruning them with their run is the owner's);
//   - taking back its own transaction's claims (ledger_take_back, for a
//     processor's refusals; it touches no committed row; nobody else may);
//   - running an effect in its sandbox (run_effect, whose owner, the
//     effect role, it becomes for the effect's duration);
//   - TEMP on the database (db, quoted), for the effect's table "claimed"
//     (PostgreSQL grants it to PUBLIC by default; granted here so that a
//     database that revoked it still works).
//
// Identity columns draw their values without any sequence privilege.
func sqlGrantWorker(role, db string) string {
	return `REVOKE ALL ON ALL TABLES IN SCHEMA ` + Schema + ` FROM ` + role + `;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA ` + Schema + ` FROM ` + role + `;
GRANT USAGE ON SCHEMA ` + Schema + ` TO ` + role + `;
GRANT SELECT ON ` + versionTable + ` TO ` + role + `;
GRANT SELECT, INSERT, UPDATE (state, superseded_at) ON ` + Schema + `.ledger TO ` + role + `;
GRANT SELECT, INSERT, UPDATE (items, objects) ON ` + Schema + `.batch_run TO ` + role + `;
GRANT SELECT, INSERT ON ` + Schema + `.batch TO ` + role + `;
GRANT SELECT, INSERT, DELETE ON ` + Schema + `.batch_sorted, ` + Schema + `.batch_sorted_shard TO ` + role + `;
GRANT SELECT ON ` + Schema + `.ledger_retired TO ` + role + `;
GRANT SELECT, INSERT, DELETE, UPDATE (` + failureRecordColumns + `) ON ` + Schema + `.item_failure TO ` + role + `;
GRANT SELECT, INSERT, UPDATE (` + progressColumns + `) ON ` + Schema + `.shard_progress TO ` + role + `;
GRANT SELECT, INSERT, DELETE, UPDATE (holder, expires_at) ON ` + Schema + `.shard_lease TO ` + role + `;
GRANT EXECUTE ON FUNCTION ` + Schema + `.shard_lease_hold(text, integer, text, interval) TO ` + role + `;
GRANT EXECUTE ON FUNCTION ` + Schema + `.ledger_take_back(text[], text[], bigint[]) TO ` + role + `;
GRANT EXECUTE ON FUNCTION ` + Schema + `.run_effect(text) TO ` + role + `;
GRANT TEMPORARY ON DATABASE ` + db + ` TO ` + role
}

// sqlCurrentDatabase names the database to grant TEMP on.
const sqlCurrentDatabase = `SELECT pg_catalog.current_database()`

// sqlShardOf is ShardOf as a PostgreSQL expression over two text expressions
// (entity, occurrence) for n shards; NULL when either is NULL.
func sqlShardOf(entity, occurrence string, n int) string {
	if n <= 1 {
		return "0"
	}
	return fmt.Sprintf(`((pg_catalog.hashtextextended(%s COLLATE pg_catalog."C", pg_catalog.hashtextextended(%s COLLATE pg_catalog."C", '%d'::bigint)) OPERATOR(pg_catalog.&) 9223372036854775807::bigint) OPERATOR(pg_catalog.%%) %d::bigint)`,
		entity, occurrence, int64(shardSeed), n)
}

// The shard's lease (lease.go, migrations/00018): a row per run and shard.
const (
	// sqlTakeShardLease takes shard $2 of run $1's lease for holder $3 for
	// $4 milliseconds when it is free, expired or $3's already, and answers
	// a row only then. A holder's chunk in flight has the row locked: the
	// take waits for it.
	sqlTakeShardLease = `
INSERT INTO ` + Schema + `.shard_lease AS l (run_uid, shard, holder, expires_at)
VALUES ($1, $2, $3, pg_catalog.now() + $4 * interval '1 millisecond')
ON CONFLICT (run_uid, shard) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= pg_catalog.now()
RETURNING true`
	// sqlLeaseLockWait bounds a take's wait for a chunk in flight that
	// holds the lease's row: a busy lease, tried again a second later.
	sqlLeaseLockWait = `SET LOCAL lock_timeout = '1s'`
	// sqlReleaseShardLease gives holder $3's lease back.
	sqlReleaseShardLease = `DELETE FROM ` + Schema + `.shard_lease WHERE run_uid = $1 AND shard = $2 AND holder = $3`
)

// sqlHoldShardLease renews holder's lease in the caller's transaction and
// row-locks it there, or fails the transaction (RL001) when it is not the
// holder's any more. Literals, for a chunk's BEGIN (a simple query).
func sqlHoldShardLease(runUID string, shard int, holder string, ttl time.Duration) string {
	return `SELECT ` + Schema + `.shard_lease_hold(` + quoteLiteral(runUID) + `, ` + strconv.Itoa(shard) + `, ` + quoteLiteral(holder) +
		`, interval '` + milliseconds(ttl) + ` milliseconds')`
}

// sqlServerIdentity reads which server, and which life of it, a session
// reached (serverWatch, the shard's counted proof): its address, its start,
// its WAL's timeline (the first 8 hex digits of the current WAL file's
// name, the insert timeline's, right after a promotion too; none on a
// standby, where there is no current insert position), and when its
// statistics started (a crash recovery resets them: ServerIdentity.Reset).
const sqlServerIdentity = `SELECT pg_catalog.host(pg_catalog.inet_server_addr()), pg_catalog.inet_server_port(), pg_catalog.pg_postmaster_start_time(),
       CASE WHEN NOT pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()) END,
       (SELECT s.stats_reset FROM pg_catalog.pg_stat_bgwriter AS s)`

// sqlBackendPID is the server backend's own process ID (poolerProbe).
// With it the search_path a session of the pool would have without the pin
// (its reset value: the connection string's, the role's or database's, or
// the server's).
const sqlBackendPID = `SELECT pg_catalog.pg_backend_pid(), (SELECT s.reset_val FROM pg_catalog.pg_settings AS s WHERE s.name = 'search_path')`

// sqlDurability reads what the server promises of a commit (durability.go):
// synchronous_commit as the login's sessions start with it (its reset
// value: the server's, the database's or role's, the connection string's),
// which a chunk's transaction commits under, since its session is reset
// before the chunk behind a pooler and after the effect directly; the
// server-wide synchronous_standby_names and max_wal_senders; and whether the
// server is a standby in recovery. pg_settings and these three settings are
// readable by any login.
const sqlDurability = `SELECT (SELECT s.reset_val FROM pg_catalog.pg_settings AS s WHERE s.name = 'synchronous_commit'),
    pg_catalog.current_setting('synchronous_standby_names'),
    pg_catalog.current_setting('max_wal_senders')::integer,
    pg_catalog.pg_is_in_recovery()`

// sqlWALPosition is where the server's WAL is now (AwaitStandby's
// position), as text.
const sqlWALPosition = `SELECT pg_catalog.pg_current_wal_lsn()::pg_catalog.text`

// sqlStandbysHave counts the server's standbys, those that have flushed its
// WAL up to $1 and those whose position the login may not read (NULL
// without pg_read_all_stats); a base backup's walsender is no standby, nor
// a logical replication client's (it is never promoted): its walsender is
// connected to a database (pg_stat_activity.datid) from its start, before
// its slot is active, where a standby's never is. And
// the physical replication slots no walsender streams from now (a standby
// cut off, or restarting: pg_auto_failover, Patroni and CloudNativePG keep
// one per standby), those whose standby had flushed up to $1 before
// (a physical slot's restart_lsn is its standby's flush position), a slot
// whose WAL was removed (restart_lsn NULL) not counted. Each view is read
// once; pg_replication_slots is readable by any login.
const sqlStandbysHave = `SELECT r.standbys, r.flushed, r.hidden, s.disconnected, s.flushed
FROM (SELECT pg_catalog.count(*)::integer AS standbys,
        (pg_catalog.count(*) FILTER (WHERE r.flush_lsn OPERATOR(pg_catalog.>=) $1::pg_catalog.text::pg_catalog.pg_lsn))::integer AS flushed,
        (pg_catalog.count(*) FILTER (WHERE r.flush_lsn IS NULL))::integer AS hidden
    FROM pg_catalog.pg_stat_replication AS r
    WHERE (r.state IS NULL OR r.state OPERATOR(pg_catalog.<>) 'backup')
      AND NOT EXISTS (SELECT FROM pg_catalog.pg_stat_activity AS a
          WHERE a.pid OPERATOR(pg_catalog.=) r.pid AND a.datid IS NOT NULL)) AS r,
    (SELECT pg_catalog.count(*)::integer AS disconnected,
        (pg_catalog.count(*) FILTER (WHERE s.restart_lsn OPERATOR(pg_catalog.>=) $1::pg_catalog.text::pg_catalog.pg_lsn))::integer AS flushed
    FROM pg_catalog.pg_replication_slots AS s
    WHERE s.slot_type OPERATOR(pg_catalog.=) 'physical' AND NOT s.active AND NOT s.temporary AND s.restart_lsn IS NOT NULL) AS s`

// sqlDescribeQuery wraps the user's query to describe its columns without
// running it.
func sqlDescribeQuery(query string) string { return "SELECT * FROM (\n" + query + "\n) AS q" }

// sqlSetOccurrence gives a batch query its run's occurrence as
// current_setting('runledger.occurrence'), local to the transaction that
// runs the query: a value, never text pasted into the user's SQL.
const (
	sqlOccurrenceSetting = "runledger.occurrence"
	sqlSetOccurrence     = `SELECT pg_catalog.set_config('` + sqlOccurrenceSetting + `', $1, true)`
	sqlOccurrenceDefined = `SELECT pg_catalog.current_setting('` + sqlOccurrenceSetting + `', true) IS NOT NULL`
)

// Failure records (migrations/00010, failures.go). sqlRecordVerdicts writes
// a chunk's failed items and forgets the earlier passes' records of the keys
// the chunk settled otherwise, in one statement. A record of an earlier pass
// is replaced; one of this pass (a key whose repeats span two chunks) gets
// the later chunk's copies added, keeping its first error: $1 run uid, $2 namespace,
// $3 name, $4 shard, $5 attempt, $6 pass, $7 chunk; the failed items as
// arrays $8 entities, $9 occurrences, $10 copies, $11 payload digests (NULL:
// no payload), $12 classes, $13 errors (keys distinct), $16 payloads (NULL:
// none, or not kept: migrations/00014); $14, $15 the settled keys. It
// returns the rows deleted and written.
const sqlRecordVerdicts = `
WITH gone AS (
    DELETE FROM ` + Schema + `.item_failure AS f
    USING ROWS FROM (pg_catalog.unnest($14::text[]), pg_catalog.unnest($15::text[])) AS k(entity, occurrence)
    WHERE f.run_uid = $1 AND f.entity = k.entity AND f.occurrence = k.occurrence AND f.pass <> $6
    RETURNING 1
), put AS (
    INSERT INTO ` + Schema + `.item_failure AS f
        (run_uid, entity, occurrence, run_namespace, run_name, shard, attempt, pass, chunk, items, payload_digest, class, error, payload)
    SELECT $1, k.entity, k.occurrence, $2, $3, $4, $5, $6, $7, k.items, k.digest, k.class, k.error, k.payload
    FROM ROWS FROM (pg_catalog.unnest($8::text[]), pg_catalog.unnest($9::text[]), pg_catalog.unnest($10::integer[]), pg_catalog.unnest($11::text[]), pg_catalog.unnest($12::text[]), pg_catalog.unnest($13::text[]), pg_catalog.unnest($16::text[]))
        AS k(entity, occurrence, items, digest, class, error, payload)
    ON CONFLICT (run_uid, entity, occurrence) DO UPDATE SET
        run_namespace = EXCLUDED.run_namespace, run_name = EXCLUDED.run_name,
        shard = EXCLUDED.shard, attempt = EXCLUDED.attempt, pass = EXCLUDED.pass, chunk = EXCLUDED.chunk,
        items = CASE WHEN f.pass = EXCLUDED.pass THEN f.items + EXCLUDED.items ELSE EXCLUDED.items END,
        payload_digest = CASE WHEN f.pass = EXCLUDED.pass THEN f.payload_digest ELSE EXCLUDED.payload_digest END,
        payload = CASE WHEN f.pass = EXCLUDED.pass THEN f.payload ELSE EXCLUDED.payload END,
        class = CASE WHEN f.pass = EXCLUDED.pass THEN f.class ELSE EXCLUDED.class END,
        error = CASE WHEN f.pass = EXCLUDED.pass THEN f.error ELSE EXCLUDED.error END,
        failed_at = CASE WHEN f.pass = EXCLUDED.pass THEN f.failed_at ELSE EXCLUDED.failed_at END
    -- The same chunk again (a try whose answer was lost): already counted.
    WHERE f.pass <> EXCLUDED.pass OR f.chunk <> EXCLUDED.chunk
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM gone), (SELECT pg_catalog.count(*) FROM put)`

// failureRecordColumns are the columns sqlRecordVerdicts replaces: all but
// the key (run_uid, entity, occurrence).
const failureRecordColumns = `run_namespace, run_name, shard, attempt, pass, chunk, items, payload_digest, class, error, failed_at, payload`

// sqlRunHasFailures: does run $1 have a failure record (of any pass)? A
// shard that starts asks once: only then do its chunks forget records.
const sqlRunHasFailures = `SELECT EXISTS (SELECT FROM ` + Schema + `.item_failure WHERE run_uid = $1)`

// The ledger's readers for `runledger items` and `runledger key`
// (verdicts.go), each run in a read-only transaction.
const (
	// sqlFindRuns: the runs named $1/$2, the latest first.
	sqlFindRuns = `
SELECT run_uid, run_namespace, run_name, source, shards, items, coalesce(digest, ''), created_at, pruned_at
FROM ` + Schema + `.batch_run WHERE run_namespace = $1 AND run_name = $2
ORDER BY created_at DESC, run_uid`

	// sqlRecentRuns: the runs whose batch was fixed at $1 or later, of
	// namespace $2 ('' for every namespace), the latest first.
	sqlRecentRuns = `
SELECT run_uid, run_namespace, run_name, source, shards, items, coalesce(digest, ''), created_at, pruned_at
FROM ` + Schema + `.batch_run WHERE created_at >= $1 AND ($2::text = '' OR run_namespace = $2::text)
ORDER BY created_at DESC, run_uid`

	// sqlRunCompleted: run $1's rows (ledger_run_shard_idx), committed or
	// superseded since.
	sqlRunCompleted = `
SELECT entity, occurrence, shard, attempt, created_at, state
FROM ` + Schema + `.ledger WHERE run_uid = $1
ORDER BY entity COLLATE "C", occurrence COLLATE "C"`

	// sqlRunFailed: run $1's failure records (their primary key).
	sqlRunFailed = `
SELECT entity, occurrence, shard, attempt, failed_at, items, class, error, payload_digest
FROM ` + Schema + `.item_failure WHERE run_uid = $1
ORDER BY entity COLLATE "C", occurrence COLLATE "C"`

	// sqlRunAlreadyHandled: the distinct keys of run $1's kept batch whose
	// committed row another run wrote (sqlAlreadyHandledOf).
	sqlRunAlreadyHandled = sqlAlreadyHandledSelect + `
    FROM ` + Schema + `.batch_run AS r
    JOIN ` + Schema + `.batch AS b ON b.batch_id = r.id
    CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(b.entities), pg_catalog.unnest(b.occurrences), pg_catalog.unnest(b.payloads)) AS i(entity, occurrence, payload)
    WHERE r.run_uid = $1 AND i.entity IS NOT NULL AND i.occurrence IS NOT NULL` + sqlAlreadyHandledRest

	// sqlStaticAlreadyHandled is sqlRunAlreadyHandled for run $1's static
	// batch (inline items or a ConfigMap, which the database does not keep),
	// given as the arrays $2 entities, $3 occurrences, $4 payloads (JSON
	// text, NULL for none) by a caller that checked them against the batch's
	// digest.
	sqlStaticAlreadyHandled = sqlAlreadyHandledSelect + `
    FROM ROWS FROM (pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[])) AS i(entity, occurrence, payload)` + sqlAlreadyHandledRest

	// sqlAlreadyHandledSelect and sqlAlreadyHandledRest surround a batch's
	// items i(entity, occurrence, payload): their distinct keys whose
	// committed row another run than $1 wrote (one probe of the rule's index
	// each), but not those run $1 failed (their verdict there is Failed: one
	// probe of item_failure's key each) nor those it committed itself
	// (another run's Supersede retired its row since: heldFor), with whether a copy's payload
	// differs from that row's now (as the claim compares:
	// sqlBatchPayloadSameText, else sqlPayloadChanged, reached only by a
	// payload the claim cast).
	sqlAlreadyHandledSelect = `
SELECT k.entity, k.occurrence, h.run_namespace, h.run_name, h.run_uid, h.shard, h.attempt, h.created_at,
       EXISTS (
           SELECT FROM pg_catalog.unnest(k.payloads) AS b(payload)
           WHERE coalesce(` + sqlBatchPayloadSameText + `,
                          nullif(h.payload, 'null'::jsonb) IS DISTINCT FROM nullif(b.payload::jsonb, 'null'::jsonb))
       )
FROM (
    SELECT i.entity, i.occurrence, pg_catalog.array_agg(DISTINCT i.payload) AS payloads`
	sqlAlreadyHandledRest = `
    GROUP BY i.entity, i.occurrence
) AS k
JOIN LATERAL (
    SELECT l.run_namespace, l.run_name, l.run_uid, l.shard, l.attempt, l.created_at, l.payload
    FROM ` + Schema + `.ledger AS l
    WHERE l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'
    LIMIT 1
) AS h ON h.run_uid <> $1
WHERE NOT EXISTS (
    SELECT FROM ` + Schema + `.item_failure AS f
    WHERE f.run_uid = $1 AND f.entity = k.entity AND f.occurrence = k.occurrence
) AND NOT EXISTS (
    SELECT FROM ` + Schema + `.ledger_retired AS r
    WHERE r.run_uid = $1 AND r.occurrence = k.occurrence AND r.entity = k.entity
)
ORDER BY k.entity COLLATE "C", k.occurrence COLLATE "C"`

	// sqlKeyRows: key ($1, $2)'s ledger rows, its committed one first (the
	// rule's index), then its superseded ones (ledger_superseded_key_idx),
	// newest first.
	sqlKeyRows = `
SELECT run_namespace, run_name, run_uid, shard, attempt, state, created_at, superseded_at
FROM (
    SELECT ` + sqlKeyRowColumns + ` FROM ` + Schema + `.ledger WHERE occurrence = $2 AND entity = $1 AND state = 'committed'
    UNION ALL
    SELECT ` + sqlKeyRowColumns + ` FROM ` + Schema + `.ledger WHERE occurrence = $2 AND entity = $1 AND state = 'superseded'
) AS l
ORDER BY state = 'committed' DESC, created_at DESC, id DESC`

	sqlKeyRowColumns = `id, run_namespace, run_name, run_uid, shard, attempt, state, created_at, superseded_at`

	// sqlKeyRetired: the runs whose row of key ($1, $2) was superseded,
	// kept when the row is pruned (ledger_retired_key_idx).
	sqlKeyRetired = `
SELECT run_uid FROM ` + Schema + `.ledger_retired WHERE occurrence = $2 AND entity = $1 ORDER BY run_uid`

	// sqlKeyFailures: key ($1, $2)'s failure records (item_failure_key_idx).
	sqlKeyFailures = `
SELECT run_namespace, run_name, run_uid, shard, attempt, items, class, error, failed_at
FROM ` + Schema + `.item_failure WHERE occurrence = $2 AND entity = $1
ORDER BY failed_at DESC, run_uid`
)

// The ledger's readers for `runledger verify` (proof.go): what proves each
// key of run $1's batch now, in one statement over the batch, and the run's
// failure records in all, both in one read-only snapshot
// (sqlBeginPinnedSnapshot).
const (
	// sqlBeginPinnedSnapshot is sqlBeginPinnedReadOnly in one snapshot for
	// every statement: the proof's two reads see the same ledger.
	sqlBeginPinnedSnapshot = `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; ` + sqlPinnedSearchPath

	// sqlProveKeptBatch: sqlProveSelect over run $1's batch kept in the
	// ledger (a query's), every row, a NULL key part included.
	sqlProveKeptBatch = `
WITH i AS (
    SELECT i.entity, i.occurrence
    FROM ` + Schema + `.batch_run AS r
    JOIN ` + Schema + `.batch AS b ON b.batch_id = r.id
    CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(b.entities), pg_catalog.unnest(b.occurrences)) AS i(entity, occurrence)
    WHERE r.run_uid = $1::text
)` + sqlProveSelect

	// sqlProveKeptShard: sqlProveShardSelect over shard $2 of run $1's
	// batch kept in the ledger (its blocks: the batch's primary key's range).
	sqlProveKeptShard = `
WITH i AS (
    SELECT i.entity, i.occurrence
    FROM ` + Schema + `.batch_run AS r
    JOIN ` + Schema + `.batch AS b ON b.batch_id = r.id AND b.shard = $2::integer
    CROSS JOIN LATERAL ROWS FROM (pg_catalog.unnest(b.entities), pg_catalog.unnest(b.occurrences)) AS i(entity, occurrence)
    WHERE r.run_uid = $1::text
)` + sqlProveShardSelect

	// sqlProveGivenShard: sqlProveShardSelect over shard $2 of run $1's
	// static batch, its keys given as the arrays $3 entities, $4
	// occurrences (a copy each).
	sqlProveGivenShard = `
WITH i AS (
    SELECT i.entity, i.occurrence
    FROM ROWS FROM (pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[])) AS i(entity, occurrence)
)` + sqlProveShardSelect

	// sqlProveShardSelect is sqlProveSelect for a shard ($2) of run $1, in
	// one row: the keys the run's own committed row of the shard holds, or
	// its retired one, and those another run's row holds, without a failure
	// record, counted (keys and copies, own first, then others'); every
	// other key (a failure record, no holder, a NULL key part) listed in
	// arrays: key, copies, held by another run, own, the record's copies and
	// class. Each key costs one probe of the rule's index (its holder, and
	// whose it is), whatever the statistics say: a join with the run's rows
	// (no statistics know a run just written) was planned as a nested loop
	// over all of them for every key, quadratic. The failure record and the
	// retired row are probed only when the run has some. A key a committed
	// row holds was a valid key when committed, so the count needs no
	// KeyPartProblem of its own.
	sqlProveShardSelect = `, k AS (
    SELECT i.entity, i.occurrence, pg_catalog.count(*) AS copies FROM i GROUP BY i.entity, i.occurrence
), v AS (
    SELECT k.entity, k.occurrence, k.copies, coalesce(h.own, false) OR m.own IS NOT NULL AS own,
           h.own IS NOT NULL AS held, f.items, f.class
    FROM k
    LEFT JOIN LATERAL (
        SELECT l.run_uid = $1::text AND l.shard = $2::integer AS own
        FROM ` + Schema + `.ledger AS l
        WHERE l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'
        LIMIT 1
    ) AS h ON true
    LEFT JOIN LATERAL (
        SELECT f.items, f.class
        FROM ` + Schema + `.item_failure AS f
        WHERE (SELECT EXISTS (SELECT FROM ` + Schema + `.item_failure AS ff WHERE ff.run_uid = $1::text))
          AND f.run_uid = $1::text AND f.entity = k.entity AND f.occurrence = k.occurrence AND f.shard = $2::integer
        LIMIT 1
    ) AS f ON true
    LEFT JOIN LATERAL (
        SELECT true AS own
        FROM ` + Schema + `.ledger_retired AS r
        WHERE h.own IS NOT TRUE
          AND (SELECT EXISTS (SELECT FROM ` + Schema + `.ledger_retired AS rr WHERE rr.run_uid = $1::text))
          AND r.run_uid = $1::text AND r.occurrence = k.occurrence AND r.entity = k.entity
        LIMIT 1
    ) AS m ON true
), w AS (
    SELECT v.*, v.items IS NULL AND (v.own OR v.held) AS plain FROM v
)
SELECT pg_catalog.count(*) FILTER (WHERE w.plain AND w.own),
       coalesce(pg_catalog.sum(w.copies) FILTER (WHERE w.plain AND w.own), 0)::bigint,
       pg_catalog.count(*) FILTER (WHERE w.plain AND NOT w.own),
       coalesce(pg_catalog.sum(w.copies) FILTER (WHERE w.plain AND NOT w.own), 0)::bigint,
       pg_catalog.array_agg(w.entity) FILTER (WHERE NOT w.plain), pg_catalog.array_agg(w.occurrence) FILTER (WHERE NOT w.plain),
       pg_catalog.array_agg(w.copies) FILTER (WHERE NOT w.plain), pg_catalog.array_agg(w.held) FILTER (WHERE NOT w.plain),
       pg_catalog.array_agg(w.own) FILTER (WHERE NOT w.plain), pg_catalog.array_agg(w.items) FILTER (WHERE NOT w.plain),
       pg_catalog.array_agg(w.class) FILTER (WHERE NOT w.plain)
FROM w`

	// sqlProveGivenBatch: sqlProveSelect over run $1's static batch given
	// as the arrays $2 entities, $3 occurrences, by a caller that checked
	// them against the batch's digest.
	sqlProveGivenBatch = `
WITH i AS (
    SELECT i.entity, i.occurrence
    FROM ROWS FROM (pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::text[])) AS i(entity, occurrence)
)` + sqlProveSelect

	// sqlProveSelect: each distinct key of the batch i, with its copies;
	// the committed row holding it now (one probe of the rule's index);
	// whether run $1 committed it itself (that row, or its row another
	// run's Supersede retired since: one probe of ledger_retired's primary
	// key, only for a key the run's row does not hold, none when the run
	// has no retired key, as ownRetired); and run $1's failure record of it
	// (one probe of item_failure's primary key).
	sqlProveSelect = `
SELECT k.entity, k.occurrence, k.copies, h.run_namespace, h.run_name, h.run_uid, h.created_at,
       h.run_uid IS NOT DISTINCT FROM $1::text OR m.own IS NOT NULL, f.items, f.class
FROM (
    SELECT i.entity, i.occurrence, pg_catalog.count(*) AS copies FROM i GROUP BY i.entity, i.occurrence
) AS k
LEFT JOIN LATERAL (
    SELECT l.run_namespace, l.run_name, l.run_uid, l.created_at
    FROM ` + Schema + `.ledger AS l
    WHERE l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'
    LIMIT 1
) AS h ON true
LEFT JOIN LATERAL (
    SELECT true AS own
    FROM ` + Schema + `.ledger_retired AS r
    WHERE h.run_uid IS DISTINCT FROM $1::text
      AND (SELECT EXISTS (SELECT FROM ` + Schema + `.ledger_retired AS rr WHERE rr.run_uid = $1::text))
      AND r.run_uid = $1::text AND r.occurrence = k.occurrence AND r.entity = k.entity
    LIMIT 1
) AS m ON true
LEFT JOIN LATERAL (
    SELECT f.items, f.class
    FROM ` + Schema + `.item_failure AS f
    WHERE f.run_uid = $1::text AND f.entity = k.entity AND f.occurrence = k.occurrence
    LIMIT 1
) AS f ON true
ORDER BY k.entity COLLATE pg_catalog."C", k.occurrence COLLATE pg_catalog."C"`

	// sqlProveFailures: run $1's failure records (their primary key's
	// range) and the copies they count failed, in all.
	sqlProveFailures = `
SELECT pg_catalog.count(*), coalesce(pg_catalog.sum(f.items), 0)::bigint
FROM ` + Schema + `.item_failure AS f WHERE f.run_uid = $1::text`

	// sqlShardOwnRows: shard $2 of run $1's rows in the ledger, committed
	// or superseded since (ledger_run_shard_idx: the shard's rows only).
	sqlShardOwnRows = `
SELECT pg_catalog.count(*) FROM ` + Schema + `.ledger AS l WHERE l.run_uid = $1::text AND l.shard = $2::integer`

	// sqlHeldOfShard: shard $2 of run $1's rows in the ledger (as
	// sqlShardOwnRows) and its batch's items kept in the ledger (as
	// sqlShardBatchItems), both only under the run's namespace $3 and name
	// $4: a run given another's uid (a copied object) is not that run.
	sqlHeldOfShard = `
SELECT (SELECT pg_catalog.count(*) FROM ` + Schema + `.ledger AS l
        WHERE l.run_uid = $1::text AND l.shard = $2::integer AND l.run_namespace = $3::text AND l.run_name = $4::text),
       (SELECT coalesce(pg_catalog.sum(pg_catalog.cardinality(b.entities)), 0)::bigint
        FROM ` + Schema + `.batch_run AS r
        JOIN ` + Schema + `.batch AS b ON b.batch_id = r.id AND b.shard = $2::integer
        WHERE r.run_uid = $1::text AND r.run_namespace = $3::text AND r.run_name = $4::text)`

	// sqlShardBatchItems: the items of shard $2 of run $1's batch kept in
	// the ledger (its blocks: the batch's primary key's range), a row with a
	// NULL key part included.
	sqlShardBatchItems = `
SELECT coalesce(pg_catalog.sum(pg_catalog.cardinality(b.entities)), 0)::bigint
FROM ` + Schema + `.batch_run AS r
JOIN ` + Schema + `.batch AS b ON b.batch_id = r.id AND b.shard = $2::integer
WHERE r.run_uid = $1::text`

	// sqlProveShardFailures: sqlProveFailures of the records shard $2 wrote.
	sqlProveShardFailures = sqlProveFailures + ` AND f.shard = $2::integer`
)

// A fromRun batch (spec.batch.fromRun): the items an earlier run of the same
// namespace failed, with their payloads, from its failure records
// (runledger.item_failure, migrations/00010 and 00014). The earlier run is
// the latest run of that name whose batch the ledger holds
// (runledger.batch_run, one header per run from its first start), as for
// `runledger items` (sqlFindRuns).
const sqlEarlierRun = `
SELECT run_uid, pruned_at IS NOT NULL FROM ` + Schema + `.batch_run
WHERE run_namespace = $1 AND run_name = $2
ORDER BY created_at DESC, run_uid
LIMIT 1`

// sqlFromRunFailed is the batch query of a fromRun batch (fixed like any
// batch query, sqlFixQueryBatch): the failed items of the earlier run
// (sqlEarlierRun's) as (entity, occurrence, payload). A record of a row that
// could not become an item (class input: its key was made storable, so it
// may look valid now) or whose payload was not kept has FromRunNotAnItem for
// its payload: it fails again, never processed under a key or payload it did
// not have. The namespace and name are quoted literals: the batch query is
// text, fixed with its digest.
func sqlFromRunFailed(namespace, name string) string {
	return `SELECT f.entity, f.occurrence,
       CASE WHEN f.class = ` + quoteLiteral(ClassInput) + ` OR (f.payload IS NULL AND f.payload_digest IS NOT NULL)
            THEN ` + quoteLiteral(FromRunNotAnItem) + ` ELSE f.payload END AS payload
FROM ` + Schema + `.item_failure AS f
WHERE f.run_uid = (
    SELECT b.run_uid FROM ` + Schema + `.batch_run AS b
    WHERE b.run_namespace = ` + quoteLiteral(namespace) + ` AND b.run_name = ` + quoteLiteral(name) + `
    ORDER BY b.created_at DESC, b.run_uid
    LIMIT 1
)`
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings,
// on since PostgreSQL 9.1: a backslash is an ordinary character).
func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// Shard progress (migrations/00015, progress.go): every worker of a run
// publishes its shard's latest counts; the live shard with the lowest index
// reports them all on its own pod.
const (
	// sqlPublishProgress upserts shard $2 of run $1's row (an older attempt
	// never overwrites a newer one's) and returns the lowest shard of the
	// run, other than $2, whose row is not done and was written within the
	// last $11 seconds (NULL: none): the reporter, unless $2 is lower. The
	// CTE's insert is not visible to the outer query, hence shard <> $2. The
	// primary key's order finds that shard in one index probe.
	sqlPublishProgress = `
WITH mine AS (
    INSERT INTO ` + Schema + `.shard_progress AS p
        (run_uid, shard, attempt, total, completed, already_handled, failed, payload_changed, message, done, updated_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, pg_catalog.now())
    ON CONFLICT (run_uid, shard) DO UPDATE SET
        attempt = EXCLUDED.attempt, total = EXCLUDED.total, completed = EXCLUDED.completed,
        already_handled = EXCLUDED.already_handled, failed = EXCLUDED.failed,
        payload_changed = EXCLUDED.payload_changed, message = EXCLUDED.message,
        done = EXCLUDED.done, updated_at = EXCLUDED.updated_at
    WHERE p.attempt <= EXCLUDED.attempt
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM mine),
       (SELECT s.shard FROM ` + Schema + `.shard_progress AS s
        WHERE s.run_uid = $1 AND s.shard <> $2 AND NOT s.done
          AND s.updated_at > pg_catalog.now() - pg_catalog.make_interval(secs => $11)
        ORDER BY s.shard LIMIT 1)`

	// progressColumns are the columns sqlPublishProgress replaces: all but
	// the key (run_uid, shard).
	progressColumns = `attempt, total, completed, already_handled, failed, payload_changed, message, done, updated_at`

	// sqlRunProgress is every shard row of run $1, by shard, with its age
	// by the database's clock.
	sqlRunProgress = `
SELECT shard, attempt, total, completed, already_handled, failed, payload_changed, message, done,
       extract(epoch FROM pg_catalog.now() - updated_at)::float8
FROM ` + Schema + `.shard_progress WHERE run_uid = $1 ORDER BY shard`

	// sqlRunCounts: run $1's ledger rows (ledger_run_shard_idx; committed
	// or superseded since) and the items of its failure records (their
	// primary key).
	sqlRunCounts = `
SELECT (SELECT pg_catalog.count(*) FROM ` + Schema + `.ledger WHERE run_uid = $1),
       (SELECT coalesce(pg_catalog.sum(items), 0)::bigint FROM ` + Schema + `.item_failure WHERE run_uid = $1)`

	// sqlRunFailureClasses: run $1's failure records by class (the item
	// failure's primary key leads with run_uid): the records and the
	// items they count failed, the most items first.
	sqlRunFailureClasses = `
SELECT class, pg_catalog.count(*), coalesce(pg_catalog.sum(items), 0)::bigint
FROM ` + Schema + `.item_failure WHERE run_uid = $1
GROUP BY class ORDER BY 3 DESC, class COLLATE "C"`
)

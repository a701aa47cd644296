package clitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// trapped is what every planted object says when something calls it.
const trapped = "runledger trap"

// trapTypes are the argument types a planted function or operator is made
// for: every type runledger's statements pass or compute, their arrays, and
// the preferred type of each category (float8, text, bool, timestamptz,
// interval, oid), which wins over an exact catalog function for an untyped
// parameter or literal.
var trapTypes = []string{
	"text", "bigint", "integer", "smallint", "numeric", "double precision", "real", "boolean",
	"jsonb", "json", "timestamp with time zone", "timestamp without time zone", "interval", "oid",
	"uuid", "name", "bytea", "\"char\"", "regclass", "xid",
	"text[]", "bigint[]", "integer[]", "jsonb[]", "boolean[]", "name[]", "double precision[]", "oid[]",
}

// trapOperators are the operators runledger's statements (and PostgreSQL's
// expansion of IN, ANY, IS DISTINCT FROM, CASE, BETWEEN, LIKE) use.
var trapOperators = []string{"=", "<>", "<", ">", "<=", ">=", "||", "->>", "->", "@>", "<@", "&&", "&", "%", "+", "-", "*", "/", "~", "~*", "~~"}

// trapTempTypes are the type names a statement may write in a cast that
// the grammar does not pin to pg_catalog itself (bigint, integer, boolean,
// numeric, interval are keywords; text, jsonb, float8 are looked up).
var trapTempTypes = []string{"text", "jsonb", "json", "float8", "float4", "int8", "int4", "int2", "bool", "oid", "regclass",
	"regtype", "regproc", "regnamespace", "timestamptz", "timestamp", "name", "uuid", "bytea", "xid", "oidvector", "varchar", "bpchar"}

// trapTempRelations are catalog relations a statement may read unqualified,
// planted as views in pg_temp, searched first for relations unless the path
// lists it.
var trapTempRelations = []string{"pg_tables", "pg_class", "pg_proc", "pg_namespace", "pg_roles", "pg_attribute", "pg_type",
	"pg_settings", "pg_stat_activity", "pg_locks", "pg_prepared_statements", "pg_cursors", "pg_stat_xact_all_tables",
	"pg_database", "pg_trigger", "pg_index", "pg_constraint", "pg_inherits", "pg_depend", "pg_authid", "pg_auth_members"}

// sqlFunctionNames returns every name written as a call in runledger's SQL:
// the ledger's statements (internal/ledger/sql.go) and the migrations.
func sqlFunctionNames(t *testing.T) []string {
	t.Helper()
	files := []string{"../../internal/ledger/sql.go"}
	mig, err := filepath.Glob("../../migrations/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, mig)
	seen := map[string]bool{}
	call := regexp.MustCompile(`(?i)\b([a-z_][a-z0-9_]*)\s*\(`)
	for _, f := range append(files, mig...) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range call.FindAllStringSubmatch(string(b), -1) {
			seen[strings.ToLower(m[1])] = true
		}
	}
	// What goose's own statements and the readers call, named here in case
	// no statement of ours spells it.
	for _, n := range []string{"count", "array_agg", "cardinality", "unnest", "pg_try_advisory_lock", "pg_advisory_unlock",
		"pg_try_advisory_xact_lock", "pg_advisory_xact_lock", "to_regnamespace", "to_regclass", "hashtextextended", "set_config",
		"current_setting", "string_agg", "jsonb_agg", "coalesce", "nullif", "now", "sum", "max", "min", "bool_and", "pg_backend_pid",
		"pg_blocking_pids", "make_interval", "extract", "date_part", "format", "lower", "array_length", "row_number"} {
		seen[n] = true
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// plantPublicTraps creates, in schema public (writable by everyone, as in
// PostgreSQL 14), for every catalog function runledger's SQL names and
// every operator it uses, an overload for each of trapTypes that raises
// "runledger trap: NAME(ARGS) called". A statement that resolves one of its
// names through the session's search_path picks an exact-type overload over
// the catalog's polymorphic or casting one (CVE-2018-1058). It returns how
// many it planted.
func plantPublicTraps(t *testing.T, d *db, names []string) int64 {
	t.Helper()
	types := make([]string, len(trapTypes))
	for i, ty := range trapTypes {
		types[i] = "'" + strings.ReplaceAll(ty, "'", "''") + "'"
	}
	names = slices.Clone(names)
	for i, n := range names {
		names[i] = "'" + n + "'"
	}
	ops := make([]string, len(trapOperators))
	for i, o := range trapOperators {
		ops[i] = "'" + o + "'"
	}
	d.exec(t, `SET search_path = pg_catalog, pg_temp;
GRANT CREATE ON SCHEMA public TO PUBLIC;
CREATE TABLE public.trap_count (n bigint NOT NULL);
INSERT INTO public.trap_count VALUES (0);
CREATE FUNCTION public.runledger_trap(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '`+trapped+`: % called as %', what, current_user;
END $$;
DO $plant$
DECLARE
    types text[] := ARRAY[`+strings.Join(types, ", ")+`];
    f record; ty text; args text; ret text; made bigint := 0;
BEGIN
    FOR f IN
        SELECT p.proname AS name, p.pronargs AS nargs, p.prokind = 'a' AS agg,
               (array_agg(p.prorettype ORDER BY (p.prorettype::regtype::text LIKE 'any%'), p.oid))[1] AS ret
        FROM pg_proc AS p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = ANY (ARRAY[`+strings.Join(names, ", ")+`]::text[])
          AND p.pronargs BETWEEN 1 AND 4 AND p.prokind IN ('f', 'a')
        GROUP BY p.proname, p.pronargs, p.prokind = 'a'
    LOOP
        FOREACH ty IN ARRAY types LOOP
            args := array_to_string(array_fill(ty, ARRAY[f.nargs]), ', ');
            ret := CASE
                WHEN f.ret::regtype::text IN ('anyelement', 'anycompatible', 'anynonarray', 'anycompatiblenonarray') THEN ty
                WHEN f.ret::regtype::text IN ('anyarray', 'anycompatiblearray') THEN CASE WHEN ty LIKE '%[]' THEN ty ELSE ty || '[]' END
                WHEN f.ret::regtype::text LIKE 'any%' OR f.ret::regtype::text IN ('record', 'internal', 'trigger', 'void') THEN ty
                ELSE f.ret::regtype::text END;
            BEGIN
                IF f.agg THEN
                    EXECUTE format('CREATE FUNCTION public.runledger_trap_step(%s, %s) RETURNS %s LANGUAGE plpgsql AS $f$ BEGIN PERFORM public.runledger_trap(%L); RETURN NULL; END $f$',
                                   ret, args, ret, f.name || '(' || args || ')');
                    EXECUTE format('CREATE AGGREGATE public.%I(%s) (SFUNC = public.runledger_trap_step, STYPE = %s)', f.name, args, ret);
                ELSE
                    EXECUTE format('CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS $f$ BEGIN PERFORM public.runledger_trap(%L); RETURN NULL; END $f$',
                                   f.name, args, ret, f.name || '(' || args || ')');
                END IF;
                made := made + 1;
            EXCEPTION WHEN duplicate_function OR invalid_function_definition OR wrong_object_type OR datatype_mismatch
                           OR invalid_parameter_value OR feature_not_supported OR undefined_function THEN
                NULL; -- a signature PostgreSQL will not take for this name (a step function made already counts)
            END;
        END LOOP;
    END LOOP;
    FOREACH ty IN ARRAY types LOOP
        EXECUTE format('CREATE FUNCTION public.runledger_trap_op(%s, %s) RETURNS boolean LANGUAGE plpgsql AS $f$ BEGIN RETURN public.runledger_trap(%L); END $f$',
                       ty, ty, 'operator(' || ty || ')');
        FOREACH args IN ARRAY ARRAY[`+strings.Join(ops, ", ")+`] LOOP
            EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.runledger_trap_op)', args, ty, ty);
            made := made + 1;
        END LOOP;
    END LOOP;
    UPDATE public.trap_count SET n = made;
END
$plant$;
RESET search_path`)
	return d.int(t, `SELECT n FROM public.trap_count`)
}

// plantTempTraps is the SQL of a function (run by an effect, as the effect
// role, in the worker's session) that plants, once per session, domains in
// pg_temp named like the catalog's types and views named like its
// relations, each calling runledger_trap when used: a statement that
// resolves a type or relation with pg_temp before pg_catalog (the default
// when the path does not list it) meets them.
func plantTempTraps() string {
	var b strings.Builder
	b.WriteString(`CREATE FUNCTION public.plant_temp_traps() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.to_regtype('pg_temp.float8') IS NOT NULL THEN
        RETURN true;
    END IF;
`)
	for _, ty := range trapTempTypes {
		fmt.Fprintf(&b, "    EXECUTE 'CREATE DOMAIN pg_temp.%s AS pg_catalog.%s CHECK (public.runledger_trap(''pg_temp.%s''))';\n", ty, ty, ty)
	}
	for _, rel := range trapTempRelations {
		cols := "*"
		if rel == "pg_attribute" { // attmissingval is of a pseudo-type, which a view may not have
			cols = "attrelid, attname, atttypid, attnum, attisdropped, atthasdef, attgenerated"
		}
		fmt.Fprintf(&b, "    EXECUTE 'CREATE TEMP VIEW %s AS SELECT %s FROM pg_catalog.%s WHERE public.runledger_trap(''pg_temp.%s'')';\n", rel, cols, rel, rel)
	}
	b.WriteString("    RETURN true;\nEND $$;\n")
	return b.String()
}

// TestPlantedNamesNeverResolve: on a ledger set up as docs/migrations.md
// says (the owner migrates with --grant-to and --effect-role; the runs
// connect as a login that owns nothing), with schema public writable by
// everyone (PostgreSQL 14's default), an overload of every catalog function
// runledger's SQL names and of every operator it uses, planted in public for
// every type it passes, and, by the runs' own effects, domains and views
// named like the catalog's types and relations in the worker's pg_temp:
// every command runledger has (migrate, run with an SQL effect, a query
// batch, static items, Supersede, a processor and its take-back, failures
// and their fromRun retry, items, key, prune, migrate again) does exactly
// what it does without them, and none of them is ever called. Through
// PgBouncer (the suite's second pass) the runs share server connections,
// and with them whatever a session left there.
func TestPlantedNamesNeverResolve(t *testing.T) {
	t.Parallel()
	d := newTwoRoles(t)
	d.owner.exec(t, plantTempTraps()+`
CREATE TABLE public.src AS SELECT 'acct-' || i AS entity, '2024-06' AS occurrence, pg_catalog.jsonb_build_object('amount', i) AS payload
    FROM pg_catalog.generate_series(1, 40) AS i;
CREATE TABLE public.sink (entity text NOT NULL CONSTRAINT not_bad CHECK (entity NOT LIKE 'bad-%'), occurrence text NOT NULL);
GRANT SELECT ON public.src TO `+d.role+`;
GRANT INSERT ON public.sink TO `+pgtest.EffectRole)
	planted := plantPublicTraps(t, d.owner, sqlFunctionNames(t))
	require.Greater(t, planted, int64(1000), "the traps were planted")

	// The effect plants the pg_temp traps in the worker's session, then
	// writes the sink: no operator, function or cast of its own, so that
	// only runledger's statements could meet a trap.
	effect := `effect: {sql: "WITH p AS (SELECT public.plant_temp_traps()) INSERT INTO public.sink SELECT c.entity, c.occurrence FROM claimed AS c, p"}`
	var out []string
	cli := func(wantCode int, args ...string) result {
		t.Helper()
		r := runCLI(t, "", args...)
		out = append(out, r.stdout, r.stderr)
		require.Equal(t, wantCode, r.code, "runledger %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.stdout, r.stderr)
		require.NotContains(t, r.stdout+r.stderr, trapped, "runledger %s called a planted object", strings.Join(args, " "))
		return r
	}
	run := func(wantCode int, name string, spec ...string) summary {
		t.Helper()
		r := cli(wantCode, "run", "-f", writeFile(t, name+".yaml", manifest(name, spec...)), "--dsn", d.worker.dsn, "--output", "json", "--retry-timeout", "20s")
		return r.summary(t)
	}

	cli(0, "migrate", "--dsn", d.owner.dsn, "--grant-to", d.role, "--effect-role", pgtest.EffectRole)

	s := run(0, "first", `batch: {query: "SELECT entity, occurrence, payload FROM public.src"}`, effect, "workers: 2", "chunkSize: 7")
	require.Equal(t, counts{Total: 40, Completed: 40}, s.counts())

	var keys [][2]string
	for i := 36; i <= 45; i++ {
		keys = append(keys, [2]string{fmt.Sprintf("acct-%d", i), "2024-06"})
	}
	s = run(0, "second", inlineItems(keys...), effect, "chunkSize: 3")
	require.Equal(t, counts{Total: 10, Completed: 5, AlreadyHandled: 5}, s.counts())

	s = run(0, "third", inlineItems(keys[:3]...), effect, "onExisting: Supersede")
	require.Equal(t, counts{Total: 3, Completed: 3}, s.counts())

	// A processor that refuses one key: the Supersede run's claim of it is
	// taken back and the earlier row restored (runledger.ledger_take_back).
	proc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Items []struct{ Entity string } `json:"items"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		type res struct {
			OK    bool   `json:"ok"`
			Error string `json:"error,omitempty"`
		}
		var answer struct {
			Results []res `json:"results"`
		}
		for _, it := range req.Items {
			answer.Results = append(answer.Results, res{OK: it.Entity != "acct-4", Error: map[bool]string{true: "refused"}[it.Entity == "acct-4"]})
		}
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(proc.Close)
	r := cli(0, "run", "-f", writeFile(t, "charge.yaml", manifest("charge", inlineItems([2]string{"acct-3", "2024-06"}, [2]string{"acct-4", "2024-06"}, [2]string{"new-1", "2024-06"}),
		"onExisting: Supersede", "maxFailedItems: 5", "effect:\n    processor: {image: example-processor, maxItemsPerCall: 2}")),
		"--dsn", d.worker.dsn, "--output", "json", "--processor-url", proc.URL+"/process", "--retry-timeout", "20s")
	require.Equal(t, counts{Total: 3, Completed: 2, Failed: 1}, r.summary(t).counts(), "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)

	// Items the sink refuses fail; once it takes them, fromRun retries them.
	bad := inlineItems([2]string{"bad-1", "2024-06"}, [2]string{"ok-1", "2024-06"}, [2]string{"bad-2", "2024-06"})
	s = run(0, "june", bad, effect, "maxFailedItems: 5")
	require.Equal(t, counts{Total: 3, Completed: 1, Failed: 2}, s.counts())
	d.owner.exec(t, `ALTER TABLE public.sink DROP CONSTRAINT not_bad`)
	s = run(0, "june-retry", "batch: {fromRun: {name: june}}", effect)
	require.Equal(t, counts{Total: 2, Completed: 2}, s.counts())

	secondRun := writeFile(t, "second-again.yaml", manifest("second", inlineItems(keys...), effect, "chunkSize: 3"))
	for _, args := range [][]string{
		{"items", "first", "-n", "billing", "--output", "json"},
		{"items", "second", "-n", "billing", "--already-handled", "--output", "json", "-f", secondRun},
		{"items", "second", "-n", "billing", "--payload-changed", "--output", "json", "-f", secondRun},
		{"items", "june", "-n", "billing", "--failed", "--output", "jsonl"},
		{"items", "charge", "-n", "billing", "--output", "json"},
		{"key", "acct-3", "2024-06", "--output", "json"},
		{"key", "acct-4", "2024-06"},
	} {
		cli(0, append(args, "--dsn", d.worker.dsn)...)
	}

	cli(0, "prune", "--superseded-older-than", "1ns", "--dsn", d.owner.dsn)
	cli(0, "prune", "--older-than", "1ns", "--dsn", d.owner.dsn)
	cli(0, "migrate", "--dsn", d.owner.dsn, "--grant-to", d.role, "--effect-role", pgtest.EffectRole)

	// Every effect ran once per committed row of an effect run, and every
	// key has one committed row.
	require.EqualValues(t, 40+5+3+1+2, d.owner.int(t, `SELECT pg_catalog.count(*) FROM public.sink`))
	require.EqualValues(t, 40+5+1+1+2, d.owner.committed(t))
	for _, o := range out {
		require.NotContains(t, o, trapped)
	}
}

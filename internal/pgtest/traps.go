package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Trapped is what every planted object (PlantPublicTraps, TempTrapsSQL)
// says in its error when something calls it.
const Trapped = "runledger trap"

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

// SQLCallNames returns every name written as a call in runledger's SQL:
// the ledger's statements (internal/ledger/sql.go) and the migrations,
// under root, the repository's top (relative to the test's directory).
func SQLCallNames(t testing.TB, root string) []string {
	t.Helper()
	files := []string{filepath.Join(root, "internal/ledger/sql.go")}
	mig, err := filepath.Glob(filepath.Join(root, "migrations/*.sql"))
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

// PlantPublicTraps creates, on the database of pool, in schema public (writable by everyone, as in
// PostgreSQL 14), for every catalog function runledger's SQL names and
// every operator it uses, an overload for each of trapTypes that raises
// "runledger trap: NAME(ARGS) called". A statement that resolves one of its
// names through the session's search_path picks an exact-type overload over
// the catalog's polymorphic or casting one (CVE-2018-1058). It returns how
// many it planted.
func PlantPublicTraps(t testing.TB, pool *pgxpool.Pool, names []string) int64 {
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
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(context.Background(), `SET search_path = pg_catalog, pg_temp;
GRANT CREATE ON SCHEMA public TO PUBLIC;
CREATE TABLE public.trap_count (n bigint NOT NULL);
INSERT INTO public.trap_count VALUES (0);
CREATE FUNCTION public.runledger_trap(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '`+Trapped+`: % called as %', what, current_user;
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
	require.NoError(t, err, "planting the traps")
	var n int64
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT n FROM public.trap_count`).Scan(&n))
	return n
}

// TempTrapsSQL is the SQL of a function (run by an effect, as the effect
// role, in the worker's session) that plants, once per session, domains in
// pg_temp named like the catalog's types and views named like its
// relations, each calling runledger_trap when used: a statement that
// resolves a type or relation with pg_temp before pg_catalog (the default
// when the path does not list it) meets them.
func TempTrapsSQL() string {
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

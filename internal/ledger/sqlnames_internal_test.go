package ledger

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// userQueryMarker stands for the user's query inside a statement of ours.
const userQueryMarker = "SELECT entity, occurrence, payload FROM user_query_marker"

// unqualifiedNames lists what in sql resolves through the session's
// search_path: a call of a function not written schema.name, an operator
// not written OPERATOR(pg_catalog.x), a cast to a type not written
// pg_catalog.name (the grammar's own type keywords aside), a collation not
// written pg_catalog."C". String literals, quoted identifiers and comments
// are left out first.
func unqualifiedNames(sql string) []string {
	sql = regexp.MustCompile(`--[^\n]*`).ReplaceAllString(sql, " ")
	sql = regexp.MustCompile(`'(?:[^']|'')*'`).ReplaceAllString(sql, " 'lit' ")
	sql = regexp.MustCompile(`OPERATOR\(pg_catalog\.[^)]+\)`).ReplaceAllString(sql, " qualifiedop ")
	var out []string
	for _, m := range regexp.MustCompile(`COLLATE\s+(pg_catalog\.)?("[^"]*"|\w+)`).FindAllStringSubmatch(sql, -1) {
		if m[1] == "" {
			out = append(out, "collation: "+m[2])
		}
	}
	sql = regexp.MustCompile(`"[^"]*"`).ReplaceAllString(sql, " ident ")
	keywords := map[string]bool{"select": true, "from": true, "as": true, "in": true, "exists": true, "values": true, "conflict": true,
		"over": true, "filter": true, "coalesce": true, "nullif": true, "when": true, "and": true, "or": true, "not": true, "join": true,
		"lateral": true, "on": true, "into": true, "where": true, "then": true, "else": true, "any": true, "array": true, "with": true,
		"returning": true, "using": true, "cast": true, "qualifiedop": true}
	for _, m := range regexp.MustCompile(`(?:^|[^.\w])(\w+)\s*\(`).FindAllStringSubmatch(sql, -1) {
		if !keywords[strings.ToLower(m[1])] {
			out = append(out, "function: "+m[1])
		}
	}
	typeKeywords := map[string]bool{"bigint": true, "integer": true, "int": true, "smallint": true, "boolean": true, "numeric": true,
		"real": true, "double": true, "interval": true}
	for _, m := range regexp.MustCompile(`::\s*([\w.]+)`).FindAllStringSubmatch(sql, -1) {
		if !strings.HasPrefix(m[1], "pg_catalog.") && !typeKeywords[strings.ToLower(m[1])] {
			out = append(out, "type: "+m[1])
		}
	}
	bare := regexp.MustCompile(`\.\*|\(\*\)|::|=>`).ReplaceAllString(sql, " ")
	for _, m := range regexp.MustCompile(`[-+*/%<>=~!@#^&|]+`).FindAllString(bare, -1) {
		out = append(out, "operator: "+m)
	}
	return out
}

// TestUserPathStatementsNameOnlyTheCatalog: the statements that run with
// the user's SQL inside them, under the user's search_path (the batch's,
// around its query; the effect's, around the effect), name every function,
// operator, type and collation of theirs by its schema, so that an object a
// user planted in public (an exact-type public.array_agg, a bigint %
// integer operator) or in pg_temp (a domain named text or oid) never stands
// in for the catalog's. On the old code it listed array_agg, %, ::text and
// "C" for the batch's, and ::oid and = for the effect's.
func TestUserPathStatementsNameOnlyTheCatalog(t *testing.T) {
	effect := sqlRunEffect(userQueryMarker)
	require.Empty(t, unqualifiedNames(strings.Replace(effect, userQueryMarker, " ", 1)), "sqlRunEffect:\n%s", effect)
	for _, hasPayload := range []bool{false, true} {
		for _, shards := range []int{1, 4} {
			q := BatchQuery{SQL: userQueryMarker, HasPayload: hasPayload, Shards: shards}
			for name, sql := range map[string]string{
				"sqlFixQueryBatch":  sqlFixQueryBatch(q.SQL, q.HasPayload, q.Shards, q.shardOf()),
				"sqlBatchRows":      sqlBatchRows(q.SQL, q.HasPayload, q.Shards, q.shardOf()),
				"sqlBatchQueryRows": sqlBatchQueryRows(q.SQL, q.HasPayload),
			} {
				require.Contains(t, sql, userQueryMarker)
				ours := strings.Replace(sql, userQueryMarker, " ", 1)
				require.Empty(t, unqualifiedNames(ours), "%s (payload %v, %d shards) resolves these through the user's search_path:\n%s", name, hasPayload, shards, sql)
			}
		}
	}
	// The check itself finds each kind.
	require.ElementsMatch(t, []string{"function: array_agg", "operator: %", "type: text", `collation: "C"`},
		unqualifiedNames(`SELECT array_agg(x % 2)::text COLLATE "C", pg_catalog.count(*), a.* FROM t AS a WHERE x OPERATOR(pg_catalog.=) 'a=b'`))
}

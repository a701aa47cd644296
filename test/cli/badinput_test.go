package clitest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// TestRunBadInput: broken manifests, JSON Lines files and flags are refused
// with exit code 2, a message that says what to fix, and nothing committed.
func TestRunBadInput(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	items := inlineItems([2]string{"acct-1", "2024-06"})
	good := manifest("good", items)
	cmRun := manifest("cm", "batch:", "  configMapRef: {name: june, key: items.jsonl}")
	bigPayload := `{"entity":"a","occurrence":"b","payload":"` + strings.Repeat("x", 1<<20) + `"}`
	tests := []struct {
		name     string
		manifest string
		jsonl    string   // --from-file content, when set
		args     []string // extra arguments
		want     string   // in stderr (and in the JSON error)
	}{
		{name: "not YAML", manifest: "apiVersion: [unclosed", want: "document 1 is not a Kubernetes object"},
		{name: "no run", manifest: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", want: "holds no ProcessingRun"},
		{name: "two runs", manifest: good + "---\n" + manifest("other", items), want: "holds 2 ProcessingRuns (good, other): runledger run takes one"},
		{name: "wrong apiVersion", manifest: strings.Replace(good, "v1alpha1", "v1", 1), want: `apiVersion "processing.runledger.dev/v1": want processing.runledger.dev/v1alpha1`},
		{name: "no kind", manifest: "metadata: {name: x}\nspec: {}\n", want: "document 1 has no kind"},
		{name: "unknown field", manifest: manifest("typo", items, "wrokers: 2"), want: `unknown field "spec.wrokers"`},
		{name: "wrong type", manifest: manifest("types", items, "workers: four"), want: "workers"},
		{name: "no name", manifest: strings.Replace(good, "name: good", "labels: {a: b}", 1), want: "metadata.name: Required value: name or generateName is required"},
		{name: "generateName only", manifest: strings.Replace(good, "name: good", "generateName: good-", 1), want: "metadata.name: Required value: runledger run needs a name"},
		{name: "name too long", manifest: manifest(strings.Repeat("n", 64), items), want: "metadata.name must be at most 63 characters: it is used as a label value on the worker pods"},
		{name: "name not a DNS subdomain", manifest: manifest("June_Invoices", items), want: `metadata.name: Invalid value: "June_Invoices": a lowercase RFC 1123 subdomain`},
		{name: "no source", manifest: manifest("nosource", "batch: {}"), want: "spec.batch: Invalid value: batch has no source: set exactly one of batch.items, batch.configMapRef, batch.query, batch.fromRun or batch.object"},
		{name: "two sources", manifest: manifest("twosources", "batch:", "  items: [{entity: a, occurrence: b}]", "  query: SELECT 1"), want: "spec.batch: Invalid value: batch has more than one source"},
		{name: "too many workers", manifest: manifest("workers", items, "workers: 1000"), want: "spec.workers: Invalid value: 1000: spec.workers in body should be less than or equal to 256"},
		{name: "zero workers", manifest: manifest("workers", items, "workers: 0"), want: "spec.workers: Invalid value: 0: spec.workers in body should be greater than or equal to 1"},
		{name: "negative chunk size", manifest: manifest("chunk", items, "chunkSize: -5"), want: "spec.chunkSize: Invalid value: -5: spec.chunkSize in body should be greater than or equal to 1"},
		{name: "bad onExisting", manifest: manifest("onexisting", items, "onExisting: Overwrite"), want: `spec.onExisting: Unsupported value: "Overwrite": supported values: "Skip", "Supersede"`},
		{name: "empty effect", manifest: manifest("effect", items, "effect: {sql: ' '}"), want: `spec.effect.sql: Invalid value: " ": must hold a statement, not only white space`},
		{name: "effect too long", manifest: manifest("effect", items, "effect: {sql: '"+strings.Repeat(" ", 65536)+"x'}"), want: "spec.effect.sql: Too long: may not be more than 65536"},
		{name: "query too long", manifest: manifest("query", "batch: {query: 'SELECT "+strings.Repeat(" ", 65536)+"'}"), want: "spec.batch.query: Too long: may not be more than 65536"},
		{name: "secret key with a slash", manifest: strings.Replace(good, "key: dsn", "key: a/b", 1), want: `spec.database.secretRef.key: Invalid value: "a/b": spec.database.secretRef.key in body should match '^[-._a-zA-Z0-9]+$'`},
		{name: "empty entity", manifest: manifest("entity", inlineItems([2]string{"a", "b"}, [2]string{"", "c"}, [2]string{"d", " "})),
			want: "3 problems:\n" +
				`  spec.batch.items[1].entity: Invalid value: "": spec.batch.items[1].entity in body should be at least 1 chars long` + "\n" +
				`  spec.batch.items[1].entity: Invalid value: "": must not be only white space` + "\n" +
				`  spec.batch.items[2].occurrence: Invalid value: " ": must not be only white space`},
		{name: "key part too long in bytes", manifest: manifest("entity", inlineItems([2]string{strings.Repeat("€", 342), "b"})),
			want: "spec.batch.items[0].entity: Invalid value: \"" + strings.Repeat("€", 342) + "\": must be at most 1024 bytes of UTF-8: the ledger's unique index holds it"},
		{name: "malformed JSON line", manifest: cmRun, jsonl: `{"entity":"a","occurrence":"b"}` + "\n" + `{"entity":"a",` + "\n", want: "line 2 is not valid JSON"},
		{name: "missing field", manifest: cmRun, jsonl: `{"entity":"a"}`, want: `line 1: field "occurrence" is missing`},
		{name: "wrong field type", manifest: cmRun, jsonl: `{"entity":"a","occurrence":2024}`, want: `line 1: field "occurrence" must be a string, not 2024`},
		{name: "oversized payload", manifest: cmRun, jsonl: `{"entity":"a","occurrence":"b"}` + "\n" + bigPayload, want: `line 2: field "payload" is 1.0 MiB, more than the 1 MiB allowed`},
		// Issue #20.5: distinct lines never collapse into one key.
		{name: "lone surrogates in a key part", manifest: cmRun, jsonl: `{"entity":"acct-\ud800","occurrence":"b"}` + "\n" + `{"entity":"acct-\udbff","occurrence":"b"}`,
			want: `line 1: field "entity" holds a lone UTF-16 surrogate escape`},
		{name: "invalid UTF-8 in a key part", manifest: cmRun, jsonl: "{\"entity\":\"acct-\xff\",\"occurrence\":\"b\"}\n{\"entity\":\"acct-\xfe\",\"occurrence\":\"b\"}",
			want: `line 2: field "entity" holds invalid UTF-8`},
		{name: "field given twice", manifest: cmRun, jsonl: `{"entity":"a","occurrence":"b","entity":"c"}`, want: `line 1: field "entity" is given twice`},
		{name: "manifest key given twice", manifest: manifest("twice", "batch:", "  items:", "  - {entity: a, occurrence: b, entity: c}"), want: `line 11, spec.batch.items[0]: the key "entity" is given twice (first at line 11)`},
		// Issue #43.7: what YAML 1.1 (kubectl's reader) would rewrite.
		{name: "YAML 1.1 key, octal and boolean in a payload", manifest: manifest("yaml11", "batch:", "  items:", "  - {entity: a, occurrence: b, payload: {n: 16, o: 010, flag: yes}}"),
			want: "3 problems:\n" +
				`  line 11, spec.batch.items[0].payload: the key n becomes "false" in YAML 1.1 (as kubectl reads it); write "n" to keep it as written` + "\n" +
				`  line 11, spec.batch.items[0].payload.o: 010 is 8 in YAML 1.1 (as kubectl reads it) but 10 in YAML 1.2; write "010" for the string or 8 or 10 for the number` + "\n" +
				`  line 11, spec.batch.items[0].payload.flag: yes is true in YAML 1.1 (as kubectl reads it) but "yes" in YAML 1.2; write "yes" for the string or true for the boolean`},
		{name: "YAML 1.1 boolean as an entity", manifest: manifest("yaml11", "batch:", "  items:", "  - {entity: on, occurrence: b}"),
			want: `line 11, spec.batch.items[0].entity: on is true in YAML 1.1 (as kubectl reads it) but "on" in YAML 1.2; write "on" for the string or true for the boolean`},
		{name: "empty JSON Lines", manifest: cmRun, jsonl: "\n\n", want: "holds no items"},
		{name: "missing ConfigMap", manifest: cmRun, want: "spec.batch.configMapRef: no ConfigMap june in"},
		{name: "ConfigMap without the key", manifest: cmRun + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: june}\ndata: {other: x}\n", want: `has no key "items.jsonl"`},
		{name: "missing --from-file", manifest: cmRun, args: []string{"--from-file", "/nonexistent/items.jsonl"}, want: "reading --from-file"},
		{name: "shard count mismatch", manifest: manifest("shards", items, "workers: 2"), args: []string{"--shard", "1/3"}, want: "the manifest declares spec.workers: 2, so N must be 2"},
		{name: "shard out of range", manifest: manifest("shards", items, "workers: 2"), args: []string{"--shard", "2/2"}, want: "shard indexes go from 0 to 1"},
		{name: "shard syntax", manifest: good, args: []string{"--shard", "one"}, want: `--shard "one": want I/N`},
		{name: "effect on a missing table", manifest: manifest("effect", items, "effect: {sql: INSERT INTO nope SELECT entity FROM claimed}"), want: `spec.effect.sql is rejected by PostgreSQL: relation "nope" does not exist`},
		{name: "query without occurrence", manifest: manifest("query", "batch: {query: \"SELECT 'a' AS entity\"}"), want: `batch.query returns no column "occurrence"`},
		{name: "query that fails", manifest: manifest("query", "batch: {query: \"SELECT 'a' AS entity, (1/0)::text AS occurrence\"}"), want: "division by zero"},
		{name: "malformed DSN", manifest: good, args: []string{"--dsn", "postgres://app:" + password + "@db:notaport/x"}, want: "parsing database URL"},
		{name: "no such database", manifest: good, args: []string{"--dsn", strings.Replace(d.dsn, "dbname=", "dbname=nope_", 1)}, want: "the database named in the connection string does not exist"},
		{name: "wrong password", manifest: good, args: []string{"--dsn", pgtest.PasswordDSN(t, d.dsn, password)}, want: "the database server rejected the connection string's credentials (its user or password)"},
		{name: "unknown role", manifest: good, args: []string{"--dsn", strings.Replace(d.dsn, "user=", "user=nobody_", 1)}, want: "the database server rejected the connection string's credentials"},
		{name: "wrong password, skipping migrations", manifest: good, args: []string{"--dsn", pgtest.PasswordDSN(t, d.dsn, password), "--skip-migrate"}, want: "rejected the connection string's credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.Contains(tt.want, "credentials") || strings.Contains(tt.want, "does not exist") {
				pgtest.DirectOnly(t, testBouncerTrusts)
			}
			args := []string{"run", "-f", writeFile(t, "run.yaml", tt.manifest), "--dsn", d.dsn, "--output", "json", "--retry-timeout", "5s"}
			if tt.jsonl != "" {
				args = append(args, "--from-file", writeFile(t, "items.jsonl", tt.jsonl))
			}
			args = append(args, tt.args...) // a later --dsn wins
			r := runCLI(t, "", args...)
			require.Equal(t, 2, r.code, "exit code 2 for bad input; stderr:\n%s", r.stderr)
			require.Contains(t, r.stderr, tt.want, "the message says what is wrong")
			require.NotContains(t, r.stderr, "retrying", "bad input is refused at once, never retried")
			s := r.summary(t)
			require.Contains(t, s.Error, tt.want, "the JSON result carries the error")
			require.Equal(t, counts{}, s.counts(), "nothing processed")
			require.Zero(t, d.committed(t), "nothing committed")
		})
	}
}

func TestRunWithoutDatabase(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "run.yaml", manifest("nodsn", inlineItems([2]string{"a", "b"})))
	r := runCLI(t, "", "run", "-f", file)
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "no database: pass --dsn or set RUNLEDGER_DATABASE_URL")

	r = runCLI(t, "", "run", "-f", file, "--dsn", "host=127.0.0.1 port=9 password=x", "--output", "yaml")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `--output "yaml": want text or json`)

	r = runCLI(t, "", "run", "--dsn", "host=127.0.0.1 port=9")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `required flag(s) "filename" not set`)
}

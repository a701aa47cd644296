package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/runledger/runledger/internal/envtestutil"
)

// manifestHead is a ProcessingRun up to its batch; an item written on the
// line after "  batch:\n    items:\n" is on line 8.
const manifestHead = "apiVersion: processing.runledger.dev/v1alpha1\nkind: ProcessingRun\nmetadata: {name: june}\nspec:\n  database: {secretRef: {name: db, key: dsn}}\n"

func readManifestText(t *testing.T, doc string) (*manifest, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run.yaml")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	return readManifest(path, nil)
}

// kubectlReads is what kubectl apply -f sends the apiserver for the first
// document of doc: its StreamVisitor (k8s.io/cli-runtime) decodes a YAML
// stream with this decoder, which converts each document with
// sigs.k8s.io/yaml.YAMLToJSON (go.yaml.in/yaml/v2, YAML 1.1).
func kubectlReads(t *testing.T, doc string) map[string]any {
	t.Helper()
	var ext runtime.RawExtension
	require.NoError(t, utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(doc), 4096).Decode(&ext))
	var obj map[string]any
	require.NoError(t, json.Unmarshal(ext.Raw, &obj))
	return obj
}

// TestKubectlReadsAsKubectlDoes checks kubectlReads, which the tests below
// compare runledger run with, against kubectl itself (kubectl label --local
// reads a file as kubectl apply does and prints what it read), on YAML 1.1
// forms and merge keys.
func TestKubectlReadsAsKubectlDoes(t *testing.T) {
	t.Parallel()
	kubectl, err := envtestutil.Kubectl()
	require.NoError(t, err)
	doc := manifestHead + "  batch:\n    items:\n" +
		"    - {entity: a, occurrence: 2026-01-31, payload: &base {n: 16, o: 010, flag: yes, y: 1, k: True, t: 1:20, u: 1_000, v: 0b101, w: 0o17, x: 0X1F, 1.0: a, 010: b}}\n" +
		"    - {entity: c, occurrence: b, payload: {<<: *base, o: 2}}\n" +
		"    - {entity: d, occurrence: b, payload: {o: 3, <<: *base}}\n" +
		"    - {entity: e, occurrence: b, payload: {<<: [{k: 1, l: 1}, {k: 2, m: 2}], r: 3}}\n" +
		"    - {entity: f, occurrence: b, payload: {true: 1, \"true\": 2}}\n"
	path := filepath.Join(t.TempDir(), "run.yaml")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	out, err := exec.Command(kubectl, "label", "--local", "-f", path, "x=y", "-o", "json").Output()
	require.NoError(t, err)
	var read struct {
		Spec struct {
			Batch struct {
				Items []struct{ Payload json.RawMessage }
			}
		}
	}
	require.NoError(t, json.Unmarshal(out, &read))
	ours := kubectlPayloads(t, doc)
	require.Len(t, read.Spec.Batch.Items, len(ours))
	const clash = 4 // true: and "true": are one key; which value it keeps is Go's map order
	for i, it := range read.Spec.Batch.Items {
		if i == clash {
			var kept bytes.Buffer
			require.NoError(t, json.Compact(&kept, it.Payload))
			require.Regexp(t, `^\{"true":[12]\}$`, kept.String(), "item %d", i)
			continue
		}
		require.JSONEq(t, string(it.Payload), ours[i], "item %d", i)
	}
	require.JSONEq(t, `{"false": 16, "o": 8, "flag": true, "true": 1, "k": true, "t": "1:20", "u": 1000, "v": 5, "w": 15, "x": 31, "1": "a", "8": "b"}`, ours[0])
	require.JSONEq(t, `{"k": 1, "l": 1, "m": 2, "r": 3}`, ours[3], "the first of a list of merges wins")
	require.Contains(t, ours[1], `"o":2`, "a key after << overrides the merged one")
	require.Contains(t, ours[2], `"o":8`, "a key before << is overridden by the merged one")
	require.Regexp(t, `^\{"true":[12]\}$`, ours[clash], "true: and \"true\": are one key, either value: runledger run refuses it")
}

func kubectlPayloads(t *testing.T, doc string) []string {
	t.Helper()
	var out []string
	items := kubectlReads(t, doc)["spec"].(map[string]any)["batch"].(map[string]any)["items"].([]any)
	for _, it := range items {
		p, err := json.Marshal(it.(map[string]any)["payload"])
		require.NoError(t, err)
		out = append(out, string(p))
	}
	return out
}

// readAs is what a manifest that should have been refused was read as.
func readAs(m *manifest) string {
	if m == nil {
		return "nothing"
	}
	j, _ := json.Marshal(m.run.Spec)
	return string(j)
}

func payloads(m *manifest) []string {
	var out []string
	for _, it := range m.run.Spec.Batch.Items {
		out = append(out, string(bytes.TrimSpace(it.Payload.Raw)))
	}
	return out
}

// TestReadManifestRefusesYAML11Rewrites is issue #43.7: a plain scalar
// that YAML 1.1 (the reader of kubectl and of sigs.k8s.io/yaml, which
// runledger run shares) reads otherwise than YAML 1.2 and its text is
// refused, naming the line, the field and what to write instead, in a
// payload's values and keys, in the key parts, anywhere in the run.
func TestReadManifestRefusesYAML11Rewrites(t *testing.T) {
	t.Parallel()
	item := func(s string) string { return manifestHead + "  batch:\n    items:\n    - " + s + "\n" }
	value := func(v string) string { return item("{entity: a, occurrence: b, payload: {x: " + v + "}}") }
	key := func(k string) string { return item("{entity: a, occurrence: b, payload: {" + k + ": 1}}") }
	const at = "line 8, spec.batch.items[0].payload.x: "
	for _, tt := range []struct{ doc, want string }{
		// The issue's own payload.
		{item(`{entity: a, occurrence: b, payload: {n: 16, o: 010, flag: yes}}`), `line 8, spec.batch.items[0].payload: the key n becomes "false" in YAML 1.1`},
		{value("yes"), at + `yes is true in YAML 1.1 (as kubectl reads it) but "yes" in YAML 1.2; write "yes" for the string or true for the boolean`},
		{value("Yes"), at + `Yes is true in YAML 1.1`},
		{value("YES"), at + `YES is true in YAML 1.1`},
		{value("y"), at + `y is true in YAML 1.1`},
		{value("Y"), at + `Y is true in YAML 1.1`},
		{value("on"), at + `on is true in YAML 1.1`},
		{value("On"), at + `On is true in YAML 1.1`},
		{value("ON"), at + `ON is true in YAML 1.1`},
		{value("no"), at + `no is false in YAML 1.1 (as kubectl reads it) but "no" in YAML 1.2; write "no" for the string or false for the boolean`},
		{value("No"), at + `No is false in YAML 1.1`},
		{value("NO"), at + `NO is false in YAML 1.1`},
		{value("n"), at + `n is false in YAML 1.1`},
		{value("N"), at + `N is false in YAML 1.1`},
		{value("off"), at + `off is false in YAML 1.1`},
		{value("Off"), at + `Off is false in YAML 1.1`},
		{value("OFF"), at + `OFF is false in YAML 1.1`},
		{value("010"), at + `010 is 8 in YAML 1.1 (as kubectl reads it) but 10 in YAML 1.2; write "010" for the string or 8 or 10 for the number`},
		{value("-010"), at + `-010 is -8 in YAML 1.1`},
		{value("0_10"), at + `0_10 is 8 in YAML 1.1 (as kubectl reads it) but "0_10" in YAML 1.2; write "0_10" for the string or 8 for the number`},
		{value("1_000"), at + `1_000 is 1000 in YAML 1.1 (as kubectl reads it) but "1_000" in YAML 1.2`},
		{value("1_0.5"), at + `1_0.5 is 10.5 in YAML 1.1`},
		{value("1_"), at + `1_ is 1 in YAML 1.1`},
		{value("0b101"), at + `0b101 is 5 in YAML 1.1`},
		{value("-0b101"), at + `-0b101 is -5 in YAML 1.1`},
		{value("0B101"), at + `0B101 is 5 in YAML 1.1`},
		{value("0O17"), at + `0O17 is 15 in YAML 1.1`},
		{value("0X1F"), at + `0X1F is 31 in YAML 1.1`},
		{value("+0x1F"), at + `+0x1F is 31 in YAML 1.1`},
		{value("!!int 010"), at + `!!int 010 is 8 in YAML 1.1`},
		{value("!!bool yes"), at + `!!bool yes is true in YAML 1.1 (as kubectl reads it) but invalid in YAML 1.2; write "yes" for the string or true for the boolean`},
		{value("!!binary aGk="), at + "the tag !!binary: runledger reads !!str, !!int, !!float, !!bool and !!null only"},
		{value("!custom yes"), at + "the tag !custom: runledger reads"},
		{value("[1, on]"), "line 8, spec.batch.items[0].payload.x[1]: on is true in YAML 1.1"},
		{value("{deep: {er: off}}"), "line 8, spec.batch.items[0].payload.x.deep.er: off is false in YAML 1.1"},
		// Keys: a key is its text or it is refused.
		{key("n"), `line 8, spec.batch.items[0].payload: the key n becomes "false" in YAML 1.1 (as kubectl reads it); write "n" to keep it as written`},
		{key("y"), `the key y becomes "true"`},
		{key("yes"), `the key yes becomes "true"`},
		{key("No"), `the key No becomes "false"`},
		{key("on"), `the key on becomes "true"`},
		{key("OFF"), `the key OFF becomes "false"`},
		{key("True"), `the key True becomes "true"`},
		{key("FALSE"), `the key FALSE becomes "false"`},
		{key("010"), `the key 010 becomes "8"`},
		{key("0x1F"), `the key 0x1F becomes "31"`},
		{key("1.0"), `the key 1.0 becomes "1"`},
		{key("1e3"), `the key 1e3 becomes "1000"`},
		{key("1_000"), `the key 1_000 becomes "1000"`},
		{key("3.14159265358979"), `the key 3.14159265358979 becomes "3.1415927"`},
		{key("+1"), `the key +1 becomes "1"`},
		// Two keys that become one: YAML 1.1 keeps one of them, at random.
		{item(`{entity: a, occurrence: b, payload: {true: 1, "true": 2}}`), `line 8, spec.batch.items[0].payload: the key "true" is given twice (first at line 8)`},
		{item(`{entity: a, occurrence: b, payload: {1: a, "1": b}}`), `the key "1" is given twice`},
		// The key parts and the rest of the run.
		{item("{entity: yes, occurrence: b}"), `line 8, spec.batch.items[0].entity: yes is true in YAML 1.1`},
		{item("{entity: a, occurrence: off}"), `line 8, spec.batch.items[0].occurrence: off is false in YAML 1.1`},
		{item("{entity: a, occurrence: 0100}"), `line 8, spec.batch.items[0].occurrence: 0100 is 64 in YAML 1.1`},
		{manifestHead + "  batch: {query: SELECT 1}\n  workers: 010\n", `line 7, spec.workers: 010 is 8 in YAML 1.1`},
	} {
		t.Run(strings.TrimPrefix(tt.doc, manifestHead+"  batch:\n    items:\n    - "), func(t *testing.T) {
			t.Parallel()
			m, err := readManifestText(t, tt.doc)
			require.Error(t, err, "read as %s", readAs(m))
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestReadManifestKeepsYAMLAsWritten: the plain scalars YAML 1.1 and 1.2
// read alike are kept, those that look like numbers or booleans included;
// and each is what kubectl would send.
func TestReadManifestKeepsYAMLAsWritten(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ payload, want string }{
		{`{a: true, b: True, c: TRUE, d: false, e: False, f: FALSE}`, `{"a":true,"b":true,"c":true,"d":false,"e":false,"f":false}`},
		{`{a: null, b: Null, c: NULL, d: ~, e: }`, `{"a":null,"b":null,"c":null,"d":null,"e":null}`},
		{`{a: 0o17, b: 0x1F, c: 08, d: 1.10, e: .5, f: +1, g: 1e3, h: -0, i: 1., j: 09.5}`, `{"a":15,"b":31,"c":8,"d":1.1,"e":0.5,"f":1,"g":1000,"h":0,"i":1,"j":9.5}`},
		// Sexagesimal numbers and dates are YAML 1.1 too, but kubectl's
		// reader keeps them as strings, as YAML 1.2 does.
		{`{a: 1:20, b: 190:20:30, c: 2001-12-14, d: 2001-12-14T21:59:43.10Z, e: 2001-12-14 21:59:43.10 -5}`,
			`{"a":"1:20","b":"190:20:30","c":"2001-12-14","d":"2001-12-14T21:59:43.10Z","e":"2001-12-14 21:59:43.10 -5"}`},
		{`{a: nothing, b: yesterday, c: only, d: offset, e: Nope, f: no way, g: 0x, h: _1, i: .x, j: -x}`,
			`{"a":"nothing","b":"yesterday","c":"only","d":"offset","e":"Nope","f":"no way","g":"0x","h":"_1","i":".x","j":"-x"}`},
		{`{a: "yes", b: 'no', c: "010", d: !!str on, e: !!float 1, f: !!int 12, g: !!bool true, h: !!null null}`,
			`{"a":"yes","b":"no","c":"010","d":"on","e":1,"f":12,"g":true,"h":null}`},
		// "!", the non-specific tag, makes a plain scalar a string in both.
		{`{a: ! yes, b: &b ! 010, c: [! on], ! n: 1, e: ! 2001-12-14}`, `{"a":"yes","b":"010","c":["on"],"n":1,"e":"2001-12-14"}`},
		{`{true: 1, false: 2, 1: 3, 15: 4, 1.5: 5, -3: 6, "yes": 7, 'n': 8, 1:20: 9, 2001-12-14: 10, nothing: 11}`,
			`{"true":1,"false":2,"1":3,"15":4,"1.5":5,"-3":6,"yes":7,"n":8,"1:20":9,"2001-12-14":10,"nothing":11}`},
		// Keys are compared byte for byte: case, trailing white space and
		// Unicode normalization make distinct keys.
		{"{name: 1, Name: 2, \"name \": 3, \"caf\u00e9\": 4, \"cafe\u0301\": 5}", "{\"name\":1,\"Name\":2,\"name \":3,\"caf\u00e9\":4,\"cafe\u0301\":5}"},
	} {
		doc := manifestHead + "  batch:\n    items:\n    - {entity: a, occurrence: 2026-01-31, payload: " + tt.payload + "}\n"
		m, err := readManifestText(t, doc)
		require.NoError(t, err, tt.payload)
		require.JSONEq(t, tt.want, payloads(m)[0], tt.payload)
		require.JSONEq(t, kubectlPayloads(t, doc)[0], payloads(m)[0], "what kubectl sends")
		require.Equal(t, "2026-01-31", m.run.Spec.Batch.Items[0].Occurrence)
	}
}

// TestReadManifestMergeKeys: a YAML merge key (<<) with a key after it that
// overrides a merged one is read as kubectl reads it (the later key wins),
// not refused as a key given twice; a key before the << that the merge
// would replace in kubectl's reader but not in YAML's is refused.
func TestReadManifestMergeKeys(t *testing.T) {
	t.Parallel()
	const items = manifestHead + "  batch:\n    items:\n"
	for _, tt := range []struct {
		name, doc string
		want      []string // the payloads; nil when refused
		err       string
	}{
		{name: "override after the merge", doc: items +
			"    - {entity: a, occurrence: b, payload: &base {currency: EUR, amount: 1}}\n" +
			"    - entity: c\n      occurrence: b\n      payload:\n        <<: *base\n        amount: 2\n",
			want: []string{`{"currency":"EUR","amount":1}`, `{"currency":"EUR","amount":2}`}},
		{name: "an item's defaults", doc: items +
			"    - &first {entity: a, occurrence: b, payload: {amount: 1}}\n" +
			"    - <<: *first\n      entity: c\n" +
			"    - {<<: *first, entity: d, payload: {amount: 4}}\n",
			want: []string{`{"amount":1}`, `{"amount":1}`, `{"amount":4}`}},
		{name: "a list of merges: the first one wins", doc: items +
			"    - {entity: a, occurrence: b, payload: {p: &p {k: 1, l: 1}, q: &q {k: 2, m: 2}}}\n" +
			"    - {entity: c, occurrence: b, payload: {<<: [*p, *q], r: 3}}\n",
			want: []string{`{"p":{"k":1,"l":1},"q":{"k":2,"m":2}}`, `{"k":1,"l":1,"m":2,"r":3}`}},
		{name: "a merge of a merge", doc: items +
			"    - {entity: a, occurrence: b, payload: {p: &p {k: 1}, q: &q {<<: *p, l: 2}}}\n" +
			"    - {entity: c, occurrence: b, payload: {<<: *q, k: 3}}\n",
			want: []string{`{"p":{"k":1},"q":{"k":1,"l":2}}`, `{"k":3,"l":2}`}},
		{name: "a key before the merge that replaces it", doc: items +
			"    - {entity: a, occurrence: b, payload: &base {currency: EUR, amount: 1}}\n" +
			"    - entity: c\n      occurrence: b\n      payload:\n        amount: 2\n        <<: *base\n",
			err: `line 13, spec.batch.items[1].payload: the key amount (line 12) comes before the merge key << that also sets it: YAML 1.1 as kubectl reads it takes the merged value, YAML 1.2 this one; put << first`},
		{name: "two merge keys", doc: items +
			"    - {entity: a, occurrence: b, payload: {p: &p {k: 1}, q: &q {l: 2}}}\n" +
			"    - {entity: c, occurrence: b, payload: {<<: *p, <<: *q}}\n",
			err: `line 9, spec.batch.items[1].payload: the key "<<" is given twice (first at line 9)`},
		{name: "a key given twice beside a merge", doc: items +
			"    - {entity: a, occurrence: b, payload: {x: &x {k: 1}}}\n" +
			"    - {entity: c, occurrence: b, payload: {<<: *x, k: 2, k: 3}}\n",
			err: `line 9, spec.batch.items[1].payload: the key "k" is given twice (first at line 9)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, err := readManifestText(t, tt.doc)
			if tt.err != "" {
				require.Error(t, err, "read as %s", readAs(m))
				require.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			got := payloads(m)
			kubectl := kubectlPayloads(t, tt.doc)
			require.Len(t, got, len(tt.want))
			for i := range got {
				require.JSONEq(t, tt.want[i], got[i], "item %d", i)
				require.JSONEq(t, kubectl[i], got[i], "item %d: what kubectl sends", i)
			}
		})
	}
}

package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSelectShards(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		flag   string
		shards int
		want   []int
		err    string
	}{
		{"", 3, []int{0, 1, 2}, ""},
		{"1/3", 3, []int{1}, ""},
		{"2", 3, []int{2}, ""},
		{"0/1", 1, []int{0}, ""},
		{"3/3", 3, nil, "shard indexes go from 0 to 2"},
		{"1/4", 3, nil, "N must be 3"},
		{"-1/3", 3, nil, "want I/N"},
		{"a/b", 3, nil, "want I/N"},
		{"1/0", 3, nil, "want I/N"},
	} {
		got, err := selectShards(tt.flag, tt.shards)
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err, "--shard %q", tt.flag)
			continue
		}
		require.NoError(t, err, "--shard %q", tt.flag)
		require.Equal(t, tt.want, got, "--shard %q", tt.flag)
	}
}

func TestReadManifest(t *testing.T) {
	t.Parallel()
	doc := `# comment only document
---
apiVersion: v1
kind: Secret
metadata: {name: db}
stringData: {dsn: postgres://x}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: june}
data:
  items.jsonl: |
    {"entity": "a", "occurrence": "b"}
---
apiVersion: processing.runledger.dev/v1alpha1
kind: ProcessingRun
metadata: {name: june, namespace: billing, uid: 0f6b2c1e-0000-4000-8000-000000000001}
spec:
  database: {secretRef: {name: db, key: dsn}}
  batch: {configMapRef: {name: june, key: items.jsonl}}
  workers: 3
status:
  phase: Running
`
	path := filepath.Join(t.TempDir(), "run.yaml")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	m, err := readManifest(path, nil)
	require.NoError(t, err)
	require.Equal(t, "june", m.run.Name)
	require.Equal(t, "billing", m.run.Namespace)
	require.EqualValues(t, "0f6b2c1e-0000-4000-8000-000000000001", m.run.UID)
	require.EqualValues(t, 3, m.run.Spec.Workers)
	require.Len(t, m.configMaps, 1)

	// The same from stdin, as JSON.
	m, err = readManifest("-", strings.NewReader(`{"apiVersion": "processing.runledger.dev/v1alpha1", "kind": "ProcessingRun",
		"metadata": {"name": "j"}, "spec": {"database": {"secretRef": {"name": "d", "key": "k"}}, "batch": {"query": "SELECT 1"}}}`))
	require.NoError(t, err)
	require.Equal(t, "SELECT 1", m.run.Spec.Batch.Query)
	require.Equal(t, "stdin", m.source)
}

// TestReadManifestKeepsNumbers: the numbers JSON keeps (an int64 beyond
// 2^53, a float64's shortest spelling, a trailing zero) reach the payload as
// their values.
func TestReadManifestKeepsNumbers(t *testing.T) {
	t.Parallel()
	const doc = "apiVersion: processing.runledger.dev/v1alpha1\nkind: ProcessingRun\nmetadata: {name: june}\nspec:\n  database: {secretRef: {name: db, key: dsn}}\n" +
		"  batch:\n    items:\n    - {entity: a, occurrence: b, payload: {big: 9007199254740993, min: -9223372036854775808, f: 0.30000000000000004, t: 1.10, e: 1e300, h: 0x1F}}\n"
	path := filepath.Join(t.TempDir(), "run.yaml")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	m, err := readManifest(path, nil)
	require.NoError(t, err)
	require.JSONEq(t, `{"big": 9007199254740993, "min": -9223372036854775808, "f": 0.30000000000000004, "t": 1.1, "e": 1e300, "h": 31}`, string(m.run.Spec.Batch.Items[0].Payload.Raw))
}

// TestReadManifestRefusesRewrites is issue #20.5 for manifests: a key given
// twice (in the run, its items, a ConfigMap's data), a lone surrogate escape
// or invalid UTF-8 is refused with the document and the key named, never
// read one way or another.
func TestReadManifestRefusesRewrites(t *testing.T) {
	t.Parallel()
	const head = "apiVersion: processing.runledger.dev/v1alpha1\nkind: ProcessingRun\nmetadata: {name: june}\nspec:\n  database: {secretRef: {name: db, key: dsn}}\n"
	cm := "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: june}\ndata:\n  items.jsonl: |\n    {\"entity\": \"a\", \"occurrence\": \"b\"}\n"
	for name, tt := range map[string]struct{ doc, want string }{
		"spec key twice":    {head + "  batch: {query: SELECT 1}\n  workers: 2\n  workers: 5\n", `line 8, spec: the key "workers" is given twice (first at line 7)`},
		"item key twice":    {head + "  batch:\n    items:\n    - {entity: a, occurrence: b, entity: c}\n", `"entity"`},
		"payload key twice": {head + "  batch:\n    items:\n    - entity: a\n      occurrence: b\n      payload: {amount: 1, amount: 2}\n", `"amount"`},
		"ConfigMap data key twice": {head + "  batch: {configMapRef: {name: june, key: items.jsonl}}\n" + cm + "  items.jsonl: |\n    {\"entity\": \"x\", \"occurrence\": \"y\"}\n",
			`document 2: line 7, data: the key "items.jsonl" is given twice (first at line 5)`},
		"kind twice":             {head + "  batch: {query: SELECT 1}\nkind: ProcessingRun\n", `"kind"`},
		"lone surrogate in YAML": {head + "  batch:\n    items:\n    - {entity: \"a\\ud800\", occurrence: b}\n", "document 1"},
		"lone surrogate in JSON": {`{"apiVersion": "processing.runledger.dev/v1alpha1", "kind": "ProcessingRun", "metadata": {"name": "j"}, "spec": {"database": {"secretRef": {"name": "d", "key": "k"}}, "batch": {"items": [{"entity": "a\ud800", "occurrence": "b"}]}}}`, "document 1"},
		"key twice in JSON":      {`{"apiVersion": "processing.runledger.dev/v1alpha1", "kind": "ProcessingRun", "metadata": {"name": "j"}, "spec": {"database": {"secretRef": {"name": "d", "key": "k"}}, "batch": {"items": [{"entity": "a", "entity": "c", "occurrence": "b"}]}}}`, `"entity"`},
		"invalid UTF-8":          {head + "  batch:\n    items:\n    - {entity: \"a\xff\", occurrence: b}\n", "document 1"},
		// A number JSON would not keep as written: rounded to a float64, or
		// turned into a string.
		"payload integer beyond 64 bits": {head + "  batch:\n    items:\n    - {entity: a, occurrence: b, payload: {id: 12345678901234567891}}\n",
			"line 8, spec.batch.items[0].payload.id: the number 12345678901234567891 "},
		"payload float with more digits than it keeps": {head + "  batch:\n    items:\n    - {entity: a, occurrence: b, payload: {x: 0.1000000000000000055511151231257827}}\n",
			"the number 0.1000000000000000055511151231257827 "},
		"payload float beyond float64": {head + "  batch:\n    items:\n    - {entity: a, occurrence: b, payload: {x: 1e400}}\n", "the number 1e400 "},
		"JSON payload integer beyond 64 bits": {`{"apiVersion": "processing.runledger.dev/v1alpha1", "kind": "ProcessingRun", "metadata": {"name": "j"}, "spec": {"database": {"secretRef": {"name": "d", "key": "k"}}, "batch": {"items": [{"entity": "a", "occurrence": "b", "payload": {"id": 12345678901234567891}}]}}}`,
			"the number 12345678901234567891 "},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "run.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tt.doc), 0o600))
			m, err := readManifest(path, nil)
			require.Error(t, err, "%+v", m)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

package cli

import (
	"errors"
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

func TestRedactExitKeepsTheCode(t *testing.T) {
	t.Parallel()
	secrets := []string{"hunter2"}
	err := redactExit(badInput(errors.New("connecting with password hunter2")), secrets)
	require.NotContains(t, err.Error(), "hunter2")
	var exit *ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, ExitBadInput, exit.Code)

	plain := &ExitError{Code: ExitFailed, Err: errors.New("no secret here")}
	var same *ExitError
	require.ErrorAs(t, redactExit(plain, secrets), &same)
	require.Same(t, plain, same, "untouched without a secret")
	require.NoError(t, redactExit(nil, secrets))
}

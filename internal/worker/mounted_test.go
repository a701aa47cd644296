package worker_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/worker"
)

// TestMountedBatchData: a configMapRef batch is the file the kubelet mounted;
// a missing file (the ConfigMap or its key deleted after the controller
// checked them) or an unset variable is bad input naming the ConfigMap.
func TestMountedBatchData(t *testing.T) {
	ref := v1alpha1.ConfigMapKeyRef{Name: "june", Key: "items.jsonl"}
	file := filepath.Join(t.TempDir(), v1alpha1.WorkerBatchFile)
	require.NoError(t, os.WriteFile(file, []byte(`{"entity":"a","occurrence":"1"}`), 0o444))

	b, name, err := worker.MountedBatchData(file, "billing")(context.Background(), ref)
	require.NoError(t, err)
	require.Equal(t, `{"entity":"a","occurrence":"1"}`, string(b))
	require.Equal(t, "ConfigMap june key items.jsonl", name)

	_, _, err = worker.MountedBatchData(filepath.Join(t.TempDir(), "absent"), "billing")(context.Background(), ref)
	require.True(t, worker.IsInputError(err), "%v", err)
	require.ErrorContains(t, err, `ConfigMap billing/june or its key "items.jsonl" is gone`)

	_, _, err = worker.MountedBatchData("", "billing")(context.Background(), ref)
	require.True(t, worker.IsInputError(err), "%v", err)
	require.ErrorContains(t, err, v1alpha1.EnvBatchFile+" is not set")
}

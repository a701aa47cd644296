package worker_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// TestReadRun: the worker's run is the file the kubelet mounted from the
// run's ConfigMap; a missing or unreadable file, one the controller did not
// write for the pod (a replaced ConfigMap: here one that would make a Skip
// run supersede), or one holding another run (deleted and created again
// under the name), is bad input that says so.
func TestReadRun(t *testing.T) {
	run := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: "invoices", Namespace: "billing", UID: "uid-1"},
		Spec:       v1alpha1.ProcessingRunSpec{Workers: 2, Batch: v1alpha1.BatchSpec{Query: "SELECT 1"}},
	}
	b, err := v1alpha1.EncodeRunFile(run)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), v1alpha1.WorkerRunFile)
	require.NoError(t, os.WriteFile(file, b, 0o444))
	env := worker.PodEnv{Namespace: "billing", Name: "invoices", UID: "uid-1", RunFile: file, RunDigest: v1alpha1.RunFileDigest(b)}

	got, err := worker.ReadRun(env)
	require.NoError(t, err)
	require.Equal(t, run.Spec, got.Spec)

	for name, tc := range map[string]struct {
		env  func(worker.PodEnv) worker.PodEnv
		want string
	}{
		"another run of the name": {func(e worker.PodEnv) worker.PodEnv { e.UID = "uid-2"; return e },
			"holds run billing/invoices with UID uid-1, not UID uid-2: the run this pod was created for is gone"},
		"another run's file": {func(e worker.PodEnv) worker.PodEnv { e.Name = "payroll"; return e },
			"holds run billing/invoices with UID uid-1"},
		"no file": {func(e worker.PodEnv) worker.PodEnv { e.RunFile = filepath.Join(t.TempDir(), "absent"); return e },
			"mounted from ConfigMap runledger-invoices-" + v1alpha1.RunFileDigest(b)[:10]},
		"a replaced ConfigMap": {func(e worker.PodEnv) worker.PodEnv {
			other := run.DeepCopy()
			other.Spec.OnExisting = v1alpha1.OnExistingSupersede
			ob, err := v1alpha1.EncodeRunFile(other)
			require.NoError(t, err)
			e.RunFile = filepath.Join(t.TempDir(), v1alpha1.WorkerRunFile)
			require.NoError(t, os.WriteFile(e.RunFile, ob, 0o444))
			return e
		}, "is not the file the controller wrote for this pod: its digest is "},
		"not a run's file": {func(e worker.PodEnv) worker.PodEnv {
			e.RunFile = filepath.Join(t.TempDir(), "x")
			content := []byte(`{"kind":"ProcessingRun","spec":{}}`)
			require.NoError(t, os.WriteFile(e.RunFile, content, 0o444))
			e.RunDigest = v1alpha1.RunFileDigest(content)
			return e
		}, "reading the run's file: gzip: invalid header"},
	} {
		_, err := worker.ReadRun(tc.env(env))
		require.True(t, worker.IsInputError(err), "%s: %v", name, err)
		require.ErrorContains(t, err, tc.want, name)
	}
}

package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	lua "github.com/yuin/gopher-lua"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// healthCase is a status the controller writes, with what kstatus and Argo
// CD make of it.
type healthCase struct {
	name    string
	run     map[string]any
	kstatus status.Status
	argo    string
	argoMsg string
}

// argoDir is the Argo CD health check in Argo's own layout
// (resource_customizations/<group>/<Kind>/).
func argoDir() string {
	return filepath.Join(envtestutil.RepoRoot(), "config", "argocd", v1alpha1.Group, "ProcessingRun")
}

// healthCases builds each phase's status with the controller's own
// decisions (decideRun, buildStatus).
func healthCases(t *testing.T) []healthCase {
	t.Helper()
	build := func(mutate func(*v1alpha1.ProcessingRun), started bool, stalled *problem, shards ...shardDecision) map[string]any {
		run := testRun()
		run.APIVersion, run.Kind = v1alpha1.GroupVersion.String(), "ProcessingRun"
		run.Spec.Workers = int32(len(shards))
		if mutate != nil {
			mutate(run)
		}
		o := decideRun(run, shards, started)
		var start *metav1.Time
		if started {
			start = &metav1.Time{Time: t0}
		}
		run.Status = buildStatus(run, statusInput{shards: shards, outcome: o, stalled: stalled, startTime: start, now: t0})
		for i := range run.Status.Conditions {
			run.Status.Conditions[i].LastTransitionTime = metav1.Time{Time: t0} // SetStatusCondition stamps the clock
		}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(run)
		require.NoError(t, err)
		unstructured.RemoveNestedField(u, "metadata", "creationTimestamp")
		return u
	}
	// What the API server shows before the controller's first write (the
	// CRD's default; TestNewRunReadsInProgress checks it on a real one).
	fresh := build(nil, false, nil, shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{}))
	fresh["status"] = map[string]any{"observedGeneration": int64(0)}
	unschedulableShard := shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})
	unschedulableShard.unschedulable = "pod invoices-0-0: 0/1 nodes are available: 1 Insufficient cpu."
	return []healthCase{
		{name: "new", run: fresh, kstatus: status.InProgressStatus,
			argo: "Progressing", argoMsg: "Waiting for the controller to observe the run"},
		{name: "pending", run: build(nil, false, nil, shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})), kstatus: status.InProgressStatus,
			argo: "Progressing", argoMsg: "Pending: 0/0 completed, 0 already handled, 0 failed"},
		{name: "running", run: build(nil, true, nil, shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{Total: 4, Completed: 1})), kstatus: status.InProgressStatus,
			argo: "Progressing", argoMsg: "Running: 1/4 completed, 0 already handled, 0 failed"},
		{name: "unschedulable", run: build(nil, true, nil, unschedulableShard), kstatus: status.InProgressStatus,
			argo: "Progressing", argoMsg: "Running: 0/0 completed, 0 already handled, 0 failed"},
		{name: "succeeded", run: build(nil, true, nil, shard(0, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 4, Completed: 3, AlreadyHandled: 1})), kstatus: status.CurrentStatus,
			argo: "Healthy", argoMsg: "3/4 completed, 1 already handled, 0 failed"},
		{name: "failed", run: build(nil, true, nil, shardDecision{index: 0, phase: v1alpha1.ShardFailed, final: true, pod: "invoices-0-3",
			failure: &shardFailure{reason: ReasonBackoffLimitExceeded, message: "shard 0 failed 4 times (backoffLimit 3); last error: pod invoices-0-3 exited 1"}}),
			kstatus: status.FailedStatus, argo: "Degraded", argoMsg: "shard 0 failed 4 times (backoffLimit 3); last error: pod invoices-0-3 exited 1"},
		{name: "stalled", run: build(nil, false, &problem{reason: ReasonSecretNotFound, message: `Secret "ledger-db" not found in namespace "billing"`},
			shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})), kstatus: status.FailedStatus,
			argo: "Degraded", argoMsg: `Secret "ledger-db" not found in namespace "billing"`},
		{name: "suspended", run: build(func(r *v1alpha1.ProcessingRun) { r.Spec.Suspend = true }, true, nil, shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{Total: 4, Completed: 2})),
			// Ready=False: a suspended batch is not done, kstatus waits.
			kstatus: status.InProgressStatus, argo: "Suspended", argoMsg: "suspended with 0/1 shards succeeded, 1 pending; set spec.suspend to false to resume"},
	}
}

// argoHealthTest is Argo CD's health_test.yaml.
type argoHealthTest struct {
	Tests []argoHealthTestCase `json:"tests"`
}

type argoHealthTestCase struct {
	HealthStatus struct {
		Status  string `json:"status"`
		Message string `json:"message"`
	} `json:"healthStatus"`
	InputPath string `json:"inputPath"`
}

// TestHealthOfEachPhase computes each phase's health with the real kstatus
// library and with the Argo CD script, on statuses the controller writes.
// The same statuses are the testdata of the Argo CD layout, and the
// expectations its health_test.yaml: RUNLEDGER_UPDATE_TESTDATA=1 rewrites
// them, otherwise they must match.
func TestHealthOfEachPhase(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(argoDir(), "health.lua"))
	require.NoError(t, err)
	update := os.Getenv("RUNLEDGER_UPDATE_TESTDATA") == "1"
	var want argoHealthTest
	for _, c := range healthCases(t) {
		t.Run(c.name, func(t *testing.T) {
			res, err := status.Compute(&unstructured.Unstructured{Object: c.run})
			require.NoError(t, err)
			require.Equal(t, c.kstatus, res.Status, "kstatus: %s", res.Message)

			health, message := luaHealth(t, string(script), c.run)
			require.Equal(t, c.argo, health, "Argo CD: %s", message)
			require.Equal(t, c.argoMsg, message)

			b, err := yaml.Marshal(c.run)
			require.NoError(t, err)
			path := filepath.Join(argoDir(), "testdata", c.name+".yaml")
			if update {
				require.NoError(t, os.WriteFile(path, b, 0o644))
			}
			got, err := os.ReadFile(path)
			require.NoError(t, err, "RUNLEDGER_UPDATE_TESTDATA=1 writes it")
			require.Equal(t, string(b), string(got), "%s is stale: RUNLEDGER_UPDATE_TESTDATA=1 go test -run TestHealthOfEachPhase ./controllers/", path)
		})
		tc := argoHealthTestCase{InputPath: "testdata/" + c.name + ".yaml"}
		tc.HealthStatus.Status, tc.HealthStatus.Message = c.argo, c.argoMsg
		want.Tests = append(want.Tests, tc)
	}
	b, err := yaml.Marshal(want)
	require.NoError(t, err)
	path := filepath.Join(argoDir(), "health_test.yaml")
	if update {
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(b), string(got), "health_test.yaml is stale: RUNLEDGER_UPDATE_TESTDATA=1 go test -run TestHealthOfEachPhase ./controllers/")
}

// luaHealth runs an Argo CD health script on an object.
func luaHealth(t *testing.T, script string, obj map[string]any) (string, string) {
	t.Helper()
	b, err := yaml.Marshal(obj)
	require.NoError(t, err)
	var decoded map[string]any
	require.NoError(t, yaml.Unmarshal(b, &decoded)) // numbers as float64, as Argo CD hands them
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, decoded))
	require.NoError(t, L.DoString(script))
	hs, ok := L.Get(-1).(*lua.LTable)
	require.True(t, ok, "the script returns a table")
	return hs.RawGetString("status").String(), hs.RawGetString("message").String()
}

// A run the controller has not written yet reads InProgress to kstatus, as
// the API server returns it (the CRD defaults status.observedGeneration to
// 0, behind metadata.generation), not Current.
func TestNewRunReadsInProgress(t *testing.T) {
	t.Parallel()
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, newRun(ns, "fresh", 1, 1))) // no controller runs here
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("ProcessingRun"))
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fresh"}, u))
	res, err := status.Compute(u)
	require.NoError(t, err)
	require.Equal(t, status.InProgressStatus, res.Status, "%s; object status: %v", res.Message, u.Object["status"])
	health, msg := luaHealth(t, mustRead(t, filepath.Join(argoDir(), "health.lua")), u.Object)
	require.Equal(t, "Progressing", health, msg)
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err, fmt.Sprintf("read %s", path))
	return string(b)
}

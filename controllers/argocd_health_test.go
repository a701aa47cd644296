package controllers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	lua "github.com/yuin/gopher-lua"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// toLua converts a decoded JSON value the way Argo CD hands objects to its
// health scripts (gopher-lua tables, 1-based arrays).
func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		t := L.NewTable()
		for _, e := range v {
			t.Append(toLua(L, e))
		}
		return t
	case map[string]any:
		t := L.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	default:
		panic("unexpected JSON value")
	}
}

// argoHealth runs the Argo CD health script on a run.
func argoHealth(t *testing.T, script string, run *v1alpha1.ProcessingRun) (string, string) {
	t.Helper()
	b, err := json.Marshal(run)
	require.NoError(t, err)
	var obj map[string]any
	require.NoError(t, json.Unmarshal(b, &obj))
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, obj))
	require.NoError(t, L.DoString(script))
	hs, ok := L.Get(-1).(*lua.LTable)
	require.True(t, ok, "the script returns a table")
	return hs.RawGetString("status").String(), hs.RawGetString("message").String()
}

func TestArgoCDHealth(t *testing.T) {
	dir := filepath.Join(envtestutil.RepoRoot(), "config", "argocd")
	script, err := os.ReadFile(filepath.Join(dir, "processing.runledger.dev", "ProcessingRun", "health.lua"))
	require.NoError(t, err)

	// The ConfigMap patch embeds the same script.
	patch, err := os.ReadFile(filepath.Join(dir, "argocd-cm-patch.yaml"))
	require.NoError(t, err)
	var cm struct {
		Data map[string]string `json:"data"`
	}
	require.NoError(t, yaml.Unmarshal(patch, &cm))
	require.Equal(t, string(script), cm.Data["resource.customizations.health.processing.runledger.dev_ProcessingRun"])

	started := &metav1.Time{Time: t0}
	status := func(mutate func(*v1alpha1.ProcessingRun), shards []shardDecision, stalled *problem) *v1alpha1.ProcessingRun {
		run := testRun()
		run.Spec.Workers = int32(len(shards))
		if mutate != nil {
			mutate(run)
		}
		o := decideRun(run, shards, true)
		run.Status = buildStatus(run, statusInput{shards: shards, outcome: o, stalled: stalled, startTime: started, now: t0})
		return run
	}
	tests := []struct {
		name    string
		run     *v1alpha1.ProcessingRun
		health  string
		message string
	}{
		{name: "not yet observed", run: testRun(), health: "Progressing", message: "Waiting for the controller"},
		{name: "running", run: status(nil, []shardDecision{shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{Total: 4, Completed: 1})}, nil),
			health: "Progressing", message: "Running: 1/4 completed, 0 already handled, 0 failed"},
		{name: "stalled", run: status(nil, []shardDecision{shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})},
			&problem{reason: ReasonSecretNotFound, message: `Secret "db" not found`}),
			health: "Degraded", message: `Secret "db" not found`},
		{name: "suspended", run: status(func(r *v1alpha1.ProcessingRun) { r.Spec.Suspend = true },
			[]shardDecision{shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})}, nil),
			health: "Suspended", message: "suspended with"},
		{name: "succeeded", run: status(nil, []shardDecision{shard(0, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 4, Completed: 3, AlreadyHandled: 1})}, nil),
			health: "Healthy", message: "3/4 completed, 1 already handled, 0 failed"},
		{name: "failed", run: status(nil, []shardDecision{{index: 0, phase: v1alpha1.ShardFailed, final: true,
			failure: &shardFailure{reason: ReasonBadInput, message: "shard 0: bad input"}}}, nil),
			health: "Degraded", message: "shard 0: bad input"},
		{name: "spec changed, not yet observed", run: status(func(r *v1alpha1.ProcessingRun) { r.Generation = 1 },
			[]shardDecision{shard(0, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 1, Completed: 1})}, nil),
			health: "Healthy"},
	}
	lagging := status(nil, []shardDecision{shard(0, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 1, Completed: 1})}, nil)
	lagging.Generation = 5
	tests = append(tests, struct {
		name    string
		run     *v1alpha1.ProcessingRun
		health  string
		message string
	}{name: "status older than the spec", run: lagging, health: "Progressing", message: "Waiting for the controller"})

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			health, message := argoHealth(t, string(script), tt.run)
			require.Equal(t, tt.health, health, "message: %s", message)
			require.True(t, strings.Contains(message, tt.message), "message %q, want %q", message, tt.message)
		})
	}
}

package v1alpha1_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/config/crd"
)

// TestCRDSaysWhatTheConstantsSay: markers need literals, so this reads the
// generated CRD back and compares each rule and default with its constant.
func TestCRDSaysWhatTheConstantsSay(t *testing.T) {
	t.Parallel()
	var def apiextensionsv1.CustomResourceDefinition
	require.NoError(t, yaml.UnmarshalStrict(crd.ProcessingRun, &def))
	require.Len(t, def.Spec.Versions, 1)
	require.Equal(t, v1alpha1.GroupVersion.Version, def.Spec.Versions[0].Name)
	root := *def.Spec.Versions[0].Schema.OpenAPIV3Schema
	at := func(path ...string) apiextensionsv1.JSONSchemaProps {
		t.Helper()
		s := root
		for _, p := range path {
			if p == "[]" {
				require.NotNil(t, s.Items, "%v", path)
				s = *s.Items.Schema
				continue
			}
			next, ok := s.Properties[p]
			require.True(t, ok, "no %s in %v", p, path)
			s = next
		}
		return s
	}
	rules := func(s apiextensionsv1.JSONSchemaProps) []string {
		var out []string
		for _, r := range s.XValidations {
			out = append(out, r.Rule)
		}
		return out
	}
	num := func(f *float64) int64 { t.Helper(); require.NotNil(t, f); return int64(*f) }
	def64 := func(s apiextensionsv1.JSONSchemaProps) string {
		t.Helper()
		require.NotNil(t, s.Default)
		return string(s.Default.Raw)
	}

	require.Contains(t, rules(root), fmt.Sprintf("size(self.metadata.name) <= %d", v1alpha1.MaxRunNameLength))

	for _, part := range []string{"entity", "occurrence"} {
		s := at("spec", "batch", "items", "[]", part)
		require.Equal(t, int64(v1alpha1.MaxKeyPartBytes), *s.MaxLength, "%s: maxLength (characters) bounds the CEL rules' cost", part)
		require.Contains(t, rules(s), fmt.Sprintf("size(bytes(self)) <= %d", v1alpha1.MaxKeyPartBytes), part)
	}
	require.Equal(t, int64(v1alpha1.MaxInlineItems), *at("spec", "batch", "items").MaxItems)
	require.Equal(t, int64(v1alpha1.MaxSQLLength), *at("spec", "batch", "query").MaxLength)
	require.Equal(t, int64(v1alpha1.MaxSQLLength), *at("spec", "effect", "sql").MaxLength)
	require.Equal(t, int64(v1alpha1.MaxImageLength), *at("spec", "workerTemplate", "image").MaxLength)
	require.Equal(t, int64(v1alpha1.MaxShardMessageLength), *at("status", "shards", "[]", "message").MaxLength)
	// The failures a status shows: as BoundFailures cuts them (bytes bound characters).
	require.Equal(t, int64(v1alpha1.MaxShardFailures), *at("status", "shards", "[]", "failures").MaxItems)
	for _, f := range []string{"entity", "occurrence", "error"} {
		require.Equal(t, int64(v1alpha1.MaxFailureSampleBytes), *at("status", "shards", "[]", "failures", "[]", f).MaxLength, f)
	}
	require.Equal(t, int64(v1alpha1.MaxFailureClassBytes), *at("status", "shards", "[]", "failures", "[]", "class").MaxLength)
	for _, ref := range [][]string{{"spec", "database", "secretRef"}, {"spec", "batch", "configMapRef"}} {
		for _, f := range []string{"name", "key"} {
			require.Equal(t, int64(v1alpha1.MaxRefNameLength), *at(append(ref, f)...).MaxLength, "%v.%s", ref, f)
		}
		require.Equal(t, v1alpha1.RefKeyPattern, at(append(ref, "key")...).Pattern, "%v", ref)
	}

	wt := func(p ...string) apiextensionsv1.JSONSchemaProps {
		return at(append([]string{"spec", "workerTemplate"}, p...)...)
	}
	require.Contains(t, rules(wt("env"))[0], fmt.Sprintf("!e.name.startsWith('%s') && e.name != '%s'", v1alpha1.ReservedEnvPrefix, v1alpha1.EnvPodName))
	require.Equal(t, int64(v1alpha1.MaxWorkerEnv), *wt("env").MaxItems)
	require.Contains(t, rules(wt("volumes")), fmt.Sprintf("self.all(v, v.name != '%s')", v1alpha1.WorkerTmpVolume))
	require.Contains(t, rules(wt("volumeMounts")), fmt.Sprintf("self.all(m, m.mountPath != '%s' && m.mountPath != '%s')", v1alpha1.WorkerTmpPath, v1alpha1.TerminationMessagePath))
	for _, f := range []string{"volumes", "volumeMounts"} {
		require.Equal(t, int64(v1alpha1.MaxWorkerVolumes), *wt(f).MaxItems, f)
	}
	for _, f := range []string{"labels", "annotations"} {
		require.Contains(t, rules(wt("metadata", f))[0], fmt.Sprintf("!k.startsWith('%s')", v1alpha1.ReservedMetadataPrefix), f)
		require.Equal(t, int64(v1alpha1.MaxWorkerMetadata), *wt("metadata", f).MaxProperties, f)
	}

	workers := at("spec", "workers")
	require.Equal(t, int64(1), num(workers.Minimum))
	require.Equal(t, int64(v1alpha1.MaxWorkers), num(workers.Maximum))
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultWorkers), def64(workers))
	chunk := at("spec", "chunkSize")
	require.Equal(t, int64(v1alpha1.MaxChunkSize), num(chunk.Maximum))
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultChunkSize), def64(chunk))
	require.Equal(t, "{}", def64(at("spec", "timeouts")), "the timeouts' own defaults apply when timeouts is not given")
	for field, want := range map[string]int64{
		"effectSeconds": v1alpha1.DefaultEffectSeconds, "querySeconds": v1alpha1.DefaultQuerySeconds,
		"lockSeconds": v1alpha1.DefaultLockSeconds, "networkSeconds": v1alpha1.DefaultNetworkSeconds,
	} {
		s := at("spec", "timeouts", field)
		require.Equal(t, fmt.Sprint(want), def64(s), field)
		if field == "networkSeconds" {
			require.Equal(t, int64(v1alpha1.MinNetworkSeconds), num(s.Minimum), field)
			require.Equal(t, int64(v1alpha1.MaxNetworkSeconds), num(s.Maximum), field)
			continue
		}
		require.Equal(t, int64(1), num(s.Minimum), field)
		require.Equal(t, int64(v1alpha1.MaxTimeoutSeconds), num(s.Maximum), field)
	}
	require.Equal(t, int64(1), num(at("spec", "activeDeadlineSeconds").Minimum))
	backoff := at("spec", "backoffLimit")
	require.Equal(t, int64(v1alpha1.MaxBackoffLimit), num(backoff.Maximum))
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultBackoffLimit), def64(backoff))
	nodeLost := at("spec", "nodeLostAfterSeconds")
	require.Equal(t, int64(0), num(nodeLost.Minimum))
	require.Equal(t, int64(v1alpha1.MaxNodeLostAfterSeconds), num(nodeLost.Maximum))
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultNodeLostAfterSeconds), def64(nodeLost))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultOnExisting), def64(at("spec", "onExisting")))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultOnPayloadChange), def64(at("spec", "onPayloadChange")))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultFromRunVerdict), def64(at("spec", "batch", "fromRun", "verdict")))
	require.Equal(t, int64(v1alpha1.MaxRunNameLength), *at("spec", "batch", "fromRun", "name").MaxLength)
	proc := func(f string) apiextensionsv1.JSONSchemaProps { return at("spec", "effect", "processor", f) }
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultProcessorPort), def64(proc("port")))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultProcessorPath), def64(proc("path")))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultProcessorTimeout.String()), def64(proc("timeout")))
	require.Contains(t, rules(proc("timeout")), fmt.Sprintf("duration(self) > duration('0s') && duration(self) <= duration('%s')", strings.TrimSuffix(v1alpha1.MaxProcessorTimeout.String(), "0s")))
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultMaxItemsPerCall), def64(proc("maxItemsPerCall")))
	require.Equal(t, int64(v1alpha1.MaxChunkSize), num(proc("maxItemsPerCall").Maximum))
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultMaxCallsInFlight), def64(proc("maxCallsInFlight")))
	require.Equal(t, int64(v1alpha1.MaxCallsInFlight), num(proc("maxCallsInFlight").Maximum))
	require.Equal(t, int64(v1alpha1.MaxImageLength), *proc("image").MaxLength)
	require.Equal(t, int64(v1alpha1.MaxWorkers-1), num(at("status", "shards", "[]", "index").Maximum), "a shard index is below spec.workers")
	maxConns := at("spec", "database", "maxConnections")
	require.Equal(t, int64(v1alpha1.MinMaxConnections), num(maxConns.Minimum), "one worker pod's connections")
	require.Equal(t, int64(v1alpha1.MaxMaxConnections), num(maxConns.Maximum))
	require.Contains(t, maxConns.Description, fmt.Sprintf("opens at most %d", v1alpha1.ConnectionsPerWorker))
	require.Contains(t, maxConns.Description, fmt.Sprintf("maxConnections / %d", v1alpha1.ConnectionsPerWorker))
	require.Equal(t, int64(v1alpha1.MinMaxConnections), num(at("status", "connections", "limit").Minimum))
	require.Contains(t, at("status", "connections", "parallelism").Description, fmt.Sprintf("limit / %d", v1alpha1.ConnectionsPerWorker))
	require.Contains(t, at("status", "active").Description, fmt.Sprintf("at most %d connections", v1alpha1.ConnectionsPerWorker))
	require.NotContains(t, rules(root), "self.spec.database == oldSelf.spec.database", "maxConnections may change")
	require.Contains(t, rules(root), "self.spec.database.secretRef == oldSelf.spec.database.secretRef")
	require.Equal(t, int64(v1alpha1.MaxWorkers), *at("status", "shards").MaxItems)
}

// TestSpecDefaults: a spec built in Go, without the CRD's defaults, reads
// the same defaults through the spec's methods as the CRD writes.
func TestSpecDefaults(t *testing.T) {
	var s v1alpha1.ProcessingRunSpec
	if s.ShardCount() != v1alpha1.DefaultWorkers || s.ChunkSizeOrDefault() != v1alpha1.DefaultChunkSize ||
		s.BackoffLimitOrDefault() != v1alpha1.DefaultBackoffLimit || s.NodeLostAfter() != v1alpha1.DefaultNodeLostAfterSeconds*time.Second {
		t.Fatalf("defaults of an empty spec: %d %d %d %s", s.ShardCount(), s.ChunkSizeOrDefault(), s.BackoffLimitOrDefault(), s.NodeLostAfter())
	}
	zero := int32(0)
	s = v1alpha1.ProcessingRunSpec{Workers: 4, ChunkSize: 10, BackoffLimit: &zero, NodeLostAfterSeconds: &zero}
	if s.ShardCount() != 4 || s.ChunkSizeOrDefault() != 10 || s.BackoffLimitOrDefault() != 0 || s.NodeLostAfter() != 0 {
		t.Fatalf("set values: %d %d %d %s", s.ShardCount(), s.ChunkSizeOrDefault(), s.BackoffLimitOrDefault(), s.NodeLostAfter())
	}
}

// TestConnectionBudgetOf: how a run's maxConnections and the manager's
// default and maximum combine, and the pods at once that follow.
func TestConnectionBudgetOf(t *testing.T) {
	t.Parallel()
	conns := func(n int32) *int32 { return &n }
	for _, tc := range []struct {
		name        string
		run         *int32
		settings    v1alpha1.ConnectionBudgetSettings
		workers     int32
		want        v1alpha1.ConnectionBudget
		parallelism int32
	}{
		{name: "no budget anywhere", workers: 256, parallelism: 256},
		{name: "the run's", run: conns(64), workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 64, Source: v1alpha1.BudgetFromRun}, parallelism: 32},
		{name: "an odd budget rounds down", run: conns(65), workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 65, Source: v1alpha1.BudgetFromRun}, parallelism: 32},
		{name: "the least budget: one pod", run: conns(2), workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 2, Source: v1alpha1.BudgetFromRun}, parallelism: 1},
		{name: "more than the shards need", run: conns(600), workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 600, Source: v1alpha1.BudgetFromRun}, parallelism: 256},
		{name: "the manager's default for a run without", settings: v1alpha1.ConnectionBudgetSettings{Default: 40}, workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 40, Source: v1alpha1.BudgetFromManagerDefault}, parallelism: 20},
		{name: "the run's beats the default, up or down", run: conns(100), settings: v1alpha1.ConnectionBudgetSettings{Default: 40}, workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 100, Source: v1alpha1.BudgetFromRun}, parallelism: 50},
		{name: "the maximum caps the run's", run: conns(100), settings: v1alpha1.ConnectionBudgetSettings{Default: 40, Maximum: 64}, workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 64, Source: v1alpha1.BudgetFromManagerMaximum}, parallelism: 32},
		{name: "a run's below the maximum stays", run: conns(10), settings: v1alpha1.ConnectionBudgetSettings{Maximum: 64}, workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 10, Source: v1alpha1.BudgetFromRun}, parallelism: 5},
		{name: "the maximum alone applies to a run without", settings: v1alpha1.ConnectionBudgetSettings{Maximum: 64}, workers: 256,
			want: v1alpha1.ConnectionBudget{Limit: 64, Source: v1alpha1.BudgetFromManagerMaximum}, parallelism: 32},
		{name: "the default below the maximum", settings: v1alpha1.ConnectionBudgetSettings{Default: 16, Maximum: 64}, workers: 4,
			want: v1alpha1.ConnectionBudget{Limit: 16, Source: v1alpha1.BudgetFromManagerDefault}, parallelism: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &v1alpha1.ProcessingRunSpec{Workers: tc.workers}
			spec.Database.MaxConnections = tc.run
			b := v1alpha1.ConnectionBudgetOf(spec, tc.settings)
			require.Equal(t, tc.want, b)
			require.Equal(t, tc.parallelism, b.Parallelism(spec.ShardCount()))
			if b.Limit > 0 {
				require.LessOrEqual(t, v1alpha1.MaxConnectionsOf(b.Parallelism(spec.ShardCount())), b.Limit, "the formula stays within the budget")
			}
		})
	}
}

func TestConnectionBudgetSettingsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    v1alpha1.ConnectionBudgetSettings
		want string
	}{
		{s: v1alpha1.ConnectionBudgetSettings{}},
		{s: v1alpha1.ConnectionBudgetSettings{Default: 2, Maximum: 512}},
		{s: v1alpha1.ConnectionBudgetSettings{Default: 64, Maximum: 64}},
		{s: v1alpha1.ConnectionBudgetSettings{Default: 1}, want: "--run-max-connections-default 1: want 0 (none) or 2 to 262143 connections"},
		{s: v1alpha1.ConnectionBudgetSettings{Maximum: -4}, want: "--run-max-connections-maximum -4"},
		{s: v1alpha1.ConnectionBudgetSettings{Default: 100, Maximum: 64}, want: "--run-max-connections-default 100 is above --run-max-connections-maximum 64"},
	} {
		err := tc.s.Validate()
		if tc.want == "" {
			require.NoError(t, err, "%+v", tc.s)
			continue
		}
		require.ErrorContains(t, err, tc.want)
	}
}

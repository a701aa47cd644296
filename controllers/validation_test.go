package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// The CRD's own validation (OpenAPI markers and CEL rules, no webhook),
// exercised on the real apiserver with manifests as users write them.

const validSpec = `
database:
  secretRef: {name: ledger-db, key: dsn}
batch:
  items:
  - {entity: acct-1, occurrence: "2026-01", payload: {amount: 12.5}}
  - {entity: acct-2, occurrence: "2026-01"}
`

// manifest builds a ProcessingRun from a spec in YAML.
func manifest(t *testing.T, ns, name, spec string) *unstructured.Unstructured {
	t.Helper()
	var s map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(spec), &s))
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "ProcessingRun",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       s,
	}}
	return u
}

// withSpec replaces (or, with a nil value, removes) top-level spec fields of
// validSpec.
func withSpec(t *testing.T, changes map[string]string) string {
	t.Helper()
	var s map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(validSpec), &s))
	for k, v := range changes {
		if v == "" {
			delete(s, k)
			continue
		}
		var val any
		require.NoError(t, yaml.Unmarshal([]byte(v), &val))
		s[k] = val
	}
	b, err := yaml.Marshal(s)
	require.NoError(t, err)
	return string(b)
}

func TestValidationRejectsBadRuns(t *testing.T) {
	t.Parallel()
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	tests := []struct {
		name    string
		run     string // spec YAML
		runName string
		want    string
	}{
		{name: "no source", run: withSpec(t, map[string]string{"batch": "{}"}),
			want: "batch has no source: set exactly one of batch.items, batch.configMapRef, batch.query, batch.fromRun or batch.object"},
		{name: "two sources", run: withSpec(t, map[string]string{"batch": `{items: [{entity: a, occurrence: "1"}], query: "select 1"}`}),
			want: "batch has more than one source: keep exactly one of batch.items, batch.configMapRef, batch.query, batch.fromRun or batch.object"},
		{name: "an object and a query", run: withSpec(t, map[string]string{"batch": `{object: {bucket: exports, key: a.csv, format: CSV}, query: "select 1"}`}),
			want: "batch has more than one source"},
		{name: "an object with a key and a prefix", run: withSpec(t, map[string]string{"batch": `{object: {bucket: exports, key: a.csv, prefix: june/, format: CSV}}`}),
			want: "set exactly one of object.key (one object) or object.prefix (every object under it)"},
		{name: "an object with neither key nor prefix", run: withSpec(t, map[string]string{"batch": `{object: {bucket: exports, format: CSV}}`}),
			want: "set exactly one of object.key (one object) or object.prefix (every object under it)"},
		{name: "an object without a format", run: withSpec(t, map[string]string{"batch": `{object: {bucket: exports, key: a.csv}}`}),
			want: "spec.batch.object.format: Required value"},
		{name: "an object of an unknown format", run: withSpec(t, map[string]string{"batch": `{object: {bucket: exports, key: a.csv, format: Parquet}}`}),
			want: `spec.batch.object.format: Unsupported value: "Parquet": supported values: "JSONLines", "CSV"`},
		{name: "a CSV delimiter for JSON Lines", run: withSpec(t, map[string]string{"batch": `{object: {bucket: exports, key: a.jsonl, format: JSONLines, csvDelimiter: ";"}}`}),
			want: "csvDelimiter applies to format CSV only"},
		{name: "an object endpoint with a path", run: withSpec(t, map[string]string{"batch": `{object: {endpoint: "https://minio:9000/exports", bucket: exports, key: a.csv, format: CSV}}`}),
			want: "spec.batch.object.endpoint: Invalid value"},
		{name: "an object endpoint with credentials in it", run: withSpec(t, map[string]string{"batch": `{object: {endpoint: "https://user:pw@minio:9000", bucket: exports, key: a.csv, format: CSV}}`}),
			want: "spec.batch.object.endpoint: Invalid value"},
		{name: "fromRun and a query", run: withSpec(t, map[string]string{"batch": `{fromRun: {name: june}, query: "select 1"}`}),
			want: "batch has more than one source"},
		{name: "fromRun of itself", run: withSpec(t, map[string]string{"batch": `{fromRun: {name: self-retry}}`}), runName: "self-retry",
			want: "batch.fromRun names this run itself: a retry is another run"},
		{name: "fromRun of no name", run: withSpec(t, map[string]string{"batch": `{fromRun: {name: ""}}`}),
			want: "spec.batch.fromRun.name"},
		{name: "fromRun of a bad name", run: withSpec(t, map[string]string{"batch": `{fromRun: {name: "June_1"}}`}),
			want: "spec.batch.fromRun.name"},
		{name: "fromRun verdict unknown", run: withSpec(t, map[string]string{"batch": `{fromRun: {name: june, verdict: Completed}}`}),
			want: `spec.batch.fromRun.verdict: Unsupported value: "Completed": supported values: "Failed"`},
		{name: "three sources", run: withSpec(t, map[string]string{"batch": `{items: [{entity: a, occurrence: "1"}], query: "select 1", configMapRef: {name: b, key: k}}`}),
			want: "batch has more than one source"},
		{name: "empty items", run: withSpec(t, map[string]string{"batch": "{items: []}"}),
			want: "spec.batch.items: Invalid value"},
		{name: "empty entity", run: withSpec(t, map[string]string{"batch": `{items: [{entity: "", occurrence: "1"}]}`}),
			want: "spec.batch.items[0].entity"},
		{name: "missing occurrence", run: withSpec(t, map[string]string{"batch": `{items: [{entity: a}]}`}),
			want: `spec.batch.items[0].occurrence: Required value`},
		{name: "empty query", run: withSpec(t, map[string]string{"batch": `{query: ""}`}),
			want: "spec.batch.query"},
		{name: "configMapRef without key", run: withSpec(t, map[string]string{"batch": `{configMapRef: {name: b}}`}),
			want: "spec.batch.configMapRef.key: Required value"},
		{name: "no database", run: withSpec(t, map[string]string{"database": ""}),
			want: "spec.database: Required value"},
		{name: "secret key with a slash", run: withSpec(t, map[string]string{"database": `{secretRef: {name: db, key: "a/b"}}`}),
			want: "spec.database.secretRef.key"},
		{name: "maxConnections below one worker pod's", run: withSpec(t, map[string]string{"database": `{secretRef: {name: db, key: dsn}, maxConnections: 1}`}),
			want: "spec.database.maxConnections: Invalid value: 1: spec.database.maxConnections in body should be greater than or equal to 2"},
		{name: "maxConnections 0", run: withSpec(t, map[string]string{"database": `{secretRef: {name: db, key: dsn}, maxConnections: 0}`}),
			want: "spec.database.maxConnections in body should be greater than or equal to 2"},
		{name: "maxConnections beyond PostgreSQL's", run: withSpec(t, map[string]string{"database": `{secretRef: {name: db, key: dsn}, maxConnections: 262144}`}),
			want: "spec.database.maxConnections in body should be less than or equal to 262143"},
		{name: "workers 0", run: withSpec(t, map[string]string{"workers": "0"}),
			want: "spec.workers: Invalid value: 0: spec.workers in body should be greater than or equal to 1"},
		{name: "workers 1000", run: withSpec(t, map[string]string{"workers": "1000"}),
			want: "spec.workers: Invalid value: 1000: spec.workers in body should be less than or equal to 256"},
		{name: "chunkSize 0", run: withSpec(t, map[string]string{"chunkSize": "0"}),
			want: "spec.chunkSize: Invalid value: 0"},
		{name: "negative backoffLimit", run: withSpec(t, map[string]string{"backoffLimit": "-1"}),
			want: "spec.backoffLimit: Invalid value: -1"},
		{name: "negative maxFailedItems", run: withSpec(t, map[string]string{"maxFailedItems": "-5"}),
			want: "spec.maxFailedItems: Invalid value: -5"},
		{name: "unknown onExisting", run: withSpec(t, map[string]string{"onExisting": "Overwrite"}),
			want: `spec.onExisting: Unsupported value: "Overwrite": supported values: "Skip", "Supersede"`},
		{name: "unknown onPayloadChange", run: withSpec(t, map[string]string{"onPayloadChange": "Ignore"}),
			want: `spec.onPayloadChange: Unsupported value: "Ignore": supported values: "Report", "Fail"`},
		{name: "empty effect", run: withSpec(t, map[string]string{"effect": `{sql: ""}`}),
			want: "spec.effect.sql"},
		{name: "negative ttl", run: withSpec(t, map[string]string{"ttlSecondsAfterFinished": "-1"}),
			want: "spec.ttlSecondsAfterFinished: Invalid value: -1"},
		{name: "name too long for a label", run: validSpec, runName: strings.Repeat("a", 64),
			want: "metadata.name must be at most 63 characters: it is used as a label value on the worker pods"},
		{name: "no spec", run: "", want: "spec: Required value"},
		{name: "env overrides the DSN", run: withSpec(t, map[string]string{"workerTemplate": `{env: [{name: RUNLEDGER_DATABASE_URL, value: "postgres://x@y/z"}]}`}),
			want: "env names starting with RUNLEDGER_, and POD_NAME, are set by runledger and cannot be overridden"},
		{name: "env overrides POD_NAME", run: withSpec(t, map[string]string{"workerTemplate": `{env: [{name: POD_NAME, value: x}]}`}),
			want: "spec.workerTemplate.env: Invalid value"},
		{name: "label the controller owns", run: withSpec(t, map[string]string{"workerTemplate": `{metadata: {labels: {processing.runledger.dev/shard: "0"}}}`}),
			want: "labels processing.runledger.dev/* and app.kubernetes.io/name, component, instance and managed-by are set by the controller"},
		{name: "app label the controller owns", run: withSpec(t, map[string]string{"workerTemplate": `{metadata: {labels: {app.kubernetes.io/managed-by: me}}}`}),
			want: "spec.workerTemplate.metadata.labels: Invalid value"},
		{name: "annotation the controller owns", run: withSpec(t, map[string]string{"workerTemplate": `{metadata: {annotations: {processing.runledger.dev/counts-floor: "{}"}}}`}),
			want: "annotations processing.runledger.dev/* are set by the controller"},
		{name: "volume named tmp", run: withSpec(t, map[string]string{"workerTemplate": `{volumes: [{name: tmp, emptyDir: {}}]}`}),
			want: "the volume name tmp is runledger's own"},
		{name: "volume named runledger-run", run: withSpec(t, map[string]string{"workerTemplate": `{volumes: [{name: runledger-run, emptyDir: {}}]}`}),
			want: "the volume names processor-tmp, runledger-token, runledger-batch and runledger-run are runledger's own"},
		{name: "volume named runledger-token", run: withSpec(t, map[string]string{"workerTemplate": `{volumes: [{name: runledger-token, emptyDir: {}}]}`}),
			want: "the volume names processor-tmp, runledger-token, runledger-batch and runledger-run are runledger's own"},
		{name: "mount over /tmp", run: withSpec(t, map[string]string{"workerTemplate": `{volumes: [{name: x, emptyDir: {}}], volumeMounts: [{name: x, mountPath: /tmp}]}`}),
			want: "/tmp and /dev/termination-log are runledger's own mount paths"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := tt.runName
			if name == "" {
				name = fmt.Sprintf("bad-%d", i)
			}
			u := manifest(t, ns, name, tt.run)
			if tt.run == "" {
				delete(u.Object, "spec")
			}
			err := env.Client.Create(ctx, u)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestValidationAcceptsWorkerTemplate: a template with every production
// field is accepted and read back whole.
func TestValidationAcceptsWorkerTemplate(t *testing.T) {
	t.Parallel()
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	u := manifest(t, ns, "template", withSpec(t, map[string]string{"workerTemplate": `
metadata: {labels: {team: billing, app.kubernetes.io/part-of: payments}, annotations: {sidecar.istio.io/inject: "false"}}
imagePullSecrets: [{name: regcred}]
env: [{name: PGSSLROOTCERT, value: /etc/pg-ca/ca.crt}, {name: PGSSLMODE, valueFrom: {configMapKeyRef: {name: pg, key: mode}}}]
envFrom: [{secretRef: {name: extra}}]
volumes: [{name: pg-ca, secret: {secretName: pg-ca}}]
volumeMounts: [{name: pg-ca, mountPath: /etc/pg-ca, readOnly: true}]
affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {processing.runledger.dev/run: template}}}}]}}
topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]
priorityClassName: batch-low
runtimeClassName: gvisor
nodeSelector: {pool: batch}
tolerations: [{key: batch, operator: Exists, effect: NoSchedule}]
`}))
	require.NoError(t, env.Client.Create(context.Background(), u))
	run := &v1alpha1.ProcessingRun{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKeyFromObject(u), run))
	tmpl := run.Spec.WorkerTemplate
	require.Equal(t, "billing", tmpl.Metadata.Labels["team"])
	require.Equal(t, "regcred", tmpl.ImagePullSecrets[0].Name)
	require.Len(t, tmpl.Env, 2)
	require.Equal(t, "extra", tmpl.EnvFrom[0].SecretRef.Name)
	require.Equal(t, "pg-ca", tmpl.Volumes[0].Secret.SecretName)
	require.Equal(t, "/etc/pg-ca", tmpl.VolumeMounts[0].MountPath)
	require.NotNil(t, tmpl.Affinity.PodAntiAffinity)
	require.Len(t, tmpl.TopologySpreadConstraints, 1)
	require.Equal(t, "batch-low", tmpl.PriorityClassName)
	require.Equal(t, "gvisor", *tmpl.RuntimeClassName)
}

func TestValidationDefaults(t *testing.T) {
	t.Parallel()
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	u := manifest(t, ns, "defaults", validSpec)
	require.NoError(t, env.Client.Create(context.Background(), u))
	run := &v1alpha1.ProcessingRun{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKeyFromObject(u), run))
	require.Equal(t, v1alpha1.OnExistingSkip, run.Spec.OnExisting)
	require.Equal(t, v1alpha1.OnPayloadChangeReport, run.Spec.OnPayloadChange)
	require.Equal(t, int32(1), run.Spec.Workers)
	require.Equal(t, int32(1000), run.Spec.ChunkSize)
	require.Equal(t, int32(3), *run.Spec.BackoffLimit)
	require.Equal(t, int64(0), run.Spec.MaxFailedItems)
	require.JSONEq(t, `{"amount": 12.5}`, string(run.Spec.Batch.Items[0].Payload.Raw), "payload kept as is")

	retry := manifest(t, ns, "retry-defaults", withSpec(t, map[string]string{"batch": `{fromRun: {name: june}}`}))
	require.NoError(t, env.Client.Create(context.Background(), retry))
	got := &v1alpha1.ProcessingRun{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKeyFromObject(retry), got))
	require.Equal(t, &v1alpha1.FromRunSource{Name: "june", Verdict: v1alpha1.FromRunFailed}, got.Spec.Batch.FromRun)
}

func TestValidationImmutability(t *testing.T) {
	t.Parallel()
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	base := withSpec(t, map[string]string{"effect": `{sql: "insert into t select entity from claimed"}`, "workers": "2"})
	tests := []struct {
		name string
		// base, when set, is the run's database at creation.
		base   string
		change map[string]string
		want   string // empty: allowed
	}{
		{name: "batch", change: map[string]string{"batch": `{query: "select 1"}`},
			want: "batch is immutable: create a new ProcessingRun to process a different batch"},
		{name: "batch to fromRun", change: map[string]string{"batch": `{fromRun: {name: june}}`},
			want: "batch is immutable"},
		{name: "one more item", change: map[string]string{"batch": `{items: [{entity: acct-1, occurrence: "2026-01"}, {entity: acct-2, occurrence: "2026-01"}, {entity: acct-3, occurrence: "2026-01"}]}`},
			want: "batch is immutable"},
		{name: "workers", change: map[string]string{"workers": "3"},
			want: "workers is immutable: the number of shards decides which shard owns each item"},
		{name: "database", change: map[string]string{"database": `{secretRef: {name: other-db, key: dsn}}`},
			want: "database.secretRef is immutable: a run's ledger cannot change"},
		{name: "database's secret key", change: map[string]string{"database": `{secretRef: {name: ledger-db, key: other}, maxConnections: 8}`},
			want: "database.secretRef is immutable"},
		{name: "maxConnections set", change: map[string]string{"database": `{secretRef: {name: ledger-db, key: dsn}, maxConnections: 8}`}},
		{name: "maxConnections removed", base: `{secretRef: {name: ledger-db, key: dsn}, maxConnections: 8}`,
			change: map[string]string{"database": `{secretRef: {name: ledger-db, key: dsn}}`}},
		{name: "maxConnections lowered", base: `{secretRef: {name: ledger-db, key: dsn}, maxConnections: 64}`,
			change: map[string]string{"database": `{secretRef: {name: ledger-db, key: dsn}, maxConnections: 4}`}},
		{name: "maxConnections out of bounds on update", change: map[string]string{"database": `{secretRef: {name: ledger-db, key: dsn}, maxConnections: 1}`},
			want: "spec.database.maxConnections in body should be greater than or equal to 2"},
		{name: "effect", change: map[string]string{"effect": `{sql: "delete from t"}`},
			want: "effect is immutable: create a new ProcessingRun to apply a different effect"},
		{name: "effect removed", change: map[string]string{"effect": ""},
			want: "effect cannot be added or removed after creation"},
		{name: "onExisting", change: map[string]string{"onExisting": "Supersede"},
			want: "onExisting is immutable"},
		{name: "onPayloadChange", change: map[string]string{"onPayloadChange": "Fail"},
			want: "onPayloadChange is immutable: create a new ProcessingRun to change it"},
		{name: "occurrence added", change: map[string]string{"occurrence": "2026-02"},
			want: "occurrence is immutable"},
		{name: "suspend", change: map[string]string{"suspend": "true"}},
		{name: "ttl", change: map[string]string{"ttlSecondsAfterFinished": "60"}},
		{name: "backoffLimit", change: map[string]string{"backoffLimit": "5"}},
		{name: "workerTemplate", change: map[string]string{"workerTemplate": `{image: "runledger:v2"}`}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("immutable-%d", i)
			spec := base
			if tt.base != "" {
				spec = withSpec(t, map[string]string{"effect": `{sql: "insert into t select entity from claimed"}`, "workers": "2", "database": tt.base})
			}
			require.NoError(t, env.Client.Create(ctx, manifest(t, ns, name, spec)))
			changed := manifest(t, ns, name, base)
			cur := &unstructured.Unstructured{}
			cur.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("ProcessingRun"))
			require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(changed), cur))
			s := cur.Object["spec"].(map[string]any)
			for k, v := range tt.change {
				if v == "" {
					delete(s, k)
					continue
				}
				var val any
				require.NoError(t, yaml.Unmarshal([]byte(v), &val))
				s[k] = val
			}
			err := env.Client.Update(ctx, cur)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

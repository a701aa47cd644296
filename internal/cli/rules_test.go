package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/worker"
)

// ruleCase is one manifest given both to the apiserver and to runledger run.
type ruleCase struct {
	name   string
	runFor string            // metadata.name; "" for a name derived from the row
	spec   map[string]string // top-level spec fields replaced (YAML), "" removes one
	meta   string            // extra metadata fields (YAML flow mapping body)
	accept bool
	want   string // in runledger run's error when rejected: the field path
}

const ruleBaseSpec = `
database: {secretRef: {name: ledger-db, key: dsn}}
batch: {items: [{entity: acct-1, occurrence: "2026-01", payload: {amount: 12.5}}]}
`

func (c ruleCase) manifest(t *testing.T, ns string, i int) map[string]any {
	t.Helper()
	var spec map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(ruleBaseSpec), &spec))
	for k, v := range c.spec {
		if v == "" {
			delete(spec, k)
			continue
		}
		var val any
		require.NoError(t, yaml.Unmarshal([]byte(v), &val), "row %q, spec.%s", c.name, k)
		spec[k] = val
	}
	meta := map[string]any{}
	if c.meta != "" {
		require.NoError(t, yaml.Unmarshal([]byte("{"+c.meta+"}"), &meta))
	}
	meta["name"], meta["namespace"] = c.runFor, ns
	if c.runFor == "" {
		meta["name"] = fmt.Sprintf("rule-%d", i)
	}
	return map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "ProcessingRun",
		"metadata":   meta,
		"spec":       spec,
	}
}

func keyPart(s string) string { return fmt.Sprintf(`{items: [{entity: %q, occurrence: "1"}]}`, s) }

var ruleCases = []ruleCase{
	{name: "inline items", accept: true},
	{name: "query", spec: map[string]string{"batch": `{query: "SELECT 'a' AS entity, 'b' AS occurrence"}`}, accept: true},
	{name: "configMapRef", spec: map[string]string{"batch": `{configMapRef: {name: june, key: items.jsonl}}`}, accept: true},
	{name: "every field at its bound", spec: map[string]string{"workers": "256", "chunkSize": "50000", "backoffLimit": "100",
		"onExisting": "Supersede", "onPayloadChange": "Fail", "maxFailedItems": "7", "ttlSecondsAfterFinished": "0", "effect": `{sql: "UPDATE t SET n = n + 1"}`}, accept: true},
	{name: "processor with defaults", spec: map[string]string{"effect": `{processor: {image: "registry.example/mailer:1"}}`}, accept: true},
	{name: "processor with every field", spec: map[string]string{"effect": `{processor: {image: "registry.example/mailer:1", command: [/mailer], args: [-v],
		env: [{name: SMTP_HOST, value: smtp}], resources: {limits: {memory: 64Mi}}, port: 65535, path: /v1/items, timeout: 10m, maxItemsPerCall: 50000, maxCallsInFlight: 64}}`}, accept: true},
	{name: "name of 63 characters", runFor: strings.Repeat("r", 63), accept: true},
	{name: "name with dots", runFor: "june.invoices", accept: true},
	{name: "key part of 1024 ASCII bytes", spec: map[string]string{"batch": keyPart(strings.Repeat("e", 1024))}, accept: true},
	{name: "key part of 341 three-byte characters", spec: map[string]string{"batch": keyPart(strings.Repeat("€", 341))}, accept: true},
	{name: "query of the longest length", spec: map[string]string{"batch": `{query: "SELECT 'a' AS entity, 'b' AS occurrence` + strings.Repeat(" ", 65536-39) + `"}`}, accept: true},
	{name: "query ending in a semicolon", spec: map[string]string{"batch": `{query: "SELECT 'a' AS entity, 'b' AS occurrence;"}`}, accept: true},

	{name: "key part of 1025 ASCII bytes", spec: map[string]string{"batch": keyPart(strings.Repeat("e", 1025))}, want: "spec.batch.items[0].entity"},
	{name: "key part of 342 three-byte characters", spec: map[string]string{"batch": keyPart(strings.Repeat("€", 342))}, want: "spec.batch.items[0].entity"},
	{name: "empty entity", spec: map[string]string{"batch": keyPart("")}, want: "spec.batch.items[0].entity"},
	{name: "blank entity", spec: map[string]string{"batch": keyPart(" \t")}, want: "spec.batch.items[0].entity"},
	{name: "entity with a NUL", spec: map[string]string{"batch": keyPart("a\x00b")}, want: "spec.batch.items[0].entity"},
	{name: "blank occurrence", spec: map[string]string{"batch": `{items: [{entity: a, occurrence: " "}]}`}, want: "spec.batch.items[0].occurrence"},
	{name: "missing occurrence", spec: map[string]string{"batch": `{items: [{entity: a}]}`}, want: "spec.batch.items[0].occurrence"},
	{name: "no items", spec: map[string]string{"batch": `{items: []}`}, want: "spec.batch.items"},
	{name: "too many inline items", spec: map[string]string{"batch": `{items: [` + strings.Repeat(`{entity: a, occurrence: b},`, 10001) + `]}`}, want: "spec.batch.items"},
	{name: "no source", spec: map[string]string{"batch": `{}`}, want: "spec.batch"},
	{name: "two sources", spec: map[string]string{"batch": `{items: [{entity: a, occurrence: b}], query: "SELECT 1"}`}, want: "spec.batch"},
	{name: "query too long", spec: map[string]string{"batch": `{query: "SELECT 'a' AS entity, 'b' AS occurrence` + strings.Repeat(" ", 65536-38) + `"}`}, want: "spec.batch.query"},
	{name: "blank query", spec: map[string]string{"batch": `{query: " ; "}`}, want: "spec.batch.query"},
	{name: "effect too long", spec: map[string]string{"effect": `{sql: "SELECT 1` + strings.Repeat(" ", 65536-7) + `"}`}, want: "spec.effect.sql"},
	{name: "blank effect", spec: map[string]string{"effect": `{sql: " "}`}, want: "spec.effect.sql"},
	{name: "effect with sql and processor", spec: map[string]string{"effect": `{sql: "SELECT 1", processor: {image: a}}`}, want: "effect needs exactly one of effect.sql and effect.processor"},
	{name: "effect with neither", spec: map[string]string{"effect": `{}`}, want: "effect needs exactly one of effect.sql and effect.processor"},
	{name: "processor without an image", spec: map[string]string{"effect": `{processor: {port: 9000}}`}, want: "spec.effect.processor.image"},
	{name: "processor port 0", spec: map[string]string{"effect": `{processor: {image: a, port: 0}}`}, want: "spec.effect.processor.port"},
	{name: "processor port 65536", spec: map[string]string{"effect": `{processor: {image: a, port: 65536}}`}, want: "spec.effect.processor.port"},
	{name: "processor path without a slash", spec: map[string]string{"effect": `{processor: {image: a, path: process}}`}, want: "spec.effect.processor.path"},
	{name: "processor timeout 0s", spec: map[string]string{"effect": `{processor: {image: a, timeout: 0s}}`}, want: "spec.effect.processor.timeout"},
	{name: "processor timeout 11m", spec: map[string]string{"effect": `{processor: {image: a, timeout: 11m}}`}, want: "spec.effect.processor.timeout"},
	{name: "processor maxItemsPerCall 0", spec: map[string]string{"effect": `{processor: {image: a, maxItemsPerCall: 0}}`}, want: "spec.effect.processor.maxItemsPerCall"},
	{name: "processor maxCallsInFlight 0", spec: map[string]string{"effect": `{processor: {image: a, maxCallsInFlight: 0}}`}, want: "spec.effect.processor.maxCallsInFlight"},
	{name: "processor maxCallsInFlight 65", spec: map[string]string{"effect": `{processor: {image: a, maxCallsInFlight: 65}}`}, want: "spec.effect.processor.maxCallsInFlight"},
	{name: "secret key with a slash", spec: map[string]string{"database": `{secretRef: {name: db, key: "a/b"}}`}, want: "spec.database.secretRef.key"},
	{name: "secret without a name", spec: map[string]string{"database": `{secretRef: {name: "", key: dsn}}`}, want: "spec.database.secretRef.name"},
	{name: "no database", spec: map[string]string{"database": ""}, want: "spec.database"},
	{name: "maxConnections 1", spec: map[string]string{"database": `{secretRef: {name: db, key: dsn}, maxConnections: 1}`}, want: "spec.database.maxConnections"},
	{name: "configMap key with a space", spec: map[string]string{"batch": `{configMapRef: {name: june, key: "items jsonl"}}`}, want: "spec.batch.configMapRef.key"},
	{name: "workers 0", spec: map[string]string{"workers": "0"}, want: "spec.workers"},
	{name: "workers 257", spec: map[string]string{"workers": "257"}, want: "spec.workers"},
	{name: "chunkSize 50001", spec: map[string]string{"chunkSize": "50001"}, want: "spec.chunkSize"},
	{name: "backoffLimit 101", spec: map[string]string{"backoffLimit": "101"}, want: "spec.backoffLimit"},
	{name: "negative maxFailedItems", spec: map[string]string{"maxFailedItems": "-1"}, want: "spec.maxFailedItems"},
	{name: "negative ttl", spec: map[string]string{"ttlSecondsAfterFinished": "-1"}, want: "spec.ttlSecondsAfterFinished"},
	{name: "unknown onExisting", spec: map[string]string{"onExisting": "Overwrite"}, want: "spec.onExisting"},
	{name: "unknown onPayloadChange", spec: map[string]string{"onPayloadChange": "Ignore"}, want: "spec.onPayloadChange"},
	{name: "image too long", spec: map[string]string{"workerTemplate": `{image: "` + strings.Repeat("i", 1025) + `"}`}, want: "spec.workerTemplate.image"},
	{name: "unknown field", spec: map[string]string{"wrokers": "2"}, want: `unknown field "spec.wrokers"`},
	{name: "unknown metadata field", meta: `labelz: {a: b}`, want: `unknown field "metadata.labelz"`},
	{name: "wrong type", spec: map[string]string{"workers": "four"}, want: "spec.workers"},
	{name: "name of 64 characters", runFor: strings.Repeat("r", 64), want: "metadata.name"},
	{name: "name not a DNS subdomain", runFor: "June_Invoices", want: "metadata.name"},
	{name: "bad label value", meta: `labels: {team: "a b"}`, want: "metadata.labels"},
}

// TestManifestRulesAgreeWithTheAPIServer feeds the same manifests to the
// real apiserver (creating the run) and to runledger run's validation: a
// manifest one accepts, the other accepts, with the same defaults.
func TestManifestRulesAgreeWithTheAPIServer(t *testing.T) {
	t.Parallel()
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	for i, c := range ruleCases {
		t.Run(c.name, func(t *testing.T) {
			obj := c.manifest(t, ns, i)
			u := &unstructured.Unstructured{Object: obj}
			apiErr := env.Client.Create(ctx, u.DeepCopy(), client.FieldValidation("Strict"))

			doc, err := yaml.Marshal(obj)
			require.NoError(t, err)
			path := filepath.Join(t.TempDir(), "run.yaml")
			require.NoError(t, os.WriteFile(path, doc, 0o600))
			run, localErr := validateLocally(ctx, path)

			require.Equal(t, apiErr == nil, localErr == nil, "apiserver and runledger run disagree:\napiserver: %v\nrunledger run: %v", apiErr, localErr)
			if c.accept {
				require.NoError(t, apiErr)
				stored := &v1alpha1.ProcessingRun{}
				require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(u), stored))
				require.Equal(t, stored.Spec, run.Spec, "runledger run applies the CRD's defaults")
				return
			}
			require.Error(t, apiErr, "the apiserver accepts it")
			require.ErrorContains(t, localErr, c.want, "runledger run names the field")
		})
	}
}

// validateLocally is what runledger run does with a manifest before it
// connects to the database.
func validateLocally(ctx context.Context, path string) (*v1alpha1.ProcessingRun, error) {
	m, err := readManifest(path, nil)
	if err != nil {
		return nil, err
	}
	jsonl := func(context.Context, v1alpha1.ConfigMapKeyRef) ([]byte, string, error) {
		return []byte(`{"entity": "a", "occurrence": "b"}`), "items.jsonl", nil
	}
	if _, err := worker.NewPlan(ctx, m.run, jsonl, worker.Limits{}); err != nil {
		return nil, err
	}
	return m.run, nil
}

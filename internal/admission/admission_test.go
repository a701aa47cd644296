package admission_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/internal/admission"
)

func decode(t *testing.T, doc string) map[string]any {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(doc))
	require.NoError(t, err)
	u := &unstructured.Unstructured{}
	require.NoError(t, u.UnmarshalJSON(j))
	return u.Object
}

const head = `apiVersion: processing.runledger.dev/v1alpha1
kind: ProcessingRun
`

func TestCreate(t *testing.T) {
	t.Parallel()
	v, err := admission.ProcessingRun()
	require.NoError(t, err)
	tests := []struct {
		name string
		doc  string
		want string // the whole error, "" when valid
		spec string // the spec after defaulting, when valid
	}{
		{name: "defaults", doc: `
metadata: {name: june, namespace: billing}
spec: {database: {secretRef: {name: db, key: dsn}}, batch: {query: "SELECT 1"}}`,
			spec: `{backoffLimit: 3, batch: {query: "SELECT 1"}, chunkSize: 1000, database: {secretRef: {key: dsn, name: db}}, maxFailedItems: 0, nodeLostAfterSeconds: 60, onExisting: Skip, onPayloadChange: Report,
				timeouts: {effectSeconds: 300, lockSeconds: 60, networkSeconds: 30, querySeconds: 3600}, workers: 1}`},
		{name: "explicit values kept, nulls dropped", doc: `
metadata: {name: june, namespace: billing}
spec: {database: {secretRef: {name: db, key: dsn}}, batch: {query: "SELECT 1"}, workers: 4, backoffLimit: 0, effect: null}`,
			spec: `{backoffLimit: 0, batch: {query: "SELECT 1"}, chunkSize: 1000, database: {secretRef: {key: dsn, name: db}}, maxFailedItems: 0, nodeLostAfterSeconds: 60, onExisting: Skip, onPayloadChange: Report,
				timeouts: {effectSeconds: 300, lockSeconds: 60, networkSeconds: 30, querySeconds: 3600}, workers: 4}`},
		{name: "what kubectl get prints", doc: `
metadata:
  name: june
  namespace: billing
  uid: 0f6b2c1e-0000-4000-8000-000000000001
  resourceVersion: "1234"
  generation: 2
  creationTimestamp: "2026-06-01T10:00:00Z"
  managedFields:
  - {apiVersion: processing.runledger.dev/v1alpha1, fieldsType: FieldsV1, fieldsV1: {f:spec: {}}, manager: kubectl, operation: Update, time: "2026-06-01T10:00:00Z"}
spec: {database: {secretRef: {name: db, key: dsn}}, batch: {query: "SELECT 1"}, workers: 2}
status: {phase: Running, shards: [{index: 999}]}`,
			spec: `{backoffLimit: 3, batch: {query: "SELECT 1"}, chunkSize: 1000, database: {secretRef: {key: dsn, name: db}}, maxFailedItems: 0, nodeLostAfterSeconds: 60, onExisting: Skip, onPayloadChange: Report,
				timeouts: {effectSeconds: 300, lockSeconds: 60, networkSeconds: 30, querySeconds: 3600}, workers: 2}`},
		{name: "unknown fields", doc: `
metadata: {name: june, namespace: billing, labelz: {}}
spec: {database: {secretRef: {name: db, key: dsn}}, batch: {query: "SELECT 1", qurey: x}}`,
			want: "2 problems:\n  unknown field \"metadata.labelz\"\n  unknown field \"spec.batch.qurey\""},
		{name: "every problem listed", doc: `
metadata: {name: june, namespace: billing}
spec: {database: {secretRef: {name: db, key: "a b"}}, batch: {items: [{entity: " ", occurrence: "1"}]}, workers: 0}`,
			want: "3 problems:\n" +
				`  spec.database.secretRef.key: Invalid value: "a b": spec.database.secretRef.key in body should match '^[-._a-zA-Z0-9]+$'` + "\n" +
				`  spec.workers: Invalid value: 0: spec.workers in body should be greater than or equal to 1` + "\n" +
				`  spec.batch.items[0].entity: Invalid value: " ": must not be only white space`},
		{name: "a rule on the whole object", doc: `
metadata: {name: a234567890123456789012345678901234567890123456789012345678901234, namespace: billing}
spec: {database: {secretRef: {name: db, key: dsn}}, batch: {query: "SELECT 1"}}`,
			want: "metadata.name must be at most 63 characters: it is used as a label value on the worker pods"},
		{name: "no namespace", doc: `
metadata: {name: june}
spec: {database: {secretRef: {name: db, key: dsn}}, batch: {query: "SELECT 1"}}`,
			want: "2 problems:\n  metadata.namespace: Required value\n" +
				"  some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := decode(t, head+tt.doc)
			err := v.Create(context.Background(), obj)
			if tt.want != "" {
				require.EqualError(t, err, tt.want)
				return
			}
			require.NoError(t, err)
			require.NotContains(t, obj, "status", "the status subresource's owner writes status")
			got, err := json.Marshal(obj["spec"])
			require.NoError(t, err)
			want, err := yaml.YAMLToJSON([]byte(tt.spec))
			require.NoError(t, err)
			require.JSONEq(t, string(want), string(got))
		})
	}
}

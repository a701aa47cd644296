package samples_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

func TestMain(m *testing.M) { envtestutil.Main(m) }

// TestDemoManifests: every manifest of the demo's story (config/samples/demo,
// which hack/demo/story.sh applies) and of the README's examples
// (config/samples/billing, which test/e2e's TestReadmeExamples applies)
// decodes strictly into the API's types (no field the API would drop) and is
// accepted by the API server with the CRDs' schemas and validation rules (a
// server-side dry run), so that a manifest the story or a reader applies
// does not fail on a typo.
func TestDemoManifests(t *testing.T) {
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for dir, namespace := range map[string]string{"demo": "runledger-demo", "billing": "billing"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		require.NoError(t, err)
		require.NotEmpty(t, files, dir)
		requireManifestsAccepted(ctx, t, env, ns, namespace, files)
	}
}

// requireManifestsAccepted: each of files, all in namespace, decodes
// strictly and is accepted by the API server in ns (a dry run).
func requireManifestsAccepted(ctx context.Context, t *testing.T, env *envtestutil.Env, ns, namespace string, files []string) {
	t.Helper()
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
			var u unstructured.Unstructured
			require.NoError(t, yaml.Unmarshal(doc, &u.Object), "%s, document %d", f, i)
			var typed any
			switch u.GetKind() {
			case "ProcessingRun":
				typed = &v1alpha1.ProcessingRun{}
			case "ProcessingSchedule":
				typed = &v1alpha1.ProcessingSchedule{}
			case "NetworkPolicy":
				typed = &networkingv1.NetworkPolicy{}
			default:
				t.Fatalf("%s, document %d: a %s: the samples' manifests are runs, schedules and network policies", f, i, u.GetKind())
			}
			require.NoError(t, yaml.UnmarshalStrict(doc, typed), "%s, document %d: strictly", f, i)
			require.Equal(t, namespace, u.GetNamespace(), "%s: in its directory's namespace", f)
			u.SetNamespace(ns)
			require.NoError(t, env.Client.Create(ctx, &u, client.DryRunAll), "%s, document %d: the API server accepts it", f, i)
		}
	}
}

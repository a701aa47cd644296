//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// TestInstall: the operator under test was installed from dist/install.yaml
// (make build-installer), which holds everything it needs with the image
// pinned by digest; config/default still installs with kubectl apply -k.
func TestInstall(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	installer := filepath.Join(root, "dist", "install.yaml")
	raw, err := os.ReadFile(installer)
	require.NoError(t, err, "make build-installer renders it (hack/demo.sh install does)")

	kinds := map[string]bool{}
	var images []string
	var dep appsv1.Deployment
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var u unstructured.Unstructured
		require.NoError(t, yaml.Unmarshal([]byte(doc), &u.Object))
		kinds[u.GetKind()+"/"+u.GetName()] = true
		if u.GetKind() == "Deployment" {
			require.NoError(t, yaml.Unmarshal([]byte(doc), &dep))
			for _, c := range dep.Spec.Template.Spec.Containers {
				images = append(images, c.Image)
				for _, a := range c.Args {
					require.NotContains(t, a, "--worker-image", "one image setting")
				}
			}
		}
	}
	for _, want := range []string{
		"Namespace/runledger-system",
		"CustomResourceDefinition/processingruns.processing.runledger.dev",
		"ServiceAccount/runledger-manager",
		"ClusterRole/runledger-manager",
		"ClusterRole/runledger-worker",
		"Deployment/runledger-manager",
	} {
		require.True(t, kinds[want], "dist/install.yaml holds %s (it holds %v)", want, kinds)
	}
	require.Len(t, images, 1)
	require.Contains(t, images[0], "@sha256:", "the image is pinned by digest")

	var live appsv1.Deployment
	require.NoError(t, e.c.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: managerName}, &live))
	require.Equal(t, images[0], live.Spec.Template.Spec.Containers[0].Image, "the operator under test runs dist/install.yaml's image")

	// Applying it again changes nothing that runs.
	out, err := e.kubectlRun(ctx, "apply", "-f", installer, "--dry-run=server")
	require.NoError(t, err, out)
	require.Contains(t, out, "deployment.apps/runledger-manager unchanged (server dry run)")

	// The kustomize base installs too (its image is the placeholder runledger:dev).
	out, err = e.kubectlRun(ctx, "apply", "-k", filepath.Join(root, "config", "default"), "--dry-run=server")
	require.NoError(t, err, out)
	require.Contains(t, out, "deployment.apps/runledger-manager configured (server dry run)")
}

package controllers

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestWorkerRestrictionsPolicy: config/policy, applied to the real
// apiserver, refuses a run whose worker image lacks an allowed prefix or
// that overrides the workers' ServiceAccount, on create and on update, with
// its message; runs without either, or with an allowed image, pass.
func TestWorkerRestrictionsPolicy(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	var kinds []string
	for _, obj := range env.Kustomize(t, "config/policy") {
		if obj.GetName() != "runledger-worker-restrictions" {
			continue // worker_pod_policy.yaml: TestWorkerTokenOnlyItsOwnPod
		}
		kinds = append(kinds, obj.GetKind())
		// Cluster-wide objects are shared by the test binary's apiserver:
		// this test's copy is bound to its own namespace only.
		name := "runledger-worker-restrictions-" + ns
		switch obj.GetKind() {
		case "ConfigMap":
			obj.SetNamespace(ns)
			require.NoError(t, unstructured.SetNestedField(obj.Object,
				"registry.example/runledger@sha256:, registry.example/approved/", "data", "allowedImagePrefixes"))
		case "ValidatingAdmissionPolicy":
			obj.SetName(name)
		case "ValidatingAdmissionPolicyBinding":
			obj.SetName(name)
			require.NoError(t, unstructured.SetNestedField(obj.Object, name, "spec", "policyName"))
			require.NoError(t, unstructured.SetNestedField(obj.Object, ns, "spec", "paramRef", "namespace"))
			require.NoError(t, unstructured.SetNestedStringMap(obj.Object, map[string]string{"kubernetes.io/metadata.name": ns},
				"spec", "matchResources", "namespaceSelector", "matchLabels"))
		}
		require.NoError(t, env.Client.Create(ctx, obj))
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
	require.ElementsMatch(t, []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap"}, kinds)

	withTemplate := func(name string, tmpl *v1alpha1.WorkerTemplate) *v1alpha1.ProcessingRun {
		run := newRun(ns, name, 1, 1)
		run.Spec.WorkerTemplate = tmpl
		return run
	}
	// The apiserver loads a new policy within a second or so.
	probes := 0
	waitFor(t, "the policy to refuse a foreign image", func() error {
		probes++
		err := env.Client.Create(ctx, withTemplate(fmt.Sprintf("probe-%d", probes), &v1alpha1.WorkerTemplate{Image: "evil.example/miner:latest"}))
		if err == nil {
			return fmt.Errorf("created")
		}
		return nil
	})

	for _, tt := range []struct {
		name string
		tmpl *v1alpha1.WorkerTemplate
		want string // "" when allowed
	}{
		{"no-template", nil, ""},
		{"pinned", &v1alpha1.WorkerTemplate{Image: "registry.example/runledger@sha256:3b5a0b2e9b4c0d6a1f3e8c7d2b9a4f6e5c1d0b8a7e6f5d4c3b2a1908f7e6d5c4"}, ""},
		{"approved", &v1alpha1.WorkerTemplate{Image: "registry.example/approved/runledger:1.2"}, ""},
		{"tag", &v1alpha1.WorkerTemplate{Image: "registry.example/runledger:latest"},
			"spec.workerTemplate.image registry.example/runledger:latest is not allowed: worker images must start with one of registry.example/runledger@sha256:, registry.example/approved/"},
		{"lookalike", &v1alpha1.WorkerTemplate{Image: "registry.example/approved-not/x"}, "is not allowed"},
		{"account", &v1alpha1.WorkerTemplate{ServiceAccountName: "powerful"},
			"spec.workerTemplate.serviceAccountName is not allowed: worker pods run as the manager's --worker-service-account"},
	} {
		err := env.Client.Create(ctx, withTemplate(tt.name, tt.tmpl))
		if tt.want == "" {
			require.NoError(t, err, tt.name)
			continue
		}
		require.Error(t, err, tt.name)
		require.ErrorContains(t, err, tt.want, tt.name)
		require.ErrorContains(t, err, "denied request", tt.name)
	}

	// workerTemplate may change after creation: the policy holds on update.
	run := getRun(t, env, ns, "no-template")
	run.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{ServiceAccountName: "powerful"}
	require.ErrorContains(t, env.Client.Update(ctx, run), "serviceAccountName is not allowed")
	run = getRun(t, env, ns, "no-template")
	run.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{Image: "evil.example/miner:latest"}
	require.ErrorContains(t, env.Client.Update(ctx, run), "is not allowed")
	run = getRun(t, env, ns, "no-template")
	run.Spec.Suspend = true
	run.Spec.BackoffLimit = ptr.To[int32](1)
	require.NoError(t, env.Client.Update(ctx, run), "other changes pass")
}

package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/worker"
)

// TestWorkerTokenOnlyItsOwnPod: with config/policy's runledger-worker-own-pod
// on the real apiserver, a token of the workers' ServiceAccount bound to a
// pod (a TokenRequest for that Pod object, as the kubelet's projected volume
// gets) may write the report annotation of that pod, exactly as the worker
// does (worker.ProgressPatch), and nothing else: not another pod, not the
// pod's spec (its image), labels or another annotation, not the pod's
// status, and a token not bound to a pod nothing at all. The workers'
// ClusterRole (config/rbac/worker_role.yaml) alone allows every one of them.
func TestWorkerTokenOnlyItsOwnPod(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	env.InstallOwnPodPolicy(t, ns)

	// The workers' rules, bound to the ServiceAccount in this namespace.
	var role rbacv1.ClusterRole
	b, err := os.ReadFile(filepath.Join(envtestutil.RepoRoot(), "config", "rbac", "worker_role.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &role))
	require.NotContains(t, fmt.Sprint(role.Rules), "configmaps", "workers read their batch from the mounted file, not the API")
	nsRole := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "runledger-worker", Namespace: ns}, Rules: role.Rules}
	require.NoError(t, env.Client.Create(ctx, nsRole))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "runledger-worker", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "runledger-worker"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "runledger-worker", Namespace: ns}},
	}))

	newPod := func(name string) *corev1.Pod {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "x"},
				Annotations: map[string]string{annotationCountsFloor: "{}"}},
			Spec: corev1.PodSpec{ServiceAccountName: "runledger-worker", AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "worker", Image: "registry.example/runledger:1"}}},
		}
		require.NoError(t, env.Client.Create(ctx, pod))
		return pod
	}
	own, other, probe := newPod("run-0-0"), newPod("victim"), newPod("probe")

	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)
	clientFor := func(bound *corev1.Pod) client.Client {
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
		if bound != nil {
			req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
		}
		tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "runledger-worker", req, metav1.CreateOptions{})
		require.NoError(t, err)
		cfg := rest.AnonymousClientConfig(env.Config)
		cfg.BearerToken = tok.Status.Token
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		require.NoError(t, err)
		return c
	}
	wc := clientFor(own)

	report := func(uid types.UID) []byte {
		body, err := workerProgressPatch(string(uid))
		require.NoError(t, err)
		return body
	}
	patch := func(c client.Client, name string, body []byte) error {
		return c.Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, body))
	}
	// The apiserver loads a new policy within a second or so.
	waitFor(t, "the policy to refuse a patch of another pod", func() error {
		if err := patch(wc, probe.Name, report("")); err == nil {
			return fmt.Errorf("allowed")
		}
		return nil
	})

	// The worker's own report, as it writes it, passes.
	require.NoError(t, patch(wc, own.Name, report(own.UID)))
	got := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(own), got))
	_, err = v1alpha1.ParseShardReport(got.Annotations[v1alpha1.AnnotationProgress])
	require.NoError(t, err)
	// So does it through the worker's own client (worker.PodClient, the
	// token as the kubelet mounts it), which gets the policy's refusal of
	// another pod as the API error it is.
	dir, _ := env.WorkerTokenDir(t, own)
	pc, err := worker.TokenDirPodClient(env.Config.Host, dir)
	require.NoError(t, err)
	require.NoError(t, pc.PatchPod(ctx, ns, own.Name, report(own.UID)))
	err = pc.PatchPod(ctx, ns, other.Name, report(""))
	require.True(t, apierrors.IsForbidden(err), "%v", err)
	require.ErrorContains(t, err, fmt.Sprintf("a worker may only patch its own pod %s/%s, not %s/%s", ns, own.Name, ns, other.Name))

	refused := func(what string, err error, want string) {
		t.Helper()
		require.Error(t, err, what)
		require.True(t, apierrors.IsForbidden(err) || apierrors.IsInvalid(err), "%s: %v", what, err)
		require.ErrorContains(t, err, want, what)
	}
	refused("another pod", patch(wc, other.Name, report("")),
		fmt.Sprintf("a worker may only patch its own pod %s/%s, not %s/%s", ns, own.Name, ns, other.Name))
	refused("another pod, its UID", patch(wc, other.Name, report(other.UID)), "may only patch its own pod")
	refused("another field", patch(wc, own.Name, []byte(`{"spec":{"containers":[{"name":"worker","image":"evil.example/miner:1"}]}}`)),
		"may change only the annotation processing.runledger.dev/progress of its pod, not its spec")
	refused("a label", patch(wc, own.Name, []byte(`{"metadata":{"labels":{"app":"y"}}}`)), "not its spec, labels")
	refused("another annotation", patch(wc, own.Name, []byte(`{"metadata":{"annotations":{"example.com/x":"1"}}}`)),
		"no other annotation")
	refused("the controller's annotation", patch(wc, own.Name,
		[]byte(`{"metadata":{"annotations":{"`+annotationCountsFloor+`":"{\"completed\":9}"}}}`)), "no other annotation")
	refused("removing an annotation", patch(wc, own.Name,
		[]byte(`{"metadata":{"annotations":{"`+annotationCountsFloor+`":null}}}`)), "no other annotation")
	refused("a token bound to no pod", patch(clientFor(nil), own.Name, report(own.UID)),
		"a worker's token must be bound to its pod")
	// The report on the other pod never landed.
	got = &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(other), got))
	require.NotContains(t, got.Annotations, v1alpha1.AnnotationProgress)
	require.Equal(t, "registry.example/runledger:1", got.Spec.Containers[0].Image)

	// Reads: none at all, since admission cannot narrow them to the
	// worker's own run: not another run of the namespace (whose spec may
	// say what another team's batch is), not its own (the kubelet mounts it
	// from the run's ConfigMap), no ConfigMap, no Secret.
	var runs v1alpha1.ProcessingRunList
	require.True(t, apierrors.IsForbidden(wc.List(ctx, &runs, client.InNamespace(ns))), "list runs")
	for _, name := range []string{"run", "another-teams-run"} {
		err = wc.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &v1alpha1.ProcessingRun{})
		require.True(t, apierrors.IsForbidden(err), "get run %s: %v", name, err)
	}
	err = wc.Get(ctx, types.NamespacedName{Namespace: ns, Name: testSecret}, &corev1.Secret{})
	require.True(t, apierrors.IsForbidden(err), "get a Secret: %v", err)
	for _, name := range []string{"kube-root-ca.crt", v1alpha1.RunConfigMapName("run", v1alpha1.RunFileDigest(nil))} {
		err = wc.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &corev1.ConfigMap{})
		require.True(t, apierrors.IsForbidden(err), "get ConfigMap %s: %v", name, err)
	}
}

// workerProgressPatch is the worker's report patch (worker.ProgressPatch).
func workerProgressPatch(uid string) ([]byte, error) {
	return worker.ProgressPatch(uid, *shardReport(0, 0, v1alpha1.ItemCounts{Total: 3, Completed: 1}, "processing"))
}

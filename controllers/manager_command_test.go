package controllers_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/version"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func httpGet(url string) (string, error) {
	resp, err := http.Get(url) //nolint:noctx // a local test endpoint
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), nil
}

// managerCommandRan: the command registers process-wide things (its
// controller's name, its metrics), so it runs once per test binary.
var managerCommandRan atomic.Bool

// `runledger manager` as it runs in the cluster (leader election, probes,
// metrics, the pod cache), against the test apiserver, installed namespaced
// (config/namespaced): it runs as its ServiceAccount with only the overlay's
// Roles in its namespace, --watch-namespaces names that namespace, and a run
// elsewhere is left alone.
func TestManagerCommand(t *testing.T) {
	if managerCommandRan.Swap(true) {
		t.Skip("runledger manager runs once per process (-count > 1)")
	}
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
		StringData: map[string]string{"dsn": "postgres://db/ledger"}}))
	require.NoError(t, env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runledger-worker", Namespace: ns}}))
	// The manager's own Pod, as the kubelet reports it: the workers get its
	// image by digest, with no --worker-image (config/manager passes none).
	const digest = "sha256:3b5a0b2e9b4c0d6a1f3e8c7d2b9a4f6e5c1d0b8a7e6f5d4c3b2a1908f7e6d5c4"
	self := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "runledger-manager-0", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "registry.example/runledger:e2e"}}}}
	require.NoError(t, env.Client.Create(ctx, self))
	self.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "manager", Image: "registry.example/runledger:e2e",
		ImageID: "registry.example/runledger@" + digest}}
	require.NoError(t, env.Client.Status().Update(ctx, self))
	t.Setenv("POD_NAME", self.Name)
	t.Setenv("POD_NAMESPACE", ns)
	user := "system:serviceaccount:" + ns + ":runledger-manager"
	installNamespaced(t, env, ns)
	kc, err := clientcmd.Load(env.KubeConfig)
	require.NoError(t, err)
	for _, a := range kc.AuthInfos {
		a.Impersonate = user
	}
	b, err := clientcmd.Write(*kc)
	require.NoError(t, err)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, b, 0o600))

	probes, metrics := freePort(t), freePort(t)
	cmd := cli.NewRootCommand()
	cmd.SetArgs([]string{"manager",
		"--kubeconfig", kubeconfig,
		"--leader-election-namespace", ns,
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", probes),
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", metrics),
		"--metrics-secure=false",
		"--pprof",
		"--watch-namespaces", ns,
		"--zap-log-level", "error",
	})
	cmdCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(cmdCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("manager did not stop")
		}
	})

	eventually(t, "readyz", func() error {
		select {
		case err := <-done:
			t.Fatalf("manager exited: %v", err)
		default:
		}
		_, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", probes))
		return err
	})
	body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz?verbose", probes))
	require.NoError(t, err)
	require.Contains(t, body, "[+]informers ok", "readyz checks that the informers synced")
	require.Contains(t, body, "[+]leader ok")
	// --pprof: Go's profiles on the metrics listener (here without its
	// authentication, --metrics-secure=false).
	body, err = httpGet(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", metrics))
	require.NoError(t, err)
	require.Contains(t, body, "goroutine profile:")
	eventually(t, "the Lease", func() error {
		var lease coordinationv1.Lease
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "runledger-manager.processing.runledger.dev"}, &lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("no holder")
		}
		return nil
	})

	run := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: "cmd", Namespace: ns},
		Spec: v1alpha1.ProcessingRunSpec{
			Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}},
			Batch:    v1alpha1.BatchSpec{Query: "select 'a' as entity, '1' as occurrence"},
			Workers:  2,
		},
	}
	require.NoError(t, env.Client.Create(ctx, run))
	eventually(t, "worker pods", func() error {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return err
		}
		var workers []corev1.Pod
		for _, p := range pods.Items {
			if p.Name != self.Name {
				workers = append(workers, p)
			}
		}
		if len(workers) != 2 {
			return fmt.Errorf("%d worker pods", len(workers))
		}
		for _, p := range workers {
			if img := p.Spec.Containers[0].Image; img != "registry.example/runledger@"+digest {
				return fmt.Errorf("pod %s image %s", p.Name, img)
			}
		}
		return nil
	})
	// Its NetworkPolicy came first (--worker-network-policy is on by
	// default), created with the namespaced install's Role.
	var np networkingv1.NetworkPolicy
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "runledger-cmd"}, &np))
	require.Equal(t, "cmd", metav1.GetControllerOf(&np).Name)
	// A run in another namespace: not this manager's to see.
	other := env.Namespace(t)
	elsewhere := run.DeepCopy()
	elsewhere.ResourceVersion, elsewhere.Namespace = "", other
	require.NoError(t, env.Client.Create(ctx, elsewhere))
	time.Sleep(2 * time.Second)
	var otherPods corev1.PodList
	require.NoError(t, env.Client.List(ctx, &otherPods, client.InNamespace(other)))
	require.Empty(t, otherPods.Items, "no pod for a run outside --watch-namespaces")
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(elsewhere), elsewhere))
	require.Empty(t, elsewhere.Status.Phase, "its status untouched")

	build := version.Get()
	eventually(t, "metrics", func() error {
		body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics))
		if err != nil {
			return err
		}
		for _, want := range []string{
			`runledger_runs{phase="Running"} 1`,
			`runledger_worker_pods_created_total`,
			`runledger_items_total{outcome="completed"}`,
			`controller_runtime_reconcile_total{controller="processingrun"`,
			`controller_runtime_reconcile_time_seconds_bucket{controller="processingrun"`,
			`workqueue_depth{controller="processingrun"`,
			`workqueue_queue_duration_seconds_bucket{controller="processingrun"`,
			`runledger_build_info{commit="` + build.Commit + `",goversion="` + build.GoVersion + `",version="` + build.Version + `"} 1`,
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("no %q in the metrics", want)
			}
		}
		return nil
	})
}

// installNamespaced creates the Roles and RoleBindings of config/namespaced
// in ns, for the manager's ServiceAccount there, and checks that the
// overlay's manager watches its own namespace only.
func installNamespaced(t *testing.T, env *envtestutil.Env, ns string) {
	t.Helper()
	ctx := context.Background()
	var roles, watches, nodes int
	var policies []string
	for _, obj := range env.Kustomize(t, "config/namespaced") {
		switch obj.GetKind() {
		case "ValidatingAdmissionPolicy":
			policies = append(policies, obj.GetName())
		case "ValidatingAdmissionPolicyBinding":
			// The parameters are in the overlay's namespace, like the manager.
			paramNS, _, _ := unstructured.NestedString(obj.Object, "spec", "paramRef", "namespace")
			policies = append(policies, obj.GetName()+" binding "+paramNS)
		case "ConfigMap":
			policies = append(policies, obj.GetName()+" params "+obj.GetNamespace())
		case "ClusterRole", "ClusterRoleBinding":
			require.NotEqual(t, "runledger-manager", obj.GetName(), "the manager's rules are a Role")
			if obj.GetName() != "runledger-manager-nodes" {
				continue
			}
			// Cluster-wide names are shared by the test binary's apiserver.
			obj.SetName(obj.GetName() + "-" + ns)
			if obj.GetKind() == "ClusterRole" {
				require.NoError(t, env.Client.Create(ctx, obj))
				t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
				continue
			}
			require.NoError(t, unstructured.SetNestedField(obj.Object, obj.GetName(), "roleRef", "name"))
			subjects, _, _ := unstructured.NestedSlice(obj.Object, "subjects")
			subjects[0].(map[string]any)["namespace"] = ns
			require.NoError(t, unstructured.SetNestedSlice(obj.Object, subjects, "subjects"))
			require.NoError(t, env.Client.Create(ctx, obj))
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
			nodes++
		case "Role", "RoleBinding":
			obj.SetNamespace(ns)
			if subjects, ok, _ := unstructured.NestedSlice(obj.Object, "subjects"); ok {
				for _, s := range subjects {
					s.(map[string]any)["namespace"] = ns
				}
				require.NoError(t, unstructured.SetNestedSlice(obj.Object, subjects, "subjects"))
			}
			require.NoError(t, env.Client.Create(ctx, obj))
			roles++
		case "Deployment":
			containers, _, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
			require.NoError(t, err)
			args, _, err := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
			require.NoError(t, err)
			require.Contains(t, args, "--watch-namespaces=$(POD_NAMESPACE)")
			watches++
		}
	}
	require.Equal(t, 4, roles, "the manager's and the leader election's Role and RoleBinding")
	require.Equal(t, 1, watches)
	require.Equal(t, 1, nodes, "reading Nodes, cluster-wide")
	require.ElementsMatch(t, []string{
		"runledger-worker-restrictions", "runledger-worker-restrictions binding runledger", "runledger-worker-restrictions params runledger",
		"runledger-worker-own-pod", "runledger-worker-own-pod binding ",
	}, policies, "the namespaced install has the default install's admission policies")
}

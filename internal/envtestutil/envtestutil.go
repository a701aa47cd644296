// Package envtestutil runs one real kube-apiserver (and etcd) per test
// binary, from the binaries hack/k8s-bins.sh builds under bin/k8s/, with
// runledger's CRDs installed, and gives each test its own namespace.
//
// Use it from TestMain, then call Get in the tests that need it; the
// apiserver starts on first use, so unit tests of the same package pay
// nothing:
//
//	func TestMain(m *testing.M) { envtestutil.Main(m) }
//
//	func TestSomething(t *testing.T) { env := envtestutil.Get(t); ... }
//
// KUBEBUILDER_ASSETS (set by `make test`) names the binaries' directory;
// without it, hack/k8s-bins.sh is asked for it (and builds them once).
// Under go test -short, Get skips the test (testtier.Needs).
package envtestutil

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/testtier"
	"github.com/runledger/runledger/internal/worker"
)

// Env is a running kube-apiserver with runledger's CRDs and Kueue's.
type Env struct {
	Config *rest.Config
	// KubeConfig is a kubeconfig file's content for the apiserver (admin).
	KubeConfig []byte
	Scheme     *k8sruntime.Scheme
	// Client is an uncached client with full rights.
	Client client.Client
	env    *envtest.Environment
	nsSeq  atomic.Int64
}

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Scheme has the core kinds and runledger's.
func Scheme() (*k8sruntime.Scheme, error) {
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add core kinds: %w", err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add runledger kinds: %w", err)
	}
	if err := kueue.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add kueue kinds: %w", err)
	}
	return s, nil
}

// kueueCRDs are the files of the Kueue CRDs the integration uses, from the
// config/ directory of the Kueue module that go.mod pins (in the module
// cache).
func kueueCRDs() ([]string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kueue")
	cmd.Dir = RepoRoot()
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("find the kueue module (go mod download sigs.k8s.io/kueue): %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" {
		return nil, fmt.Errorf("the kueue module is not in the module cache: run go mod download sigs.k8s.io/kueue")
	}
	dir := filepath.Join(mod, "config", "components", "crd", "bases")
	var files []string
	for _, kind := range []string{"workloads", "resourceflavors", "workloadpriorityclasses", "clusterqueues", "localqueues"} {
		files = append(files, filepath.Join(dir, "kueue.x-k8s.io_"+kind+".yaml"))
	}
	return files, nil
}

// assetsDir is KUBEBUILDER_ASSETS, or what hack/k8s-bins.sh prints.
func assetsDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err != nil {
			return "", fmt.Errorf("KUBEBUILDER_ASSETS=%s holds no kube-apiserver (make envtest-assets builds it; unset KUBEBUILDER_ASSETS to let hack/k8s-bins.sh find it): %w", dir, err)
		}
		return dir, nil
	}
	script := filepath.Join(RepoRoot(), "hack", "k8s-bins.sh")
	cmd := exec.Command(script, "--print-dir", "kube-apiserver", "etcd", "kubectl")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("find envtest binaries with %s (or set KUBEBUILDER_ASSETS): %w", script, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Kubectl is the path of the kubectl binary next to the envtest binaries.
func Kubectl() (string, error) {
	dir, err := assetsDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "kubectl"), nil
}

// Needs is what a test that starts an Env needs (testtier.Needs): Get says
// so, and so does a test that calls Start itself, first.
const Needs = "kube-apiserver and etcd (envtest, hack/k8s-bins.sh)"

// Start starts etcd and kube-apiserver and installs the CRDs of
// config/crd/bases and Kueue's (kueueCRDs).
func Start() (*Env, error) {
	dir, err := assetsDir()
	if err != nil {
		return nil, err
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	kueueFiles, err := kueueCRDs()
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		CRDDirectoryPaths:        append([]string{filepath.Join(RepoRoot(), "config", "crd", "bases")}, kueueFiles...),
		ErrorIfCRDPathMissing:    true,
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	// As on clusters that enforce owner references: setting
	// blockOwnerDeletion needs update on the owner's finalizers.
	te.ControlPlane.GetAPIServer().Configure().Append("enable-admission-plugins", "OwnerReferencesPermissionEnforcement")
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest: %w", err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Env{Config: cfg, KubeConfig: te.KubeConfig, Scheme: scheme, Client: c, env: te}, nil
}

// EtcdURL is the client URL of the Env's etcd (its Prometheus metrics are at
// /metrics there).
func (e *Env) EtcdURL() string {
	return e.env.ControlPlane.Etcd.URL.String()
}

// Stop stops kube-apiserver and etcd.
func (e *Env) Stop() error {
	if err := e.env.Stop(); err != nil {
		return fmt.Errorf("stop envtest: %w", err)
	}
	return nil
}

var shared struct {
	once sync.Once
	env  *Env
	err  error
}

// Get returns the test binary's Env, starting it on first use. It fails the
// test when the apiserver cannot start.
func Get(t testing.TB) *Env {
	t.Helper()
	testtier.Needs(t, Needs)
	shared.once.Do(func() { shared.env, shared.err = Start() })
	if shared.err != nil {
		t.Fatalf("envtest: %v", shared.err)
	}
	return shared.env
}

// Main runs the tests, then stops the Env if a test started it and calls
// each of stops (pgtest.Stop, for a package whose tests use PostgreSQL too);
// it exits the process.
func Main(m *testing.M, stops ...func() error) {
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "envtest:", err)
		}
	}
	for _, stop := range stops {
		if err := stop(); err != nil {
			fmt.Fprintln(os.Stderr, "after the tests:", err)
			code = max(code, 1)
		}
	}
	os.Exit(code)
}

// Namespace creates a namespace for one test, deleted when the test ends.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", e.nsSeq.Add(1), sanitize(t.Name()))
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.Client.Delete(ctx, ns); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete namespace %s: %v", name, err)
		}
	})
	return name
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-")
}

// Kustomize renders the kustomization in dir (relative to the repository's
// root) with the kubectl of the test binaries, as `kubectl apply -k` would,
// into unstructured objects.
func (e *Env) Kustomize(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.Command(filepath.Join(e.env.BinaryAssetsDirectory, "kubectl"), "kustomize", filepath.Join(RepoRoot(), dir))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(string(out), "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
	return objs
}

// WorkerServiceAccount is the ServiceAccount WorkerTokenDir issues tokens
// of (the manager's default --worker-service-account).
const WorkerServiceAccount = "runledger-worker"

// WorkerTokenDir is what the kubelet gives a worker pod to reach the API
// server (controllers/podspec.go's token volume, mounted at
// v1alpha1.WorkerTokenPath): a directory holding a token of the pod's
// namespace's ServiceAccount WorkerServiceAccount bound to pod (a
// TokenRequest for that Pod object, as the projected volume gets) and the
// apiserver's CA, and the environment the kubelet sets in every container
// (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT). The ServiceAccount
// and a Role with config/rbac's worker rules, bound to it, are created in
// the namespace when missing: the token may do what a worker's may.
func (e *Env) WorkerTokenDir(t testing.TB, pod *corev1.Pod) (dir string, env []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := pod.Namespace
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "config", "rbac", "worker_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatalf("config/rbac/worker_role.yaml: %v", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: WorkerServiceAccount, Namespace: ns}}
	for _, obj := range []client.Object{
		sa,
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: ns}, Rules: role.Rules},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: WorkerServiceAccount, Namespace: ns}},
		},
	} {
		if err := e.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %T %s/%s: %v", obj, ns, obj.GetName(), err)
		}
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](v1alpha1.WorkerTokenExpirationSeconds),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if err := e.Client.SubResource("token").Create(ctx, sa, req); err != nil {
		t.Fatalf("requesting a token of %s/%s bound to pod %s: %v", ns, WorkerServiceAccount, pod.Name, err)
	}
	dir = t.TempDir()
	for name, content := range map[string][]byte{"token": []byte(req.Status.Token), "ca.crt": e.Config.CAData, "namespace": []byte(ns)} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(e.Config.Host)
	if err != nil {
		t.Fatalf("the apiserver's address %q: %v", e.Config.Host, err)
	}
	return dir, []string{"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port()}
}

// PodClient is a worker's pod client (worker.PodClient) with the
// apiserver's administrator credentials, for tests and benchmarks that play
// many workers in one process.
func (e *Env) PodClient() (*worker.PodClient, error) {
	tlsConfig, err := rest.TLSConfigFor(e.Config)
	if err != nil {
		return nil, fmt.Errorf("TLS configuration of the apiserver: %w", err)
	}
	return worker.NewPodClient(e.Config.Host, tlsConfig, nil), nil
}

// InstallOwnPodPolicy creates config/policy's runledger-worker-own-pod policy
// and binding, under names of the test's own, bound to namespace ns only
// (cluster-wide objects are shared by the test binary's apiserver). The
// apiserver loads a new policy within a second or so.
func (e *Env) InstallOwnPodPolicy(t testing.TB, ns string) {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, obj := range e.Kustomize(t, "config/policy") {
		if obj.GetName() != "runledger-worker-own-pod" {
			continue
		}
		n++
		obj.SetName("runledger-worker-own-pod-" + ns)
		if obj.GetKind() == "ValidatingAdmissionPolicyBinding" {
			if err := unstructured.SetNestedField(obj.Object, obj.GetName(), "spec", "policyName"); err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedStringMap(obj.Object, map[string]string{"kubernetes.io/metadata.name": ns},
				"spec", "matchResources", "namespaceSelector", "matchLabels"); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Client.Create(ctx, obj); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		t.Cleanup(func() { _ = e.Client.Delete(context.Background(), obj) })
	}
	if n != 2 {
		t.Fatalf("config/policy holds %d objects named runledger-worker-own-pod, want the policy and its binding", n)
	}
}

// User adds a user name (in no group) to the Env's apiserver and returns a
// kubeconfig of theirs: they may do what RBAC grants them, nothing else.
func (e *Env) User(t testing.TB, name string) []byte {
	t.Helper()
	u, err := e.env.AddUser(envtest.User{Name: name}, nil)
	if err != nil {
		t.Fatalf("adding user %s: %v", name, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatalf("kubeconfig of user %s: %v", name, err)
	}
	return kc
}

//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/redact"
)

// The operator as config/default installs it.
const (
	systemNamespace = "runledger-system"
	managerName     = "runledger-manager"
	leaseName       = "runledger-manager.processing.runledger.dev"
)

// env is the cluster the tests run against, shared by all tests.
type env struct {
	c         client.Client
	wc        client.WithWatch // c, to watch (made with it: a client made later logs a warning)
	cs        kubernetes.Interface
	cfg       *rest.Config // the admin's
	adminDSN  string       // the cluster's PostgreSQL, database runledger
	kubectl   string
	clusterSh string // hack/cluster.sh, for `postgres restart`
}

var (
	envOnce sync.Once
	theEnv  *env
	envErr  error
)

// errSkip marks what makes the tests skip rather than fail: no cluster was
// given to them.
var errSkip = errors.New("cannot run here")

// setup returns the shared environment, or skips the test (fails it with
// RUNLEDGER_E2E_REQUIRE=1) when there is no cluster to run against.
func setup(t *testing.T) *env {
	t.Helper()
	envOnce.Do(func() { theEnv, envErr = newEnv() })
	if envErr != nil {
		if errors.Is(envErr, errSkip) && os.Getenv("RUNLEDGER_E2E_REQUIRE") != "1" {
			t.Skipf("e2e: %v", envErr)
		}
		t.Fatalf("e2e: %v", envErr)
	}
	return theEnv
}

func newEnv() (*env, error) {
	kubeconfig := os.Getenv("KUBECONFIG")
	dsn := os.Getenv("RUNLEDGER_E2E_DSN")
	if dsn == "" {
		dsn = os.Getenv("RUNLEDGER_DATABASE_URL")
	}
	if kubeconfig == "" || dsn == "" {
		return nil, fmt.Errorf("%w: no cluster: KUBECONFIG and RUNLEDGER_DATABASE_URL (or RUNLEDGER_E2E_DSN) must be set; "+
			"run `make e2e`, or `source <(hack/cluster.sh env)` against a cluster with the operator deployed", errSkip)
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		return nil, fmt.Errorf("%w: kubectl not in PATH (source <(hack/cluster.sh env) puts it there)", errSkip)
	}
	clusterSh, err := filepath.Abs(filepath.Join("..", "..", "hack", "cluster.sh"))
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes clientset: %w", err)
	}
	e := &env{c: c, wc: c, cs: cs, cfg: cfg, adminDSN: dsn, kubectl: kubectl, clusterSh: clusterSh}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var dep appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: managerName}, &dep); err != nil {
		return nil, fmt.Errorf("the operator is not deployed (deployment %s/%s: %w): hack/e2e.sh deploys it", systemNamespace, managerName, err)
	}
	if dep.Status.AvailableReplicas < 1 {
		return nil, fmt.Errorf("deployment %s/%s has no available replica", systemNamespace, managerName)
	}
	if _, err := e.sql(ctx, dsn, "SELECT 1"); err != nil {
		return nil, fmt.Errorf("PostgreSQL (%s): %w", redact.DSN(dsn), err)
	}
	return e, nil
}

// kubectlRun runs kubectl and returns its combined output.
func (e *env) kubectlRun(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.kubectl, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// withDatabase is dsn with another database name.
func withDatabase(dsn, db string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("parse DSN: %w", err)
	}
	u.Path = "/" + db
	return u.String(), nil
}

// managerPods are the manager's pods, by name.
func (e *env) managerPods(ctx context.Context) (map[string]corev1.Pod, error) {
	var pods corev1.PodList
	if err := e.c.List(ctx, &pods, client.InNamespace(systemNamespace),
		client.MatchingLabels{"app.kubernetes.io/name": "runledger", "app.kubernetes.io/component": "manager"}); err != nil {
		return nil, err
	}
	out := make(map[string]corev1.Pod, len(pods.Items))
	for _, p := range pods.Items {
		out[p.Name] = p
	}
	return out, nil
}

package cli

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/internal/envtestutil"
)

// TestPprofBehindMetricsAuthn: the metrics listener as the manager's flags
// build it, against the real apiserver's TokenReview and
// SubjectAccessReview. With --pprof, /debug/pprof/ refuses a request
// without a token (401) and a token that may only scrape /metrics (403),
// and serves the profiles to a token bound to config/rbac's
// runledger-pprof-reader; with the default flags it serves none, to that
// token either.
func TestPprofBehindMetricsAuthn(t *testing.T) {
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)

	// config/rbac's reader ClusterRoles, bound to one ServiceAccount each.
	b, err := os.ReadFile(filepath.Join(envtestutil.RepoRoot(), "config", "rbac", "metrics_auth_role.yaml"))
	require.NoError(t, err)
	roles := map[string]rbacv1.ClusterRole{}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var role rbacv1.ClusterRole
		require.NoError(t, yaml.Unmarshal([]byte(doc), &role))
		if role.Kind == "ClusterRole" {
			roles[role.Name] = role
		}
	}
	token := func(sa, clusterRole string) string {
		_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
		role, ok := roles[clusterRole]
		require.True(t, ok, "config/rbac has the ClusterRole %s", clusterRole)
		// Cluster-wide names are shared by the test binary's apiserver.
		name := clusterRole + "-" + ns
		_, err = cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: role.Rules}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
			_ = cs.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tok.Status.Token
	}
	profiler, scraper := token("profiler", "runledger-pprof-reader"), token("scraper", "runledger-metrics-reader")

	// serve: the listener of `runledger manager ARGS...` (the flags parsed
	// as the command parses them), until the test ends.
	serve := func(args ...string) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		o := &managerOptions{}
		require.NoError(t, managerCommand(o).ParseFlags(append([]string{"--metrics-bind-address", addr}, args...)))
		opts, err := o.metricsOptions()
		require.NoError(t, err)
		hc, err := rest.HTTPClientFor(env.Config)
		require.NoError(t, err)
		srv, err := metricsserver.NewServer(opts, env.Config, hc)
		require.NoError(t, err)
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- srv.Start(sctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("metrics server: %v", err)
			}
		})
		return "https://" + addr
	}
	// The listener's certificate is self-signed (no --metrics-cert-dir).
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a throwaway self-signed listener
	get := func(url, bearer string) (int, string) {
		t.Helper()
		var code int
		var body string
		require.Eventually(t, func() bool {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			require.NoError(t, err)
			if bearer != "" {
				req.Header.Set("Authorization", "Bearer "+bearer)
			}
			resp, err := hc.Do(req)
			if err != nil {
				return false // not listening yet
			}
			defer func() { _ = resp.Body.Close() }()
			b, _ := io.ReadAll(resp.Body)
			code, body = resp.StatusCode, string(b)
			return true
		}, 20*time.Second, 100*time.Millisecond, "GET %s", url)
		return code, body
	}

	on := serve("--pprof")
	code, _ := get(on+"/debug/pprof/goroutine?debug=1", "")
	require.Equal(t, http.StatusUnauthorized, code, "no token")
	code, body := get(on+"/debug/pprof/goroutine?debug=1", "not-a-token")
	// controller-runtime's filter answers a token the TokenReview rejects
	// with 500 "Authentication failed": refused all the same.
	require.Equal(t, http.StatusInternalServerError, code, "a token the apiserver does not know: %s", body)
	require.Contains(t, body, "Authentication failed")
	code, _ = get(on+"/debug/pprof/goroutine?debug=1", scraper)
	require.Equal(t, http.StatusForbidden, code, "a token that may only read /metrics")
	code, _ = get(on+"/metrics", scraper)
	require.Equal(t, http.StatusOK, code, "the scraper reads /metrics")
	code, body = get(on+"/debug/pprof/goroutine?debug=1", profiler)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "goroutine profile:")
	code, body = get(on+"/debug/pprof/", profiler)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "heap")

	off := serve()
	code, body = get(off+"/debug/pprof/goroutine?debug=1", profiler)
	require.Equal(t, http.StatusNotFound, code, "no profiles without --pprof: %s", body)
	code, _ = get(off+"/debug/pprof/", "")
	require.Equal(t, http.StatusNotFound, code, "the path is not there at all")
	code, _ = get(off+"/metrics", "")
	require.Equal(t, http.StatusUnauthorized, code, "the listener itself still asks who it is")
}

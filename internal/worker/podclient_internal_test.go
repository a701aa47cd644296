package worker

import (
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// TestPodClientRequest: what the worker's client sends (a JSON merge patch
// of the pod's path, the token of the file as it is at each request, since
// the kubelet renews it) and how it reads the answers that are not the API
// server's own Status (the API server's are in test/cli and controllers'
// TestWorkerTokenOnlyItsOwnPod).
func TestPodClientRequest(t *testing.T) {
	t.Parallel()
	type request struct{ method, path, contentType, auth, agent, body string }
	var mu sync.Mutex
	var got []request
	status, answer := http.StatusOK, `{"kind":"Pod"}`
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, request{r.Method, r.URL.EscapedPath(), r.Header.Get("Content-Type"), r.Header.Get("Authorization"), r.Header.Get("User-Agent"), string(body)})
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	}))
	defer srv.Close()

	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte("first\n"), 0o600))
	c, err := TokenDirPodClient(srv.URL, dir)
	require.NoError(t, err)
	ctx := context.Background()

	require.NoError(t, c.PatchPod(ctx, "billing", "run-0-0", []byte(`{"metadata":{}}`)))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte("renewed"), 0o600))
	require.NoError(t, c.PatchPod(ctx, "billing", "run-0-1", []byte(`{}`)))
	require.Len(t, got, 2)
	require.Equal(t, request{http.MethodPatch, "/api/v1/namespaces/billing/pods/run-0-0", "application/merge-patch+json", "Bearer first", got[0].agent, `{"metadata":{}}`}, got[0])
	require.Regexp(t, `^runledger-worker/\S+ \(\w+/\w+\)$`, got[0].agent)
	require.Equal(t, "Bearer renewed", got[1].auth, "the token is read again at every request")

	// An answer that is not a Status (a proxy's, say) is still an API
	// error of its code, what the server said its cause.
	status, answer = http.StatusServiceUnavailable, "upstream connect error"
	err = c.PatchPod(ctx, "billing", "run-0-0", []byte(`{}`))
	require.True(t, apierrors.IsServiceUnavailable(err), "%v", err)
	var st apierrors.APIStatus
	require.ErrorAs(t, err, &st)
	require.Equal(t, "upstream connect error", st.Status().Details.Causes[0].Message)
	// A Status is the error it describes.
	status, answer = http.StatusNotFound, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"run-0-9\" not found","reason":"NotFound","code":404}`
	err = c.PatchPod(ctx, "billing", "run-0-9", []byte(`{}`))
	require.True(t, apierrors.IsNotFound(err), "%v", err)
	require.EqualError(t, err, `pods "run-0-9" not found`)

	// A token that cannot be read fails the request, saying so.
	require.NoError(t, os.Remove(filepath.Join(dir, "token")))
	require.ErrorContains(t, c.PatchPod(ctx, "billing", "run-0-0", []byte(`{}`)), "reading the pod's ServiceAccount token")
	_, err = TokenDirPodClient(srv.URL, dir)
	require.ErrorContains(t, err, "reading the pod's ServiceAccount token", "checked at start")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("not a certificate"), 0o600))
	_, err = TokenDirPodClient(srv.URL, dir)
	require.ErrorContains(t, err, "holds no PEM certificate")
}

func TestInClusterPodClientOutsideAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err := InClusterPodClient(t.TempDir())
	require.EqualError(t, err, "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
}

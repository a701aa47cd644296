package worker

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/runledger/runledger/internal/version"
)

// PodClient is the worker's one use of the Kubernetes API: JSON merge
// patches of pods (its reports on its own pod), over HTTPS, and nothing
// else. It is net/http, not a Kubernetes client library, so that the worker
// binary links none (cmd/runledger-worker; docs/scale.md, "Where a shard's
// memory goes").
type PodClient struct {
	host      string // https://HOST:PORT
	http      *http.Client
	token     func() (string, error) // nil: the TLS client certificate authenticates
	userAgent string
}

// podRequestTimeout bounds one request: a turn of the reporter never waits
// on a hung connection longer than this.
const podRequestTimeout = 30 * time.Second

// Where a pod's token directory holds what InClusterPodClient reads (as the
// ServiceAccount admission plugin and the worker's projected volume lay it
// out).
const (
	tokenFile = "token"
	caFile    = "ca.crt"
)

// InClusterPodClient is the client of a process in a pod: the API server at
// $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (set by the kubelet in
// every container), as TokenDirPodClient. dir is v1alpha1.WorkerTokenPath
// in a worker pod.
func InClusterPodClient(dir string) (*PodClient, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	}
	return TokenDirPodClient("https://"+net.JoinHostPort(host, port), dir)
}

// TokenDirPodClient is the client of the API server at host (https://HOST:PORT)
// trusted with dir/ca.crt and authenticated with dir/token, read again at
// every request since the kubelet renews it.
func TokenDirPodClient(host, dir string) (*PodClient, error) {
	ca, err := os.ReadFile(filepath.Join(dir, caFile))
	if err != nil {
		return nil, fmt.Errorf("reading the API server's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s holds no PEM certificate", filepath.Join(dir, caFile))
	}
	token := filepath.Join(dir, tokenFile)
	if _, err := readToken(token); err != nil {
		return nil, err
	}
	return NewPodClient(host, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		func() (string, error) { return readToken(token) }), nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the pod's ServiceAccount token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("the pod's ServiceAccount token %s is empty", path)
	}
	return tok, nil
}

// NewPodClient is a client of the API server at host (https://HOST:PORT)
// over tlsConfig, sending the bearer token that token returns (nil: none,
// tlsConfig's client certificate authenticates).
func NewPodClient(host string, tlsConfig *tls.Config, token func() (string, error)) *PodClient {
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true, // as client-go: one connection, the API server's preferred protocol
		// client-go's health check: a silent connection is closed after an unanswered ping, not reused until TCP gives up.
		HTTP2:               &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second},
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 1,
	}
	v := version.Get().Version
	return &PodClient{
		host:      strings.TrimSuffix(host, "/"),
		http:      &http.Client{Transport: transport, Timeout: podRequestTimeout},
		token:     token,
		userAgent: "runledger-worker/" + v + " (" + runtime.GOOS + "/" + runtime.GOARCH + ")",
	}
}

// podsResource names pods in the API's errors.
var podsResource = schema.GroupResource{Resource: "pods"}

// PatchPod applies the JSON merge patch body to pod namespace/name. An API
// error is an *apierrors.StatusError (apierrors.IsNotFound, IsConflict, ...
// answer as for client-go's); a network error is returned as it is.
func (c *PodClient) PatchPod(ctx context.Context, namespace, name string, body []byte) error {
	u := c.host + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("patching pod %s/%s: %w", namespace, name, err)
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if c.token != nil {
		tok, err := c.token()
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close() //nolint:errcheck // read to the end below
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// The pod as patched, which the worker does not need; read so that
		// the connection is reused.
		_, err := io.Copy(io.Discard, resp.Body)
		return err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return statusError(resp.StatusCode, msg, name)
}

// statusError is the API server's answer code, body to a request on pod
// name as client-go reports it: the metav1.Status it sent, or one made of
// the code, the body its cause.
func statusError(code int, body []byte, name string) error {
	var st metav1.Status
	if err := json.Unmarshal(body, &st); err == nil && st.Kind == "Status" && st.Status == metav1.StatusFailure {
		if st.Code == 0 {
			st.Code = int32(code)
		}
		return &apierrors.StatusError{ErrStatus: st}
	}
	return apierrors.NewGenericServerResponse(code, http.MethodPatch, podsResource, name, strings.TrimSpace(string(body)), 0, true)
}

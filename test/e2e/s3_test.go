//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// objectStore is the cluster's S3-compatible object store (one SeaweedFS,
// hack/cluster/lib/s3.sh) as hack/cluster.sh s3-env describes it: HTTPS
// only, its certificate signed by a CA of its own, one static identity,
// path-style addressing. Endpoint is the same from the host and from pods.
type objectStore struct {
	// Endpoint is the S3 API's base URL (https://10.250.0.2:8333), as pods
	// and the host reach it.
	Endpoint  string
	Region    string
	AccessKey string
	SecretKey string
	// CAFile is the host's path of the CA that signed the store's
	// certificate (no other CA does: the Kubernetes cluster's does not);
	// CAPEM is its content.
	CAFile string
	CAPEM  []byte
}

var (
	storeOnce sync.Once
	theStore  *objectStore
	storeErr  error
)

// objectStore returns the cluster's object store, ready (an object written
// and read back once per test binary); it fails the test when the cluster
// has none.
func (e *env) objectStore(t *testing.T) *objectStore {
	t.Helper()
	storeOnce.Do(func() {
		if theStore, storeErr = readObjectStore(e.clusterSh); storeErr == nil {
			storeErr = theStore.waitReady(2 * time.Minute)
		}
	})
	require.NoError(t, storeErr, "the cluster's object store (hack/cluster.sh s3-env)")
	return theStore
}

// readObjectStore parses hack/cluster.sh s3-env's KEY=VALUE lines.
func readObjectStore(clusterSh string) (*objectStore, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(clusterSh, "s3-env")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("hack/cluster.sh s3-env: %w: %s", err, stderr.Bytes())
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	s := &objectStore{
		Endpoint: kv["S3_ENDPOINT"], Region: kv["S3_REGION"],
		AccessKey: kv["S3_ACCESS_KEY_ID"], SecretKey: kv["S3_SECRET_ACCESS_KEY"], CAFile: kv["S3_CA_FILE"],
	}
	if s.Endpoint == "" || s.Region == "" || s.AccessKey == "" || s.SecretKey == "" || s.CAFile == "" {
		return nil, fmt.Errorf("hack/cluster.sh s3-env: a value is missing: %v", keysOf(kv))
	}
	if s.CAPEM, err = os.ReadFile(s.CAFile); err != nil {
		return nil, err
	}
	return s, nil
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// client is an S3 client of the store from the host: path-style, the
// store's identity, TLS verified against the store's CA alone (not the
// system's roots); opts change its options.
func (s *objectStore) client(opts ...func(*s3.Options)) *s3.Client {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.CAPEM) {
		panic("no certificate in " + s.CAFile)
	}
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(s.Endpoint),
		Region:       s.Region,
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
			tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}),
	}, opts...)
}

// waitReady: until an object is written and read back (the store grows its
// first volume on the first write), then removed.
func (s *objectStore) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := s.client(func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	bucket := "e2e-ready-" + randSuffix()
	var last error
	for {
		if last = roundTrip(ctx, c, bucket); last == nil {
			_, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)})
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the object store at %s is not ready after %s: %w", s.Endpoint, timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func roundTrip(ctx context.Context, c *s3.Client, bucket string) error {
	if _, err := c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)}); err != nil {
		if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
			return fmt.Errorf("creating a bucket: %w", err)
		}
	}
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("ready"), Body: strings.NewReader("ready")}); err != nil {
		return fmt.Errorf("writing an object: %w", err)
	}
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("ready")})
	if err != nil {
		return fmt.Errorf("reading an object: %w", err)
	}
	defer out.Body.Close() //nolint:errcheck // read-only
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return fmt.Errorf("reading an object: %w", err)
	}
	if string(b) != "ready" {
		return fmt.Errorf("read %q back, wrote %q", b, "ready")
	}
	return nil
}

// newBucket creates an empty bucket for the fixture's test, named after its
// namespace; it is deleted with its objects when the test passes, kept
// with the namespace when it fails.
func (f *fixture) newBucket() string {
	f.t.Helper()
	store := f.objectStore(f.t)
	name := f.ns // e2e-NAME-SUFFIX: a valid bucket name
	if len(name) > 63 {
		name = name[:63]
	}
	c := store.client()
	_, err := c.CreateBucket(f.ctx, &s3.CreateBucketInput{Bucket: aws.String(name)})
	require.NoError(f.t, err, "creating bucket %s", name)
	t := f.t
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept bucket %s of %s for debugging", name, store.Endpoint)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The store deletes a bucket that is not empty (-s3.allowDeleteBucketNotEmpty).
		if _, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(name)}); err != nil {
			t.Logf("deleting bucket %s: %v", name, err)
		}
	})
	return name
}

// putObject writes body as bucket's object key from the host; it returns
// the object's ETag as the store gives it (quoted).
func (f *fixture) putObject(bucket, key string, body []byte) string {
	f.t.Helper()
	out, err := f.objectStore(f.t).client().PutObject(f.ctx, &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body),
	})
	require.NoError(f.t, err, "putting s3://%s/%s", bucket, key)
	return aws.ToString(out.ETag)
}

// presignGet is a URL that reads bucket's object key for ttl without
// credentials (S3's presigned GET, signed with the store's identity).
func (f *fixture) presignGet(bucket, key string, ttl time.Duration) string {
	f.t.Helper()
	req, err := s3.NewPresignClient(f.objectStore(f.t).client()).PresignGetObject(f.ctx,
		&s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)}, s3.WithPresignExpires(ttl))
	require.NoError(f.t, err)
	return req.URL
}

// objectStoreCAKey is the key of createObjectStoreCASecret's Secret.
const objectStoreCAKey = "ca.crt"

// createObjectStoreCASecret creates Secret name in the fixture's namespace
// holding the store's CA as ca.crt, for a pod to mount.
func (f *fixture) createObjectStoreCASecret(name string) {
	f.t.Helper()
	require.NoError(f.t, f.c.Create(f.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Data:       map[string][]byte{objectStoreCAKey: f.objectStore(f.t).CAPEM},
	}))
}

// allowObjectStore creates NetworkPolicy name in the fixture's namespace
// that lets the pods of podLabels connect to the store. A run's own policy
// lets its workers reach the API server, the database and DNS only;
// NetworkPolicies add up, so this one opens the store to them.
func (f *fixture) allowObjectStore(name string, podLabels map[string]string) {
	f.t.Helper()
	store := f.objectStore(f.t)
	u, err := url.Parse(store.Endpoint)
	require.NoError(f.t, err)
	port := u.Port()
	if port == "" {
		port = "443"
	}
	require.NoError(f.t, f.c.Create(f.ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: podLabels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: u.Hostname() + "/32"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.Parse(port))}},
			}},
		},
	}))
}

// httpsProbe runs `smoke https URL /etc/ca/ca.crt` in a pod of the
// fixture's namespace with the labels given, Secret caSecret's ca.crt
// mounted at /etc/ca; it returns whether the GET succeeded (a 200 over TLS
// verified against that CA), and the pod's log.
func (f *fixture) httpsProbe(image, name string, labels map[string]string, caSecret, target string) (bool, string) {
	f.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name: "https", Image: image, Args: []string{"https", target, "/etc/ca/" + objectStoreCAKey},
				SecurityContext: restricted(),
				VolumeMounts:    []corev1.VolumeMount{{Name: "ca", MountPath: "/etc/ca", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: caSecret}}}},
		},
	}
	require.NoError(f.t, f.c.Create(f.ctx, pod))
	require.Eventually(f.t, func() bool {
		return f.c.Get(f.ctx, client.ObjectKeyFromObject(pod), pod) == nil &&
			(pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed)
	}, 2*time.Minute, 500*time.Millisecond, "pod %s finishes", name)
	out, err := f.kubectl("logs", name)
	require.NoError(f.t, err, out)
	f.t.Logf("pod %s (CA of Secret %s): %s: %s", name, caSecret, pod.Status.Phase, strings.TrimSpace(out))
	return pod.Status.Phase == corev1.PodSucceeded, out
}

// TestObjectStoreReachableFromPods: the cluster's object store, as the
// object batches' tests will use it. From the host, with the store's CA:
// a bucket made, an object put and read back. From a pod, at the same
// endpoint (a presigned GET of that object, no SDK in the pod): read over
// TLS verified against the store's CA, mounted from a Secret, under a
// NetworkPolicy that denies every other egress (allowObjectStore opens the
// store; without it the pod gets no connection); with another CA (the Kubernetes cluster's) the same GET is
// refused by the pod's TLS client: certificate signed by unknown authority.
func TestObjectStoreReachableFromPods(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "s3", 0)
	store := f.objectStore(t)
	require.True(t, strings.HasPrefix(store.Endpoint, "https://"), store.Endpoint)

	bucket := f.newBucket()
	const key = "exports/2026-06-30/smoke.jsonl"
	body := []byte(`{"entity":"acct-1","occurrence":"1"}` + "\n")
	etag := f.putObject(bucket, key, body)
	out, err := store.client().GetObject(f.ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), IfMatch: aws.String(etag)})
	require.NoError(t, err)
	got, err := io.ReadAll(out.Body)
	require.NoError(t, out.Body.Close())
	require.NoError(t, err)
	require.Equal(t, body, got, "read back from the host")

	// From the host, a client without the store's CA is refused too.
	_, err = store.client(func(o *s3.Options) {
		o.RetryMaxAttempts = 1
		o.HTTPClient = awshttp.NewBuildableClient()
	}).HeadBucket(f.ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)})
	var unknown x509.UnknownAuthorityError
	require.True(t, errors.As(err, &unknown), "the system's roots do not verify the store: %v", err)

	image := f.pushSmoke()
	f.createObjectStoreCASecret("s3-ca")
	// Another CA: the Kubernetes cluster's, beside the store's.
	k8sCA, err := os.ReadFile(filepath.Join(filepath.Dir(store.CAFile), "ca.crt"))
	require.NoError(t, err)
	require.NotEqual(t, string(store.CAPEM), string(k8sCA))
	require.NoError(t, f.c.Create(f.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "wrong-ca"}, Data: map[string][]byte{objectStoreCAKey: k8sCA},
	}))

	// Every probe pod is denied all egress; allowObjectStore opens the
	// store to those labelled s3: allowed, and to no other.
	denied := map[string]string{"app": "s3-probe"}
	allowed := map[string]string{"app": "s3-probe", "s3": "allowed"}
	require.NoError(t, f.c.Create(f.ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "deny-egress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: denied},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		},
	}))
	f.allowObjectStore("allow-s3", map[string]string{"s3": "allowed"})

	presigned := f.presignGet(bucket, key, 10*time.Minute)
	require.True(t, strings.HasPrefix(presigned, store.Endpoint+"/"), "the pods read the endpoint the host does: %s", store.Endpoint)
	ok, log := f.httpsProbe(image, "s3-verified", allowed, "s3-ca", presigned)
	require.True(t, ok, "a pod reads the object over TLS verified against the store's CA: %s", log)
	require.Contains(t, log, "200 OK")
	require.Contains(t, log, string(bytes.TrimSpace(body)), "the object's content, as put from the host")
	require.Contains(t, log, "verified against /etc/ca/ca.crt")

	require.NotContains(t, log, "X-Amz-Signature", "the probe prints no signature")

	ok, log = f.httpsProbe(image, "s3-wrong-ca", allowed, "wrong-ca", presigned)
	require.False(t, ok, "another CA does not verify the store: %s", log)
	require.Contains(t, log, "x509: certificate signed by unknown authority")
	require.NotContains(t, log, "X-Amz-Signature", "the probe prints no signature")

	// Without allowObjectStore's policy the same pod gets no connection:
	// that policy is what opens the store.
	ok, log = f.httpsProbe(image, "s3-denied", denied, "s3-ca", presigned)
	require.False(t, ok, "a pod denied egress does not reach the store: %s", log)
	require.Contains(t, log, "i/o timeout", "dropped by the node, not refused by the store")
}

package s3test_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/md5"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/s3test"
	"github.com/runledger/runledger/internal/testtier"
)

func TestMain(m *testing.M) { s3test.Main(m) }

// apiError is err's S3 error code and HTTP status, as the SDK reports them.
func apiError(t *testing.T, err error) (string, int) {
	t.Helper()
	require.Error(t, err)
	var api smithy.APIError
	require.True(t, errors.As(err, &api), "not an API error: %v", err)
	var resp *awshttp.ResponseError
	require.True(t, errors.As(err, &resp), "no HTTP response: %v", err)
	return api.ErrorCode(), resp.HTTPStatusCode()
}

// TestObjects: what the object batches will ask of a store, path-style
// with static credentials: a bucket, objects put, listed under a prefix a
// page at a time in key order, read back with the ETag they were put with
// (the MD5 of a single-part object), and read only while that ETag holds.
func TestObjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bucket := s3test.NewBucket(t)
	client := s3test.Client(t)

	objects := map[string]string{
		"exports/2026-06-30/b.csv": "entity,occurrence,amount\nacct-2,1,20\n",
		"exports/2026-06-30/a.csv": "entity,occurrence,amount\nacct-1,1,10\n",
		"exports/2026-07-01/c.csv": "entity,occurrence,amount\nacct-3,1,30\n",
		"other.jsonl":              `{"entity":"acct-4","occurrence":"1"}` + "\n",
	}
	etags := map[string]string{}
	for key, body := range objects {
		etags[key] = s3test.PutObject(t, bucket, key, []byte(body))
		sum := md5.Sum([]byte(body))
		require.Equal(t, `"`+hex.EncodeToString(sum[:])+`"`, etags[key], "the ETag of %s", key)
	}

	// Listed under the prefix, one key a page: in key order, sizes and ETags as put.
	var keys []string
	var token *string
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		out, err := client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{
			Bucket: aws.String(bucket), Prefix: aws.String("exports/2026-06-30/"), MaxKeys: aws.Int32(1), ContinuationToken: token,
		})
		require.NoError(t, err)
		for _, o := range out.Contents {
			key := aws.ToString(o.Key)
			keys = append(keys, key)
			require.EqualValues(t, len(objects[key]), aws.ToInt64(o.Size), key)
			require.Equal(t, etags[key], aws.ToString(o.ETag), key)
		}
		if !aws.ToBool(out.IsTruncated) {
			break
		}
		token = out.NextContinuationToken
	}
	require.Equal(t, []string{"exports/2026-06-30/a.csv", "exports/2026-06-30/b.csv"}, keys)

	key := "exports/2026-06-30/a.csv"
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), IfMatch: aws.String(etags[key])})
	require.NoError(t, err)
	body, err := io.ReadAll(out.Body)
	require.NoError(t, out.Body.Close())
	require.NoError(t, err)
	require.Equal(t, objects[key], string(body))
	require.Equal(t, etags[key], aws.ToString(out.ETag))
	require.EqualValues(t, len(objects[key]), aws.ToInt64(out.ContentLength))

	// Replaced, the object has another ETag and a read pinned to the old one is refused.
	etag2 := s3test.PutObject(t, bucket, key, []byte(objects[key]+"acct-5,1,50\n"))
	require.NotEqual(t, etags[key], etag2)
	_, err = client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), IfMatch: aws.String(etags[key])})
	code, status := apiError(t, err)
	require.Equal(t, "PreconditionFailed", code)
	require.Equal(t, 412, status)
	head, err := client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	require.NoError(t, err)
	require.Equal(t, etag2, aws.ToString(head.ETag))
}

// TestRefused: the store checks the signature: a wrong secret is
// SignatureDoesNotMatch and an unknown access key InvalidAccessKeyId, both
// 403; a missing object is NoSuchKey (types.NoSuchKey), a missing bucket
// NoSuchBucket, both 404.
func TestRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bucket := s3test.NewBucket(t)
	s3test.PutObject(t, bucket, "a.jsonl", []byte("{}\n"))
	get := &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("a.jsonl")}

	for _, c := range []struct{ name, key, secret, code string }{
		{"wrong secret", s3test.AccessKey, s3test.SecretKey + "-wrong", "SignatureDoesNotMatch"},
		{"unknown key", "NOSUCHACCESSKEY", s3test.SecretKey, "InvalidAccessKeyId"},
	} {
		client := s3test.Client(t, func(o *s3.Options) {
			o.Credentials = credentials.NewStaticCredentialsProvider(c.key, c.secret, "")
		})
		_, err := client.GetObject(ctx, get)
		code, status := apiError(t, err)
		t.Logf("%s: %s %d: %v", c.name, code, status, err)
		require.Equal(t, c.code, code, c.name)
		require.Equal(t, 403, status, c.name)
		_, err = client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
		code, _ = apiError(t, err)
		require.Equal(t, c.code, code, c.name+", listing")
	}

	client := s3test.Client(t)
	_, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("missing.jsonl")})
	var noKey *types.NoSuchKey
	require.True(t, errors.As(err, &noKey), "want NoSuchKey, got %v", err)
	code, status := apiError(t, err)
	require.Equal(t, "NoSuchKey", code)
	require.Equal(t, 404, status)

	_, err = client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket + "-missing"), Key: aws.String("a.jsonl")})
	code, status = apiError(t, err)
	require.Equal(t, "NoSuchBucket", code)
	require.Equal(t, 404, status)
}

// TestTLS: the HTTPS endpoint serves the same store as the plain one, to a
// client that trusts the server's CA (given as its PEM or as its file, by
// address or by the name localhost); a client that trusts the system's
// roots, or another CA, is refused with x509's unknown authority, before
// any request is sent.
func TestTLS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := s3test.Get(t)
	require.True(t, strings.HasPrefix(srv.HTTPSEndpoint, "https://127.0.0.1:"), srv.HTTPSEndpoint)
	require.NotEqual(t, srv.Endpoint, srv.HTTPSEndpoint)
	fromFile, err := os.ReadFile(srv.CAFile)
	require.NoError(t, err)
	require.Equal(t, srv.CAPEM, fromFile)
	block, _ := pem.Decode(srv.CAPEM)
	require.NotNil(t, block)
	ca, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	require.True(t, ca.IsCA)

	bucket := s3test.NewBucket(t)
	etag := s3test.PutObject(t, bucket, "over-http.jsonl", []byte("{}\n"))

	// Trusting the CA: what was put over HTTP is read over HTTPS, and written.
	client := s3test.TLSClient(t)
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("over-http.jsonl")})
	require.NoError(t, err)
	body, err := io.ReadAll(out.Body)
	require.NoError(t, out.Body.Close())
	require.NoError(t, err)
	require.Equal(t, "{}\n", string(body))
	require.Equal(t, etag, aws.ToString(out.ETag))
	_, err = client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("over-https.jsonl"), Body: strings.NewReader("{}\n")})
	require.NoError(t, err)
	_, err = s3test.Client(t).HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("over-https.jsonl")})
	require.NoError(t, err, "written over HTTPS, seen over HTTP")

	// The name localhost, and a plain net/http client with the CA's file: verified too.
	byName := s3test.TLSClient(t, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(strings.Replace(srv.HTTPSEndpoint, "127.0.0.1", "localhost", 1))
	})
	_, err = byName.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)})
	require.NoError(t, err, "the certificate names localhost")
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(fromFile))
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := plain.Get(srv.HTTPSEndpoint + "/")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "an anonymous request, answered by S3 over verified TLS")

	// Not trusting the CA: refused, an x509 error, whatever the client trusts instead.
	other := x509.NewCertPool()
	require.True(t, other.AppendCertsFromPEM(otherCA(t)))
	for name, roots := range map[string]*x509.CertPool{"the system's roots": nil, "another CA": other} {
		client := s3test.Client(t, func(o *s3.Options) {
			o.BaseEndpoint = aws.String(srv.HTTPSEndpoint)
			o.RetryMaxAttempts = 1
			o.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
				tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
			})
		})
		_, err := client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)})
		require.Error(t, err, name)
		t.Logf("%s: %v", name, err)
		var unknown x509.UnknownAuthorityError
		require.True(t, errors.As(err, &unknown), "%s: want x509.UnknownAuthorityError, got %v", name, err)
		require.ErrorContains(t, err, "x509: certificate signed by unknown authority", name)
	}
}

// otherCA is the PEM of a self-signed CA that signed nothing.
func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestStartStop: a server of its own, started and stopped as Main does:
// how long each takes, the process gone by its PID, its files and /tmp's
// sockets removed.
func TestStartStop(t *testing.T) {
	t.Parallel()
	testtier.Needs(t, "SeaweedFS (make weed)")
	if _, err := s3test.Binary(); err != nil && os.Getenv(s3test.EnvRequire) != "1" {
		t.Skipf("s3test: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := s3test.Start(ctx)
	require.NoError(t, err)
	pid := srv.PID()
	t.Logf("weed (PID %d) stored and read its first object %s after its start", pid, srv.Ready.Round(time.Millisecond))

	_, err = srv.Client().ListBuckets(ctx, &s3.ListBucketsInput{})
	require.NoError(t, err)
	_, err = srv.TLSClient().ListBuckets(ctx, &s3.ListBucketsInput{})
	require.NoError(t, err)

	began := time.Now()
	require.NoError(t, srv.Stop())
	t.Logf("stopped in %s", time.Since(began).Round(time.Millisecond))
	_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
	require.True(t, os.IsNotExist(err), "weed (PID %d) still running", pid)
	files := srv.Files()
	require.Len(t, files, 5)
	for _, f := range files {
		_, err := os.Lstat(f)
		require.True(t, os.IsNotExist(err), "left behind: %s", f)
	}
}

// TestBinaryMissing: a weed that is not there is ErrNoBinary, on which the
// tests skip (fail with RUNLEDGER_S3_REQUIRE=1), naming the variable.
func TestBinaryMissing(t *testing.T) {
	t.Setenv(s3test.EnvWeed, filepath.Join(t.TempDir(), "weed"))
	_, err := s3test.Binary()
	require.ErrorIs(t, err, s3test.ErrNoBinary)
	require.ErrorContains(t, err, s3test.EnvWeed)
}

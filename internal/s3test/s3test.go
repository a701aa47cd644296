// Package s3test gives tests a real S3-compatible object store: one
// throwaway SeaweedFS per test binary (weed server: master, volume server,
// filer and S3 gateway in one process, every port on 127.0.0.1, its files
// in a temporary directory), a static identity (AccessKey, SecretKey,
// Region), path-style addressing, and a fresh bucket per test. Its S3 API
// is served over plain HTTP (Server.Endpoint) and over TLS
// (Server.HTTPSEndpoint, SeaweedFS' own HTTPS listener) with a certificate
// signed by a CA generated at start for this server alone (Server.CAPEM,
// Server.CAFile): a client given that CA verifies it (TLSClient), any
// other fails with x509's "certificate signed by unknown authority".
//
// The weed binary is built pinned from the Go module proxy (make weed:
// bin/weed-VERSION; hack/tools/seaweedfs pins it); RUNLEDGER_S3_WEED names
// another. Under go test -short every entry point skips (testtier.Needs).
// Without -short and without the binary the tests skip, saying how to
// build it, unless RUNLEDGER_S3_REQUIRE=1 (make test sets it, and builds
// the binary first): then they fail.
//
//	func TestMain(m *testing.M) { s3test.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		bucket := s3test.NewBucket(t) // empty, this test's own
//		etag := s3test.PutObject(t, bucket, "2026-06-30/a.csv", data)
//		client := s3test.Client(t)
//		srv := s3test.Get(t) // srv.HTTPSEndpoint, srv.CAPEM, srv.CAFile
//		tlsClient := s3test.TLSClient(t) // trusts srv.CAPEM only
//	}
package s3test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/runledger/runledger/internal/testtier"
)

// EnvRequire, set to 1, makes a missing weed binary fail the tests
// instead of skipping them (make test and CI set it).
const EnvRequire = "RUNLEDGER_S3_REQUIRE"

var (
	once     sync.Once
	server   *Server
	setupErr error
	prefix   = fmt.Sprintf("rltest-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	counter  atomic.Int64
)

// Main runs the test binary's tests and stops the server afterwards (it
// starts lazily, at the first test that asks for it). Call it from
// TestMain: func TestMain(m *testing.M) { s3test.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if err := Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "s3test: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Stop stops the server this process started, if any. A TestMain that is
// not Main's calls it after m.Run: a server left running is killed when
// the test binary exits, and its files stay.
func Stop() error {
	if server == nil {
		return nil
	}
	if err := server.Stop(); err != nil {
		return fmt.Errorf("stopping weed: %w", err)
	}
	return nil
}

// Get returns this test binary's server, starting it if needed; it skips
// the test under -short, and without the weed binary unless EnvRequire is
// set.
func Get(t testing.TB) *Server {
	t.Helper()
	testtier.Needs(t, "SeaweedFS (make weed)")
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		server, setupErr = Start(ctx)
		if setupErr == nil {
			fmt.Fprintf(os.Stderr, "s3test: weed ready at %s in %s\n", server.Endpoint, server.Ready.Round(time.Millisecond))
		}
	})
	if setupErr != nil {
		if errors.Is(setupErr, ErrNoBinary) && os.Getenv(EnvRequire) != "1" {
			t.Skipf("s3test: %v (%s=1 fails instead)", setupErr, EnvRequire)
		}
		t.Fatalf("s3test: no S3 server: %v", setupErr)
	}
	return server
}

// Client is an S3 client of this binary's server (Server.Client).
func Client(t testing.TB, opts ...func(*s3.Options)) *s3.Client {
	t.Helper()
	return Get(t).Client(opts...)
}

// TLSClient is an S3 client of this binary's server over TLS
// (Server.TLSClient): its HTTPS endpoint, trusting its CA and no other.
func TLSClient(t testing.TB, opts ...func(*s3.Options)) *s3.Client {
	t.Helper()
	return Get(t).TLSClient(opts...)
}

// NewBucket creates an empty bucket of a new name for this test, deleted
// with whatever it holds when the test ends.
func NewBucket(t testing.TB) string {
	t.Helper()
	client := Client(t)
	name := fmt.Sprintf("%s-%d", prefix, counter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("s3test: creating bucket %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The server deletes a bucket that is not empty (-s3.allowDeleteBucketNotEmpty).
		if _, err := client.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(name)}); err != nil {
			t.Logf("s3test: deleting bucket %s: %v", name, err)
		}
	})
	return name
}

// PutObject writes body as bucket's object key and returns its ETag, as the
// server gives it (quoted).
func PutObject(t testing.TB, bucket, key string, body []byte) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := Client(t).PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body),
	})
	if err != nil {
		t.Fatalf("s3test: putting s3://%s/%s: %v", bucket, key, err)
	}
	return aws.ToString(out.ETag)
}

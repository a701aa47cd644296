package s3test_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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

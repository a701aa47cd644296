package clitest

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/s3test"
)

// s3Env is the environment of a user whose AWS credentials are the test
// store's (the standard chain's variables), with the instance metadata
// service off: no test reaches for a link-local address.
func s3Env(access, secret string) []string {
	return []string{"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
}

func objectManifest(name, endpoint, bucket, where string) string {
	return manifest(name, "batch:", "  object:", "    endpoint: "+endpoint, "    bucket: "+bucket, "    "+where, "    format: CSV", "workers: 2")
}

// TestRunObjectBatch: `runledger run` reads spec.batch.object with the
// user's own credentials (the AWS chain), fixes it once, and a second run
// of the same name counts its own rows; a refused credential is bad input
// at once (exit 2) that names the object and no secret, with nothing
// committed.
func TestRunObjectBatch(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	srv := s3test.Get(t)
	bucket := s3test.NewBucket(t)
	var b bytes.Buffer
	b.WriteString("entity,occurrence,amount\n")
	for i := range 500 {
		fmt.Fprintf(&b, "acct-%d,2026-06,%d\n", i%400, i)
	}
	s3test.PutObject(t, bucket, "exports/2026-06-30/invoices.csv", b.Bytes())
	file := writeFile(t, "run.yaml", objectManifest("june-export", srv.Endpoint, bucket, "key: exports/2026-06-30/invoices.csv"))

	r := runCLIEnv(t, s3Env(s3test.AccessKey, s3test.SecretKey), "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 500, Completed: 400, AlreadyHandled: 100}, r.summary(t).counts())
	require.EqualValues(t, 400, d.committed(t))
	require.Contains(t, r.stderr, "s3://"+bucket+"/exports/2026-06-30/invoices.csv")

	r = runCLIEnv(t, s3Env(s3test.AccessKey, s3test.SecretKey), "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 500, Completed: 400, AlreadyHandled: 100}, r.summary(t).counts(), "the run again: its own rows count as completed")

	other := writeFile(t, "other.yaml", objectManifest("june-export-again", srv.Endpoint, bucket, "key: exports/2026-06-30/invoices.csv"))
	const wrong = "not-the-secret-key-at-all"
	r = runCLIEnv(t, s3Env(s3test.AccessKey, wrong), "", "run", "-f", other, "--dsn", d.dsn, "--output", "json")
	require.Equal(t, 2, r.code, "a refused credential is bad input; stderr:\n%s", r.stderr)
	s := r.summary(t)
	require.Contains(t, s.Error, "s3://"+bucket+"/exports/2026-06-30/invoices.csv")
	require.Contains(t, s.Error, "the credentials may not read it")
	for _, out := range []string{r.stdout, r.stderr} {
		require.NotContains(t, out, wrong)
		require.NotContains(t, out, s3test.SecretKey)
	}
	require.EqualValues(t, 400, d.committed(t), "nothing more committed")
	require.Zero(t, d.int(t, `SELECT count(*) FROM runledger.batch_run WHERE run_name = 'june-export-again'`), "no batch fixed")
}

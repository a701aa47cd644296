package clitest

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/procmem"
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

// TestRunObjectBatch_OneGiB: a 1 GiB object is fixed in bounded memory.
// `runledger run --shard 0/64` fixes the whole batch (every shard's items
// go into runledger.batch) and then processes shard 0's; its peak RSS (the
// kernel's VmHWM of the command itself) is within 64 MiB of the same
// command's on a 1 MiB object.
func TestRunObjectBatch_OneGiB(t *testing.T) {
	t.Parallel()
	small := fixObject(t, &s3test.Lines{N: 1 << 8, LineLen: 4 << 10})
	big := fixObject(t, &s3test.Lines{N: 1 << 18, LineLen: 4 << 10})
	require.Less(t, big-small, int64(64<<20), "peak RSS %d MiB fixing 1 GiB, %d MiB fixing 1 MiB", big>>20, small>>20)
}

// fixObject puts obj in a new bucket, fixes it with `runledger run --shard
// 0/64` and returns the command's peak RSS.
func fixObject(t *testing.T, obj *s3test.Lines) int64 {
	t.Helper()
	d := newDB(t)
	srv := s3test.Get(t)
	bucket := s3test.NewBucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	s3test.PutLines(t, bucket, "big.jsonl", obj)
	t.Logf("put %d MiB in %s", obj.Size()>>20, time.Since(start).Round(time.Millisecond))

	file := writeFile(t, "run.yaml", manifest("big", "batch:", "  object:", "    endpoint: "+srv.Endpoint, "    bucket: "+bucket,
		"    key: big.jsonl", "    format: JSONLines", "workers: 64"))
	cmd, stdout, stderr := command(ctx, "", "run", "-f", file, "--dsn", d.dsn, "--shard", "0/64", "--output", "json")
	cmd.Env = append(cmd.Env, s3Env(s3test.AccessKey, s3test.SecretKey)...)
	start = time.Now()
	rss, err := procmem.Run(cmd) // not getrusage's: it reports the test process's peak (procmem)
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	elapsed := time.Since(start)
	t.Logf("fixed %d MiB (%d items) and ran shard 0/64 in %s: peak RSS %d MiB", obj.Size()>>20, obj.N, elapsed.Round(time.Millisecond), rss>>20)

	sum := result{stdout: stdout.String(), stderr: stderr.String()}.summary(t)
	require.Positive(t, sum.Completed)
	require.Equal(t, sum.Total, sum.Completed)
	require.EqualValues(t, obj.N, d.int(t, `SELECT items FROM runledger.batch_run WHERE run_name = 'big'`), "the whole object is in the batch")
	require.EqualValues(t, obj.N, d.int(t, `SELECT sum(cardinality(seqs)) FROM runledger.batch`))
	return rss
}

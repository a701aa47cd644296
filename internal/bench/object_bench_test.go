package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/procmem"
	"github.com/runledger/runledger/internal/s3test"
)

// objectMiB is the size of the object BenchmarkObjectFix fixes
// (RUNLEDGER_BENCH_OBJECT_MIB overrides it for a quick look).
func objectMiB() int64 {
	if n, err := strconv.ParseInt(os.Getenv("RUNLEDGER_BENCH_OBJECT_MIB"), 10, 64); err == nil && n > 0 {
		return n
	}
	return 512
}

// objectShards: the fix writes every shard's items; the run then
// processes shard 0 of this many, a small part of the time.
const objectShards = 64

// BenchmarkObjectFix measures how fast a batch.object is fixed (issue #47:
// the first shard streams the object, checked line by line, into
// runledger.batch by COPY) against what a user's own client does with the
// same bytes: one GET of the object read to its end, from the same SeaweedFS
// on loopback. The fix is `runledger run --shard 0/64` of a JSON Lines
// object of 256-byte lines (the fix writes all 64 shards' items, then the
// run processes shard 0's 1/64); the faster of two repetitions each. It
// prints MiB/s of both, the ratio x(plain read), the items/s fixed and the
// command's peak RSS. No target: reading is bounded by the network and
// fixing by PostgreSQL's COPY.
func BenchmarkObjectFix(b *testing.B) {
	mib := objectMiB()
	bin := buildRunledger(b)
	srv := s3test.Get(b)
	bucket := s3test.NewBucket(b)
	obj := &s3test.Lines{N: mib << 20 / 256, LineLen: 256}
	s3test.PutLines(b, bucket, "export.jsonl", obj)
	var read, fix time.Duration
	var rss int64
	for range b.N {
		for rep := range workerReps {
			r := plainRead(b, bucket, "export.jsonl", obj.Size())
			f, peak := fixRun(b, bin, srv.Endpoint, bucket, fmt.Sprintf("fix-%d", rep))
			if rep == 0 || r < read {
				read = r
			}
			if rep == 0 || f < fix {
				fix = f
			}
			rss = max(rss, peak)
		}
	}
	rate := func(d time.Duration) float64 { return float64(obj.Size()) / (1 << 20) / d.Seconds() }
	b.ReportMetric(rate(fix)/rate(read), "x(plain)")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nbatch.object: a %d MiB JSON Lines object (%d items of 256 bytes) from SeaweedFS on loopback, fsync on, the faster of %d\n", mib, obj.N, workerReps)
	fmt.Fprintln(w, "what\ttime\tMiB/s\titems/s\tx(plain read)\tpeak RSS\t")
	fmt.Fprintf(w, "a plain client's GET, read to its end\t%s\t%.0f\t\t1.00\t\t\n", read.Round(time.Millisecond), rate(read))
	fmt.Fprintf(w, "runledger run --shard 0/%d: the fix (COPY into runledger.batch) and shard 0\t%s\t%.0f\t%.0f\t%.2f\t%d MiB\t\n", objectShards,
		fix.Round(time.Millisecond), rate(fix), float64(obj.N)/fix.Seconds(), rate(fix)/rate(read), rss>>20)
	_ = w.Flush()
}

// plainRead is one GET of the object read to its end.
func plainRead(b *testing.B, bucket, key string, size int64) time.Duration {
	b.Helper()
	start := time.Now()
	out, err := s3test.Client(b).GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, out.Body)
	_ = out.Body.Close()
	if err != nil || n != size {
		b.Fatalf("reading the object: %d of %d bytes: %v", n, size, err)
	}
	return time.Since(start)
}

// fixRun fixes the object as run name in a new database and returns the
// command's time and peak RSS.
func fixRun(b *testing.B, bin, endpoint, bucket, name string) (time.Duration, int64) {
	b.Helper()
	dsn := pgtest.NewDatabase(b)
	manifest := writeManifest(b, name, fmt.Sprintf("object: {endpoint: %q, bucket: %s, key: export.jsonl, format: JSONLines}", endpoint, bucket), objectShards, "")
	cmd := exec.Command(bin, "run", "-f", manifest, "--dsn", dsn, "--shard", "0/"+strconv.Itoa(objectShards), "--output", "json")
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+s3test.AccessKey, "AWS_SECRET_ACCESS_KEY="+s3test.SecretKey,
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	peak, err := procmem.Run(cmd) // not getrusage's: it reports this process's peak (procmem)
	elapsed := time.Since(start)
	if err != nil {
		b.Fatalf("runledger run: %v\n%s%s", err, out.Bytes(), errOut.Bytes())
	}
	var counts v1alpha1.ItemCounts
	if err := json.Unmarshal(out.Bytes(), &counts); err != nil || counts.Total == 0 || counts.Completed != counts.Total {
		b.Fatalf("runledger run: %+v %v\n%s", counts, err, out.Bytes())
	}
	return elapsed, peak
}

package worker_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/s3test"
	"github.com/runledger/runledger/internal/worker"
)

// objectSource is a source over bucket's key (or prefix, ending in "/"),
// signed with the test server's credentials.
func objectSource(t *testing.T, spec v1alpha1.ObjectSource) *worker.ObjectSource {
	t.Helper()
	srv := s3test.Get(t)
	if spec.Endpoint == "" {
		spec.Endpoint = srv.Endpoint
	}
	src := worker.NewObjectSource(spec, nil, "")
	src.UseCredentials(credentials.NewStaticCredentialsProvider(s3test.AccessKey, s3test.SecretKey, ""))
	return src
}

// jsonLines is n items e0..e(n-1) of occurrence o, payload {"i": i}.
func jsonLines(from, n int, o string) []byte {
	var b bytes.Buffer
	for i := from; i < from+n; i++ {
		fmt.Fprintf(&b, `{"entity":"e%d","occurrence":%q,"payload":{"i":%d}}`+"\n", i, o, i)
	}
	return b.Bytes()
}

// TestObjectSource_JSONLines: one object, repeats included, fixed once by
// the first shard and read by three; the counts are the ledger's, a rerun
// reports the same, and the header records what was read.
func TestObjectSource_JSONLines(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	bucket := s3test.NewBucket(t)
	data := append(jsonLines(0, 3000, "2026-06"), jsonLines(0, 200, "2026-06")...)
	etag := s3test.PutObject(t, bucket, "exports/june.jsonl", data)
	src := objectSource(t, v1alpha1.ObjectSource{Bucket: bucket, Key: "exports/june.jsonl", Format: v1alpha1.ObjectJSONLines})
	cfg := worker.ShardConfig{Run: run("uid-object"), Shards: 3, Source: src, ChunkSize: 97}

	_, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 3200, Completed: 3000, AlreadyHandled: 200}, sum)
	require.EqualValues(t, 3000, f.committed(t))
	require.EqualValues(t, 1500, queryInt(t, f.pool, `SELECT (payload->>'i')::int FROM runledger.ledger WHERE entity = 'e1500'`), "payload stored")

	objects, err := f.store.BatchObjects(context.Background(), "uid-object")
	require.NoError(t, err)
	require.Len(t, objects, 1)
	require.Equal(t, ledger.BatchObject{Key: "exports/june.jsonl", Size: int64(len(data)), ETag: etag, SHA256: sha256Of(data), VersionID: objects[0].VersionID}, objects[0])

	_, again := runShards(t, f, cfg)
	require.Equal(t, sum, again, "a rerun of the same run reports the same")
}

// TestObjectSource_PrefixOfManyObjects: every object under a prefix, in
// key order, CSV with a ';' delimiter, plain and gzip, a folder marker
// skipped; CSV's other columns are the payload's, as strings.
func TestObjectSource_PrefixOfManyObjects(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	bucket := s3test.NewBucket(t)
	s3test.PutObject(t, bucket, "drop/", nil)
	var want int
	for i := range 12 {
		var b strings.Builder
		b.WriteString("entity;occurrence;amount;note\n")
		for j := range 250 {
			fmt.Fprintf(&b, "acct-%d-%d;2026-06;%d.50;\"a; quoted \"\"note\"\"\"\n", i, j, j)
			want++
		}
		body := []byte(b.String())
		if i%2 == 1 {
			body = s3test.Gzip(t, body)
		}
		s3test.PutObject(t, bucket, fmt.Sprintf("drop/part-%02d.csv", i), body)
	}
	s3test.PutObject(t, bucket, "other/ignored.csv", []byte("entity;occurrence\nx;y\n"))
	src := objectSource(t, v1alpha1.ObjectSource{Bucket: bucket, Prefix: "drop/", Format: v1alpha1.ObjectCSV, CSVDelimiter: ";"})
	cfg := worker.ShardConfig{Run: run("uid-prefix"), Shards: 2, Source: src, ChunkSize: 500}

	_, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: int64(want), Completed: int64(want)}, sum)
	require.EqualValues(t, want, f.committed(t))
	var payload string
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT payload::text FROM runledger.ledger WHERE entity = 'acct-7-3'`).Scan(&payload))
	require.JSONEq(t, `{"amount": "3.50", "note": "a; quoted \"note\""}`, payload)

	objects, err := f.store.BatchObjects(context.Background(), "uid-prefix")
	require.NoError(t, err)
	require.Len(t, objects, 12, "the folder marker and the other prefix are not read")
	for i, o := range objects {
		require.Equal(t, fmt.Sprintf("drop/part-%02d.csv", i), o.Key, "in key order")
	}
}

func sha256Of(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// requireNothingFixed: the run committed nothing and has no batch.
func requireNothingFixed(t *testing.T, f *fixture, runUID string) {
	t.Helper()
	require.Zero(t, f.committed(t), "nothing committed")
	h, err := f.store.BatchHeader(context.Background(), runUID)
	require.NoError(t, err)
	require.Nil(t, h, "no batch fixed")
}

// TestObjectSource_BadInput: every bad object, and every refusal of the
// store that retrying cannot change, fails the run at once as bad input
// naming the object (and the line), with nothing committed or fixed.
func TestObjectSource_BadInput(t *testing.T) {
	t.Parallel()
	bucket := s3test.NewBucket(t)
	put := func(key, body string) string { s3test.PutObject(t, bucket, key, []byte(body)); return key }
	notS3 := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notS3.Close)
	ok := `{"entity":"a","occurrence":"o"}` + "\n"
	tests := []struct {
		name string
		spec v1alpha1.ObjectSource
		cred *credentials.StaticCredentialsProvider
		want []string
	}{
		{"invalid UTF-8", v1alpha1.ObjectSource{Key: put("utf8.jsonl", ok+"{\"entity\":\"a\xff\",\"occurrence\":\"o\"}\n"), Format: v1alpha1.ObjectJSONLines},
			nil, []string{"s3://" + bucket + "/utf8.jsonl", "line 2", "UTF-8"}},
		{"a field twice", v1alpha1.ObjectSource{Key: put("twice.jsonl", `{"entity":"a","entity":"b","occurrence":"o"}`), Format: v1alpha1.ObjectJSONLines},
			nil, []string{"twice.jsonl", "line 1", `"entity"`, "twice"}},
		{"a key part missing", v1alpha1.ObjectSource{Key: put("missing.jsonl", ok+`{"entity":"a"}`), Format: v1alpha1.ObjectJSONLines},
			nil, []string{"missing.jsonl", `line 2: field "occurrence" is missing`}},
		{"a CSV row of the wrong width", v1alpha1.ObjectSource{Key: put("wide.csv", "entity,occurrence\na,b\na,b,c\n"), Format: v1alpha1.ObjectCSV},
			nil, []string{"wide.csv", "record 3 (line 3) has 3 fields, the header 2"}},
		{"an unterminated quote", v1alpha1.ObjectSource{Key: put("quote.csv", "entity,occurrence\na,b\n\"a,b\nc,d\n"), Format: v1alpha1.ObjectCSV},
			nil, []string{"quote.csv", "record 3 (line 3) has a quoted field that is never closed"}},
		{"a missing bucket", v1alpha1.ObjectSource{Bucket: "rltest-no-such-bucket", Key: "a.jsonl", Format: v1alpha1.ObjectJSONLines},
			nil, []string{"s3://rltest-no-such-bucket/a.jsonl", "does not exist"}},
		{"a missing object", v1alpha1.ObjectSource{Key: "absent.jsonl", Format: v1alpha1.ObjectJSONLines},
			nil, []string{"absent.jsonl", "does not exist"}},
		{"an empty prefix", v1alpha1.ObjectSource{Prefix: "nothing/", Format: v1alpha1.ObjectJSONLines},
			nil, []string{"s3://" + bucket + "/nothing/ holds no object"}},
		{"a wrong secret key", v1alpha1.ObjectSource{Key: put("ok.jsonl", ok), Format: v1alpha1.ObjectJSONLines},
			ptrTo(credentials.NewStaticCredentialsProvider(s3test.AccessKey, "not-the-secret", "")), []string{"ok.jsonl"}},
		{"an unknown access key", v1alpha1.ObjectSource{Key: "ok.jsonl", Format: v1alpha1.ObjectJSONLines},
			ptrTo(credentials.NewStaticCredentialsProvider("NOSUCHKEY", "whatever", "")), []string{"ok.jsonl"}},
		{"an endpoint that is no S3", v1alpha1.ObjectSource{Endpoint: notS3.URL, Key: "ok.jsonl", Format: v1alpha1.ObjectJSONLines},
			nil, []string{"ok.jsonl", "does not exist"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if tt.spec.Bucket == "" {
				tt.spec.Bucket = bucket
			}
			src := objectSource(t, tt.spec)
			if tt.cred != nil {
				src.UseCredentials(*tt.cred)
			}
			uid := fmt.Sprintf("uid-bad-%d", i)
			rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run(uid), Shards: 1, Source: src})
			require.Error(t, rep.Err)
			require.True(t, worker.IsInputError(rep.Err), "bad input (exit 2), not retried: %v", rep.Err)
			for _, w := range tt.want {
				require.Contains(t, rep.Err.Error(), w)
			}
			require.NotContains(t, rep.Err.Error(), s3test.SecretKey, "no secret in the error")
			requireNothingFixed(t, f, uid)
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// twoObjects is a fresh ledger and a bucket holding in/a.jsonl and
// in/b.jsonl, 100 items each, read as one batch by prefix.
func twoObjects(t *testing.T) (*fixture, string, *worker.ObjectSource) {
	t.Helper()
	f := newFixture(t)
	bucket := s3test.NewBucket(t)
	s3test.PutObject(t, bucket, "in/a.jsonl", jsonLines(0, 100, "o"))
	s3test.PutObject(t, bucket, "in/b.jsonl", jsonLines(100, 100, "o"))
	return f, bucket, objectSource(t, v1alpha1.ObjectSource{Bucket: bucket, Prefix: "in/", Format: v1alpha1.ObjectJSONLines})
}

// TestObjectSource_ChangedAfterTheFix: once the first shard fixed the
// batch, an object replaced, added or removed under the run is refused by
// every later shard, naming it; the batch and what was committed stay.
func TestObjectSource_ChangedAfterTheFix(t *testing.T) {
	t.Parallel()
	for _, change := range []string{"replaced", "added", "removed"} {
		t.Run(change, func(t *testing.T) {
			t.Parallel()
			f, bucket, src := twoObjects(t)
			uid := "uid-changed-" + change
			cfg := worker.ShardConfig{Run: run(uid), Shards: 2, Source: src}
			rep := worker.RunShard(context.Background(), f.store, cfg)
			require.NoError(t, rep.Err)
			require.True(t, rep.Done)
			committed := f.committed(t)

			var name string
			switch change {
			case "replaced":
				name = "in/b.jsonl"
				s3test.PutObject(t, bucket, name, jsonLines(100, 101, "o"))
			case "added":
				name = "in/c.jsonl"
				s3test.PutObject(t, bucket, name, jsonLines(300, 1, "o"))
			case "removed":
				name = "in/a.jsonl"
				_, err := s3test.Client(t).DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: &bucket, Key: &name})
				require.NoError(t, err)
			}
			cfg.Run.Shard = 1
			rep = worker.RunShard(context.Background(), f.store, cfg)
			require.Error(t, rep.Err)
			require.True(t, worker.IsInputError(rep.Err), "bad input: %v", rep.Err)
			require.Contains(t, rep.Err.Error(), "s3://"+bucket+"/"+name+" was "+change)
			require.Contains(t, rep.Err.Error(), "since the run's first shard fixed its batch at ")
			require.Contains(t, rep.Err.Error(), "give the run a new name")
			require.Equal(t, committed, f.committed(t), "nothing more committed")
			h, err := f.store.BatchHeader(context.Background(), uid)
			require.NoError(t, err)
			require.EqualValues(t, 200, h.Items, "the fixed batch stays as it was read")
		})
	}
}

// TestObjectSource_FailedAttemptReportsTheLedgersRows: a shard whose first
// attempt committed part of its batch and stopped without a word (a pod
// killed), and whose next attempt fails before it counts anything (the
// object was replaced since the fix: bad input), reports what the ledger
// holds of the shard: its committed rows as completed, its fixed batch's
// items as its total. Counted as it was, a Failed run said nothing had
// been completed while the effects of 50 items were done.
func TestObjectSource_FailedAttemptReportsTheLedgersRows(t *testing.T) {
	t.Parallel()
	f, bucket, src := twoObjects(t)
	const uid = "uid-failed-attempt"
	cfg := worker.ShardConfig{Run: run(uid), Source: src, ChunkSize: 50}

	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	first := cfg
	first.Progress = func(worker.Report) {
		if calls++; calls == 2 { // after the first chunk
			cancel()
		}
	}
	rep := worker.RunShard(ctx, f.store, first)
	cancel()
	require.True(t, rep.Interrupted)
	require.EqualValues(t, 50, f.committed(t))

	s3test.PutObject(t, bucket, "in/b.jsonl", jsonLines(100, 101, "o"))
	cfg.Run.Attempt = 1
	rep = worker.RunShard(context.Background(), f.store, cfg)
	require.True(t, worker.IsInputError(rep.Err), "bad input: %v", rep.Err)
	require.False(t, rep.Done)
	require.EqualValues(t, 50, f.committed(t), "nothing more committed")
	require.Equal(t, v1alpha1.ItemCounts{Total: 200, Completed: 50}, rep.ItemCounts, "the ledger's rows of the shard, and its fixed batch")
	require.True(t, rep.TotalKnown)
}

// faultyStore is a proxy in front of the test store that answers 503 to
// its first unavailable requests, breaks off the body of the first cuts
// GETs of an object after 8 KiB, and stalls the next one's for a minute.
type faultyStore struct {
	unavailable, cuts, stalls atomic.Int32
	ranged, served503         atomic.Int32
}

func (fs *faultyStore) start(t *testing.T) string {
	t.Helper()
	target, err := url.Parse(s3test.Get(t).Endpoint)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target) // keeps the Host header the request was signed for
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fs.unavailable.Add(-1) >= 0 {
			fs.served503.Add(1)
			http.Error(w, "slow down", http.StatusServiceUnavailable)
			return
		}
		if r.Header.Get("Range") != "" {
			fs.ranged.Add(1)
		}
		if r.Method == http.MethodGet && !strings.Contains(r.URL.RawQuery, "list-type") {
			switch {
			case fs.cuts.Add(-1) >= 0:
				w = &cutWriter{ResponseWriter: w, left: 8 << 10}
			case fs.stalls.Add(-1) >= 0:
				w = &cutWriter{ResponseWriter: w, left: 8 << 10, stall: time.Minute, ctx: r.Context()}
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// cutWriter passes left bytes of a body on, then fails (the proxy then
// aborts the connection) or first stalls.
type cutWriter struct {
	http.ResponseWriter
	left  int
	stall time.Duration
	ctx   context.Context
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) <= c.left {
		c.left -= len(p)
		return c.ResponseWriter.Write(p)
	}
	n, _ := c.ResponseWriter.Write(p[:c.left])
	c.left = 0
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	if c.stall > 0 {
		select {
		case <-time.After(c.stall):
		case <-c.ctx.Done():
		}
	}
	return n, errors.New("cut")
}

// TestObjectSource_StoreFaults: a store that answers 503 is retried with
// back-off, a read that breaks off or stalls resumes where it stopped (a
// ranged GET of the same ETag), and the batch is whole: counts = ledger.
func TestObjectSource_StoreFaults(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	bucket := s3test.NewBucket(t)
	data := jsonLines(0, 20000, "o") // about 1 MiB
	s3test.PutObject(t, bucket, "in/big.jsonl", s3test.Gzip(t, data))
	s3test.PutObject(t, bucket, "in/plain.jsonl", jsonLines(20000, 5000, "o"))
	fs := &faultyStore{}
	fs.unavailable.Store(6) // more than the client's own 3 attempts
	fs.cuts.Store(2)
	fs.stalls.Store(1)
	src := objectSource(t, v1alpha1.ObjectSource{Endpoint: fs.start(t), Bucket: bucket, Prefix: "in/", Format: v1alpha1.ObjectJSONLines})
	src.UseIdleTimeout(time.Second)
	cfg := worker.ShardConfig{Run: run("uid-faults"), Shards: 2, Source: src, Retry: worker.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}}

	_, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 25000, Completed: 25000}, sum)
	require.EqualValues(t, 25000, f.committed(t))
	require.EqualValues(t, 6, fs.served503.Load())
	require.GreaterOrEqual(t, fs.ranged.Load(), int32(3), "each broken read resumed with a range")
}

// TestObjectSource_RandomBatches: random batches (keys repeated, some held
// by an earlier run, some occurrences the run's placeholder; a key's payload
// the same in every copy) split over a
// random number of objects, JSON Lines or CSV, some compressed, read by a
// random number of shards: every item has one verdict, the counts are the
// ledger's, and every item counted as already handled has its holder row.
func TestObjectSource_RandomBatches(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	for round := range 4 {
		t.Run(fmt.Sprintf("round-%d", round), func(t *testing.T) {
			f := newFixture(t)
			bucket := s3test.NewBucket(t)
			csv := rng.IntN(2) == 0
			type key struct{ e, o string }
			var items []key
			for range 200 + rng.IntN(1500) {
				k := key{fmt.Sprintf("acct-%d", rng.IntN(900)), []string{"2026-06", "2026-07", v1alpha1.OccurrencePlaceholder}[rng.IntN(3)]}
				items = append(items, k)
			}
			resolved := func(k key) ledger.Key {
				return ledger.Key{Entity: k.e, Occurrence: strings.ReplaceAll(k.o, v1alpha1.OccurrencePlaceholder, "2026-08")}
			}
			// An earlier run holds some keys.
			var held []ledger.Item
			heldKeys := map[ledger.Key]bool{}
			for _, k := range items {
				if rk := resolved(k); rng.IntN(5) == 0 && !heldKeys[rk] {
					heldKeys[rk] = true
					held = append(held, ledger.Item{Key: rk, Payload: []byte(`{"n":"` + k.e + `"}`)})
				}
			}
			if len(held) > 0 {
				rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run(fmt.Sprintf("uid-earlier-%d", round)), Shards: 1,
					Source: worker.NewStaticSource("earlier", held)})
				require.NoError(t, rep.Err)
			}
			objects := 1 + rng.IntN(6)
			for o := range objects {
				var b strings.Builder
				if csv {
					b.WriteString("occurrence,entity,n\n")
				}
				for i := o; i < len(items); i += objects {
					if csv {
						fmt.Fprintf(&b, "%s,%s,%s\n", items[i].o, items[i].e, items[i].e)
					} else {
						fmt.Fprintf(&b, `{"entity":%q,"occurrence":%q,"payload":{"n":%q}}`+"\n", items[i].e, items[i].o, items[i].e)
					}
				}
				body := []byte(b.String())
				if rng.IntN(2) == 0 {
					body = s3test.Gzip(t, body)
				}
				s3test.PutObject(t, bucket, fmt.Sprintf("in/%03d", o), body)
			}
			format := v1alpha1.ObjectJSONLines
			if csv {
				format = v1alpha1.ObjectCSV
			}
			src := worker.NewObjectSource(v1alpha1.ObjectSource{Endpoint: s3test.Get(t).Endpoint, Bucket: bucket, Prefix: "in/", Format: format}, nil, "2026-08")
			src.UseCredentials(credentials.NewStaticCredentialsProvider(s3test.AccessKey, s3test.SecretKey, ""))
			uid := fmt.Sprintf("uid-random-%d", round)
			cfg := worker.ShardConfig{Run: run(uid), Shards: 1 + rng.IntN(4), Source: src, ChunkSize: 1 + rng.IntN(300)}
			_, sum := runShards(t, f, cfg)

			distinct := map[ledger.Key]bool{}
			for _, k := range items {
				distinct[resolved(k)] = true
			}
			fresh := 0
			for k := range distinct {
				if !heldKeys[k] {
					fresh++
				}
			}
			require.Equal(t, v1alpha1.ItemCounts{Total: int64(len(items)), Completed: int64(fresh), AlreadyHandled: int64(len(items) - fresh)}, sum,
				"%d items, %d distinct, %d held before, %d shards", len(items), len(distinct), len(heldKeys), cfg.Shards)
			require.EqualValues(t, fresh, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, uid), "completed = the run's rows")
			require.EqualValues(t, len(distinct), queryInt(t, f.pool, `SELECT count(DISTINCT (entity, occurrence)) FROM runledger.ledger WHERE state = 'committed'`),
				"every key counted has its holder row, once")
			require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE occurrence LIKE '%OCCURRENCE%'`), "the placeholder was replaced")
		})
	}
}

// TestObjectSource_TLS: an https endpoint is verified, against the
// system's CAs and the run's CA bundle: with the store's CA the batch is
// read; without it the run is bad input at once, saying why and what to
// set, with nothing fixed.
func TestObjectSource_TLS(t *testing.T) {
	t.Parallel()
	srv := s3test.Get(t)
	bucket := s3test.NewBucket(t)
	s3test.PutObject(t, bucket, "june.jsonl", jsonLines(0, 50, "2026-06"))
	spec := v1alpha1.ObjectSource{Endpoint: srv.HTTPSEndpoint, Bucket: bucket, Key: "june.jsonl", Format: v1alpha1.ObjectJSONLines}
	creds := credentials.NewStaticCredentialsProvider(s3test.AccessKey, s3test.SecretKey, "")

	f := newFixture(t)
	src := worker.NewObjectSource(spec, srv.CAPEM, "")
	src.UseCredentials(creds)
	_, sum := runShards(t, f, worker.ShardConfig{Run: run("uid-tls"), Shards: 2, Source: src})
	require.Equal(t, v1alpha1.ItemCounts{Total: 50, Completed: 50}, sum)

	f = newFixture(t)
	src = worker.NewObjectSource(spec, nil, "")
	src.UseCredentials(creds)
	rep := worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-tls-unknown-ca"), Shards: 1, Source: src})
	require.Error(t, rep.Err)
	require.True(t, worker.IsInputError(rep.Err), "bad input, not retried: %v", rep.Err)
	require.Contains(t, rep.Err.Error(), "the endpoint's certificate does not verify (object.caConfigMapRef adds a CA)")
	requireNothingFixed(t, f, "uid-tls-unknown-ca")

	// A CA bundle that holds no certificate is refused as such.
	f = newFixture(t)
	src = worker.NewObjectSource(spec, []byte("not a certificate"), "")
	src.UseCredentials(creds)
	rep = worker.RunShard(context.Background(), f.store, worker.ShardConfig{Run: run("uid-tls-bad-ca"), Shards: 1, Source: src})
	require.True(t, worker.IsInputError(rep.Err), "bad input: %v", rep.Err)
	require.Contains(t, rep.Err.Error(), "caConfigMapRef")
	requireNothingFixed(t, f, "uid-tls-bad-ca")
}

// TestObjectSource_ReplacedWhileFixed: an object replaced between the
// listing and its read (the GET finds another ETag) makes the fix start
// over and read the new content, which the header then records.
func TestObjectSource_ReplacedWhileFixed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	bucket := s3test.NewBucket(t)
	s3test.PutObject(t, bucket, "in/a.jsonl", jsonLines(0, 100, "o"))
	var replaced atomic.Bool
	var newETag string
	target, err := url.Parse(s3test.Get(t).Endpoint)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/in/a.jsonl") && replaced.CompareAndSwap(false, true) {
			newETag = s3test.PutObject(t, bucket, "in/a.jsonl", jsonLines(0, 150, "o"))
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	src := objectSource(t, v1alpha1.ObjectSource{Endpoint: srv.URL, Bucket: bucket, Prefix: "in/", Format: v1alpha1.ObjectJSONLines})
	cfg := worker.ShardConfig{Run: run("uid-replaced-while-fixed"), Shards: 1, Source: src, Retry: worker.Backoff{Initial: 50 * time.Millisecond}}
	_, sum := runShards(t, f, cfg)
	require.True(t, replaced.Load())
	require.Equal(t, v1alpha1.ItemCounts{Total: 150, Completed: 150}, sum, "the new content, whole")
	objects, err := f.store.BatchObjects(context.Background(), "uid-replaced-while-fixed")
	require.NoError(t, err)
	require.Len(t, objects, 1)
	require.Equal(t, newETag, objects[0].ETag)
}

// TestObjectSource_OccurrenceInTheKey: $(OCCURRENCE) in a key or prefix is
// the run's spec.occurrence (a schedule's run reads that day's export); a
// run without one is bad input.
func TestObjectSource_OccurrenceInTheKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	bucket := s3test.NewBucket(t)
	s3test.PutObject(t, bucket, "exports/2026-06-29/a.jsonl", jsonLines(0, 10, "$(OCCURRENCE)"))
	s3test.PutObject(t, bucket, "exports/2026-06-30/a.jsonl", jsonLines(0, 30, "$(OCCURRENCE)"))
	pr := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Name: "daily", Namespace: "default", UID: "uid-daily"}, Spec: v1alpha1.ProcessingRunSpec{
		Occurrence: "2026-06-30",
		Batch: v1alpha1.BatchSpec{Object: &v1alpha1.ObjectSource{Endpoint: s3test.Get(t).Endpoint, Bucket: bucket,
			Prefix: "exports/$(OCCURRENCE)/", Format: v1alpha1.ObjectJSONLines}},
	}}
	plan, err := worker.NewPlan(context.Background(), pr, nil, worker.Limits{})
	require.NoError(t, err)
	plan.Source.(*worker.ObjectSource).UseCredentials(credentials.NewStaticCredentialsProvider(s3test.AccessKey, s3test.SecretKey, ""))
	_, sum := runShards(t, f, plan.ShardConfig(0, 0))
	require.Equal(t, v1alpha1.ItemCounts{Total: 30, Completed: 30}, sum, "the occurrence's objects")
	require.EqualValues(t, 30, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE occurrence = '2026-06-30'`))

	pr.Spec.Occurrence = ""
	_, err = worker.NewPlan(context.Background(), pr, nil, worker.Limits{})
	require.True(t, worker.IsInputError(err), "bad input: %v", err)
	require.ErrorContains(t, err, `spec.batch.object: field "prefix" names $(OCCURRENCE) and the run has no spec.occurrence to replace it with`)
}

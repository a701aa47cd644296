package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
	"github.com/runledger/runledger/pkg/processor"
)

// recorder is a processor over real HTTP that records every item of every
// call, and what it answered. Items whose occurrence ends in -fail are
// refused, -retry are asked to retry every time, -flaky the first time only.
type recorder struct {
	mu    sync.Mutex
	calls int
	sent  map[string]int // idempotency key -> times sent
	oks   map[string]int // idempotency key -> times answered ok
	keys  map[string]ledger.Key
	delay time.Duration
}

func newRecorder() *recorder {
	return &recorder{sent: map[string]int{}, oks: map[string]int{}, keys: map[string]ledger.Key{}}
}

func (r *recorder) handler() http.Handler {
	h := processor.Handler(func(_ context.Context, _ *processor.Request, it processor.Item) processor.Result {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.sent[it.Key]++
		r.keys[it.Key] = ledger.Key{Entity: it.Entity, Occurrence: it.Occurrence}
		switch {
		case strings.HasSuffix(it.Occurrence, "-fail"):
			return processor.Refuse(fmt.Errorf("card declined"))
		case strings.HasSuffix(it.Occurrence, "-retry"):
			return processor.Retry(fmt.Errorf("try later"))
		case strings.HasSuffix(it.Occurrence, "-flaky") && r.sent[it.Key] == 1:
			return processor.Retry(fmt.Errorf("busy"))
		}
		r.oks[it.Key]++
		return processor.OK()
	})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.calls++
		r.mu.Unlock()
		time.Sleep(r.delay)
		h.ServeHTTP(w, req)
	})
}

func (r *recorder) snapshot() (calls int, sent, oks map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sent, oks = map[string]int{}, map[string]int{}
	for k, v := range r.sent {
		sent[k] = v
	}
	for k, v := range r.oks {
		oks[k] = v
	}
	return r.calls, sent, oks
}

// fastRetry keeps the tests short: 4 attempts a few milliseconds apart.
var fastRetry = worker.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond, MaxAttempts: 4, MaxElapsed: time.Minute}

func processorConfig(uid, url string, items []ledger.Item, timeout time.Duration) worker.ShardConfig {
	return worker.ShardConfig{
		Run: run(uid), Shards: 1, Source: worker.NewStaticSource("items", items), ChunkSize: 10,
		Processor: worker.NewHTTPProcessor(url, timeout), Retry: fastRetry, MaxFailedItems: 1 << 30,
	}
}

func occItems(occurrences ...string) []ledger.Item {
	out := make([]ledger.Item, len(occurrences))
	for i, o := range occurrences {
		out[i] = ledger.Item{Key: ledger.Key{Entity: "acct", Occurrence: o}, Payload: json.RawMessage(`{"amount": 1}`)}
	}
	return out
}

// TestProcessor_MixedResults: ok items commit, refused ones fail with the
// processor's text, a retryable one is sent again after the back-off (and
// commits if it then succeeds, fails once the retries are spent); a rerun
// of the run sends nothing; another run sends only the keys still free.
func TestProcessor_MixedResults(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec := newRecorder()
	srv := httptest.NewServer(rec.handler())
	defer srv.Close()
	items := occItems("1", "2-fail", "3", "4-retry", "5-flaky", "6", "6") // 6 twice: a repeat
	cfg := processorConfig("uid-mixed", srv.URL, items, 5*time.Second)

	reports, sum := runShards(t, f, cfg)
	require.Equal(t, v1alpha1.ItemCounts{Total: 7, Completed: 4, AlreadyHandled: 1, Failed: 2}, sum, "%+v", reports[0].Failures)
	require.EqualValues(t, 4, f.committed(t), "completed == committed rows")
	failures := map[string]string{}
	for _, fl := range reports[0].Failures {
		failures[fl.Occurrence] = fl.Error
	}
	require.Equal(t, map[string]string{"2-fail": "processor: card declined", "4-retry": "processor: try later (retryable)"}, failures)

	key := func(o string) string {
		return worker.IdempotencyKey(ledger.Key{Entity: "acct", Occurrence: o}, 0)
	}
	_, sent, oks := rec.snapshot()
	require.Equal(t, 1, sent[key("1")], "an accepted item is sent once")
	require.Equal(t, 1, sent[key("2-fail")], "a refused item is not retried")
	require.Equal(t, fastRetry.MaxAttempts, sent[key("4-retry")], "a retryable item is sent until the retries are spent")
	require.Equal(t, 2, sent[key("5-flaky")])
	require.Equal(t, 1, sent[key("6")], "a repeat is never sent")
	for k, n := range oks {
		require.Equal(t, 1, n, "key %s accepted once", k)
	}

	// The same run again: its rows count as completed and are not sent;
	// only the failed items, never committed, are sent again.
	_, again := runShards(t, f, cfg)
	require.Equal(t, sum, again)
	_, sentAgain, _ := rec.snapshot()
	for _, o := range []string{"1", "3", "5-flaky", "6"} {
		require.Equal(t, sent[key(o)], sentAgain[key(o)], "%s, committed, is not sent again", o)
	}
	require.Equal(t, 2, sentAgain[key("2-fail")])

	// Another run: the committed keys are already handled and not sent; a
	// failed one is sent with the same key as before (the same work).
	_, other := runShards(t, f, processorConfig("uid-other", srv.URL, items, 5*time.Second))
	require.Equal(t, v1alpha1.ItemCounts{Total: 7, AlreadyHandled: 5, Failed: 2}, other)
	_, sentOther, _ := rec.snapshot()
	for _, o := range []string{"1", "3", "5-flaky", "6"} {
		require.Equal(t, sentAgain[key(o)], sentOther[key(o)], "%s, committed by another run, is not sent", o)
	}
	require.Equal(t, 3, sentOther[key("2-fail")])
}

// TestProcessor_CallFails: whatever breaks the call as a whole, nothing of
// it commits, the call is retried with back-off, and its items are then
// Failed with the processor's error text (cut to a bounded length). The
// same run later, with the processor fixed, completes them.
func TestProcessor_CallFails(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 2000)
	tests := []struct {
		name    string
		handler http.HandlerFunc
		timeout time.Duration
		want    string
	}{
		{"500", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) }, 5 * time.Second,
			"500 Internal Server Error: boom"},
		{"500 with a long body", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, long, http.StatusBadGateway) }, 5 * time.Second,
			"502 Bad Gateway: " + v1alpha1.Truncate(long, worker.MaxProcessorErrorBytes)},
		{"hangs past the timeout", func(_ http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // the server then notices the client hanging up
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
		}, 100 * time.Millisecond,
			"no answer within the timeout of 100ms"},
		{"closes the connection", func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}, 5 * time.Second, "EOF"},
		{"wrong number of results", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"results": [{"ok": true}]}`))
		}, 5 * time.Second, "1 results for 3 items"},
		{"malformed body", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"results": [`)) }, 5 * time.Second,
			"malformed answer"},
		{"no results", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{}`)) }, 5 * time.Second,
			`malformed answer: no "results"`},
		// Issue #20.5: an answer is read as written, or refused.
		{"results given twice", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"results": [{"error": "no"}, {"error": "no"}, {"error": "no"}], "results": [{"ok": true}, {"ok": true}, {"ok": true}]}`))
		}, 5 * time.Second, `malformed answer: /results is given twice`},
		{"ok given twice", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"results": [{"ok": false, "ok": true}, {"ok": true}, {"ok": true}]}`))
		}, 5 * time.Second, `malformed answer: /results/0/ok is given twice`},
		{"lone surrogate", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"results": [{"ok": true}, {"ok": true}, {"error": "\ud800"}]}`))
		}, 5 * time.Second, `malformed answer: /results/2/error holds a lone UTF-16 surrogate escape`},
		{"invalid UTF-8", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("{\"results\": [{\"ok\": true}, {\"ok\": true}, {\"error\": \"\xff\"}]}"))
		}, 5 * time.Second, `malformed answer: /results/2/error holds invalid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			var mu sync.Mutex
			calls := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				calls++
				mu.Unlock()
				tt.handler(w, r)
			}))
			defer srv.Close()
			items := occItems("1", "2", "3")
			reports, sum := runShards(t, f, processorConfig("uid-broken", srv.URL, items, tt.timeout))
			require.Equal(t, v1alpha1.ItemCounts{Total: 3, Failed: 3}, sum)
			require.Zero(t, f.committed(t), "nothing of a failed call commits")
			require.Len(t, reports[0].Failures, 3)
			for _, fl := range reports[0].Failures {
				require.Contains(t, fl.Error, "calling the processor: POST "+srv.URL)
				require.Contains(t, fl.Error, tt.want)
				require.LessOrEqual(t, len(fl.Error), worker.MaxProcessorErrorBytes+200, "the processor's text is cut")
			}
			mu.Lock()
			require.Equal(t, fastRetry.MaxAttempts, calls, "the call is retried with back-off")
			mu.Unlock()

			rec := newRecorder()
			fixed := httptest.NewServer(rec.handler())
			defer fixed.Close()
			_, sum = runShards(t, f, processorConfig("uid-broken", fixed.URL, items, 5*time.Second))
			require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 3}, sum)
			require.EqualValues(t, 3, f.committed(t))
		})
	}
}

// TestProcessor_RefusedConnection: no processor listening is a failed call
// like any other.
func TestProcessor_RefusedConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	reports, sum := runShards(t, f, processorConfig("uid-refused", url, occItems("1", "2"), time.Second))
	require.Equal(t, v1alpha1.ItemCounts{Total: 2, Failed: 2}, sum)
	require.Contains(t, reports[0].Failures[0].Error, "connection refused")
	require.Zero(t, f.committed(t))
}

// TestProcessor_OverlappingRuns: two runs over overlapping keys at once,
// several shards each, small chunks, one recording processor: no key is
// accepted twice, each key is committed once, and the runs' completed
// counts add up to the distinct keys.
func TestProcessor_OverlappingRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec := newRecorder()
	rec.delay = 2 * time.Millisecond // widen the window between claim and commit
	srv := httptest.NewServer(rec.handler())
	defer srv.Close()
	all := keyItems("acct", 300)
	a := append([]ledger.Item(nil), all[:200]...)
	b := append([]ledger.Item(nil), all[100:]...)
	cfgA := processorConfig("uid-a", srv.URL, a, 5*time.Second)
	cfgB := processorConfig("uid-b", srv.URL, b, 5*time.Second)
	cfgA.Shards, cfgB.Shards = 3, 2
	cfgA.ChunkSize, cfgB.ChunkSize = 7, 11

	var wg sync.WaitGroup
	var sumA, sumB v1alpha1.ItemCounts
	wg.Add(2)
	go func() { defer wg.Done(); _, sumA = runShards(t, f, cfgA) }()
	go func() { defer wg.Done(); _, sumB = runShards(t, f, cfgB) }()
	wg.Wait()

	require.Zero(t, sumA.Failed+sumB.Failed)
	require.EqualValues(t, 300, sumA.Completed+sumB.Completed, "each key completed by exactly one run")
	require.EqualValues(t, 100, sumA.AlreadyHandled+sumB.AlreadyHandled)
	require.EqualValues(t, 300, f.committed(t))
	_, sent, oks := rec.snapshot()
	perKey := map[ledger.Key]int{}
	for k, n := range oks {
		require.Equal(t, 1, n, "key %s accepted once", k)
		perKey[rec.keys[k]]++
	}
	require.Len(t, perKey, 300)
	for k, n := range perKey {
		require.Equal(t, 1, n, "business key %s processed successfully by one run only", k)
	}
	for k, n := range sent {
		require.Equal(t, 1, n, "key %s sent once: no call failed", k)
	}
	require.EqualValues(t, sumA.Completed, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE run_uid = 'uid-a' AND state = 'committed'`))

	// A rerun of either run sends nothing and writes nothing.
	calls, _, _ := rec.snapshot()
	writes := f.ledgerWrites(t)
	_, againA := runShards(t, f, cfgA)
	_, againB := runShards(t, f, cfgB)
	require.Equal(t, sumA, againA)
	require.Equal(t, sumB, againB)
	callsAfter, _, _ := rec.snapshot()
	require.Equal(t, calls, callsAfter, "a rerun sends nothing to the processor")
	require.Equal(t, writes, f.ledgerWrites(t), "and writes nothing")
}

// TestIdempotencyKey: at most 64 ASCII characters, a function of the
// business key and the generation it replaces only (never of a run), and
// different for another key or generation (also where a naive concatenation
// would collide).
func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	k := worker.IdempotencyKey(ledger.Key{Entity: "acct-1", Occurrence: "2026-01"}, 0)
	require.Len(t, k, processor.MaxKeyLength)
	for _, c := range k {
		require.Less(t, c, rune(128))
	}
	require.Equal(t, k, worker.IdempotencyKey(ledger.Key{Entity: "acct-1", Occurrence: "2026-01"}, 0))
	// Pinned (sha256 of "28:runledger.idempotency-key/v26:acct-17:2026-011:0"):
	// a processor's store outlives runledger's versions.
	require.Equal(t, "e1f2a5e17ab614e2d44bc54add39003504e4d5231004d76cf59426d2289e4e73", k)
	// A later generation's, scheme v3 (sha256 of
	// "28:runledger.idempotency-key/v36:acct-17:2026-011:1").
	require.Equal(t, "eb1bb37dbdf8600ae36fd53d7fe4f81cb10526dc607f9ebf474fb00427e6518a", worker.IdempotencyKey(ledger.Key{Entity: "acct-1", Occurrence: "2026-01"}, 1))
	for _, other := range []string{
		worker.IdempotencyKey(ledger.Key{Entity: "acct-1", Occurrence: "2026-01"}, 1),
		worker.IdempotencyKey(ledger.Key{Entity: "acct-2", Occurrence: "2026-01"}, 0),
		worker.IdempotencyKey(ledger.Key{Entity: "acct-12", Occurrence: "026-01"}, 0),
		worker.IdempotencyKey(ledger.Key{Entity: "acct-1", Occurrence: "2026-011"}, 0),
		worker.IdempotencyKey(ledger.Key{Entity: "acct-1", Occurrence: "2026-0"}, 11),
	} {
		require.NotEqual(t, k, other)
	}
}

// TestHTTPProcessor_URLPasswordNeverInErrors: a processor URL may carry
// credentials (`--processor-url http://user:password@host/...`); a failed
// call's error, which goes to logs, the shard's failures and the run's
// status, names the URL with its password masked.
func TestHTTPProcessor_URLPasswordNeverInErrors(t *testing.T) {
	t.Parallel()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer failing.Close()
	refused := httptest.NewServer(http.NotFoundHandler())
	refused.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://proc:s3cret-word@127.0.0.1:1/process?token=s3cret-word", http.StatusSeeOther)
	}))
	defer redirecting.Close()
	for name, base := range map[string]string{"500": failing.URL, "refused": refused.URL, "303": redirecting.URL} {
		t.Run(name, func(t *testing.T) {
			url := strings.Replace(base, "http://", "http://proc:s3cret-word@", 1) + "/process"
			p := worker.NewHTTPProcessor(url, 2*time.Second)
			_, err := p.Process(context.Background(), ledger.Run{UID: "uid"}, []ledger.Claim{{Item: ledger.Item{Key: ledger.Key{Entity: "e", Occurrence: "o"}}}})
			require.Error(t, err)
			require.NotContains(t, err.Error(), "s3cret-word")
			require.Contains(t, err.Error(), "proc:xxxxx@", "the URL is still named")
		})
	}
}

// allOK is a canned answer accepting three items, whoever asked.
const allOK = `{"results": [{"ok": true}, {"ok": true}, {"ok": true}]}`

// requireCallFailed: the three items of a call that failed as a whole every
// time are Failed, none committed, after every attempt of the back-off, each
// with an error holding want and none of secrets.
func requireCallFailed(t *testing.T, f *fixture, reports []worker.Report, sum v1alpha1.ItemCounts, calls int32, srvURL string, want []string, secrets ...string) {
	t.Helper()
	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Failed: 3}, sum, "%+v", reports[0].Failures)
	require.Zero(t, f.committed(t), "nothing of the call commits")
	require.Zero(t, queryInt(t, f.pool, `SELECT count(*) FROM runledger.ledger WHERE entity = 'acct'`), "nor stays claimed")
	require.EqualValues(t, fastRetry.MaxAttempts, calls, "a failed call: retried with back-off")
	require.Len(t, reports[0].Failures, 3)
	for _, fl := range reports[0].Failures {
		require.Contains(t, fl.Error, "calling the processor: POST "+srvURL)
		for _, w := range want {
			require.Contains(t, fl.Error, w)
		}
		for _, s := range secrets {
			require.NotContains(t, fl.Error, s)
		}
		require.Equal(t, ledger.ClassProcessorUnavailable, fl.Class)
	}
}

// TestProcessor_RedirectNotFollowed (issue #43.4): a processor that answers
// with a redirect fails the call, whatever the redirect's kind: the worker
// follows none, so no GET (a 303's) nor a POST to another server answers for
// the items, and nothing commits. The error names the status and the
// Location's host, never its credentials, path or query.
func TestProcessor_RedirectNotFollowed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		code     int
		relative bool // Location a path on the processor's own server
	}{
		{"301", http.StatusMovedPermanently, false},
		{"302", http.StatusFound, false},
		{"303", http.StatusSeeOther, false},
		{"307", http.StatusTemporaryRedirect, false},
		{"308", http.StatusPermanentRedirect, false},
		{"303 to a path of its own", http.StatusSeeOther, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			// elsewhere answers all ok to any method: a GET, body-less, too.
			var followed atomic.Int32
			elsewhere := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				followed.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				_, _ = io.WriteString(w, allOK)
			})
			other := httptest.NewServer(elsewhere)
			defer other.Close()
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/elsewhere" {
					elsewhere(w, r)
					return
				}
				calls.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				loc := strings.Replace(other.URL, "http://", "http://loc-user:loc-s3cret@", 1) + "/process?token=qs-s3cret"
				if tt.relative {
					loc = "/elsewhere?token=qs-s3cret"
				}
				http.Redirect(w, r, loc, tt.code)
			}))
			defer srv.Close()
			host := strings.TrimPrefix(other.URL, "http://")
			if tt.relative {
				host = strings.TrimPrefix(srv.URL, "http://")
			}

			reports, sum := runShards(t, f, processorConfig("uid-redirect", srv.URL+"/process", occItems("1", "2", "3"), 5*time.Second))
			requireCallFailed(t, f, reports, sum, calls.Load(), srv.URL+"/process",
				[]string{fmt.Sprintf("%d %s", tt.code, http.StatusText(tt.code)), "redirect", host},
				"s3cret", "loc-user", "/elsewhere")
			require.Zero(t, followed.Load(), "the redirect is not followed")
		})
	}
}

// TestProcessor_OnlyStatus200Commits (issue #43.4): the contract's answer is
// 200; another 2xx, even with a body of results accepting every item, fails
// the call and commits nothing. A 200 commits.
func TestProcessor_OnlyStatus200Commits(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNonAuthoritativeInfo,
		http.StatusNoContent, http.StatusResetContent, http.StatusPartialContent} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				_, _ = io.WriteString(w, allOK) // dropped by the server for a 204
			}))
			defer srv.Close()
			reports, sum := runShards(t, f, processorConfig("uid-status", srv.URL, occItems("1", "2", "3"), 5*time.Second))
			if code == http.StatusOK {
				require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 3}, sum)
				require.EqualValues(t, 3, f.committed(t))
				require.EqualValues(t, 1, calls.Load())
				return
			}
			requireCallFailed(t, f, reports, sum, calls.Load(), srv.URL,
				[]string{fmt.Sprintf("%d %s, not 200 OK", code, http.StatusText(code))})
		})
	}
}

// TestProcessor_AnswerEndsWithinTheLimit (issue #43.4): an answer is read
// whole, up to its end, within 16 MiB (docs/processors.md), or not at all.
// One that goes on past the limit fails the call, even when what comes
// before the limit is a valid answer accepting every item; one that ends
// within it is checked whole: one JSON value, then only white space.
func TestProcessor_AnswerEndsWithinTheLimit(t *testing.T) {
	t.Parallel()
	const limit = 16 << 20 // the contract's, docs/processors.md
	refuseAll := `{"results": [{"ok": false, "error": "no"}, {"ok": false, "error": "no"}, {"ok": false, "error": "no"}]}`
	tests := []struct {
		name          string
		body          string
		contentLength bool // sent with a Content-Length, else chunked
		want          string
	}{
		{"all ok, 17 MiB of blanks, a refusal", allOK + strings.Repeat(" ", 17<<20) + refuseAll, false, "the limit of 16 MiB"},
		{"the same with a Content-Length", allOK + strings.Repeat(" ", 17<<20) + refuseAll, true, "the limit of 16 MiB"},
		{"all ok, blanks to one byte past the limit", allOK + strings.Repeat(" ", limit+1-len(allOK)), false, "the limit of 16 MiB"},
		{"the same with a Content-Length", allOK + strings.Repeat("\n", limit+1-len(allOK)), true, "the limit of 16 MiB"},
		{"all ok, a few blanks, a refusal", allOK + "   " + refuseAll, false, "malformed answer: the JSON text holds more than one JSON value"},
		{"all ok, blanks to the limit", allOK + strings.Repeat(" ", limit-len(allOK)), false, ""},
		{"the same with a Content-Length", allOK + strings.Repeat("\t", limit-len(allOK)), true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				if tt.contentLength {
					w.Header().Set("Content-Length", strconv.Itoa(len(tt.body)))
				}
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			reports, sum := runShards(t, f, processorConfig("uid-limit", srv.URL, occItems("1", "2", "3"), 30*time.Second))
			if tt.want == "" {
				require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 3}, sum, "%+v", reports[0].Failures)
				require.EqualValues(t, 3, f.committed(t))
				return
			}
			requireCallFailed(t, f, reports, sum, calls.Load(), srv.URL, []string{tt.want})
		})
	}
}

// TestProcessor_ErrorsHideTheURLsSecrets: a processor URL's query may carry
// a token (?token=...) as much as its userinfo a password: no error of a
// call (an answer not 200, no answer, no answer in time) shows either; they
// show the URL with the query's values and the password masked.
func TestProcessor_ErrorsHideTheURLsSecrets(t *testing.T) {
	t.Parallel()
	slow := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-slow
		}
		http.Error(w, "nope", http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(slow) }) // first: Close waits for the slow handler
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	withSecrets := func(base, path string) string {
		return strings.Replace(base, "http://", "http://proc:pw-s3cret@", 1) + path + "?token=tok-s3cret&mode=fast#frag-s3cret"
	}
	// Only the call that must run out of time gets a short timeout: on a
	// busy host a prompt answer may take longer than that.
	for _, tc := range []struct {
		name, url, want string
		timeout         time.Duration
	}{
		{"answer not 200", withSecrets(srv.URL, "/process"), "500 Internal Server Error", time.Minute},
		{"no answer", withSecrets(closed.URL, "/process"), "connection refused", time.Minute},
		{"no answer in time", withSecrets(srv.URL, "/slow"), "no answer within the timeout", 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := worker.NewHTTPProcessor(tc.url, tc.timeout)
			_, err := p.Process(context.Background(), run("secrets"), []ledger.Claim{{Item: ledger.Item{Key: ledger.Key{Entity: "a", Occurrence: "b"}}}})
			require.Error(t, err)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "s3cret", "a secret of the URL is shown")
			require.Contains(t, err.Error(), "mode=xxxxx&token=xxxxx", "the query's names are kept, its values masked")
		})
	}
}

// TestIdempotencyKey_AsFormatted: the key is the hash of its parts as fmt
// wrote them ("%d:%s" each, the length in bytes), whatever the parts hold
// (non-ASCII, colons, digits, empty), for any generation: a processor's
// store outlives the way the worker computes the key.
func TestIdempotencyKey_AsFormatted(t *testing.T) {
	t.Parallel()
	formatted := func(k ledger.Key, generation int64) string {
		scheme := "runledger.idempotency-key/v2"
		if generation > 0 {
			scheme = "runledger.idempotency-key/v3"
		}
		h := sha256.New()
		for _, part := range []string{scheme, k.Entity, k.Occurrence, strconv.FormatInt(generation, 10)} {
			fmt.Fprintf(h, "%d:%s", len(part), part)
		}
		return hex.EncodeToString(h.Sum(nil))
	}
	parts := []string{"", "a", "acct-1", "2026-01", "12:3", "ünïcödé", "€", strings.Repeat("x", 1024), "0", ":", "\x00"}
	for _, e := range parts {
		for _, o := range parts {
			for _, g := range []int64{0, 1, 2, 10, 1 << 40} {
				k := ledger.Key{Entity: e, Occurrence: o}
				require.Equal(t, formatted(k, g), worker.IdempotencyKey(k, g), "%q %q %d", e, o, g)
			}
		}
	}
}

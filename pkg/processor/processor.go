// Package processor is the wire contract between a runledger worker and a
// processor (spec.effect.processor), and a tiny helper to write one in Go.
//
// The worker calls POST http://127.0.0.1:<port><path> with a Request (JSON)
// holding the items its chunk's transaction has just claimed, and expects
// 200 with a Response holding one Result per item, in the same order, its
// body ending within 16 MiB. A key commits only once its Result is ok; any
// other answer (another status, another 2xx and a redirect included: the
// worker follows none; a timeout, a malformed body or one past 16 MiB, a
// wrong number of results) commits nothing of the call, and its items are
// tried again with back-off, then Failed.
//
// Delivery is at least once, commit exactly once: only a crash or a timeout
// between an ok and the commit sends an item again, with the same Item.Key,
// whichever run (or renamed rerun of a failed run) sends it.
// Pass Item.Key on as an idempotency key (the Idempotency-Key header payment
// APIs take), or record it in your own store under a unique constraint.
package processor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/runledger/runledger/internal/strictjson"
)

// maxRequestBytes bounds a request Handler reads: a chunk of items with
// their payloads (the worker's own bound on an answer).
const maxRequestBytes = 256 << 20

// MaxKeyLength bounds Item.Key: ASCII, at most this many characters.
const MaxKeyLength = 64

// Run identifies the ProcessingRun the items belong to.
type Run struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// Item is one item to process.
type Item struct {
	// Key is the item's idempotency key: at most MaxKeyLength ASCII
	// characters naming the logical work, not the run. It is the same for
	// the same business key across retries, attempts and runs (a failed
	// run retried under a new name included), and another only for a
	// deliberate reprocessing: each onExisting: Supersede generation of the
	// key gets its own, the same across that generation's retries.
	Key        string          `json:"key"`
	Entity     string          `json:"entity"`
	Occurrence string          `json:"occurrence"`
	Payload    json.RawMessage `json:"payload,omitempty"`
}

// Request is the body of one call.
type Request struct {
	Run     Run    `json:"run"`
	Shard   int    `json:"shard"`
	Attempt int    `json:"attempt"`
	Items   []Item `json:"items"`
}

// Result is the answer for one item.
type Result struct {
	// OK: the item is processed; its key commits.
	OK bool `json:"ok"`
	// Retryable (with OK false): try the item again later in the run (with
	// back-off, then Failed).
	Retryable bool `json:"retryable,omitempty"`
	// Error says why the item was not processed (shown in the run's
	// failures).
	Error string `json:"error,omitempty"`
}

// Response is the body of a 200 answer: one Result per item, in order.
type Response struct {
	Results []Result `json:"results"`
}

// OK is the Result of a processed item.
func OK() Result { return Result{OK: true} }

// Refuse is the Result of an item that will not be processed: it is Failed.
func Refuse(err error) Result { return Result{Error: err.Error()} }

// Retry is the Result of an item to try again later in the run.
func Retry(err error) Result { return Result{Retryable: true, Error: err.Error()} }

// Func processes one item of a request.
type Func func(ctx context.Context, req *Request, item Item) Result

// Handler serves the contract: it decodes each request, calls fn for its
// items in order, and answers with their results. A body that does not
// decode strictly (a field given twice, invalid UTF-8 or a lone surrogate
// escape included) is answered 400 (the worker retries the call, then fails its
// items).
func Handler(fn Func) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "only POST", http.StatusMethodNotAllowed)
			return
		}
		var req Request
		body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
		switch {
		case err != nil:
			http.Error(w, fmt.Sprintf("reading the request: %v", err), http.StatusBadRequest)
			return
		case len(body) > maxRequestBytes:
			http.Error(w, "the request is too large", http.StatusRequestEntityTooLarge)
			return
		}
		// Strict, as the worker reads the answer: a field given twice,
		// invalid UTF-8 or a lone surrogate is refused, never rewritten.
		if err := strictjson.Unmarshal(body, &req, false); err != nil {
			http.Error(w, fmt.Sprintf("decoding the request: %v", err), http.StatusBadRequest)
			return
		}
		resp := Response{Results: make([]Result, len(req.Items))}
		for i, it := range req.Items {
			resp.Results[i] = fn(r.Context(), &req, it)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	})
}

// Command processor is an example processor for spec.effect.processor: it
// charges each item's amount through a payment service, passing the item's
// key on as the Idempotency-Key, so that an item delivered twice (a crash
// or a timeout between the processor's ok and the ledger's commit, retried
// by the same run or by a failed run's rerun under a new name: the key
// names the work, not the run) is charged once. A deliberate reprocessing
// (onExisting: Supersede) comes with a new key, and is charged again.
//
//	processor -listen :8080 -payments http://payments:8080
//
// Without -payments it only logs the items. -delay-answer holds each
// answer after the items were charged: a window in which a crash (the demo
// deletes the worker pod in it) leaves charged items uncommitted, so that
// they come again, with the same keys. With -serve-payments it is instead a
// tiny payment service (for the demo and the e2e test): POST /charge records
// each call by its Idempotency-Key, charges a key once and logs each call;
// GET /stats answers {"calls": N, "keys": N}.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/runledger/runledger/pkg/processor"
)

func main() {
	listen := flag.String("listen", ":8080", "address to listen on (all interfaces: the kubelet probes the port)")
	payments := flag.String("payments", os.Getenv("PAYMENTS_URL"), "base URL of the payment service (default $PAYMENTS_URL; empty: only log the items)")
	servePayments := flag.Bool("serve-payments", false, "be the example payment service instead")
	delay := flag.Duration("delay", 0, "wait this long per call (to watch a run, or kill a pod mid-run)")
	delayAnswer := flag.Duration("delay-answer", 0, "wait this long after charging a call's items before answering (a window to kill the worker pod between the charge and the commit)")
	flag.Parse()

	var h http.Handler
	if *servePayments {
		h = newPaymentService()
	} else {
		mux := http.NewServeMux()
		process := processor.Handler(charger{base: *payments, client: &http.Client{Timeout: 10 * time.Second}}.process)
		mux.Handle("POST /process", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(*delay)
			delayedAnswer(process, *delayAnswer).ServeHTTP(w, r)
		}))
		h = mux
	}
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	// A processor needs no Kubernetes credentials, and runledger mounts
	// none unless the run asks (automountServiceAccountToken).
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		log.Printf("a Kubernetes ServiceAccount token is mounted")
	} else {
		log.Printf("no Kubernetes ServiceAccount token mounted")
	}
	log.Printf("listening on %s", *listen)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// delayedAnswer is h, its answer held for d once h has done its work (or
// until the caller gives up).
func delayedAnswer(h http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held := &heldResponse{header: http.Header{}, status: http.StatusOK}
		h.ServeHTTP(held, r)
		log.Printf("answering in %s", d)
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			log.Printf("the caller went away before the answer: %v", context.Cause(r.Context()))
			return
		}
		for k, v := range held.header {
			w.Header()[k] = v
		}
		w.WriteHeader(held.status)
		_, _ = w.Write(held.body.Bytes())
	})
}

// heldResponse is an answer kept until it is sent.
type heldResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header         { return h.header }
func (h *heldResponse) WriteHeader(status int)      { h.status = status }
func (h *heldResponse) Write(b []byte) (int, error) { return h.body.Write(b) }

// charger processes an item by charging its payload's amount.
type charger struct {
	base   string
	client *http.Client
}

func (c charger) process(ctx context.Context, req *processor.Request, it processor.Item) processor.Result {
	if c.base == "" {
		log.Printf("run %s/%s shard %d: %s/%s key %s payload %s", req.Run.Namespace, req.Run.Name, req.Shard, it.Entity, it.Occurrence, it.Key, it.Payload)
		return processor.OK()
	}
	body, _ := json.Marshal(map[string]any{"account": it.Entity, "period": it.Occurrence, "payload": it.Payload})
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/charge", bytes.NewReader(body))
	if err != nil {
		return processor.Refuse(err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", it.Key)
	resp, err := c.client.Do(hreq)
	if err != nil {
		return processor.Retry(err) // the payment service may be back soon
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	switch {
	case resp.StatusCode < 300:
		return processor.OK()
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return processor.Retry(fmt.Errorf("payment service: %s: %s", resp.Status, bytes.TrimSpace(msg)))
	default:
		return processor.Refuse(fmt.Errorf("payment service: %s: %s", resp.Status, bytes.TrimSpace(msg)))
	}
}

// paymentService charges each Idempotency-Key once and counts every call.
type paymentService struct {
	mu    sync.Mutex
	calls int
	keys  map[string]int
}

func newPaymentService() http.Handler {
	s := &paymentService{keys: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charge", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, "no Idempotency-Key", http.StatusBadRequest)
			return
		}
		var charge struct{ Account, Period string }
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&charge)
		s.mu.Lock()
		s.calls++
		s.keys[key]++
		n := s.keys[key]
		s.mu.Unlock()
		replay := n > 1
		if replay {
			log.Printf("%s/%s Idempotency-Key %s: call %d of this key: already charged, not charged again", charge.Account, charge.Period, key, n)
		} else {
			log.Printf("%s/%s Idempotency-Key %s: charged", charge.Account, charge.Period, key)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"charged": !replay, "replay": replay})
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int{"calls": s.calls, "keys": len(s.keys)})
	})
	return mux
}

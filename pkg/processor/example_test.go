package processor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/runledger/runledger/pkg/processor"
)

// A processor that charges each invoice once: it passes the item's Key on
// as the payment API's idempotency key, refuses what can never succeed and
// asks for a retry of what may succeed later. The worker calls it as below.
func ExampleHandler() {
	charged := map[string]bool{} // the payment service's own record, by idempotency key
	h := processor.Handler(func(_ context.Context, _ *processor.Request, it processor.Item) processor.Result {
		switch it.Entity {
		case "acct-closed":
			return processor.Refuse(errors.New("account closed"))
		case "acct-busy":
			return processor.Retry(errors.New("payment service busy"))
		}
		if !charged[it.Key] {
			charged[it.Key] = true // charge(it.Payload, "Idempotency-Key: "+it.Key)
		}
		return processor.OK()
	})
	srv := httptest.NewServer(h)
	defer srv.Close()

	body := `{"run": {"namespace": "billing", "name": "june", "uid": "u1"}, "shard": 0, "attempt": 0, "items": [
		{"key": "k1", "entity": "acct-1", "occurrence": "2026-06", "payload": {"amount": 12.5}},
		{"key": "k2", "entity": "acct-closed", "occurrence": "2026-06"},
		{"key": "k3", "entity": "acct-busy", "occurrence": "2026-06"}]}`
	resp, err := http.Post(srv.URL+"/process", "application/json", strings.NewReader(body))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode)
	fmt.Print(string(out))
	// Output:
	// 200
	// {"results":[{"ok":true},{"ok":false,"error":"account closed"},{"ok":false,"retryable":true,"error":"payment service busy"}]}
}

// A request that does not decode is answered 400: the worker commits
// nothing of the call and tries it again.
func ExampleHandler_badRequest() {
	srv := httptest.NewServer(processor.Handler(func(context.Context, *processor.Request, processor.Item) processor.Result {
		return processor.OK()
	}))
	defer srv.Close()
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader("not json"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode)
	// Output: 400
}

// The three results a processor answers per item.
func ExampleResult() {
	for _, r := range []processor.Result{
		processor.OK(),
		processor.Refuse(errors.New("card declined")),
		processor.Retry(errors.New("rate limited")),
	} {
		fmt.Printf("ok=%t retryable=%t error=%q\n", r.OK, r.Retryable, r.Error)
	}
	// Output:
	// ok=true retryable=false error=""
	// ok=false retryable=false error="card declined"
	// ok=false retryable=true error="rate limited"
}

package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/redact"
	"github.com/runledger/runledger/internal/strictjson"
	"github.com/runledger/runledger/pkg/processor"
)

// MaxProcessorErrorBytes bounds a processor's error text kept with a failed
// item (its own per item, or a failed call's: a status line and body).
const MaxProcessorErrorBytes = 512

// maxProcessorResponseBytes bounds a processor's answer: one that does not
// end within it is no answer (docs/processors.md).
const maxProcessorResponseBytes = 16 << 20

// maxProcessorErrorBodyBytes bounds what is read of a failed call's body: it
// is shown cut to MaxProcessorErrorBytes anyway.
const maxProcessorErrorBodyBytes = 64 << 10

// IdempotencyKey is the key a processor gets for an item: it names the
// logical work, not the run that asks for it. It is the hex SHA-256 (64
// ASCII characters) of the business key and of the generation its claim
// commits (ledger.Claim.Generation: 0 for the key's first row), so it is
// the same for the same business key on every retry, attempt and run (a
// failed run given a new name included), and another only when a Supersede
// run deliberately reprocesses the key: each generation of the key's
// committed row gets its own, the same across that generation's retries,
// and across a database failover that lost it and the generations after.
//
// A first row's key is the one of scheme v2 (which named the replaced
// row's id, 0 for none); a later generation's names scheme v3, so that no
// v3 generation's key is a v2 key of another generation.
func IdempotencyKey(k ledger.Key, generation int64) string {
	scheme := "runledger.idempotency-key/v2"
	if generation > 0 {
		scheme = "runledger.idempotency-key/v3"
	}
	// Length-prefixed, so that no two different tuples hash alike; the
	// first part names the scheme. Each part is "<its length in bytes>:<it>"
	// (as fmt's "%d:%s" wrote them), appended to one buffer: a call of
	// 100 items computes 100 keys, and fmt took half of each key's time.
	var num [20]byte
	gen := strconv.AppendInt(num[:0], generation, 10)
	buf := make([]byte, 0, 64+len(k.Entity)+len(k.Occurrence))
	for _, part := range [...]string{scheme, k.Entity, k.Occurrence, string(gen)} {
		buf = strconv.AppendInt(buf, int64(len(part)), 10)
		buf = append(buf, ':')
		buf = append(buf, part...)
	}
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:])
}

// HTTPProcessor calls a processor over HTTP: POST URL with a
// processor.Request per call (the ledger splits a chunk into calls), each
// bounded by Timeout. Process is safe for concurrent calls.
type HTTPProcessor struct {
	URL     string
	Timeout time.Duration
	client  *http.Client
}

// NewHTTPProcessor returns a client of the processor at url.
func NewHTTPProcessor(rawURL string, timeout time.Duration) *HTTPProcessor {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil // the processor is the pod's own sidecar, or the user's on a laptop
	// A chunk's calls in flight each keep their connection for the next
	// chunk (the default keeps 2 idle, and closed the others after each call).
	t.MaxIdleConnsPerHost = v1alpha1.MaxCallsInFlight
	client := &http.Client{Transport: t, CheckRedirect: noRedirects}
	return &HTTPProcessor{URL: rawURL, Timeout: timeout, client: client}
}

// noRedirects hands a redirect back to Process, which fails the call: a
// followed 303 is a body-less GET whose answer would commit items no
// processor received, and a 307 would send them to a server not configured.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

var _ ledger.Processor = (*HTTPProcessor)(nil)

// Process sends items and returns the processor's verdicts. Every answer but
// a 200, not redirected, whose body is one JSON value with one result per
// item, ending within maxProcessorResponseBytes, is an error (the ledger
// makes it a transient *ledger.ProcessorError: nothing of the call commits).
func (p *HTTPProcessor) Process(ctx context.Context, run ledger.Run, items []ledger.Claim) ([]ledger.Verdict, error) {
	req := processor.Request{
		Run:     processor.Run{Namespace: run.Namespace, Name: run.Name, UID: run.UID},
		Shard:   run.Shard,
		Attempt: run.Attempt,
		Items:   make([]processor.Item, len(items)),
	}
	for i, it := range items {
		req.Items[i] = processor.Item{Key: IdempotencyKey(it.Key, it.Generation), Entity: it.Entity, Occurrence: it.Occurrence, Payload: it.Payload}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding the request: %w", err)
	}
	// Error texts name the URL with its password masked: they reach logs,
	// the shard's failures and the run's status.
	target, err := url.Parse(p.URL)
	if err != nil {
		return nil, errors.New("building the request: the processor's URL does not parse")
	}
	shown := shownURL(target)
	callCtx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(callCtx, http.MethodPost, p.URL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("building the request to %s: %w", shown, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(hreq)
	if err != nil {
		return nil, p.callError(ctx, shown, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %w", shown, answerStatusError(resp))
	}
	body, err = readAnswer(resp)
	if err != nil {
		return nil, p.callError(ctx, shown, err)
	}
	var out struct {
		Results *[]processor.Result `json:"results"`
	}
	// Strict: a field given twice, invalid UTF-8 or a lone surrogate is a
	// malformed answer, not one encoding/json reads its own way.
	if err := strictjson.Unmarshal(body, &out, false); err != nil {
		return nil, fmt.Errorf("POST %s: malformed answer: %w", shown, err)
	}
	if out.Results == nil {
		return nil, fmt.Errorf("POST %s: malformed answer: no \"results\"", shown)
	}
	if len(*out.Results) != len(items) {
		return nil, fmt.Errorf("POST %s: %d results for %d items", shown, len(*out.Results), len(items))
	}
	verdicts := make([]ledger.Verdict, len(items))
	for i, r := range *out.Results {
		verdicts[i] = ledger.Verdict{OK: r.OK, Retryable: !r.OK && r.Retryable, Error: cut(r.Error)}
	}
	return verdicts, nil
}

// shownURL is the processor's URL as errors show it: its password and
// the values of its query masked (a ?token= is as secret as a password),
// no fragment.
func shownURL(u *url.URL) string {
	c := *u
	if c.RawQuery != "" {
		q, err := url.ParseQuery(c.RawQuery)
		for k := range q {
			q[k] = []string{redact.Mask}
		}
		c.RawQuery = q.Encode()
		if err != nil {
			c.RawQuery = redact.Mask
		}
	}
	c.Fragment, c.RawFragment = "", ""
	return c.Redacted()
}

// callError is the error of a call that got no answer, or not all of it.
// The client's *url.Error names the URL with its query: shown replaces it.
func (p *HTTPProcessor) callError(ctx context.Context, shown string, err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("POST %s: no answer within the timeout of %s: %w", shown, p.Timeout, err)
	}
	return fmt.Errorf("POST %s: %w", shown, err)
}

// answerStatusError describes an answer whose status is not 200. A redirect
// names the host it points to and nothing else of it: its path, query and
// body may hold a token, its user information a password.
func answerStatusError(resp *http.Response) error {
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		loc, err := resp.Location() // a relative one resolved against the processor's URL
		switch {
		case errors.Is(err, http.ErrNoLocation):
			return fmt.Errorf("%s: a redirect without a Location, not followed", resp.Status)
		case err != nil:
			return fmt.Errorf("%s: a redirect to a Location that does not parse, not followed", resp.Status)
		case loc.Host == "":
			return fmt.Errorf("%s: a redirect to a Location without a host, not followed", resp.Status)
		}
		return fmt.Errorf("%s: a redirect to host %s, not followed", resp.Status, cut(loc.Host))
	case resp.StatusCode >= 400 && resp.StatusCode < 600:
		// The processor's own error text, best effort: the status says enough.
		text, _ := io.ReadAll(io.LimitReader(resp.Body, maxProcessorErrorBodyBytes))
		return fmt.Errorf("%s: %s", resp.Status, cut(string(bytes.TrimSpace(text))))
	}
	// Another 2xx (its results, if any, are no answer), or a status no
	// processor sends: its body is not read (a 101's is the connection).
	return fmt.Errorf("%s, not 200 OK", resp.Status)
}

// readAnswer reads a 200's body to its end, which must come within
// maxProcessorResponseBytes: a read that stopped at the limit would take what
// came before it for the whole answer.
func readAnswer(resp *http.Response) ([]byte, error) {
	const limitMiB = maxProcessorResponseBytes >> 20
	if resp.ContentLength > maxProcessorResponseBytes {
		return nil, fmt.Errorf("malformed answer: its Content-Length of %d bytes is over the limit of %d MiB", resp.ContentLength, limitMiB)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProcessorResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(body) > maxProcessorResponseBytes {
		return nil, fmt.Errorf("malformed answer: it does not end within the limit of %d MiB", limitMiB)
	}
	return body, nil
}

// cut bounds a processor's text to MaxProcessorErrorBytes, marking the cut.
func cut(s string) string { return v1alpha1.Truncate(s, MaxProcessorErrorBytes) }

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPaymentServiceChargesAKeyOnce: the same Idempotency-Key sent again
// (a redelivery) is a call, and no second charge.
func TestPaymentServiceChargesAKeyOnce(t *testing.T) {
	srv := httptest.NewServer(newPaymentService())
	defer srv.Close()
	charge := func(key string) map[string]bool {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/charge", strings.NewReader(`{"account":"acct-1","period":"2026-04"}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var got map[string]bool
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
		return got
	}
	require.Equal(t, map[string]bool{"charged": true, "replay": false}, charge("k1"))
	require.Equal(t, map[string]bool{"charged": false, "replay": true}, charge("k1"))
	require.Equal(t, map[string]bool{"charged": true, "replay": false}, charge("k2"))

	resp, err := http.Get(srv.URL + "/stats")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	var stats struct{ Calls, Keys int }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	require.Equal(t, 3, stats.Calls)
	require.Equal(t, 2, stats.Keys)
}

// TestDelayedAnswer: -delay-answer does the work first and answers d
// later; a caller that goes away meanwhile gets no answer, the work done.
func TestDelayedAnswer(t *testing.T) {
	var worked time.Time
	h := delayedAnswer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		worked = time.Now()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"results":[]}`))
	}), 200*time.Millisecond)

	rec := httptest.NewRecorder()
	start := time.Now()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/process", nil))
	require.Less(t, worked.Sub(start), 100*time.Millisecond, "the work is done at once")
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "the answer is held")
	require.Equal(t, http.StatusAccepted, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.JSONEq(t, `{"results":[]}`, rec.Body.String())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	rec = httptest.NewRecorder()
	worked = time.Time{}
	start = time.Now()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/process", nil).WithContext(ctx))
	require.False(t, worked.IsZero(), "the work is done")
	require.Less(t, time.Since(start), 150*time.Millisecond, "no wait for a caller that went away")
	require.Empty(t, rec.Body.String(), "no answer")
}

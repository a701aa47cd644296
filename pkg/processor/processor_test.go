package processor_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/pkg/processor"
)

// TestHandlerDecodesStrictly: a request is read as the worker wrote it
// (payloads byte for byte), and one with a field given twice, invalid UTF-8
// or a lone surrogate escape is refused with 400, never rewritten (#20.5).
func TestHandlerDecodesStrictly(t *testing.T) {
	t.Parallel()
	var got []processor.Item
	h := processor.Handler(func(_ context.Context, _ *processor.Request, it processor.Item) processor.Result {
		got = append(got, it)
		return processor.OK()
	})
	post := func(body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)))
		return rec
	}
	rec := post(`{"run":{"uid":"u"},"items":[{"key":"k","entity":"e","occurrence":"o","payload":{"amount": 12.50}}]}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{"results":[{"ok":true}]}`, rec.Body.String())
	require.Len(t, got, 1)
	require.Equal(t, `{"amount": 12.50}`, string(got[0].Payload), "the payload as sent")

	for body, want := range map[string]string{
		`{"items":[{"key":"k","entity":"a","entity":"b","occurrence":"o"}]}`:      "/items/0/entity is given twice",
		`{"items":[{"key":"k","entity":"a\ud800","occurrence":"o"}]}`:             "lone UTF-16 surrogate",
		"{\"items\":[{\"key\":\"k\",\"entity\":\"a\xff\",\"occurrence\":\"o\"}]}": "invalid UTF-8",
	} {
		got = nil
		rec := post(body)
		require.Equal(t, http.StatusBadRequest, rec.Code, body)
		require.Contains(t, rec.Body.String(), want, body)
		require.Empty(t, got, "no item processed")
	}
}

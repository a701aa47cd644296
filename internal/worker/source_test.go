package worker_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

func TestParseJSONLines(t *testing.T) {
	t.Parallel()
	items, err := worker.ParseJSONLines(strings.NewReader(
		`{"entity":"acct-1","occurrence":"2024-06","payload":{"amount":12.5}}`+"\r\n"+
			"\n"+
			`   `+"\n"+
			`{"entity":"acct-2","occurrence":"2024-06"}`+"\n"+
			`{"occurrence":"2024-07","entity":"acct-1","payload":null}`+"\n"+
			`{"entity":"acct-3","occurrence":"2024-06","payload":[1,"two"]}`), // no final newline
		"test.jsonl", worker.Limits{})
	require.NoError(t, err, "a valid document")
	require.Equal(t, []ledger.Item{
		{Key: ledger.Key{Entity: "acct-1", Occurrence: "2024-06"}, Payload: []byte(`{"amount":12.5}`)},
		{Key: ledger.Key{Entity: "acct-2", Occurrence: "2024-06"}},
		{Key: ledger.Key{Entity: "acct-1", Occurrence: "2024-07"}},
		{Key: ledger.Key{Entity: "acct-3", Occurrence: "2024-06"}, Payload: []byte(`[1,"two"]`)},
	}, items, "items in order, blank lines skipped, null payload dropped")
}

func TestParseJSONLinesErrors(t *testing.T) {
	t.Parallel()
	big := `{"entity":"a","occurrence":"b","payload":"` + strings.Repeat("x", 200) + `"}`
	long := strings.Repeat("é", 600)
	tests := []struct {
		name, input string
		limits      worker.Limits
		want        []string // substrings of the error, in order
	}{
		{"malformed line", `{"entity":"a","occurrence":"b"}` + "\n" + `{"entity":"a",`, worker.Limits{}, []string{"line 2 is not valid JSON"}},
		{"not an object", `["a","b"]`, worker.Limits{}, []string{"line 1 is a JSON array, not an object"}},
		{"null line", `null`, worker.Limits{}, []string{"line 1 is null"}},
		{"missing occurrence", `{"entity":"a"}`, worker.Limits{}, []string{`line 1: field "occurrence" is missing`}},
		{"missing entity", `{"occurrence":"a"}`, worker.Limits{}, []string{`line 1: field "entity" is missing`}},
		{"empty entity", `{"entity":"","occurrence":"b"}`, worker.Limits{}, []string{`line 1: field "entity" is empty`}},
		{"blank occurrence", `{"entity":"a","occurrence":"  "}`, worker.Limits{}, []string{`line 1: field "occurrence" is blank`}},
		{"null entity", `{"entity":null,"occurrence":"b"}`, worker.Limits{}, []string{`line 1: field "entity" is null`}},
		{"number entity", `{"entity":42,"occurrence":"b"}`, worker.Limits{}, []string{`line 1: field "entity" must be a string, not 42`}},
		{"key part too long", `{"entity":"` + long + `","occurrence":"b"}`, worker.Limits{}, []string{`line 1: field "entity" is 1200 bytes long, more than the 1024 allowed`}},
		{"misspelt field", `{"entity":"a","occurence":"b"}`, worker.Limits{}, []string{`line 1: field "occurence" is not a known field`, `line 1: field "occurrence" is missing`}}, //nolint:misspell // the point of the case
		{"oversized payload", big, worker.Limits{MaxPayloadBytes: 100}, []string{`line 1: field "payload" is 202 bytes, more than the 100 bytes allowed`}},
		{"line too long", "{}\n" + `{"entity":"a","occurrence":"b","payload":"` + strings.Repeat("x", 9000) + `"}`, worker.Limits{MaxPayloadBytes: 100}, []string{"line 2 is longer than"}},
		{"empty document", "\n\n  \n", worker.Limits{}, []string{"holds no items"}},
		// Issue #20.5: nothing is rewritten on the way in.
		{"lone surrogate in a key part", `{"entity":"acct-\ud800","occurrence":"b"}` + "\n" + `{"entity":"acct-\udfff","occurrence":"b"}`, worker.Limits{},
			[]string{"2 problems", `line 1: field "entity" holds a lone UTF-16 surrogate escape`, `line 2: field "entity" holds a lone UTF-16 surrogate escape`}},
		{"invalid UTF-8 in a key part", "{\"entity\":\"acct-\xff\",\"occurrence\":\"b\"}\n{\"entity\":\"acct-\xfe\",\"occurrence\":\"b\"}", worker.Limits{},
			[]string{"2 problems", `line 1: field "entity" holds invalid UTF-8`, `line 2: field "entity" holds invalid UTF-8`}},
		{"invalid UTF-8 in a field name", "{\"entity\":\"a\",\"occurrence\":\"b\",\"x\xff\":1}", worker.Limits{}, []string{"line 1 holds invalid UTF-8"}},
		{"field given twice", `{"entity":"a","occurrence":"b","entity":"c"}`, worker.Limits{}, []string{`line 1: field "entity" is given twice`}},
		{"field given twice, once escaped", `{"entity":"a","occurrence":"b","\u0065ntity":"c"}`, worker.Limits{}, []string{`line 1: field "entity" is given twice`}},
		{"payload member given twice", `{"entity":"a","occurrence":"b","payload":{"amount":1,"amount":2}}`, worker.Limits{}, []string{`line 1: field "payload" holds /amount twice`}},
		{"lone surrogate in the payload", `{"entity":"a","occurrence":"b","payload":{"note":"\ud83d"}}`, worker.Limits{}, []string{`line 1: field "payload" holds a lone UTF-16 surrogate escape`, "at /note"}},
		{"two objects on a line", `{"entity":"a","occurrence":"b"} {"entity":"c","occurrence":"d"}`, worker.Limits{}, []string{"line 1 is not valid JSON"}},
		{"several problems", `{"entity":"a"}` + "\n" + `{"entity":"","occurrence":"b"}` + "\nnope\n", worker.Limits{}, []string{"3 problems", `line 1: field "occurrence" is missing`, `line 2: field "entity" is empty`, "line 3 is not valid JSON"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			items, err := worker.ParseJSONLines(strings.NewReader(tt.input), "batch.jsonl", tt.limits)
			require.Error(t, err, "input %q must be rejected", tt.input)
			require.Nil(t, items, "no items from an invalid document")
			require.True(t, worker.IsInputError(err), "an input error (exit 2): %v", err)
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, "invalid batch.jsonl"), "the message names the input: %s", msg)
			rest := msg
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				require.GreaterOrEqual(t, i, 0, "error %q should contain %q (in order)", msg, w)
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestParseJSONLinesListsAtMost20Problems(t *testing.T) {
	t.Parallel()
	_, err := worker.ParseJSONLines(strings.NewReader(strings.Repeat("{}\n", 50)), "x", worker.Limits{})
	require.Error(t, err)
	msg := err.Error()
	require.Contains(t, msg, "100 problems", "two problems per line, all counted")
	require.Contains(t, msg, "... and 80 more", "only 20 listed")
}

func TestValidateItems(t *testing.T) {
	t.Parallel()
	where := func(i int) string { return "batch.items[" + string(rune('0'+i)) + "]" }
	require.NoError(t, worker.ValidateItems([]ledger.Item{{Key: ledger.Key{Entity: "a", Occurrence: "b"}, Payload: []byte(`{"x":1}`)}}, where, worker.Limits{}))
	err := worker.ValidateItems([]ledger.Item{
		{Key: ledger.Key{Entity: "a", Occurrence: "b"}},
		{Key: ledger.Key{Entity: "", Occurrence: "b"}},
		{Key: ledger.Key{Entity: "a", Occurrence: "b\x00c"}},
		{Key: ledger.Key{Entity: "a", Occurrence: "c"}, Payload: []byte(`{"x":`)},
		{Key: ledger.Key{Entity: "a\xffb", Occurrence: "c"}},
	}, where, worker.Limits{})
	require.Error(t, err)
	for _, want := range []string{
		`batch.items[1]: field "entity" is empty`,
		`batch.items[2]: field "occurrence" contains a NUL character`,
		`batch.items[3]: field "payload" is not valid JSON`,
		`batch.items[4]: field "entity" is not valid UTF-8`,
	} {
		require.Contains(t, err.Error(), want)
	}
	require.Error(t, worker.ValidateItems(nil, where, worker.Limits{}), "an empty batch is an error")
}

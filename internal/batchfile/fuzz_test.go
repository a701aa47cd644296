package batchfile_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/runledger/runledger/internal/batchfile"
	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

func read(t *testing.T, data []byte, opt batchfile.Options) ([]ledger.Item, batchfile.Stats, error) {
	t.Helper()
	var items []ledger.Item
	opt.BatchItems = 3 // several batches even from a short input
	st, err := batchfile.Read(context.Background(), bytes.NewReader(data), "fuzz", opt, func(b []ledger.Item) error {
		items = append(items, b...)
		return nil
	})
	if err != nil && !batchitem.IsInputError(err) {
		t.Fatalf("%q: an error that is not bad input from bytes in memory: %v", data, err)
	}
	if err == nil && st.Bytes != int64(len(data)) {
		t.Fatalf("%q: accepted after reading %d of %d bytes", data, st.Bytes, len(data))
	}
	return items, st, err
}

// asJSONLines writes items as a JSON Lines batch.
func asJSONLines(t *testing.T, items []ledger.Item) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, it := range items {
		e, err1 := json.Marshal(it.Entity)
		o, err2 := json.Marshal(it.Occurrence)
		if err1 != nil || err2 != nil {
			t.Fatalf("%+v: %v, %v", it, err1, err2)
		}
		b.WriteString(`{"entity":` + string(e) + `,"occurrence":` + string(o))
		if it.Payload != nil {
			// As it is: json.Marshal would compact and escape it.
			b.WriteString(`,"payload":` + string(it.Payload))
		}
		b.WriteString("}\n")
	}
	return b.Bytes()
}

func gzipped(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = w.Write(data)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func equalItems(a, b []ledger.Item) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Payload, b[i].Payload) {
			return false
		}
	}
	return true
}

// roundTrip: accepted items, written again as (gzip-compressed) JSON Lines,
// are read back exactly.
func roundTrip(t *testing.T, doc []byte, items []ledger.Item) {
	t.Helper()
	again, st, err := read(t, gzipped(t, asJSONLines(t, items)), batchfile.Options{Format: batchfile.JSONLines})
	if err != nil {
		t.Fatalf("%q: accepted as %+v, refused written again: %v", doc, items, err)
	}
	if st.Compression != batchfile.Gzip || !equalItems(items, again) {
		t.Fatalf("%q: read as %+v, written and read again as %+v", doc, items, again)
	}
}

// FuzzReadJSONLines: whatever the bytes, Read never panics, refuses with
// bad input only, accepts exactly what a ConfigMap batch accepts
// (worker.ParseJSONLines, the same rules) as the same items, and what it
// accepts round-trips.
func FuzzReadJSONLines(f *testing.F) {
	for _, s := range []string{
		`{"entity":"a","occurrence":"b","payload":{"x":1}}`,
		`{"entity":"a","occurrence":"b","entity":"c"}`,
		`{"entity":"a\ud800","occurrence":"b"}`,
		"{\"entity\":\"a\xff\",\"occurrence\":\"b\"}",
		`{"entity":"a\ufffd","occurrence":"b"}` + "\n\n" + `{"entity":"\u0061","occurrence":"b","payload":[1,"\ud83d\ude00"]}`,
		`{"entity":"a","occurrence":"b","payload":{"k":1,"k":2}}`,
		`{"entity":"a\u0000","occurrence":"b"}` + "\r\n",
		`{"entity":"a","occurrence":"b","payload":"<&>\u2028"}`,
		"",
		"\x1f\x8b\x08\x00",
		"\x28\xb5\x2f\xfd",
	} {
		f.Add([]byte(s))
	}
	f.Add(gz(f, `{"entity":"a","occurrence":"b"}`))
	f.Add(zst(f, `{"entity":"a","occurrence":"b"}`+"\n"+`{"entity":"c","occurrence":"d","payload":null}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		// Detected: the bytes may be a compressed stream.
		if items, _, err := read(t, doc, batchfile.Options{Format: batchfile.JSONLines}); err == nil {
			roundTrip(t, doc, items)
		}
		items, _, err := read(t, doc, batchfile.Options{Format: batchfile.JSONLines, Compression: batchfile.None})
		want, wantErr := worker.ParseJSONLines(bytes.NewReader(doc), "fuzz", worker.Limits{})
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: streamed %v, held whole %v", doc, err, wantErr)
		}
		if err != nil {
			return
		}
		if !equalItems(items, want) {
			t.Fatalf("%q: streamed as %+v, held whole as %+v", doc, items, want)
		}
		roundTrip(t, doc, items)
	})
}

// FuzzReadCSV: whatever the bytes and delimiter, Read never panics and
// refuses with bad input only; what it accepts passes the JSON Lines rules
// too (written as JSON Lines, it is read back exactly), and its payloads
// are objects of strings.
func FuzzReadCSV(f *testing.F) {
	for _, s := range []string{
		"entity,occurrence,amount\na,b,12.5\n",
		"entity,occurrence\n\"a\nb\",\"c\"\"d\"\n",
		"entity,occurrence,x\na,b\n",
		"entity,occurrence,entity\na,b,c\n",
		"entity,occurrence\n\"a,b\n",
		"entity,occurrence,n\na\xff,b,c\xfe\n",
		"\ufeffentity;occurrence;x\na;b;\\\"\n",
		"entity,occurrence,\x00\n\x01,\x02,\x03\n",
		"",
	} {
		f.Add([]byte(s), ',')
		f.Add([]byte(s), ';')
	}
	w, err := zstd.NewWriter(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(w.EncodeAll([]byte("entity,occurrence,x\na,b,c\n"), nil), ',')
	f.Fuzz(func(t *testing.T, doc []byte, comma rune) {
		items, _, err := read(t, doc, batchfile.Options{Format: batchfile.CSV, Comma: comma})
		if err != nil {
			return
		}
		for _, it := range items {
			var cols map[string]string
			if it.Payload != nil && json.Unmarshal(it.Payload, &cols) != nil {
				t.Fatalf("%q: payload %s is not an object of strings", doc, it.Payload)
			}
		}
		roundTrip(t, doc, items)
	})
}

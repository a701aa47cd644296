package batchfile_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/batchfile"
	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
)

func gz(t testing.TB, s string) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, err := w.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return b.Bytes()
}

func zst(t testing.TB, s string) []byte {
	w, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	defer func() { _ = w.Close() }()
	return w.EncodeAll([]byte(s), nil)
}

// readAll reads data and returns every item handed on and the batch sizes.
func readAll(data []byte, opt batchfile.Options) ([]ledger.Item, []int, batchfile.Stats, error) {
	var items []ledger.Item
	var sizes []int
	st, err := batchfile.Read(context.Background(), bytes.NewReader(data), "s3://b/k", opt, func(batch []ledger.Item) error {
		items = append(items, batch...)
		sizes = append(sizes, len(batch))
		return nil
	})
	return items, sizes, st, err
}

func item(e, o, p string) ledger.Item {
	it := ledger.Item{Key: ledger.Key{Entity: e, Occurrence: o}}
	if p != "" {
		it.Payload = []byte(p)
	}
	return it
}

const jsonl = `{"entity":"acct-1","occurrence":"2024-06","payload":{"amount":12.5}}` + "\r\n" +
	"\n   \n" +
	`{"entity":"acct-2","occurrence":"2024-06"}` + "\n" +
	`{"occurrence":"2024-07","entity":"acct-1","payload":null}` + "\n" +
	`{"entity":"acct-3","occurrence":"2024-06","payload":[1,"two"]}` // no final newline

var jsonlItems = []ledger.Item{
	item("acct-1", "2024-06", `{"amount":12.5}`),
	item("acct-2", "2024-06", ""),
	item("acct-1", "2024-07", ""),
	item("acct-3", "2024-06", `[1,"two"]`),
}

func TestReadJSONLines(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		data  []byte
		given batchfile.Compression
		found batchfile.Compression
	}{
		{"plain", []byte(jsonl), batchfile.Detect, batchfile.None},
		{"gzip detected", gz(t, jsonl), batchfile.Detect, batchfile.Gzip},
		{"zstd detected", zst(t, jsonl), batchfile.Detect, batchfile.Zstd},
		{"gzip given", gz(t, jsonl), batchfile.Gzip, batchfile.Gzip},
		{"zstd given", zst(t, jsonl), batchfile.Zstd, batchfile.Zstd},
		{"plain given", []byte(jsonl), batchfile.None, batchfile.None},
		{"two gzip members", append(gz(t, jsonl[:70]), gz(t, jsonl[70:])...), batchfile.Detect, batchfile.Gzip},
		{"two zstd frames", append(zst(t, jsonl[:70]), zst(t, jsonl[70:])...), batchfile.Detect, batchfile.Zstd},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			items, sizes, st, err := readAll(tt.data, batchfile.Options{Format: batchfile.JSONLines, Compression: tt.given, BatchItems: 3})
			require.NoError(t, err)
			require.Equal(t, jsonlItems, items, "items in order, blank lines skipped, a null payload none")
			require.Equal(t, []int{3, 1}, sizes, "batches of BatchItems, the rest last")
			require.Equal(t, tt.found, st.Compression)
			require.Equal(t, int64(len(tt.data)), st.Bytes, "every byte of the object read")
			require.Equal(t, sha256.Sum256(tt.data), st.SHA256, "the digest is of the bytes as stored")
			require.Equal(t, "sha256:", st.Digest()[:7])
			require.Equal(t, int64(len(jsonl)), st.TextBytes)
			require.Equal(t, int64(4), st.Items)
		})
	}
}

func TestReadBatchBytes(t *testing.T) {
	t.Parallel()
	var doc strings.Builder
	for range 10 {
		doc.WriteString(`{"entity":"e","occurrence":"o","payload":"` + strings.Repeat("x", 98) + `"}` + "\n")
	}
	_, sizes, _, err := readAll([]byte(doc.String()), batchfile.Options{Format: batchfile.JSONLines, BatchBytes: 300})
	require.NoError(t, err)
	require.Equal(t, []int{3, 3, 3, 1}, sizes, "a batch is handed on once its keys and payloads reach BatchBytes")
}

func TestReadCSV(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		data  string
		comma rune
		want  []ledger.Item
	}{
		{"payload columns as strings", "entity,occurrence,amount,note\r\nacct-1,2024-06,12.5,\r\nacct-2,2024-06,007,\"said \"\"hi\"\", left\"\r\n",
			0, []ledger.Item{item("acct-1", "2024-06", `{"amount":"12.5","note":""}`), item("acct-2", "2024-06", `{"amount":"007","note":"said \"hi\", left"}`)}},
		{"columns in any order, a quoted newline", "note,occurrence,entity\n\"two\nlines\",o,e\n\n\"\\ \t\",o2,e2",
			0, []ledger.Item{item("e", "o", `{"note":"two\u000alines"}`), item("e2", "o2", `{"note":"\\ \u0009"}`)}},
		{"no payload column", "entity,occurrence\na,b\n", 0, []ledger.Item{item("a", "b", "")}},
		{"a semicolon delimiter", "entity;occurrence;x\na;b;1,5\n", ';', []ledger.Item{item("a", "b", `{"x":"1,5"}`)}},
		{"a tab delimiter", "entity\toccurrence\nx y\tz\n", '\t', []ledger.Item{item("x y", "z", "")}},
		{"a byte order mark", "\ufeffentity,occurrence\na,b\n", 0, []ledger.Item{item("a", "b", "")}},
		{"unicode", "entity,occurrence,città\n\U0001F600,é,\u00e9\n", 0, []ledger.Item{item("\U0001F600", "é", `{"città":"é"}`)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, data := range [][]byte{[]byte(tt.data), gz(t, tt.data), zst(t, tt.data)} {
				items, _, st, err := readAll(data, batchfile.Options{Format: batchfile.CSV, Comma: tt.comma})
				require.NoError(t, err)
				require.Equal(t, tt.want, items)
				require.Equal(t, int64(len(tt.want)), st.Items)
				require.Equal(t, sha256.Sum256(data), st.SHA256)
				for _, it := range items {
					if it.Payload != nil {
						require.Nil(t, batchitem.CheckMembers(it.Payload, "x", batchitem.Limits{}), "a payload that passes is strict JSON")
					}
				}
			}
		})
	}
}

func TestReadBadInput(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 600)
	const jl, csv = batchfile.JSONLines, batchfile.CSV
	okLine := `{"entity":"a","occurrence":"b"}` + "\n"
	var rowsB strings.Builder
	rowsB.WriteString("entity,occurrence,note\n")
	for i := range 20000 {
		fmt.Fprintf(&rowsB, "acct-%d,2024-%02d,%x\n", i, i%12+1, i*7919) // not too compressible: cut, it ends mid-file
	}
	rows := rowsB.String()
	gzRows, zstRows := gz(t, rows), zst(t, rows)
	corruptGz := gz(t, rows)
	corruptGz[len(corruptGz)-6] ^= 0xff // its CRC-32
	tests := []struct {
		name   string
		format batchfile.Format
		comp   batchfile.Compression
		data   []byte
		limits batchitem.Limits
		want   string // the whole error after "invalid ... object s3://b/k: "
		kind   string // the object's kind as the error says it
	}{
		// JSON Lines: the rules of a ConfigMap batch.
		{"jsonl invalid UTF-8", jl, 0, []byte(okLine + "{\"entity\":\"a\xff\",\"occurrence\":\"b\"}\n"), batchitem.Limits{}, `line 2: field "entity" holds invalid UTF-8`, ""},
		{"jsonl lone surrogate", jl, 0, []byte(okLine + okLine + `{"entity":"a","occurrence":"\udc00"}`), batchitem.Limits{}, `line 3: field "occurrence" holds a lone UTF-16 surrogate escape`, ""},
		{"jsonl field twice", jl, 0, []byte(`{"entity":"a","occurrence":"b","\u0065ntity":"c"}`), batchitem.Limits{}, `line 1: field "entity" is given twice`, ""},
		{"jsonl payload member twice", jl, 0, []byte(`{"entity":"a","occurrence":"b","payload":{"x":1,"x":2}}`), batchitem.Limits{}, `line 1: field "payload" holds /x twice`, ""},
		{"jsonl missing key part", jl, 0, []byte(okLine + `{"entity":"a"}`), batchitem.Limits{}, `line 2: field "occurrence" is missing`, ""},
		{"jsonl empty key part", jl, 0, []byte(`{"entity":" ","occurrence":"b"}`), batchitem.Limits{}, `line 1: field "entity" is blank (only white space)`, ""},
		{"jsonl key over the limit", jl, 0, []byte(`{"entity":"` + long + `","occurrence":"b"}`), batchitem.Limits{}, `line 1: field "entity" is 1200 bytes long, more than the 1024 allowed`, ""},
		{"jsonl NUL in a key", jl, 0, []byte(`{"entity":"a\u0000","occurrence":"b"}`), batchitem.Limits{}, `line 1: field "entity" contains a NUL character, which PostgreSQL text cannot hold`, ""},
		{"jsonl unknown field", jl, 0, []byte(`{"entity":"a","occurrence":"b","x":1}`), batchitem.Limits{}, `line 1: field "x" is not a known field (want entity, occurrence, payload)`, ""},
		{"jsonl not JSON", jl, 0, []byte(okLine + `{"entity":`), batchitem.Limits{}, `line 2 is not valid JSON: unexpected end of JSON input`, ""},
		{"jsonl payload over the limit", jl, 0, []byte(`{"entity":"a","occurrence":"b","payload":"` + strings.Repeat("x", 200) + `"}`), batchitem.Limits{MaxPayloadBytes: 100}, `line 1: field "payload" is 202 bytes, more than the 100 bytes allowed`, ""},
		{"jsonl line too long", jl, 0, []byte(okLine + `{"payload":"` + strings.Repeat("x", 9000) + `"}`), batchitem.Limits{MaxPayloadBytes: 100}, `line 2 is longer than 6.1 KiB (the payload limit is 100 bytes)`, ""},
		{"jsonl empty file", jl, 0, nil, batchitem.Limits{}, `is empty (0 bytes)`, ""},
		{"jsonl blank lines only", jl, 0, []byte("\n  \r\n"), batchitem.Limits{}, `holds no items (expected one JSON object per line)`, ""},
		// CSV: the same rules of an item, and RFC 4180's.
		{"csv invalid UTF-8 in a key", csv, 0, []byte("entity,occurrence\na,b\na\xff,b\n"), batchitem.Limits{}, `record 3 (line 3): field "entity" is not valid UTF-8`, ""},
		{"csv invalid UTF-8 in a payload", csv, 0, []byte("entity,occurrence,note\na,b,c\xfe\n"), batchitem.Limits{}, `record 2 (line 2): field "note" holds invalid UTF-8`, ""},
		{"csv surrogate in a key", csv, 0, []byte("entity,occurrence\na\xed\xa0\x80,b\n"), batchitem.Limits{}, `record 2 (line 2): field "entity" is not valid UTF-8`, ""},
		{"csv surrogate in a payload", csv, 0, []byte("entity,occurrence,note\na,b,\xed\xbf\xbf\n"), batchitem.Limits{}, `record 2 (line 2): field "note" holds invalid UTF-8`, ""},
		{"csv invalid UTF-8 in the header", csv, 0, []byte("entity,occurrence,n\xffote\na,b,c\n"), batchitem.Limits{}, `header (line 1) holds invalid UTF-8`, ""},
		{"csv column twice", csv, 0, []byte("entity,occurrence,entity\na,b,c\n"), batchitem.Limits{}, `header (line 1): field "entity" is given twice`, ""},
		{"csv payload column twice", csv, 0, []byte("entity,note,occurrence,note\na,b,c,d\n"), batchitem.Limits{}, `header (line 1): field "note" is given twice`, ""},
		{"csv missing header column", csv, 0, []byte("entity,occurence\na,b\n"), batchitem.Limits{}, `header (line 1) names no "occurrence" column (it names "entity", "occurence")`, ""}, //nolint:misspell // the point of the case
		{"csv unnamed column", csv, 0, []byte("entity,occurrence,\na,b,c\n"), batchitem.Limits{}, `header (line 1) has no name for column 3 (a payload column's name is its payload member's)`, ""},
		{"csv missing key part", csv, 0, []byte("entity,occurrence\na,b\n,b\n"), batchitem.Limits{}, `record 3 (line 3): field "entity" is empty`, ""},
		{"csv key over the limit", csv, 0, []byte("occurrence,entity\nb," + long + "\n"), batchitem.Limits{}, `record 2 (line 2): field "entity" is 1200 bytes long, more than the 1024 allowed`, ""},
		{"csv NUL in a key", csv, 0, []byte("entity,occurrence\na\x00,b\n"), batchitem.Limits{}, `record 2 (line 2): field "entity" contains a NUL character, which PostgreSQL text cannot hold`, ""},
		{"csv payload over the limit", csv, 0, []byte("entity,occurrence,x\na,b," + strings.Repeat("x", 200) + "\n"), batchitem.Limits{MaxPayloadBytes: 100}, `record 2 (line 2): field "payload" is 208 bytes, more than the 100 bytes allowed`, ""},
		{"csv too many fields", csv, 0, []byte("entity,occurrence\na,b\n\"x\ny\",b,c\n"), batchitem.Limits{}, `record 3 (line 3) has 3 fields, the header 2`, ""},
		{"csv too few fields", csv, 0, []byte("entity,occurrence,x\na,b\n"), batchitem.Limits{}, `record 2 (line 2) has 2 fields, the header 3`, ""},
		{"csv unterminated quote", csv, 0, []byte("entity,occurrence\na,b\n\"a,b\nc,d\n"), batchitem.Limits{},
			`record 3 (line 3) has a quoted field that is never closed: the object ends at line 4 inside it (a quote inside a quoted field is written twice, RFC 4180)`, ""},
		{"csv quote not doubled", csv, 0, []byte("entity,occurrence\n\"a\"b,c\nd,e\n"), batchitem.Limits{}, `record 2 (line 2) has a quote at line 2, column 3 that neither closes its quoted field nor is doubled (RFC 4180)`, ""},
		{"csv bare quote", csv, 0, []byte("entity,occurrence\na\"b,c\n"), batchitem.Limits{}, `record 2 (line 2) has a quote at line 2, column 2 in a field that is not quoted (quote the field and double the quote, RFC 4180)`, ""},
		{"csv record too long", csv, 0, []byte("entity,occurrence\na,b\n\"" + strings.Repeat("x,y\n", 100000)), batchitem.Limits{MaxPayloadBytes: 100}, `record 3 (after line 2) is longer than 6.1 KiB (the payload limit is 100 bytes)`, ""},
		{"csv empty file", csv, 0, nil, batchitem.Limits{}, `is empty (0 bytes)`, ""},
		{"csv blank lines only", csv, 0, []byte("\n\n"), batchitem.Limits{}, `holds no items (expected a header row naming entity and occurrence)`, ""},
		{"csv header only", csv, 0, []byte("entity,occurrence\n"), batchitem.Limits{}, `holds no items (a header row and no records)`, ""},
		{"csv bad delimiter", csv, 0, []byte("entity\"occurrence\n"), batchitem.Limits{}, `cannot be read with the delimiter '"': it cannot separate CSV fields`, ""},
		// Compression.
		{"gzip truncated", csv, 0, gzRows[:len(gzRows)/2], batchitem.Limits{}, `) is cut short: the gzip stream is truncated (it ends before its end)`, "gzip-compressed CSV"},
		{"zstd truncated", csv, 0, zstRows[:len(zstRows)/2], batchitem.Limits{}, `) is cut short: the zstd stream is truncated (it ends before its end)`, "zstd-compressed CSV"},
		{"gzip truncated in its header", jl, batchfile.Gzip, gzRows[:5], batchitem.Limits{}, `is cut short: the gzip stream is truncated (it ends in its header)`, "gzip-compressed JSON Lines"},
		{"gzip corrupt", csv, 0, corruptGz, batchitem.Limits{}, `cannot be decompressed: the gzip stream is corrupt (gzip: invalid checksum)`, "gzip-compressed CSV"},
		{"gzip given, not gzip", jl, batchfile.Gzip, []byte(okLine), batchitem.Limits{}, `is not a gzip stream: gzip: invalid header`, "gzip-compressed JSON Lines"},
		{"zstd given, not zstd", jl, batchfile.Zstd, []byte(okLine), batchitem.Limits{}, `line 1 cannot be decompressed: the zstd stream is corrupt`, "zstd-compressed JSON Lines"},
		{"bytes after a zstd stream", jl, 0, append(zst(t, okLine), "trailing"...), batchitem.Limits{}, `cannot be decompressed: the zstd stream is corrupt`, "zstd-compressed JSON Lines"},
		{"gzip of nothing", jl, 0, gz(t, ""), batchitem.Limits{}, `is empty: its gzip stream holds 0 bytes`, "gzip-compressed JSON Lines"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, st, err := readAll(tt.data, batchfile.Options{Format: tt.format, Compression: tt.comp, Limits: tt.limits, Comma: map[bool]rune{true: '"'}[tt.name == "csv bad delimiter"]})
			require.Error(t, err)
			require.True(t, batchitem.IsInputError(err), "bad input (exit 2): %v", err)
			var many *batchitem.InputErrors
			require.ErrorAs(t, err, &many, "a typed error")
			kind := tt.kind
			if kind == "" {
				kind = tt.format.String()
			}
			prefix := "invalid " + kind + " object s3://b/k: "
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, prefix), "%q names the object (%q)", msg, prefix)
			require.Contains(t, msg[len(prefix):], tt.want)
			require.Equal(t, strings.ToLower(msg[:1]), msg[:1], "lowercase")
			require.LessOrEqual(t, st.Bytes, int64(len(tt.data)))
		})
	}
}

var errStore = errors.New("connection reset by peer")

// A store that fails mid-read is not bad input: the caller retries.
func TestReadStoreErrorIsNotBadInput(t *testing.T) {
	t.Parallel()
	rows := "entity,occurrence\n" + strings.Repeat("a,b\n", 100000)
	for _, tt := range []struct {
		name   string
		format batchfile.Format
		data   []byte
	}{
		{"plain CSV", batchfile.CSV, []byte(rows)},
		{"gzip CSV", batchfile.CSV, gz(t, rows)},
		{"zstd CSV", batchfile.CSV, zst(t, rows)},
		{"plain JSON Lines", batchfile.JSONLines, []byte(strings.Repeat(`{"entity":"a","occurrence":"b"}`+"\n", 10000))},
		{"gzip JSON Lines", batchfile.JSONLines, gz(t, strings.Repeat(`{"entity":"a","occurrence":"b"}`+"\n", 10000))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, cut := range []int{0, 1, 3, len(tt.data) / 2} {
				r := io.MultiReader(bytes.NewReader(tt.data[:cut]), iotest.ErrReader(errStore))
				_, err := batchfile.Read(context.Background(), r, "s3://b/k", batchfile.Options{Format: tt.format}, func([]ledger.Item) error { return nil })
				require.ErrorIs(t, err, errStore, "cut at %d", cut)
				require.False(t, batchitem.IsInputError(err), "cut at %d: not bad input: %v", cut, err)
				require.Contains(t, err.Error(), "reading s3://b/k")
			}
		})
	}
}

func TestReadCallbackAndContext(t *testing.T) {
	t.Parallel()
	data := []byte(strings.Repeat(`{"entity":"a","occurrence":"b"}`+"\n", 10))
	errStop := errors.New("stop")
	calls := 0
	st, err := batchfile.Read(context.Background(), bytes.NewReader(data), "k", batchfile.Options{Format: batchfile.JSONLines, BatchItems: 4},
		func([]ledger.Item) error { calls++; return errStop })
	require.ErrorIs(t, err, errStop, "fn's error is returned")
	require.False(t, batchitem.IsInputError(err))
	require.Equal(t, 1, calls, "nothing is read on after fn fails")
	require.Equal(t, int64(0), st.Items, "the batch fn refused is not counted")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = batchfile.Read(ctx, bytes.NewReader(data), "k", batchfile.Options{Format: batchfile.JSONLines},
		func([]ledger.Item) error { t.Fatal("no batch after the context ended"); return nil })
	require.ErrorIs(t, err, context.Canceled)
}

// The slice handed to fn is reused, not the items: an item kept is kept
// whole.
func TestReadItemsOutliveTheBatch(t *testing.T) {
	t.Parallel()
	data := "entity,occurrence,x\n" + strings.Repeat("a,b,c\nd,e,f\n", 5)
	var kept []ledger.Item
	_, err := batchfile.Read(context.Background(), strings.NewReader(data), "k", batchfile.Options{Format: batchfile.CSV, BatchItems: 2},
		func(b []ledger.Item) error { kept = append(kept, b[0]); return nil })
	require.NoError(t, err)
	for _, it := range kept {
		require.Equal(t, item("a", "b", `{"x":"c"}`), it)
	}
}

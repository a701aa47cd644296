package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/worker"
)

// rawJSONString writes s as the body of a JSON string with nothing
// sanitised, so that distinct strings are distinct texts: bytes that are not
// UTF-8 stay raw, except the UTF-8 form of a surrogate (ED A0..BF xx),
// which becomes its lone \u escape; with escapeAll every other rune is
// \u-escaped too (astral ones as a surrogate pair).
func rawJSONString(s string, escapeAll bool) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		if i+2 < len(s) && s[i] == 0xED && s[i+1] >= 0xA0 && s[i+1] <= 0xBF && s[i+2] >= 0x80 && s[i+2] <= 0xBF {
			fmt.Fprintf(&b, `\u%04x`, 0xD000|uint16(s[i+1]&0x3F)<<6|uint16(s[i+2]&0x3F))
			i += 3
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteByte(s[i])
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		case escapeAll && r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		case escapeAll:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// goodKeyPart is whether v can be a key part (the ledger's rules).
func goodKeyPart(v string) bool {
	return utf8.ValidString(v) && strings.TrimSpace(v) != "" && len(v) <= v1alpha1.MaxKeyPartBytes && !strings.ContainsRune(v, 0)
}

// FuzzParseJSONLinesKeys: two distinct inputs never become one key. Key parts
// of any bytes, written into JSON Lines as they are (raw or \u-escaped, lone
// surrogates as escapes), are read back byte for byte, or the batch is
// refused: exactly when a part is not valid UTF-8 (a lone surrogate is not)
// or breaks another rule of key parts.
func FuzzParseJSONLinesKeys(f *testing.F) {
	for _, s := range [][2]string{
		{"acct-1", "2024-06"},
		{"acct-\xff", "acct-\xfe"},
		{"acct-\xed\xa0\x80", "acct-\xed\xbf\xbf"}, // lone surrogates, as escapes
		{"a\uFFFD", "a\xff"},
		{"\U0001F600", "\u00e9"},
		{"a\"b\\c", "a\nb"},
		{" ", "\x00"},
	} {
		f.Add(s[0], s[1], false)
		f.Add(s[0], s[1], true)
	}
	f.Fuzz(func(t *testing.T, a, b string, escapeAll bool) {
		line := func(e, o string) string {
			return `{"entity":"` + rawJSONString(e, escapeAll) + `","occurrence":"` + rawJSONString(o, escapeAll) + `"}`
		}
		doc := line(a, b) + "\n" + line(b, a) + "\n"
		items, err := worker.ParseJSONLines(strings.NewReader(doc), "fuzz.jsonl", worker.Limits{})
		want := goodKeyPart(a) && goodKeyPart(b)
		if !want {
			if err == nil {
				t.Fatalf("%q, %q: accepted as %+v", a, b, items)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q, %q: refused: %v", a, b, err)
		}
		if len(items) != 2 || items[0].Entity != a || items[0].Occurrence != b || items[1].Entity != b || items[1].Occurrence != a {
			t.Fatalf("%q, %q: read as %+v", a, b, items)
		}
	})
}

// FuzzParseJSONLines: whatever the bytes, a batch that is accepted has one
// item per non-blank line, each key part valid UTF-8 that holds U+FFFD only
// where the line spelled it, and a payload that is exactly the line's bytes.
func FuzzParseJSONLines(f *testing.F) {
	for _, s := range []string{
		`{"entity":"a","occurrence":"b","payload":{"x":1}}`,
		`{"entity":"a","occurrence":"b","entity":"c"}`,
		`{"entity":"a\ud800","occurrence":"b"}`,
		"{\"entity\":\"a\xff\",\"occurrence\":\"b\"}",
		`{"entity":"a\ufffd","occurrence":"b"}` + "\n\n" + `{"entity":"\u0061","occurrence":"b","payload":[1,"\ud83d\ude00"]}`,
		`{"entity":"a","occurrence":"b","payload":{"k":1,"k":2}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		items, err := worker.ParseJSONLines(strings.NewReader(doc), "fuzz.jsonl", worker.Limits{})
		if err != nil {
			return
		}
		var lines []string
		for l := range strings.SplitSeq(doc, "\n") {
			if strings.TrimSpace(strings.TrimSuffix(l, "\r")) != "" {
				lines = append(lines, l)
			}
		}
		if len(items) != len(lines) {
			t.Fatalf("%d items from %d lines", len(items), len(lines))
		}
		for i, it := range items {
			spelt := strings.Contains(lines[i], "\uFFFD") || strings.Contains(strings.ToLower(lines[i]), `\ufffd`)
			for _, p := range []string{it.Entity, it.Occurrence} {
				if !utf8.ValidString(p) || (strings.ContainsRune(p, utf8.RuneError) && !spelt) {
					t.Fatalf("line %d %q: key part %q rewritten", i+1, lines[i], p)
				}
			}
			if it.Payload != nil && !strings.Contains(lines[i], string(it.Payload)) {
				t.Fatalf("line %d %q: payload %q is not the line's", i+1, lines[i], it.Payload)
			}
		}
	})
}

package strictjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/runledger/runledger/internal/strictjson"
)

// hasDuplicate reports whether an object of data (read leniently) holds a
// member name twice, or data is no JSON at all (ok false).
func hasDuplicate(data []byte) (dup, ok bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(data), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	type frame struct {
		obj   bool
		names map[string]bool
		name  bool // the next string token of the object is a name
	}
	var stack []*frame
	for {
		tok, err := dec.ReadToken()
		if errors.Is(err, io.EOF) {
			return dup, true
		}
		if err != nil {
			return dup, false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		isName := top != nil && top.obj && top.name
		if top != nil && top.obj {
			top.name = !top.name
		}
		switch k := tok.Kind(); {
		case isName && k == '"':
			if top.names[tok.String()] {
				dup = true
			}
			top.names[tok.String()] = true
		case k == '{':
			stack = append(stack, &frame{obj: true, names: map[string]bool{}, name: true})
		case k == '[':
			stack = append(stack, &frame{})
		case k == '}' || k == ']':
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].obj {
				stack[len(stack)-1].name = true
			}
		}
	}
}

func fffdSpelt(data []byte) bool {
	return bytes.Contains(data, []byte("\uFFFD")) || strings.Contains(strings.ToLower(string(data)), `\ufffd`)
}

func hasFFFD(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.ContainsRune(x, utf8.RuneError)
	case []any:
		for _, e := range x {
			if hasFFFD(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if strings.ContainsRune(k, utf8.RuneError) || hasFFFD(e) {
				return true
			}
		}
	}
	return false
}

// FuzzCheck: a text Check accepts is read by encoding/json as it is written:
// valid UTF-8, valid JSON, no U+FFFD it did not spell, no member twice.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		`{"a":1}`, `{"a":"\ud800"}`, "{\"a\":\"\xff\"}", `{"a":1,"a":2}`, `{"a":1,"\u0061":2}`,
		`[{"x":{"y":[1,{"z":1,"z":2}]}}]`, `"\ud83d\ude00"`, `"\ufffd"`, `{"results":[{"ok":true}]}`, ` 1 `, `1 2`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := strictjson.Check(data)
		dup, lenient := hasDuplicate(data)
		if err != nil {
			if _, ok := errors.AsType[*strictjson.Error](err); !ok {
				t.Fatalf("%q: not a *strictjson.Error: %v", data, err)
			}
			return
		}
		if !utf8.Valid(data) || !json.Valid(data) || !lenient || dup {
			t.Fatalf("%q accepted: UTF-8 %v, JSON %v, duplicate %v", data, utf8.Valid(data), json.Valid(data), dup)
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber() // a number past float64 is JSON all the same
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%q accepted, encoding/json refuses it: %v", data, err)
		}
		if hasFFFD(v) && !fffdSpelt(data) {
			t.Fatalf("%q accepted, encoding/json reads a U+FFFD into it", data)
		}
	})
}

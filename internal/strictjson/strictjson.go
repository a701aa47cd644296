// Package strictjson is the one strict reader of the JSON runledger takes in
// (JSON Lines batches, payloads, processor answers, the workers' reports):
// a text is exactly one JSON value in valid UTF-8, with no lone surrogate
// escape (\ud800) and no object holding a member name twice. Go's
// encoding/json accepts all three, replacing the first two with U+FFFD and
// keeping the last of a name given twice, so that distinct inputs would
// silently become one (two keys one, a processor's answer another).
package strictjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	json "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Kind is what is wrong with a text.
type Kind int

const (
	Syntax      Kind = iota // not one JSON value
	Duplicate               // an object holds a member name twice
	InvalidUTF8             // bytes that are not UTF-8
	Surrogate               // a \u escape of a lone UTF-16 surrogate
)

// Error is a text that is not one strict JSON value.
type Error struct {
	Kind Kind
	// Pointer is the JSON Pointer (RFC 6901) of the value the problem is
	// in: of the member given twice for a Duplicate; "" for the whole text.
	Pointer string
	// Offset is the byte offset at or after which the problem is.
	Offset int64
	// Msg says what is wrong, of the value at Pointer: "is given twice",
	// "holds invalid UTF-8", ...
	Msg string
}

func (e *Error) Error() string {
	if e.Pointer == "" {
		return fmt.Sprintf("the JSON text %s (byte %d)", e.Msg, e.Offset)
	}
	return fmt.Sprintf("%s %s (byte %d)", e.Pointer, e.Msg, e.Offset)
}

// Field is the top-level member the problem is in ("" when it is not in
// one): "entity" for a problem at /entity or at /entity/x.
func (e *Error) Field() string {
	p, ok := strings.CutPrefix(e.Pointer, "/")
	if !ok {
		return ""
	}
	p, _, _ = strings.Cut(p, "/")
	return unescapeToken(p)
}

// Below is the Pointer below Field ("" when the problem is the field
// itself): "/x/y" for /payload/x/y.
func (e *Error) Below() string {
	p, ok := strings.CutPrefix(e.Pointer, "/")
	if !ok {
		return ""
	}
	if _, rest, ok := strings.Cut(p, "/"); ok {
		return "/" + rest
	}
	return ""
}

func unescapeToken(t string) string { return strings.NewReplacer("~1", "/", "~0", "~").Replace(t) }

// Check returns nil if data is exactly one JSON value (white space around
// it allowed) in valid UTF-8, with no lone surrogate escape and no object
// holding a member name twice (names compared after unescaping: "a" and
// "\u0061" are one name), and otherwise an *Error.
func Check(data []byte) error {
	c := checkers.Get().(*checker)
	defer func() { c.r.Reset(nil); checkers.Put(c) }()
	c.r.Reset(data)
	c.dec.Reset(&c.r)
	dec := c.dec
	if err := dec.SkipValue(); err != nil {
		return fromDecoder(err, dec)
	}
	if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
		if err != nil {
			return fromDecoder(err, dec)
		}
		return &Error{Offset: dec.InputOffset(), Msg: "holds more than one JSON value"}
	}
	return nil
}

// checker is a decoder Check reuses: a worker checks every payload of its
// batch, and a new decoder each (its buffers and name sets) was a tenth of
// what a shard allocated.
type checker struct {
	r   bytes.Reader
	dec *jsontext.Decoder
}

var checkers = sync.Pool{New: func() any {
	c := &checker{}
	c.dec = jsontext.NewDecoder(&c.r)
	return c
}}

// Unmarshal checks data (Check) and decodes it into v. Member names match
// v's JSON field names exactly, not ignoring case as encoding/json does (so
// "Results" is not a second "results"); with rejectUnknown a member v has
// no field for is an error. v's types may implement json.Unmarshaler.
func Unmarshal(data []byte, v any, rejectUnknown bool) error {
	if err := Check(data); err != nil {
		return err
	}
	return json.Unmarshal(data, v, json.RejectUnknownMembers(rejectUnknown))
}

func fromDecoder(err error, dec *jsontext.Decoder) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &Error{Offset: dec.InputOffset(), Msg: "ends before its JSON value does"}
	}
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) {
		return &Error{Offset: dec.InputOffset(), Msg: "is not valid JSON: " + err.Error()}
	}
	e := &Error{Pointer: string(se.JSONPointer), Offset: se.ByteOffset}
	inner := se.Err.Error()
	switch {
	case errors.Is(se.Err, jsontext.ErrDuplicateName):
		e.Kind, e.Msg = Duplicate, "is given twice"
	case strings.Contains(inner, "surrogate"):
		e.Kind, e.Msg = Surrogate, "holds a lone UTF-16 surrogate escape ("+inner+")"
	case strings.Contains(inner, "UTF-8"):
		e.Kind, e.Msg = InvalidUTF8, "holds invalid UTF-8"
	default:
		e.Msg = "is not valid JSON: " + inner
	}
	return e
}

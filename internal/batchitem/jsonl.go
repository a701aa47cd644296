package batchitem

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/strictjson"
)

// MaxLine bounds one JSON Lines line: a payload and its key, plus JSON
// syntax.
func MaxLine(l Limits) int { return l.MaxPayload() + 2*v1alpha1.MaxKeyPartBytes + 4096 }

// LineTooLong is the problem of a line longer than MaxLine(l).
func LineTooLong(where string, l Limits) *InputError {
	return &InputError{Where: where, Msg: fmt.Sprintf("is longer than %s (the payload limit is %s)", ByteSize(MaxLine(l)), ByteSize(l.MaxPayload()))}
}

// ReadLine returns the next line without its end of line. When the line is
// longer than max, it is consumed (never held whole) and reported as
// tooLong. err is io.EOF with the last line. line is valid until the next
// call only when it fit in br's buffer; callers copy what they keep.
func ReadLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > max+2 { // + "\r\n"
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			return trimEOL(buf), tooLong, err
		}
		return trimEOL(buf), tooLong, nil
	}
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// IsBlank reports whether a line holds only white space (JSON Lines skips
// it).
func IsBlank(line []byte) bool { return len(bytes.TrimSpace(line)) == 0 }

var jsonlFields = []string{"entity", "occurrence", "payload"}

// ParseLine reads one JSON Lines line,
//
//	{"entity": "acct-1", "occurrence": "2024-06", "payload": {"amount": 12.5}}
//
// with entity and occurrence non-empty strings and payload optional (any
// JSON value; null is none). Any other field is a problem (a misspelt field
// would otherwise silently drop data). where names the line in problems.
// The item shares no memory with line.
func ParseLine(line []byte, where string, l Limits) (ledger.Item, []*InputError) {
	// Strict first: encoding/json would turn invalid UTF-8 and lone
	// surrogates into U+FFFD (two keys into one) and keep the last of a
	// field given twice.
	if p := strictProblem(where, strictjson.Check(line)); p != nil {
		return ledger.Item{}, []*InputError{p}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return ledger.Item{}, []*InputError{{Where: where, Msg: fmt.Sprintf("is a JSON %s, not an object with entity, occurrence and payload", typeErr.Value)}}
		}
		return ledger.Item{}, []*InputError{{Where: where, Msg: "is not valid JSON: " + err.Error()}}
	}
	if obj == nil { // the line is `null`
		return ledger.Item{}, []*InputError{{Where: where, Msg: "is null, not an object with entity, occurrence and payload"}}
	}
	var problems []*InputError
	var unknown []string
	for k := range obj {
		if k != "entity" && k != "occurrence" && k != "payload" {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		problems = append(problems, &InputError{Where: where, Field: k, Msg: "is not a known field (want " + strings.Join(jsonlFields, ", ") + ")"})
	}
	var it ledger.Item
	for _, f := range []struct {
		name string
		dst  *string
	}{{"entity", &it.Entity}, {"occurrence", &it.Occurrence}} {
		raw, ok := obj[f.name]
		switch {
		case !ok:
			problems = append(problems, &InputError{Where: where, Field: f.name, Msg: "is missing"})
		case string(raw) == "null":
			problems = append(problems, &InputError{Where: where, Field: f.name, Msg: "is null"})
		case json.Unmarshal(raw, f.dst) != nil:
			problems = append(problems, &InputError{Where: where, Field: f.name, Msg: "must be a string, not " + string(abbreviate(raw, 40))})
		default:
			if msg := v1alpha1.KeyPartProblem(*f.dst); msg != "" {
				problems = append(problems, &InputError{Where: where, Field: f.name, Msg: msg})
			}
		}
	}
	if raw, ok := obj["payload"]; ok && string(raw) != "null" {
		if msg := CheckPayload(raw, l); msg != "" {
			problems = append(problems, &InputError{Where: where, Field: "payload", Msg: msg})
		}
		it.Payload = raw // json.Unmarshal copied it out of the line
	}
	return it, problems
}

func abbreviate(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append(append([]byte(nil), b[:n]...), "..."...)
}

// Package batchitem holds the rules one batch item must follow (its key
// parts, its payload, a JSON Lines line) and the bad-input errors that name
// where an item broke them. The worker's sources and internal/batchfile's
// streaming reader share it, so that every batch, whatever it comes from, is
// checked by one copy of each rule (the key parts' limits are the API's,
// v1alpha1.KeyPartProblem).
package batchitem

import (
	"errors"
	"fmt"
	"strings"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/strictjson"
)

// DefaultMaxPayloadBytes bounds one item's payload. (Key parts are bounded by
// v1alpha1.MaxKeyPartBytes, the API's rule.)
const DefaultMaxPayloadBytes = 1 << 20 // 1 MiB

// InputError is bad input: an item, a line or a row that cannot be processed,
// or a batch or query that cannot be read. Where names the place (line 3,
// batch.items[2], query row 17), Field the field when there is one.
type InputError struct {
	Where string
	Field string
	Msg   string
}

func (e *InputError) Error() string {
	switch {
	case e.Where != "" && e.Field != "":
		return fmt.Sprintf("%s: field %q %s", e.Where, e.Field, e.Msg)
	case e.Field != "":
		return fmt.Sprintf("field %q %s", e.Field, e.Msg)
	case e.Where != "":
		return e.Where + " " + e.Msg
	}
	return e.Msg
}

// maxListedProblems bounds how many problems an InputErrors lists.
const maxListedProblems = 20

// InputErrors is every problem found in a batch (the first
// maxListedProblems of them listed), so that a user fixes a file in one go.
type InputErrors struct {
	Source string // e.g. "batch.items", "JSON Lines file runs.jsonl"
	Errs   []*InputError
	Count  int // problems found, including those not listed
}

// Add counts err and lists it while fewer than maxListedProblems are.
func (e *InputErrors) Add(err *InputError) {
	e.Count++
	if len(e.Errs) < maxListedProblems {
		e.Errs = append(e.Errs, err)
	}
}

// OrNil returns e, or nil when it holds no problem.
func (e *InputErrors) OrNil() error {
	if e.Count == 0 {
		return nil
	}
	return e
}

func (e *InputErrors) Error() string {
	var b strings.Builder
	if e.Count == 1 {
		fmt.Fprintf(&b, "invalid %s: %s", e.Source, e.Errs[0])
		return b.String()
	}
	fmt.Fprintf(&b, "invalid %s: %d problems", e.Source, e.Count)
	for _, err := range e.Errs {
		b.WriteString("\n  ")
		b.WriteString(err.Error())
	}
	if e.Count > len(e.Errs) {
		fmt.Fprintf(&b, "\n  ... and %d more", e.Count-len(e.Errs))
	}
	return b.String()
}

// IsInputError reports whether err is bad input (exit code 2 in the CLI).
func IsInputError(err error) bool {
	var one *InputError
	var many *InputErrors
	return errors.As(err, &one) || errors.As(err, &many)
}

// Limits configures validation.
type Limits struct {
	// MaxPayloadBytes bounds one item's payload (DefaultMaxPayloadBytes if 0).
	MaxPayloadBytes int
}

// MaxPayload is the payload limit in force.
func (l Limits) MaxPayload() int {
	if l.MaxPayloadBytes > 0 {
		return l.MaxPayloadBytes
	}
	return DefaultMaxPayloadBytes
}

// CheckPayload validates a payload (nil: none). It returns the problem or "".
func CheckPayload(p []byte, l Limits) string {
	if msg := payloadSizeProblem(p, l); msg != "" {
		return msg
	}
	if p == nil {
		return ""
	}
	// Strict: the ledger stores it as jsonb, which keeps the last of a
	// member given twice; and encoding/json would make invalid UTF-8 U+FFFD.
	if err := strictjson.Check(p); err != nil {
		var se *strictjson.Error
		if errors.As(err, &se) && se.Kind != strictjson.Syntax {
			return strictMsg(se, se.Pointer)
		}
		return "is not valid JSON"
	}
	return ""
}

func payloadSizeProblem(p []byte, l Limits) string {
	if len(p) > l.MaxPayload() {
		return fmt.Sprintf("is %s, more than the %s allowed", ByteSize(len(p)), ByteSize(l.MaxPayload()))
	}
	return ""
}

// CheckMembers validates a payload that is a JSON object whose members are
// the fields of a record (a CSV row's payload columns): the same checks as
// CheckPayload, but a problem inside a member is that field's (Field is the
// member's name), and one of the payload's size is the payload's.
func CheckMembers(p []byte, where string, l Limits) *InputError {
	if msg := payloadSizeProblem(p, l); msg != "" {
		return &InputError{Where: where, Field: "payload", Msg: msg}
	}
	return CheckObject(p, where)
}

// CheckObject checks that p is one strict JSON value (strictjson.Check); a
// problem inside a member of the object p is that member's (Field).
func CheckObject(p []byte, where string) *InputError {
	err := strictjson.Check(p)
	if err == nil {
		return nil
	}
	if prob := strictProblem(where, err); prob != nil {
		return prob
	}
	return &InputError{Where: where, Msg: "is not valid JSON: " + err.Error()}
}

// strictMsg says what se found, of the value whose pointer below the field
// is below ("": the field itself).
func strictMsg(se *strictjson.Error, below string) string {
	switch {
	case below == "":
		return se.Msg
	case se.Kind == strictjson.Duplicate:
		return "holds " + below + " twice"
	}
	return se.Msg + " at " + below
}

// strictProblem is the problem strictjson found in the object at where (a
// JSON line), or nil when it is a mere syntax error (err is not an
// *strictjson.Error of another kind), which the caller describes itself.
func strictProblem(where string, err error) *InputError {
	var se *strictjson.Error
	if !errors.As(err, &se) || se.Kind == strictjson.Syntax {
		return nil
	}
	if f := se.Field(); f != "" {
		return &InputError{Where: where, Field: f, Msg: strictMsg(se, se.Below())}
	}
	return &InputError{Where: where, Msg: se.Msg}
}

// CheckKey validates an item's key parts (the API's rules) and returns
// their problems, if any.
func CheckKey(k ledger.Key, where string) []*InputError {
	var out []*InputError
	if msg := v1alpha1.KeyPartProblem(k.Entity); msg != "" {
		out = append(out, &InputError{Where: where, Field: "entity", Msg: msg})
	}
	if msg := v1alpha1.KeyPartProblem(k.Occurrence); msg != "" {
		out = append(out, &InputError{Where: where, Field: "occurrence", Msg: msg})
	}
	return out
}

// CheckItem validates one item and returns its problems, if any.
func CheckItem(it ledger.Item, where string, l Limits) []*InputError {
	out := CheckKey(it.Key, where)
	if msg := CheckPayload(it.Payload, l); msg != "" {
		out = append(out, &InputError{Where: where, Field: "payload", Msg: msg})
	}
	return out
}

// ByteSize writes n bytes for a person: "1 MiB", "1.5 KiB", "12 bytes".
func ByteSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

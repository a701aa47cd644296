package batchfile

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
)

// utf8BOM is skipped before a CSV header: spreadsheets write one, and it
// would otherwise be part of the first column's name.
const utf8BOM = "\ufeff"

// errRecordTooLong: a record grew past the limit before it ended (a quoted
// field not closed, most often), so it is never held whole.
var errRecordTooLong = errors.New("record too long")

// readCSV reads the CSV format (see CSV) with encoding/csv, strict (no lazy
// quotes), and stops at the first bad record, as readJSONLines does.
func (o *object) readCSV(t *text) error {
	l := o.opt.Limits
	lim := &recordLimit{r: t, max: int64(batchitem.MaxLine(l)) + 64<<10}
	cr := csv.NewReader(lim)
	lim.cr = cr
	cr.ReuseRecord = true
	if o.opt.Comma != 0 {
		cr.Comma = o.opt.Comma
	}
	if err := checkComma(cr.Comma); err != nil {
		return o.bad(err)
	}
	rec, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return o.noItems("expected a header row naming entity and occurrence")
	}
	if err != nil {
		return o.csvFailed(cr, lim, 1, 0, rec, err)
	}
	lim.next()
	headerLine, _ := cr.FieldPos(0)
	cols, prob := newColumns(rec, fmt.Sprintf("header (line %d)", headerLine))
	if prob != nil {
		return o.bad(prob)
	}
	prevLine := headerLine
	for recNo := 2; ; recNo++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return o.csvFailed(cr, lim, recNo, prevLine, rec, err)
		}
		lim.next()
		line, _ := cr.FieldPos(0)
		prevLine = line
		it, problems := cols.item(rec, fmt.Sprintf("record %d (line %d)", recNo, line), l)
		if len(problems) > 0 {
			return o.bad(problems...)
		}
		if err := o.b.add(it); err != nil {
			return err
		}
	}
	return o.noItems("a header row and no records")
}

func checkComma(c rune) *batchitem.InputError {
	if c == '\r' || c == '\n' || c == '"' || c == 0xFFFD || c <= 0 || c > 0x10FFFF {
		return &batchitem.InputError{Msg: fmt.Sprintf("cannot be read with the delimiter %q: it cannot separate CSV fields", c)}
	}
	return nil
}

// csvFailed is the error of record recNo, which starts after line prevLine;
// rec is what encoding/csv returned with err.
func (o *object) csvFailed(cr *csv.Reader, lim *recordLimit, recNo, prevLine int, rec []string, err error) error {
	after := "the header"
	if recNo > 1 {
		after = fmt.Sprintf("record %d (after line %d)", recNo, prevLine)
	}
	if errors.Is(err, errRecordTooLong) {
		return o.bad(batchitem.LineTooLong(after, o.opt.Limits))
	}
	var pe *csv.ParseError
	if !errors.As(err, &pe) {
		return o.failed(after, err)
	}
	where := fmt.Sprintf("record %d (line %d)", recNo, pe.StartLine)
	var msg string
	switch {
	case errors.Is(pe.Err, csv.ErrFieldCount):
		msg = fmt.Sprintf("has %d fields, the header %d", len(rec), cr.FieldsPerRecord)
	case errors.Is(pe.Err, csv.ErrQuote) && lim.consumed() && o.text.eof:
		msg = fmt.Sprintf("has a quoted field that is never closed: the object ends at line %d inside it (a quote inside a quoted field is written twice, RFC 4180)", pe.Line)
	case errors.Is(pe.Err, csv.ErrQuote):
		msg = fmt.Sprintf("has a quote at line %d, column %d that neither closes its quoted field nor is doubled (RFC 4180)", pe.Line, pe.Column)
	case errors.Is(pe.Err, csv.ErrBareQuote):
		msg = fmt.Sprintf("has a quote at line %d, column %d in a field that is not quoted (quote the field and double the quote, RFC 4180)", pe.Line, pe.Column)
	default:
		msg = "is not valid CSV: " + pe.Err.Error()
	}
	return o.bad(&batchitem.InputError{Where: where, Msg: msg})
}

// recordLimit feeds encoding/csv and stops a record that outgrows max:
// encoding/csv holds a record whole, however long, and has no limit of its
// own.
type recordLimit struct {
	r      io.Reader
	cr     *csv.Reader
	passed int64
	start  int64 // where the record being read starts (csv's InputOffset)
	max    int64
}

// next is told that a record was read: the next one starts.
func (l *recordLimit) next() { l.start = l.cr.InputOffset() }

func (l *recordLimit) Read(p []byte) (int, error) {
	// What csv took since the record started: the record so far and its
	// read-ahead buffer.
	if l.passed-l.start > l.max {
		return 0, errRecordTooLong
	}
	n, err := l.r.Read(p)
	l.passed += int64(n)
	return n, err
}

// consumed: csv parsed every byte it was given.
func (l *recordLimit) consumed() bool { return l.passed == l.cr.InputOffset() }

// columns is what a header says of the records under it.
type columns struct {
	entity, occurrence int
	payload            []int
	// names[i] is payload column i's JSON member name and colon: `"amount":`.
	names [][]byte
}

// newColumns reads the header. Its names are checked as the members of a
// JSON object (they become the payload's): valid UTF-8, none twice.
func newColumns(header []string, where string) (*columns, *batchitem.InputError) {
	header[0] = strings.TrimPrefix(header[0], utf8BOM)
	obj := []byte{'{'}
	for i, name := range header {
		if i > 0 {
			obj = append(obj, ',')
		}
		obj = append(appendJSONString(obj, name), ":0"...)
	}
	if prob := batchitem.CheckObject(append(obj, '}'), where); prob != nil {
		return nil, prob
	}
	c := &columns{entity: -1, occurrence: -1}
	for i, name := range header {
		switch name {
		case "entity":
			c.entity = i
		case "occurrence":
			c.occurrence = i
		case "":
			return nil, &batchitem.InputError{Where: where, Msg: fmt.Sprintf("has no name for column %d (a payload column's name is its payload member's)", i+1)}
		default:
			c.payload = append(c.payload, i)
			c.names = append(c.names, append(appendJSONString(nil, name), ':'))
		}
	}
	for _, k := range []struct {
		name string
		i    int
	}{{"entity", c.entity}, {"occurrence", c.occurrence}} {
		if k.i < 0 {
			return nil, &batchitem.InputError{Where: where, Msg: fmt.Sprintf("names no %q column (it names %s)", k.name, strings.Join(quoteAll(header), ", "))}
		}
	}
	return c, nil
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = fmt.Sprintf("%q", n)
	}
	return out
}

// item makes a record an item, or says why it cannot be one.
func (c *columns) item(rec []string, where string, l batchitem.Limits) (ledger.Item, []*batchitem.InputError) {
	// Cloned: a record's fields share one string, which the key must not
	// keep alive.
	it := ledger.Item{Key: ledger.Key{Entity: strings.Clone(rec[c.entity]), Occurrence: strings.Clone(rec[c.occurrence])}}
	problems := batchitem.CheckKey(it.Key, where)
	if len(c.payload) > 0 {
		it.Payload = c.payloadOf(rec)
		if prob := batchitem.CheckMembers(it.Payload, where, l); prob != nil {
			problems = append(problems, prob)
		}
	}
	return it, problems
}

// payloadOf is a record's payload: {"column": "cell", ...}.
func (c *columns) payloadOf(rec []string) []byte {
	n := 2
	for i, col := range c.payload {
		n += len(c.names[i]) + len(rec[col]) + 3
	}
	p := make([]byte, 0, n)
	p = append(p, '{')
	for i, col := range c.payload {
		if i > 0 {
			p = append(p, ',')
		}
		p = appendJSONString(append(p, c.names[i]...), rec[col])
	}
	return append(p, '}')
}

// appendJSONString writes s as a JSON string with nothing sanitised: bytes
// that are not UTF-8 stay as they are, for strictjson to refuse (one check
// of UTF-8 for every payload), where an encoder would make them U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

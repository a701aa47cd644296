package batchfile

import (
	"bufio"
	"errors"
	"io"
	"strconv"

	"github.com/runledger/runledger/internal/batchitem"
)

// readJSONLines reads one JSON object per line, with the rules of a
// ConfigMap batch (batchitem.ParseLine), and stops at the first bad line:
// its items may already be on their way to a transaction, and the caller
// exits 2 at once rather than read on through gigabytes to list more.
func (o *object) readJSONLines(t *text) error {
	l := o.opt.Limits
	maxLine := batchitem.MaxLine(l)
	br := bufio.NewReaderSize(t, 64<<10)
	lineNo := 0
	for {
		lineNo++
		line, tooLong, err := batchitem.ReadLine(br, maxLine)
		if err != nil && !errors.Is(err, io.EOF) {
			return o.failed(lineWhere(lineNo), err)
		}
		switch {
		case tooLong:
			return o.bad(batchitem.LineTooLong(lineWhere(lineNo), l))
		case !batchitem.IsBlank(line):
			it, problems := batchitem.ParseLine(line, lineWhere(lineNo), l)
			if len(problems) > 0 {
				return o.bad(problems...)
			}
			if aerr := o.b.add(it); aerr != nil {
				return aerr
			}
		}
		if err != nil { // io.EOF
			break
		}
	}
	return o.noItems("expected one JSON object per line")
}

// lineWhere names a line; made only for a line that is not blank (a file
// of blank lines costs no string each).
func lineWhere(n int) string { return "line " + strconv.Itoa(n) }

// noItems is bad input when the object held no item: it is empty, or holds
// only blank lines (or a CSV header).
func (o *object) noItems(expected string) error {
	switch {
	case o.stats.Items > 0 || len(o.b.items) > 0:
		return nil
	case o.text.n == 0 && o.text.c == None:
		return o.bad(&batchitem.InputError{Msg: "is empty (0 bytes)"})
	case o.text.n == 0:
		return o.bad(&batchitem.InputError{Msg: "is empty: its " + o.text.c.String() + " stream holds 0 bytes"})
	}
	return o.bad(&batchitem.InputError{Msg: "holds no items (" + expected + ")"})
}

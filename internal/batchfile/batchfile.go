// Package batchfile streams the items of one batch file (an object of a
// bucket, a file): JSON Lines or CSV, plain, gzip- or zstd-compressed, in
// bounded memory whatever its size. Every item is checked by the rules
// every other batch follows (internal/batchitem: invalid UTF-8, lone
// surrogates, a field twice, a key part missing or over the API's limits,
// NUL, a payload over its limit); the first bad line or record stops the
// read with a bad-input error (batchitem.IsInputError) that names the
// object and the line. Read also returns the SHA-256 of the bytes it read
// (as stored, compressed), so that a batch fixed from the file can tell
// later whether the object changed.
//
// It knows nothing of buckets or of the ledger: the caller opens the object
// and decides what to do with the items (a COPY into runledger.batch).
package batchfile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
)

// Format is how a file writes its items.
type Format int

const (
	// JSONLines: one JSON object per line, as a ConfigMap batch
	// (batchitem.ParseLine); blank lines are skipped.
	JSONLines Format = iota + 1
	// CSV: RFC 4180 records (quoted fields, "" for a quote, a configurable
	// delimiter) under a header row that names an "entity" and an
	// "occurrence" column, exactly and once each. Every other column is the
	// payload's: a record's payload is the JSON object of those columns, in
	// the header's order, each value the cell's text as a JSON string
	// ({"amount": "12.5"}), for CSV has no types and guessing them would
	// rewrite data ("007" would become 7); no other column, no payload. An
	// empty cell is "" (CSV cannot tell empty from absent), empty lines are
	// skipped, a UTF-8 byte order mark before the header is dropped.
	// Records are numbered from the header's, record 1, as a spreadsheet
	// numbers rows; errors also give the line where the record starts.
	CSV
)

func (f Format) String() string {
	switch f {
	case JSONLines:
		return "JSON Lines"
	case CSV:
		return "CSV"
	}
	return fmt.Sprintf("format(%d)", int(f))
}

// Compression is how a file's bytes are compressed.
type Compression int

const (
	// Detect (the zero value) takes the compression from the file's first
	// bytes: gzip's and zstd's magic numbers, else none. Both formats are
	// UTF-8 text, which can never begin with either (0x8b and 0xb5 are
	// continuation bytes, which cannot follow an ASCII byte), so a text is
	// never taken for a compressed stream; a key's suffix or a store's
	// Content-Encoding is only what the writer claimed.
	Detect Compression = iota
	// None: the bytes are the text.
	None
	// Gzip (RFC 1952), one member or several one after the other.
	Gzip
	// Zstd (RFC 8878), one frame or several.
	Zstd
)

func (c Compression) String() string {
	switch c {
	case Detect:
		return "detect"
	case None:
		return "none"
	case Gzip:
		return "gzip"
	case Zstd:
		return "zstd"
	}
	return fmt.Sprintf("compression(%d)", int(c))
}

// Defaults of Options.
const (
	DefaultBatchItems = 1000
	DefaultBatchBytes = 8 << 20 // 8 MiB
)

// Options configures Read.
type Options struct {
	Format Format
	// Compression: Detect (the zero value) reads it from the magic bytes;
	// another value is required of the file (a gzip file read as Zstd is
	// bad input).
	Compression Compression
	// Comma is CSV's field delimiter (',' if 0): ';' and '\t' are common.
	Comma rune
	// BatchItems and BatchBytes bound one batch handed to the callback: it
	// is handed on when it holds BatchItems items or its keys and payloads
	// BatchBytes bytes (DefaultBatchItems, DefaultBatchBytes if 0).
	BatchItems int
	BatchBytes int
	// Limits are the item rules' (the payload limit).
	Limits batchitem.Limits
}

// Stats is what Read read.
type Stats struct {
	// Compression is the file's (found, when Options.Compression was
	// Detect).
	Compression Compression
	// Bytes is how many bytes were read from the reader (compressed, as
	// stored), SHA256 their digest: of the whole object when Read returns
	// nil.
	Bytes  int64
	SHA256 [sha256.Size]byte
	// TextBytes is how many bytes the text had (decompressed).
	TextBytes int64
	// Items is how many items were handed to the callback.
	Items int64
}

// Digest is SHA256 as "sha256:" and 64 hex digits.
func (s Stats) Digest() string { return "sha256:" + hex.EncodeToString(s.SHA256[:]) }

// Read streams the items of the file r holds to fn, in batches, in the
// file's order. name names the file in errors (say s3://bucket/key).
//
// fn's slice is reused once fn returns (the items are not): it copies what
// it keeps. Items are handed on before the end of the file is read, so a
// bad line found later makes the batches already handed on part of a bad
// file: the caller discards them (rolls their transaction back).
//
// ctx is checked before each batch is handed on; r's reads should end with
// ctx too (an HTTP response body does).
//
// Memory is bounded whatever the file's size: a line or record at most
// batchitem.MaxLine(Limits) long, a batch (BatchItems, BatchBytes), and
// the decompressor's window (zstd's at most maxZstdWindow).
//
// The error is bad input (batchitem.IsInputError: an *batchitem.InputErrors
// naming the object and the line or record) when the file's bytes are
// wrong, including a compressed stream cut short; r's own errors (a store
// that fails mid-read), ctx's and fn's are returned wrapped, not as bad
// input.
func Read(ctx context.Context, r io.Reader, name string, opt Options, fn func([]ledger.Item) error) (Stats, error) {
	o := &object{name: name, opt: opt, src: newSource(r)}
	o.b = &batcher{ctx: ctx, fn: fn, maxItems: opt.BatchItems, maxBytes: opt.BatchBytes, count: &o.stats.Items}
	if o.b.maxItems <= 0 {
		o.b.maxItems = DefaultBatchItems
	}
	if o.b.maxBytes <= 0 {
		o.b.maxBytes = DefaultBatchBytes
	}
	err := o.read()
	o.stats.Bytes, o.stats.SHA256 = o.src.n, o.src.sum()
	if o.text != nil {
		o.stats.TextBytes = o.text.n
	}
	return o.stats, err
}

// object is one Read.
type object struct {
	name  string
	opt   Options
	src   *source
	text  *text // the decompressed bytes
	b     *batcher
	stats Stats
}

func (o *object) read() error {
	if o.opt.Format != JSONLines && o.opt.Format != CSV {
		return fmt.Errorf("reading %s: unknown format %v", o.name, o.opt.Format)
	}
	t, closeText, err := o.open()
	if err != nil {
		return err
	}
	defer closeText()
	o.text = t
	switch o.opt.Format {
	case JSONLines:
		err = o.readJSONLines(t)
	default:
		err = o.readCSV(t)
	}
	if err != nil {
		return err
	}
	if err := o.b.flush(); err != nil {
		return err
	}
	return o.atEnd()
}

// atEnd makes sure every byte of the object was read (and hashed): a
// compressed stream followed by other bytes is bad input.
func (o *object) atEnd() error {
	n, err := io.Copy(io.Discard, o.src.buf)
	if err != nil {
		return fmt.Errorf("reading %s after its %s stream: %w", o.name, o.stats.Compression, err)
	}
	if n > 0 {
		return o.bad(&batchitem.InputError{Msg: fmt.Sprintf("has %d bytes after the end of its %s stream", n, o.stats.Compression)})
	}
	return nil
}

// kind names the object in bad-input errors: "gzip-compressed CSV object".
func (o *object) kind() string {
	if c := o.stats.Compression; c == Gzip || c == Zstd {
		return fmt.Sprintf("%s-compressed %s object", c, o.opt.Format)
	}
	return fmt.Sprintf("%s object", o.opt.Format)
}

// bad is bad input: the problems of one place of the object.
func (o *object) bad(problems ...*batchitem.InputError) error {
	errs := &batchitem.InputErrors{Source: o.kind() + " " + o.name}
	for _, p := range problems {
		errs.Add(p)
	}
	return errs
}

// failed is an error reading the text at where: bad input when the
// compressed stream is wrong, r's own error otherwise.
func (o *object) failed(where string, err error) error {
	var se *storeError
	var ce *corruptError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("reading %s at %s: %w", o.name, where, se.err)
	case errors.As(err, &ce):
		return o.bad(&batchitem.InputError{Where: where, Msg: ce.problem()})
	}
	return fmt.Errorf("reading %s at %s: %w", o.name, where, err)
}

// batcher hands items on in batches.
type batcher struct {
	ctx                context.Context
	fn                 func([]ledger.Item) error
	items              []ledger.Item
	bytes              int
	maxItems, maxBytes int
	count              *int64
}

func (b *batcher) add(it ledger.Item) error {
	b.items = append(b.items, it)
	b.bytes += len(it.Entity) + len(it.Occurrence) + len(it.Payload)
	if len(b.items) >= b.maxItems || b.bytes >= b.maxBytes {
		return b.flush()
	}
	return nil
}

func (b *batcher) flush() error {
	if len(b.items) == 0 {
		return nil
	}
	if err := b.ctx.Err(); err != nil {
		return err
	}
	if err := b.fn(b.items); err != nil {
		return fmt.Errorf("handing on %d items: %w", len(b.items), err)
	}
	*b.count += int64(len(b.items))
	clear(b.items) // the slice is reused: its items are the garbage collector's now
	b.items, b.bytes = b.items[:0], 0
	return nil
}

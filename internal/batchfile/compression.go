package batchfile

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/runledger/runledger/internal/batchitem"
)

// maxZstdWindow bounds the memory a zstd frame may ask for: zstd's levels
// use at most 8 MiB, --long at most 128 MiB; a frame that wants more is
// refused rather than allowed to take the worker's memory.
const maxZstdWindow = 128 << 20

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// source is the object as read: it counts and hashes every byte, and keeps
// the reader's own error so that a decompressor's error is told from the
// store's.
type source struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	err error
	buf *bufio.Reader // over the source: peeks the magic bytes
}

func newSource(r io.Reader) *source {
	s := &source{r: r, h: sha256.New()}
	s.buf = bufio.NewReaderSize(s, 64<<10)
	return s
}

func (s *source) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.h.Write(p[:n])
	s.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		s.err = err
	}
	return n, err
}

func (s *source) sum() (out [sha256.Size]byte) {
	copy(out[:], s.h.Sum(nil))
	return out
}

// storeError is an error of the reader Read was given (not bad input).
type storeError struct{ err error }

func (e *storeError) Error() string { return e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// corruptError is a compressed stream that cannot be decompressed (bad
// input).
type corruptError struct {
	c   Compression
	err error
}

func (e *corruptError) Error() string { return e.problem() }
func (e *corruptError) Unwrap() error { return e.err }

func (e *corruptError) problem() string {
	if errors.Is(e.err, io.ErrUnexpectedEOF) {
		return fmt.Sprintf("is cut short: the %s stream is truncated (it ends before its end)", e.c)
	}
	return fmt.Sprintf("cannot be decompressed: the %s stream is corrupt (%v)", e.c, e.err)
}

// text is the decompressed bytes: it counts them, and tells the store's
// errors from the stream's own.
type text struct {
	r   io.Reader
	src *source
	c   Compression
	n   int64
	eof bool
}

func (t *text) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.n += int64(n)
	switch {
	case err == nil:
		return n, nil
	case errors.Is(err, io.EOF):
		t.eof = true
		return n, io.EOF // bare: encoding/csv compares err == io.EOF
	case t.src.err != nil:
		return n, &storeError{err: err}
	case t.c == None:
		return n, &storeError{err: err} // no stream of ours: nothing else fails
	}
	return n, &corruptError{c: t.c, err: err}
}

// open finds (or checks) the compression and returns the text.
func (o *object) open() (*text, func(), error) {
	c := o.opt.Compression
	if c == Detect {
		head, err := o.src.buf.Peek(len(zstdMagic))
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("reading %s: %w", o.name, err)
		}
		switch {
		case bytes.HasPrefix(head, gzipMagic):
			c = Gzip
		case bytes.HasPrefix(head, zstdMagic):
			c = Zstd
		default:
			c = None
		}
	}
	o.stats.Compression = c
	t := &text{src: o.src, c: c}
	switch c {
	case None:
		t.r = o.src.buf
		return t, func() {}, nil
	case Gzip:
		zr, err := gzip.NewReader(o.src.buf)
		if err != nil {
			return nil, nil, o.notStream(err)
		}
		t.r = zr
		return t, func() { _ = zr.Close() }, nil
	case Zstd:
		// One goroutine, low memory: the reader is read line by line, and
		// a worker's memory is the batch's.
		zr, err := zstd.NewReader(o.src.buf, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s: starting zstd: %w", o.name, err)
		}
		t.r = zr
		return t, zr.Close, nil
	}
	return nil, nil, fmt.Errorf("reading %s: unknown compression %v", o.name, c)
}

// notStream is the error of a stream whose header cannot be read.
func (o *object) notStream(err error) error {
	if o.src.err != nil {
		return fmt.Errorf("reading %s: %w", o.name, o.src.err)
	}
	if o.src.n == 0 {
		return o.bad(&batchitem.InputError{Msg: "is empty (0 bytes)"})
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return o.bad(&batchitem.InputError{Msg: fmt.Sprintf("is cut short: the %s stream is truncated (it ends in its header)", o.stats.Compression)})
	}
	return o.bad(&batchitem.InputError{Msg: fmt.Sprintf("is not a %s stream: %v", o.stats.Compression, err)})
}

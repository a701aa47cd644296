package s3test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Lines is a JSON Lines object of N lines of exactly LineLen bytes each
// (at least 80), made on demand: as large as a test wants, never in
// memory. Line i is the item e<i> (9 digits) of occurrence 2026-06 with a
// payload padded to length. It is an io.ReadSeeker, as a client that signs
// the payload needs.
type Lines struct {
	N, LineLen int64
	pos        int64
}

// Size is the object's length in bytes.
func (l *Lines) Size() int64 { return l.N * l.LineLen }

func (l *Lines) line(i int64) string {
	head := fmt.Sprintf(`{"entity":"e%09d","occurrence":"2026-06","payload":{"pad":"`, i)
	tail := `"}}` + "\n"
	return head + strings.Repeat("x", int(l.LineLen)-len(head)-len(tail)) + tail
}

func (l *Lines) Read(p []byte) (int, error) {
	if l.pos >= l.Size() {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && l.pos < l.Size() {
		i, off := l.pos/l.LineLen, l.pos%l.LineLen
		c := copy(p[n:], l.line(i)[off:])
		n += c
		l.pos += int64(c)
	}
	return n, nil
}

// Seek implements io.Seeker.
func (l *Lines) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		l.pos = offset
	case io.SeekCurrent:
		l.pos += offset
	case io.SeekEnd:
		l.pos = l.Size() + offset
	}
	if l.pos < 0 {
		return 0, fmt.Errorf("seeking before the start of the object")
	}
	return l.pos, nil
}

// PutLines writes l as bucket's object key, streamed, and returns its ETag.
func PutLines(t testing.TB, bucket, key string, l *Lines) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := l.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	out, err := Client(t).PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: l, ContentLength: aws.Int64(l.Size())})
	if err != nil {
		t.Fatalf("s3test: putting s3://%s/%s (%d bytes): %v", bucket, key, l.Size(), err)
	}
	return aws.ToString(out.ETag)
}

// Gzip is b gzip-compressed, as an export tool writes it.
func Gzip(t testing.TB, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

package batchfile_test

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/batchfile"
	"github.com/runledger/runledger/internal/ledger"
)

// generated is a batch file of n items made as it is read, never held.
type generated struct {
	n, i   int
	csv    bool
	line   []byte // the current line's backing array
	rest   []byte // what is left of it to read
	filler string
}

func newGenerated(n int, csv bool) *generated {
	g := &generated{n: n, csv: csv, filler: fmt.Sprintf("%0200d", 7)}
	if csv {
		g.line = append(g.line, "entity,occurrence,amount,note\n"...)
		g.rest = g.line
	}
	return g
}

func (g *generated) Read(p []byte) (int, error) {
	for len(g.rest) == 0 {
		if g.i == g.n {
			return 0, io.EOF
		}
		g.line = g.line[:0]
		if g.csv {
			g.line = fmt.Appendf(g.line, "acct-%d,2024-%02d,%d.%02d,\"%s, \"\"n\"\"\"\n", g.i, g.i%12+1, g.i, g.i%100, g.filler)
		} else {
			g.line = fmt.Appendf(g.line, `{"entity":"acct-%d","occurrence":"2024-%02d","payload":{"amount":%d.%02d,"note":"%s"}}`+"\n", g.i, g.i%12+1, g.i, g.i%100, g.filler)
		}
		g.rest = g.line
		g.i++
	}
	n := copy(p, g.rest)
	g.rest = g.rest[n:]
	return n, nil
}

// compressed is r compressed as it is read.
func compressed(t *testing.T, r io.Reader, c batchfile.Compression) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		var w io.WriteCloser
		switch c {
		case batchfile.Gzip:
			w, _ = gzip.NewWriterLevel(pw, gzip.BestSpeed)
		default:
			zw, err := zstd.NewWriter(pw, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			w = zw
		}
		_, err := io.Copy(w, r)
		if err == nil {
			err = w.Close()
		}
		pw.CloseWithError(err)
	}()
	t.Cleanup(func() { _ = pr.Close() })
	return pr
}

// heapPeak reads r and returns its stats and how far the live heap grew
// above where it stood before, at its highest (sampled every few batches).
func heapPeak(t *testing.T, r io.Reader, format batchfile.Format) (batchfile.Stats, uint64) {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapAlloc, ms.HeapAlloc
	batches := 0
	st, err := batchfile.Read(context.Background(), r, "generated", batchfile.Options{Format: format}, func(b []ledger.Item) error {
		if batches++; batches%20 == 0 {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
		}
		return nil
	})
	require.NoError(t, err)
	return st, peak - base
}

// TestReadMemoryIsBounded reads generated files far larger than the bound
// (and one a tenth their size): the heap's growth, measured, stays under
// the bound and does not grow with the file.
func TestReadMemoryIsBounded(t *testing.T) {
	const bound = 48 << 20
	items := 1_000_000 // about 290 MB of JSON Lines, 250 MB of CSV
	if testing.Short() {
		items = 250_000
	}
	for _, tt := range []struct {
		format batchfile.Format
		comp   batchfile.Compression
	}{
		{batchfile.JSONLines, batchfile.None},
		{batchfile.CSV, batchfile.Gzip},
		{batchfile.JSONLines, batchfile.Zstd},
	} {
		t.Run(tt.format.String()+" "+tt.comp.String(), func(t *testing.T) {
			grew := map[int]uint64{}
			var large int64
			for _, n := range []int{items / 10, items} {
				var r io.Reader = newGenerated(n, tt.format == batchfile.CSV)
				if tt.comp != batchfile.None {
					r = compressed(t, r, tt.comp)
				}
				st, g := heapPeak(t, r, tt.format)
				require.Equal(t, int64(n), st.Items)
				require.Equal(t, tt.comp, st.Compression)
				require.Greater(t, st.TextBytes, int64(n/10*200), "the text is as large as generated")
				t.Logf("%d items, %s of text, %s read: the heap grew %s at most", n, mib(st.TextBytes), mib(st.Bytes), mib(int64(g)))
				require.Less(t, g, uint64(bound), "the heap grew by %s reading %s", mib(int64(g)), mib(st.TextBytes))
				grew[n], large = g, st.TextBytes
			}
			if !testing.Short() {
				require.Greater(t, large, int64(4*bound), "the large file's text is several times the bound")
			}
			// Ten times the file, not ten times the memory (a little slack for
			// where the sampling and the collector happen to fall).
			require.Less(t, grew[items], 3*grew[items/10]+(8<<20), "the heap's growth does not follow the file's size")
		})
	}
}

func mib(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }

package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ledgerSample is the ledger's highest row id at a moment of a run: on a
// fresh ledger (no conflicts, so no gaps) the number of items committed.
type ledgerSample struct {
	at   time.Duration
	rows int64
}

// sampleLedger reads the ledger's highest id every interval (an index-only
// lookup, so cheap whatever the ledger's size) until the returned stop is
// called, which returns the samples.
func sampleLedger(b *testing.B, dsn string, interval time.Duration) (stop func() []ledgerSample) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	done := make(chan []ledgerSample, 1)
	go func() {
		var samples []ledgerSample
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			var rows int64
			// The table may not exist until the first shard has migrated.
			if err := pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM runledger.ledger`).Scan(&rows); err == nil {
				samples = append(samples, ledgerSample{at: time.Since(start), rows: rows})
			}
			select {
			case <-ctx.Done():
				done <- samples
				return
			case <-tick.C:
			}
		}
	}()
	return func() []ledgerSample {
		cancel()
		s := <-done
		pool.Close()
		return s
	}
}

// flatness is the rate of the slowest fifth of a run's committed items over
// the rate of its fastest fifth (1 is perfectly flat; a rate that decays as
// the ledger grows, or steps when statistics catch up, shows well below).
// The fifths are of the items after the first tenth, so that the start
// (fixing the batch, the processes' first connections) is left out; the
// moment a mark is reached is interpolated between two samples. It returns
// 0 when the run did not finish or its samples are too few to tell.
func flatness(samples []ledgerSample, total int64) float64 {
	const parts = 5
	var reached [parts + 1]float64
	k := 0
	for i := 1; i < len(samples) && k <= parts; i++ {
		a, b := samples[i-1], samples[i]
		for k <= parts {
			mark := float64(total) * (1 + 9*float64(k)/parts) / 10
			if float64(b.rows) < mark {
				break
			}
			if b.rows == a.rows || float64(a.rows) >= mark {
				reached[k] = b.at.Seconds()
			} else {
				f := (mark - float64(a.rows)) / float64(b.rows-a.rows)
				reached[k] = a.at.Seconds() + f*(b.at-a.at).Seconds()
			}
			k++
		}
	}
	if k <= parts || len(samples) < 4*parts {
		return 0
	}
	slowest, fastest := 0.0, 0.0
	for i := 1; i <= parts; i++ {
		d := reached[i] - reached[i-1]
		if d <= 0 {
			return 0
		}
		if i == 1 || d > slowest {
			slowest = d
		}
		if i == 1 || d < fastest {
			fastest = d
		}
	}
	return fastest / slowest
}

func TestFlatness(t *testing.T) {
	at := func(s ...int64) []ledgerSample {
		out := make([]ledgerSample, len(s))
		for i, rows := range s {
			out[i] = ledgerSample{at: time.Duration(i) * time.Second, rows: rows}
		}
		return out
	}
	// decay continues at(...) from rows at 2 items a second until total,
	// its samples a second apart after the 7 of at(...) above.
	decay := func(rows, perSecond, total int64) []ledgerSample {
		var out []ledgerSample
		for i := int64(1); rows < total; i++ {
			rows = min(total, rows+perSecond)
			out = append(out, ledgerSample{at: time.Duration(7+i) * time.Second, rows: rows})
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		samples []ledgerSample
		want    float64
	}{
		{"flat after a slow start", at(0, 0, 0, 0, 0, 0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 100, 100, 100, 100, 100, 100), 1},
		// 10 items a second, then 2 from the 64th item on: the last two
		// fifths (18 items each) take 9s instead of 1.8s.
		{"decay", append(at(0, 0, 10, 20, 30, 40, 50, 60), decay(60, 2, 100)...), 0.2},
		{"unfinished", at(0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 96, 97, 98, 99, 99, 99, 99, 99, 99, 99), 0},
		{"too few samples", at(0, 50, 100), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := flatness(tc.samples, 100); got < tc.want-0.01 || got > tc.want+0.01 {
				t.Fatalf("flatness = %.3f, want %.3f", got, tc.want)
			}
		})
	}
}

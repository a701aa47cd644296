package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ledgerSample is the last id the ledger's sequence handed out at a moment of
// a run: on a fresh ledger (no conflicts, so no gaps) the number of items
// claimed, committed or in a chunk's transaction still in flight.
type ledgerSample struct {
	at   time.Duration
	rows int64
}

// sampleLedger reads the ledger's id sequence every interval until the
// returned stop is called, which returns the samples, timed from start. (Not
// max(id): its backward scan of the primary key checks every row of the
// chunks in flight, up to 40,000, and cost 80 ms of a core per sample, a
// third of a core taken from the run it measured.)
func sampleLedger(b *testing.B, dsn string, start time.Time, interval time.Duration) (stop func() []ledgerSample) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	var samples []ledgerSample
	sample := func(ctx context.Context) {
		var rows int64
		// The table may not exist until the first shard has migrated.
		if err := pool.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value('runledger.ledger_id_seq'), 0)`).Scan(&rows); err == nil {
			samples = append(samples, ledgerSample{at: time.Since(start), rows: rows})
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			sample(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() []ledgerSample {
		cancel()
		<-done
		sample(context.Background()) // the end, after the last commit
		pool.Close()
		return samples
	}
}

// flatness is the rate of the slowest fifth of a run's committed items over
// the rate of its fastest fifth (1 is perfectly flat; a rate that decays as
// the ledger grows, or steps when statistics catch up, shows well below); 0
// when the fifths are unknown.
func flatness(rates []float64) float64 {
	if rates == nil {
		return 0
	}
	return slices.Min(rates) / slices.Max(rates)
}

// whileAllRan is the samples taken before the first shard's process exited
// (at firstExit): after it fewer shards commit, so the run's rate falls for a
// reason that is not the insert path's; and the rows they reach, the total
// for fifths.
func whileAllRan(samples []ledgerSample, firstExit time.Duration) ([]ledgerSample, int64) {
	n := 0
	for n < len(samples) && samples[n].at <= firstExit {
		n++
	}
	if n == 0 {
		return nil, 0
	}
	return samples[:n], samples[n-1].rows
}

// fifths is the items/s of each fifth of a run's items after the first tenth,
// so that the start (fixing the batch, the processes' first connections) is
// left out; the moment a mark is reached is interpolated between two
// samples. It is nil when the run did not finish or its samples are too few.
func fifths(samples []ledgerSample, total int64) []float64 {
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
		return nil
	}
	rates := make([]float64, parts)
	for i := range rates {
		d := reached[i+1] - reached[i]
		if d <= 0 {
			return nil
		}
		rates[i] = float64(total) * 9 / 10 / parts / d
	}
	return rates
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
			if got := flatness(fifths(tc.samples, 100)); got < tc.want-0.01 || got > tc.want+0.01 {
				t.Fatalf("flatness = %.3f, want %.3f", got, tc.want)
			}
		})
	}
}

// perSecond shows rates as "12.1k 11.8k ..." (or "-" when unknown).
func perSecond(rates []float64) string {
	if rates == nil {
		return "-"
	}
	out := make([]string, len(rates))
	for i, r := range rates {
		out[i] = fmt.Sprintf("%.1fk", r/1000)
	}
	return strings.Join(out, " ")
}

func TestWhileAllRan(t *testing.T) {
	s := []ledgerSample{{at: 0, rows: 0}, {at: time.Second, rows: 10}, {at: 2 * time.Second, rows: 20}, {at: 3 * time.Second, rows: 25}}
	got, rows := whileAllRan(s, 2*time.Second)
	if len(got) != 3 || rows != 20 {
		t.Fatalf("whileAllRan = %v, %d; want the first 3 samples and 20 rows", got, rows)
	}
	if got, rows := whileAllRan(s, -time.Second); got != nil || rows != 0 {
		t.Fatalf("before any sample: %v, %d", got, rows)
	}
}

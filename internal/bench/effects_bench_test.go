package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/pkg/processor"
)

// effectItems is the batch of the effects benchmark
// (RUNLEDGER_BENCH_EFFECT_ITEMS overrides it for a quick look).
func effectItems() int {
	if n, err := strconv.Atoi(os.Getenv("RUNLEDGER_BENCH_EFFECT_ITEMS")); err == nil && n > 0 {
		return n
	}
	return 500_000
}

const effectShards = 2

// The effects of BenchmarkWorkerEffects, as a new user writes them (issue #31).
const (
	trivialEffect   = `select count(*) from claimed`
	insertingEffect = `insert into eff select entity, occurrence from claimed`
)

// BenchmarkWorkerEffects runs `runledger run` end to end (the real binary,
// one process per shard, a query source of effectItems() rows, 2 shards,
// the default chunk size) on a fresh ledger each time, durable, without an
// effect and then with a trivial SQL effect, an SQL effect that inserts one
// row per item, and a minimal Go processor (pkg/processor, answering ok, in
// this process on loopback; the default maxItemsPerCall, 100, so its chunks
// are of 100 items), and prints each one's items/s and its ratio to the run
// without an effect measured in the same process. Each figure is the best
// of two runs; its flatness (flatness(), while every shard's process runs)
// is the worst of the two. Targets:
// trivial >= 0.8x, inserting >= 0.5x, flatness >= 0.6 for each
// (docs/insert-path.md gives the processor's and what bounds it).
func BenchmarkWorkerEffects(b *testing.B) {
	n := effectItems()
	bin := buildRunledger(b)
	url := minimalProcessor(b)
	variants := []struct {
		name, spec string
		args       []string
	}{
		{name: "no effect"},
		{name: "SQL effect, trivial", spec: "  effect: {sql: '" + trivialEffect + "'}\n"},
		{name: "SQL effect, inserting", spec: "  effect: {sql: '" + insertingEffect + "'}\n"},
		{name: "processor, minimal", spec: "  effect:\n    processor: {image: bench-processor}\n", args: []string{"--processor-url", url}},
	}
	// An untimed run first: the server's first run of a process decayed in
	// six of seven cold starts (flatness 0.55-0.59), its later runs not
	// (0.81-0.87): the fresh server warming (new pg_wal files or free
	// shared_buffers, not pinned: docs/insert-path.md), not the ledger's growth.
	warm := sourceDatabase(b, n)
	if r := runShards(b, bin, warm, "effect-warm-up", effectShards, ""); r.counts[1] != int64(n) {
		b.Fatalf("warm-up: counts %v, want all %d completed", r.counts, n)
	}
	rates := make([]float64, len(variants))
	flat := make([]float64, len(variants))    // the worst of the repetitions
	shape := make([][]float64, len(variants)) // the fifths of that worst
	for range b.N {
		for rep := range workerReps {
			for i, v := range variants {
				dsn := sourceDatabase(b, n)
				effectTable(b, dsn)
				r := runShards(b, bin, dsn, fmt.Sprintf("effect-%d-%d", i, rep), effectShards, v.spec, v.args...)
				if r.counts != [4]int64{int64(n), int64(n), 0, 0} {
					b.Fatalf("%s: counts %v, want all %d completed", v.name, r.counts, n)
				}
				rates[i] = max(rates[i], r.rate)
				if f := flatness(r.fifths); rep == 0 || f < flat[i] {
					flat[i], shape[i] = f, r.fifths
				}
			}
		}
	}
	b.ReportMetric(rates[0], "items/s")
	b.ReportMetric(rates[1]/rates[0], "x(trivial)")
	b.ReportMetric(rates[2]/rates[0], "x(inserting)")
	b.ReportMetric(rates[3]/rates[0], "x(processor)")
	b.ReportMetric(slices.Min(flat), "flat")

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nworker with effects: runledger run, %d items from a query, %d shards (one process each), default chunks, a fresh ledger each, fsync on, best of %d\n",
		n, effectShards, workerReps)
	fmt.Fprintln(w, "effect\titems/s\tvs no effect\tflatness\titems/s by fifth\t")
	for i, v := range variants {
		fmt.Fprintf(w, "%s\t%.0f/s\t%.2fx\t%.2f\t%s\t\n", v.name, rates[i], rates[i]/rates[0], flat[i], perSecond(shape[i]))
	}
	fmt.Fprintln(w, "flatness: the slowest fifth of the items after the first tenth, until a shard ends, over the fastest fifth; worst of the runs (1 is flat)")
	fmt.Fprintln(w, "targets: trivial SQL >= 0.80x; inserting SQL >= 0.50x; flatness >= 0.60 (docs/insert-path.md)")
	_ = w.Flush()
}

// effectTable creates the inserting effect's table, granted to the effect
// role as a user would.
func effectTable(b *testing.B, dsn string) {
	b.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE eff (entity text NOT NULL, occurrence text NOT NULL)`); err != nil {
		b.Fatalf("creating the effect's table: %v", err)
	}
}

// minimalProcessor serves pkg/processor's contract on loopback, answering
// ok for every item, until the benchmark ends, and returns its URL.
func minimalProcessor(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{
		Handler: processor.Handler(func(context.Context, *processor.Request, processor.Item) processor.Result {
			return processor.OK()
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}

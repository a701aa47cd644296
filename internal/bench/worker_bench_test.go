package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/internal/pgtest"
)

// workerItems is the batch of the end-to-end benchmark
// (RUNLEDGER_BENCH_WORKER_ITEMS overrides it for a quick look).
func workerItems() int {
	if n, err := strconv.Atoi(os.Getenv("RUNLEDGER_BENCH_WORKER_ITEMS")); err == nil && n > 0 {
		return n
	}
	return 1_000_000
}

const (
	workerShards = 4
	workerChunk  = 10_000 // as the ceiling's statements
	workerReps   = 2
)

// workerRun is one `runledger run` of every shard, each in its own process,
// started together.
type workerRun struct {
	rate    float64 // items per second, wall clock of the slowest shard
	peakRSS []int64 // bytes, per shard
	// peakAnon: the private part of peakRSS (RssAnon: heap, stacks), per
	// shard; the rest is the binary's pages, shared by every process running it.
	peakAnon []int64
	counts   [4]int64  // total, completed, alreadyHandled, failed
	fifths   []float64 // items/s of each fifth of the items after the first tenth (fifths), on a fresh ledger
}

// BenchmarkWorker runs `runledger run` end to end (the real binary, one
// process per shard, a query source of workerItems() rows, 4 shards) on a
// durable cluster, fresh and then with every item already handled, against
// the ledger's ceiling (a) (bare set-based INSERT ... ON CONFLICT DO NOTHING
// in statements of 10,000 items on 4 connections) measured in the same
// process, and prints items/s, the ratios and each shard's peak RSS.
// Targets: fresh >= 0.6x (a); already handled >= 2x fresh; RSS < 100 MiB.
func BenchmarkWorker(b *testing.B) {
	n := workerItems()
	bin := buildRunledger(b)

	var ceilingRate float64
	var freshRun, handled workerRun
	for range b.N {
		for rep := range workerReps {
			ceilingRate = max(ceilingRate, measure(b, ceiling, n, workerShards, fresh))
			dsn := sourceDatabase(b, n)
			f := runWorkers(b, bin, dsn, fmt.Sprintf("fresh-%d", rep))
			if f.counts != [4]int64{int64(n), int64(n), 0, 0} {
				b.Fatalf("fresh run: counts %v, want all %d completed", f.counts, n)
			}
			// Another run over the same batch: every item already handled.
			h := runWorkers(b, bin, dsn, fmt.Sprintf("again-%d", rep))
			if h.counts != [4]int64{int64(n), 0, int64(n), 0} {
				b.Fatalf("handled run: counts %v, want all %d already handled", h.counts, n)
			}
			freshRun, handled = best(freshRun, f), best(handled, h)
		}
	}
	b.ReportMetric(freshRun.rate, "items/s")
	b.ReportMetric(freshRun.rate/ceilingRate, "x(a)")
	b.ReportMetric(handled.rate/freshRun.rate, "handled/fresh")

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nworker benchmark: runledger run, %d items from a query, %d shards (one process each), chunks of %d, fsync on, best of %d\n",
		n, workerShards, workerChunk, workerReps)
	fmt.Fprintln(w, "run\titems/s\tvs (a) ceiling\tpeak RSS per shard\tof which private\t")
	fmt.Fprintf(w, "(a) ceiling, %d conns\t%.0f/s\t1.00x\t\t\t\n", workerShards, ceilingRate)
	fmt.Fprintf(w, "fresh\t%.0f/s\t%.2fx\t%s\t%s\t\n", freshRun.rate, freshRun.rate/ceilingRate, mib(freshRun.peakRSS), mib(freshRun.peakAnon))
	fmt.Fprintf(w, "all already handled\t%.0f/s\t%.2fx\t%s\t%s\t\n", handled.rate, handled.rate/ceilingRate, mib(handled.peakRSS), mib(handled.peakAnon))
	fmt.Fprintf(w, "already handled / fresh: %.2fx\n", handled.rate/freshRun.rate)
	fmt.Fprintln(w, "targets: fresh >= 0.60x (a); already handled >= 2x fresh; peak RSS < 100 MiB per shard")
	_ = w.Flush()
}

// buildRunledger builds the runledger binary the benchmarks run.
func buildRunledger(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "runledger")
	build := exec.Command("go", "build", "-o", bin, "github.com/runledger/runledger")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building runledger: %v\n%s", err, out)
	}
	return bin
}

func best(a, b workerRun) workerRun {
	if b.rate > a.rate {
		return b
	}
	return a
}

func mib(rss []int64) string {
	parts := make([]string, len(rss))
	for i, r := range rss {
		parts[i] = fmt.Sprintf("%.0f", float64(r)/(1<<20))
	}
	return strings.Join(parts, " / ") + " MiB"
}

// sourceDatabase returns a fresh durable database holding the batch as a
// table (written and vacuumed before any timing).
func sourceDatabase(b *testing.B, n int) string {
	b.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(b)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
CREATE TABLE usage AS
SELECT 'acct-' || lpad((i % 1000)::text, 4, '0') AS account,
       '2026-11-' || lpad(i::text, 7, '0') AS period,
       jsonb_build_object('amount', i) AS payload
FROM generate_series(0, $1 - 1) i`, n); err != nil {
		b.Fatalf("creating the source table: %v", err)
	}
	settle(ctx, b, pool)
	return dsn
}

// runWorkers runs the shards of run name over the usage table, one process
// each, all started at once, and returns their combined rate and counts.
func runWorkers(b *testing.B, bin, dsn, name string) workerRun {
	b.Helper()
	return runShards(b, bin, dsn, name, workerShards, fmt.Sprintf("  chunkSize: %d\n", workerChunk))
}

// runShards runs shards processes of run name over the usage table, its spec
// completed by spec (YAML lines under spec:), with extra arguments.
func runShards(b *testing.B, bin, dsn, name string, shards int, spec string, extra ...string) workerRun {
	b.Helper()
	manifest := filepath.Join(b.TempDir(), name+".yaml")
	if err := os.WriteFile(manifest, []byte(fmt.Sprintf(`apiVersion: processing.runledger.dev/v1alpha1
kind: ProcessingRun
metadata: {name: %s, namespace: bench}
spec:
  database: {secretRef: {name: db, key: dsn}}
  batch:
    query: SELECT account AS entity, period AS occurrence, payload FROM usage
  workers: %d
%s`, name, shards, spec)), 0o600); err != nil {
		b.Fatal(err)
	}
	cmds := make([]*exec.Cmd, shards)
	outs := make([]*bytes.Buffer, shards)
	errs := make([]*bytes.Buffer, shards)
	for s := range cmds {
		args := append([]string{"run", "-f", manifest, "--dsn", dsn, "--shard", fmt.Sprintf("%d/%d", s, shards), "--output", "json"}, extra...)
		cmds[s] = exec.Command(bin, args...)
		outs[s], errs[s] = &bytes.Buffer{}, &bytes.Buffer{}
		cmds[s].Stdout, cmds[s].Stderr = outs[s], errs[s]
	}
	busyBefore := machineBusy()
	start := time.Now()
	stopSampling := sampleLedger(b, dsn, start, 100*time.Millisecond)
	exits := make([]time.Duration, shards) // since start
	var wg sync.WaitGroup
	failures := make([]error, shards)
	r := workerRun{peakRSS: make([]int64, shards), peakAnon: make([]int64, shards)}
	for s, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			b.Fatalf("starting shard %d: %v", s, err)
		}
		exited := make(chan struct{})
		wg.Go(func() { failures[s] = cmd.Wait(); exits[s] = time.Since(start); close(exited) })
		wg.Go(func() { r.peakRSS[s], r.peakAnon[s] = peakRSS(cmd.Process.Pid, exited) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	samples := stopSampling()

	for s := range cmds {
		if failures[s] != nil {
			b.Fatalf("shard %d of %s: %v\n%s", s, name, failures[s], errs[s])
		}
		var out struct{ Total, Completed, AlreadyHandled, Failed int64 }
		if err := json.Unmarshal(outs[s].Bytes(), &out); err != nil {
			b.Fatalf("shard %d of %s: result %q: %v", s, name, outs[s], err)
		}
		r.counts[0] += out.Total
		r.counts[1] += out.Completed
		r.counts[2] += out.AlreadyHandled
		r.counts[3] += out.Failed
	}
	r.rate = float64(r.counts[0]) / elapsed.Seconds()
	r.fifths = fifths(whileAllRan(samples, slices.Min(exits)))
	if os.Getenv("RUNLEDGER_BENCH_DEBUG") != "" {
		var shardsCPU time.Duration
		for _, cmd := range cmds {
			shardsCPU += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
		busy := machineBusy() - busyBefore
		b.Logf("%s: %s; CPU: the shards' processes %s, the rest of the machine (PostgreSQL) %s\n%s",
			name, elapsed, shardsCPU.Round(time.Millisecond), (busy - shardsCPU).Round(time.Millisecond), errs[0])
	}
	return r
}

// machineBusy is the CPU time the whole machine has spent busy (every
// state of /proc/stat's cpu line but idle and iowait), for the debug output.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var busy int64
	for i, f := range strings.Fields(line)[1:] {
		if v, err := strconv.ParseInt(f, 10, 64); err == nil && i != 3 && i != 4 {
			busy += v
		}
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}

// peakRSS follows a process's VmHWM (its peak resident set, in bytes) and
// the largest RssAnon seen (its private memory: the rest is the binary's
// pages, shared by all its processes), sampled every 20 ms, until exited.
func peakRSS(pid int, exited <-chan struct{}) (peak, anon int64) {
	for {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				name, v, _ := strings.Cut(line, ":")
				kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				switch {
				case err != nil:
				case name == "VmHWM":
					peak = max(peak, kib*1024)
				case name == "RssAnon":
					anon = max(anon, kib*1024)
				}
			}
		}
		select {
		case <-exited:
			return peak, anon
		case <-time.After(20 * time.Millisecond):
		}
	}
}

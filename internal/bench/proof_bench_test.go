package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/runledger/runledger/internal/ledger"
)

// proofItems is the batch of the proof benchmark
// (RUNLEDGER_BENCH_PROOF_ITEMS overrides it for a quick look).
func proofItems() int {
	if n, err := strconv.Atoi(os.Getenv("RUNLEDGER_BENCH_PROOF_ITEMS")); err == nil && n > 0 {
		return n
	}
	return 500_000
}

// BenchmarkProof measures what the shard's proof (issue #44: before a shard
// reports success the ledger proves its counts, ledger.Store.ProveShard)
// costs, against the run it ends: `runledger run` of proofItems() rows from
// a query in 2 shards (one process each, durable, the proof included), fresh
// and then a second run over the same batch (every item already handled);
// after each, every shard's proof again, at once, as the shards make it.
// It prints each proof's time over its run's. Target: <= 0.10 of a fresh
// run's time, for the fresh run's proof and the handled run's.
func BenchmarkProof(b *testing.B) {
	n := proofItems()
	bin := buildRunledger(b)
	var freshRun, handledRun, freshProof, handledProof time.Duration
	for range b.N {
		for rep := range workerReps {
			dsn := sourceDatabase(b, n)
			f := runShards(b, bin, dsn, fmt.Sprintf("proof-fresh-%d", rep), effectShards, "")
			checkCounts(b, "fresh run", f, [4]int64{int64(n), int64(n), 0, 0})
			fp := proveShards(b, dsn, fmt.Sprintf("proof-fresh-%d", rep), effectShards)
			h := runShards(b, bin, dsn, fmt.Sprintf("proof-handled-%d", rep), effectShards, "")
			checkCounts(b, "handled run", h, [4]int64{int64(n), 0, int64(n), 0})
			hp := proveShards(b, dsn, fmt.Sprintf("proof-handled-%d", rep), effectShards)
			fr, hr := runTime(n, f), runTime(n, h)
			if rep == 0 || fr+fp < freshRun+freshProof { // the fastest repetition's
				freshRun, freshProof, handledRun, handledProof = fr, fp, hr, hp
			}
		}
	}
	b.ReportMetric(float64(freshProof)/float64(freshRun), "proof/fresh")
	b.ReportMetric(float64(handledProof)/float64(freshRun), "handledProof/fresh")

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nthe shard's proof: runledger run, %d items from a query, %d shards (one process each), fsync on, the faster of %d; every shard's proof again after the run, at once\n",
		n, effectShards, workerReps)
	fmt.Fprintln(w, "run\trun's time\tits proof\tproof / run\tproof / fresh run\t")
	fmt.Fprintf(w, "fresh\t%s\t%s\t%.3f\t%.3f\t\n", freshRun.Round(time.Millisecond), freshProof.Round(time.Millisecond), float64(freshProof)/float64(freshRun), float64(freshProof)/float64(freshRun))
	fmt.Fprintf(w, "all already handled\t%s\t%s\t%.3f\t%.3f\t\n", handledRun.Round(time.Millisecond), handledProof.Round(time.Millisecond), float64(handledProof)/float64(handledRun), float64(handledProof)/float64(freshRun))
	fmt.Fprintln(w, "target: each proof <= 0.10 of the fresh run's time (issue #44)")
	_ = w.Flush()
}

// runTime is the wall time of run r of n items.
func runTime(n int, r workerRun) time.Duration {
	return time.Duration(float64(n) / r.rate * float64(time.Second))
}

// proveShards proves every shard of run name (the one runledger run fixed
// in dsn's ledger) at once and returns the wall time of the slowest.
func proveShards(b *testing.B, dsn, name string, shards int) time.Duration {
	b.Helper()
	ctx := context.Background()
	pool, err := ledger.Open(ctx, dsn, int32(shards))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var uid string
	if err := pool.QueryRow(ctx, `SELECT run_uid FROM runledger.batch_run WHERE run_name = $1`, name).Scan(&uid); err != nil {
		b.Fatalf("finding run %s: %v", name, err)
	}
	store := ledger.NewStore(pool)
	proofs := make([]ledger.RunProof, shards)
	errs := make([]error, shards)
	start := time.Now()
	var wg sync.WaitGroup
	for s := range shards {
		wg.Go(func() { proofs[s], errs[s] = store.ProveShard(ctx, uid, s, true, nil) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	var keys int64
	for s := range shards {
		if errs[s] != nil || !proofs[s].Proven() {
			b.Fatalf("proving shard %d of %s: %v %+v", s, name, errs[s], proofs[s])
		}
		keys += proofs[s].Keys
	}
	if keys == 0 {
		b.Fatalf("proving %s: no key", name)
	}
	return elapsed
}

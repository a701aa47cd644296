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

	"github.com/runledger/runledger/api/v1alpha1"
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
// after each, every shard's proof again, at once, as the shards make it
// (their server kept its life: counted), and then key by key, as after a
// failover. It prints each proof's time over its run's. Target: <= 0.10 of
// a fresh run's time, for the fresh run's proof and the handled run's.
func BenchmarkProof(b *testing.B) {
	n := proofItems()
	bin := buildRunledger(b)
	var best [2]proofRun
	for range b.N {
		for rep := range workerReps {
			dsn := sourceDatabase(b, n)
			server := serverOf(b, dsn)
			f := runShards(b, bin, dsn, fmt.Sprintf("proof-fresh-%d", rep), effectShards, "")
			checkCounts(b, "fresh run", f, [4]int64{int64(n), int64(n), 0, 0})
			fresh := proofRun{run: runTime(n, f)}
			fresh.counted, fresh.byKey = proveShards(b, dsn, fmt.Sprintf("proof-fresh-%d", rep), server, f.shards)
			h := runShards(b, bin, dsn, fmt.Sprintf("proof-handled-%d", rep), effectShards, "")
			checkCounts(b, "handled run", h, [4]int64{int64(n), 0, int64(n), 0})
			handled := proofRun{run: runTime(n, h)}
			handled.counted, handled.byKey = proveShards(b, dsn, fmt.Sprintf("proof-handled-%d", rep), server, h.shards)
			if rep == 0 || fresh.run+fresh.counted < best[0].run+best[0].counted { // the fastest repetition's
				best = [2]proofRun{fresh, handled}
			}
		}
	}
	fresh, handled := best[0], best[1]
	b.ReportMetric(float64(fresh.counted)/float64(fresh.run), "proof/fresh")
	b.ReportMetric(float64(handled.counted)/float64(fresh.run), "handledProof/fresh")

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nthe shard's proof: runledger run, %d items from a query, %d shards (one process each), fsync on, the faster of %d; every shard's proof again after the run, at once\n",
		n, effectShards, workerReps)
	fmt.Fprintln(w, "run\trun's time\tits proof\tproof / run\tproof / fresh run\tkey by key (after a failover)\tkey by key / fresh run\t")
	for _, r := range []struct {
		name string
		proofRun
	}{{"fresh", fresh}, {"all already handled", handled}} {
		fmt.Fprintf(w, "%s\t%s\t%s\t%.3f\t%.3f\t%s\t%.3f\t\n", r.name, r.run.Round(time.Millisecond), r.counted.Round(time.Millisecond),
			float64(r.counted)/float64(r.run), float64(r.counted)/float64(fresh.run), r.byKey.Round(time.Millisecond), float64(r.byKey)/float64(fresh.run))
	}
	fmt.Fprintln(w, "target: each proof <= 0.10 of the fresh run's time (issue #44); key by key: what a failover adds")
	_ = w.Flush()
}

// proofRun is a run's time and its shards' proofs': counted (the server
// kept its life through the run) and key by key.
type proofRun struct {
	run, counted, byKey time.Duration
}

// runTime is the wall time of run r of n items.
func runTime(n int, r workerRun) time.Duration {
	return time.Duration(float64(n) / r.rate * float64(time.Second))
}

// serverOf reads which server, and which life of it, dsn's is, as a shard
// does before its pass.
func serverOf(b *testing.B, dsn string) ledger.ServerIdentity {
	b.Helper()
	ctx := context.Background()
	pool, err := ledger.Open(ctx, dsn, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	id, err := ledger.NewStore(pool).Server(ctx)
	if err != nil || !id.Known() {
		b.Fatalf("reading the ledger's server: %v (%s)", err, id)
	}
	return id
}

// proveShards proves every shard of run name (the one runledger run fixed
// in dsn's ledger) at once, as the shards do (their counts, server the
// ledger's server before the run), and then key by key, and returns the
// wall time of the slowest of each.
func proveShards(b *testing.B, dsn, name string, server ledger.ServerIdentity, counts []v1alpha1.ItemCounts) (counted, byKey time.Duration) {
	b.Helper()
	ctx := context.Background()
	pool, err := ledger.Open(ctx, dsn, int32(len(counts)))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var uid string
	if err := pool.QueryRow(ctx, `SELECT run_uid FROM runledger.batch_run WHERE run_name = $1`, name).Scan(&uid); err != nil {
		b.Fatalf("finding run %s: %v", name, err)
	}
	store := ledger.NewStore(pool)
	prove := func(how string, counted func(int) *ledger.Counted) time.Duration {
		proofs := make([]ledger.RunProof, len(counts))
		errs := make([]error, len(counts))
		start := time.Now()
		var wg sync.WaitGroup
		for s := range counts {
			wg.Go(func() { proofs[s], errs[s] = store.ProveShard(ctx, uid, s, true, nil, counted(s)) })
		}
		wg.Wait()
		elapsed := time.Since(start)
		for s := range counts {
			if errs[s] != nil || !proofs[s].Proven() || proofs[s].ItemCounts != counts[s] {
				b.Fatalf("proving shard %d of %s %s: %v %+v (it reported %+v)", s, name, how, errs[s], proofs[s], counts[s])
			}
			if proofs[s].Counted != (how == "counted") {
				b.Fatalf("proving shard %d of %s %s: counted %v", s, name, how, proofs[s].Counted)
			}
		}
		return elapsed
	}
	counted = prove("counted", func(s int) *ledger.Counted { return &ledger.Counted{Server: server, ItemCounts: counts[s]} })
	byKey = prove("key by key", func(int) *ledger.Counted { return nil })
	return counted, byKey
}

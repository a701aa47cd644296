package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/worker"
)

// runsCount is how many runs the benchmark keeps (RUNLEDGER_BENCH_RUNS
// overrides it); runsRunning of them run, the others are finished.
func runsCount() int {
	if n, err := strconv.Atoi(os.Getenv("RUNLEDGER_BENCH_RUNS")); err == nil && n > 0 {
		return n
	}
	return 1000
}

const (
	runsRunning        = 50
	runsFinishedShards = 2
	runsRunningShards  = 4
	runsWindow         = 30 * time.Second
)

// BenchmarkManyRuns: one `runledger manager` with runsCount() runs, most
// finished (2 shards each, their pods kept, half with a TTL of a day), 50
// running (4 shards each, the workers reporting on their pods every 2 s with
// the real worker.StatusReporter). It measures, from the manager's own
// metrics, reconciles and API requests per second while only finished runs
// exist (target: none, no periodic work for finished runs), then, with the
// running ones, the reconcile latency p50/p99
// (controller_runtime_reconcile_time_seconds), API requests per second
// (rest_client_requests_total) and the manager's memory (VmRSS, Go heap in
// use). Targets: memory < 256 MiB, p99 < 1 s.
func BenchmarkManyRuns(b *testing.B) {
	bin := buildRunledger(b)
	k := startKubeBench(b)
	k.startManager(b, bin)
	ctx := context.Background()
	total := runsCount()
	finished := total - runsRunning

	var idleReconciles, idleRequests, reconcilesPerSec, requestsPerSec, p50, p99 float64
	var rssBytes int64
	var heapBytes float64
	var setup time.Duration
	for range b.N {
		start := time.Now()
		ns := k.namespace(b, "runs")
		// Finished runs: created, their pods created by the manager, every
		// shard succeeded (the kubelet played here).
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := range finished {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				run := newBenchRun(ns, fmt.Sprintf("done-%04d", i), runsFinishedShards, 0)
				if i%2 == 0 {
					run.Spec.TTLSecondsAfterFinished = ptr.To[int32](86400)
				}
				if err := k.c.Create(ctx, run); err != nil {
					b.Errorf("creating %s: %v", run.Name, err)
					return
				}
				for _, pod := range k.waitPods(b, run) {
					shard := int32(shardOf(b, &pod))
					setSucceeded(b, k.c, &pod, v1alpha1.ShardReport{Shard: shard, ItemCounts: v1alpha1.ItemCounts{Total: 500, Completed: 500}, Message: "done"})
				}
			})
		}
		wg.Wait()
		waitRunsFinished(b, k, ns, finished)
		setup = time.Since(start)

		// Only finished runs: nothing to do.
		time.Sleep(5 * time.Second)
		m0 := mustScrape(b, k.mgrMetrics)
		time.Sleep(runsWindow / 2)
		m1 := mustScrape(b, k.mgrMetrics)
		idleReconciles = (reconciles(m1) - reconciles(m0)) / (runsWindow / 2).Seconds()
		idleRequests = (requests(m1) - requests(m0)) / (runsWindow / 2).Seconds()

		// Running runs, their workers reporting.
		simCtx, stop := context.WithCancel(ctx)
		var sim sync.WaitGroup
		begin := time.Now()
		for i := range runsRunning {
			run := newBenchRun(ns, fmt.Sprintf("live-%04d", i), runsRunningShards, 0)
			if err := k.c.Create(ctx, run); err != nil {
				b.Fatal(err)
			}
			for _, pod := range k.waitPods(b, run) {
				shard := shardOf(b, &pod)
				env := worker.PodEnv{Namespace: ns, Name: run.Name, UID: string(run.UID), Shard: shard, Shards: runsRunningShards,
					PodName: pod.Name, PodUID: string(pod.UID)}
				rep := worker.NewStatusReporter(k.c, env, 0, logr.Discard())
				sim.Go(func() { rep.Run(simCtx) })
				sim.Go(func() {
					t := time.NewTicker(500 * time.Millisecond)
					defer t.Stop()
					for {
						select {
						case <-simCtx.Done():
							return
						case <-t.C:
							done := int64(time.Since(begin) / time.Millisecond)
							rep.Update(worker.Report{Shard: shard, ItemCounts: v1alpha1.ItemCounts{Total: 1 << 40, Completed: done}, TotalKnown: true}, 0)
						}
					}
				})
			}
		}
		time.Sleep(5 * time.Second)
		m0 = mustScrape(b, k.mgrMetrics)
		time.Sleep(runsWindow)
		m1 = mustScrape(b, k.mgrMetrics)
		stop()
		sim.Wait()
		reconcilesPerSec = (reconciles(m1) - reconciles(m0)) / runsWindow.Seconds()
		requestsPerSec = (requests(m1) - requests(m0)) / runsWindow.Seconds()
		p50, p99 = quantile(m0, m1, 0.50), quantile(m0, m1, 0.99)
		rssBytes = rss(k.mgr.Process.Pid)
		heapBytes = m1.sum("go_memstats_heap_inuse_bytes", nil)
	}
	b.ReportMetric(float64(rssBytes)/(1<<20), "MiB-rss")
	b.ReportMetric(p99, "s-p99")

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nmany runs benchmark: one runledger manager (envtest apiserver), %d runs: %d finished (%d shards, pods kept, half with a 1-day TTL), %d running (%d shards, workers reporting every 2 s); set up in %s\n",
		total, finished, runsFinishedShards, runsRunning, runsRunningShards, setup.Round(time.Second))
	fmt.Fprintln(w, "figure\tmeasured\ttarget\t")
	fmt.Fprintf(w, "reconciles/s, finished runs only\t%.2f\t0 (no periodic work)\t\n", idleReconciles)
	fmt.Fprintf(w, "API requests/s, finished runs only\t%.2f\t0\t\n", idleRequests)
	fmt.Fprintf(w, "reconciles/s, with %d running\t%.1f\t\t\n", runsRunning, reconcilesPerSec)
	fmt.Fprintf(w, "API requests/s of the manager, with %d running\t%.1f\t\t\n", runsRunning, requestsPerSec)
	fmt.Fprintf(w, "reconcile p50\t<= %s\t\t\n", seconds(p50))
	fmt.Fprintf(w, "reconcile p99\t<= %s\t< 1 s\t\n", seconds(p99))
	fmt.Fprintf(w, "manager RSS\t%.0f MiB\t< 256 MiB\t\n", float64(rssBytes)/(1<<20))
	fmt.Fprintf(w, "manager Go heap in use\t%.0f MiB\t\t\n", heapBytes/(1<<20))
	_ = w.Flush()
	if idleReconciles > 0.05 || p99 >= 1 || rssBytes >= 256<<20 {
		fmt.Println("TARGET MISSED")
	}
}

func waitRunsFinished(b *testing.B, k *kubeBench, ns string, want int) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var list v1alpha1.ProcessingRunList
		if err := k.c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, r := range list.Items {
			if r.Status.Phase == v1alpha1.RunSucceeded {
				n++
			}
		}
		if n >= want {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d runs finished after 10 minutes", n, want)
		}
		time.Sleep(time.Second)
	}
}

func reconciles(m metrics) float64 {
	return m.sum("controller_runtime_reconcile_total", is("controller", "processingrun"))
}

func requests(m metrics) float64 { return m.sum("rest_client_requests_total", nil) }

// quantile is the upper bound of the reconcile-time bucket holding quantile q
// of the reconciles between two scrapes.
func quantile(m0, m1 metrics, q float64) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, le := range bucketBounds(m1) {
		match := func(l map[string]string) bool { return l["controller"] == "processingrun" && l["le"] == le }
		n := m1.sum("controller_runtime_reconcile_time_seconds_bucket", match) - m0.sum("controller_runtime_reconcile_time_seconds_bucket", match)
		v := math.Inf(1)
		if le != "+Inf" {
			v, _ = strconv.ParseFloat(le, 64)
		}
		bs = append(bs, bucket{v, n})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0
	}
	all := bs[len(bs)-1].n
	for _, bk := range bs {
		if bk.n >= q*all {
			return bk.le
		}
	}
	return math.Inf(1)
}

func bucketBounds(m metrics) []string {
	seen := map[string]bool{}
	var out []string
	m.each("controller_runtime_reconcile_time_seconds_bucket", func(l map[string]string) {
		if l["controller"] == "processingrun" && !seen[l["le"]] {
			seen[l["le"]] = true
			out = append(out, l["le"])
		}
	})
	return out
}

func seconds(s float64) string {
	if math.IsInf(s, 1) {
		return "+Inf"
	}
	return (time.Duration(s * float64(time.Second))).String()
}

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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// runsCount is how many runs the benchmark keeps (RUNLEDGER_BENCH_RUNS
// overrides it); runsRunning of them run, the others are finished.
func runsCount() int {
	if n, err := strconv.Atoi(os.Getenv("RUNLEDGER_BENCH_RUNS")); err == nil && n > 0 {
		return n
	}
	return 10_000
}

const (
	runsRunning        = 50
	runsFinishedShards = 2
	runsRunningShards  = 4
	runsWindow         = 30 * time.Second
)

// BenchmarkManyRuns: one `runledger manager` with runsCount() runs, most
// finished (2 shards each, their pods kept, half with a TTL of a day), 50
// running (4 shards each). It measures, from the manager's own metrics,
// reconciles and API requests per second while only finished runs exist
// (target: none, no periodic work for finished runs), then, with the running
// ones, the reconcile latency p50/p99 (controller_runtime_reconcile_time_seconds),
// reconciles and API requests per second, and the manager's memory (VmRSS,
// Go heap in use), twice on the same running runs: their workers reporting
// with the real worker.StatusReporter on a real ledger database (one
// reporter per run), then as before (every worker patching its own pod
// every 2 s). Targets: RSS < 512 MiB, p99 < 1 s, reconciles per running run
// <= 1/s.
func BenchmarkManyRuns(b *testing.B) {
	bin := buildRunledger(b)
	k := startKubeBench(b)
	k.startManager(b, bin)
	store := ledger.NewStore(pgtest.Pool(b, pgtest.NewDatabase(b)))
	ctx := context.Background()
	total := runsCount()
	finished := total - runsRunning

	var idleReconciles, idleRequests float64
	var now, before runsWindowFigures
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
				run := newBenchRun(ns, fmt.Sprintf("done-%05d", i), runsFinishedShards, 0)
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

		live := startLiveRuns(b, k, ns)
		now = measureLive(b, k, live, store, designReporter)
		before = measureLive(b, k, live, store, designPods)
	}
	b.ReportMetric(float64(now.rss)/(1<<20), "MiB-rss")
	b.ReportMetric(now.p99, "s-p99")

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nmany runs benchmark: one runledger manager (envtest apiserver), %d runs: %d finished (%d shards, pods kept, half with a 1-day TTL), %d running (%d shards); set up in %s\n",
		total, finished, runsFinishedShards, runsRunning, runsRunningShards, setup.Round(time.Second))
	fmt.Fprintf(w, "figure\t%s\t%s\ttarget\t\n", designReporter, designPods)
	fmt.Fprintf(w, "reconciles/s, finished runs only\t%.2f\t\t0 (no periodic work)\t\n", idleReconciles)
	fmt.Fprintf(w, "API requests/s, finished runs only\t%.2f\t\t0\t\n", idleRequests)
	fmt.Fprintf(w, "reconciles/s, with %d running\t%.1f\t%.1f\t\t\n", runsRunning, now.reconciles, before.reconciles)
	fmt.Fprintf(w, "reconciles/s per running run\t%.2f\t%.2f\t<= 1\t\n", now.reconciles/runsRunning, before.reconciles/runsRunning)
	fmt.Fprintf(w, "pod writes/s per running run\t%.2f\t%.2f\t\t\n", now.podWrites/runsRunning, before.podWrites/runsRunning)
	fmt.Fprintf(w, "API requests/s of the manager, with %d running\t%.1f\t%.1f\t\t\n", runsRunning, now.requests, before.requests)
	fmt.Fprintf(w, "reconcile p50\t<= %s\t<= %s\t\t\n", seconds(now.p50), seconds(before.p50))
	fmt.Fprintf(w, "reconcile p99\t<= %s\t<= %s\t< 1 s\t\n", seconds(now.p99), seconds(before.p99))
	fmt.Fprintf(w, "manager RSS\t%.0f MiB\t%.0f MiB\t< 512 MiB\t\n", float64(now.rss)/(1<<20), float64(before.rss)/(1<<20))
	fmt.Fprintf(w, "manager Go heap in use\t%.0f MiB\t%.0f MiB\t\t\n", now.heap/(1<<20), before.heap/(1<<20))
	_ = w.Flush()
	if idleReconciles > 0.05 || now.p99 >= 1 || now.rss >= 512<<20 || now.reconciles/runsRunning > 1 {
		fmt.Println("TARGET MISSED")
	}
}

// liveRun is a running run's pods, as the simulated workers report on them.
type liveRun struct {
	run  *v1alpha1.ProcessingRun
	pods []corev1.Pod
}

func startLiveRuns(b *testing.B, k *kubeBench, ns string) []liveRun {
	b.Helper()
	var out []liveRun
	for i := range runsRunning {
		run := newBenchRun(ns, fmt.Sprintf("live-%04d", i), runsRunningShards, 0)
		if err := k.c.Create(context.Background(), run); err != nil {
			b.Fatal(err)
		}
		out = append(out, liveRun{run: run, pods: k.waitPods(b, run)})
	}
	return out
}

// runsWindowFigures are one window's figures with running runs.
type runsWindowFigures struct {
	reconciles, requests, podWrites, p50, p99, heap float64
	rss                                             int64
}

// measureLive has the live runs' workers report with design for a window
// and measures it.
func measureLive(b *testing.B, k *kubeBench, live []liveRun, store *ledger.Store, design string) runsWindowFigures {
	b.Helper()
	simCtx, stop := context.WithCancel(context.Background())
	var sim sync.WaitGroup
	begin := time.Now()
	interval := time.Duration(v1alpha1.ReportIntervalSeconds) * time.Second
	for _, lr := range live {
		for i := range lr.pods {
			pod := &lr.pods[i]
			shard := shardOf(b, pod)
			counts := func() v1alpha1.ItemCounts {
				return v1alpha1.ItemCounts{Total: 1 << 40, Completed: int64(time.Since(begin) / time.Millisecond)}
			}
			if design == designPods {
				sim.Go(func() { podReporterBefore(simCtx, k.c, pod, shard, interval, counts) })
				continue
			}
			env := worker.PodEnv{Namespace: lr.run.Namespace, Name: lr.run.Name, UID: string(lr.run.UID), Shard: shard, Shards: runsRunningShards,
				PodName: pod.Name, PodUID: string(pod.UID)}
			rep := worker.NewStatusReporter(k.pods, env, 0, logr.Discard())
			rep.SetBoard(store)
			sim.Go(func() { rep.Run(simCtx) })
			sim.Go(func() {
				t := time.NewTicker(500 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-simCtx.Done():
						return
					case <-t.C:
						rep.Update(worker.Report{Shard: shard, ItemCounts: counts(), TotalKnown: true}, 0)
					}
				}
			})
		}
	}
	time.Sleep(8 * time.Second)
	m0, a0 := mustScrape(b, k.mgrMetrics), k.apiserverMetrics(b)
	time.Sleep(runsWindow)
	m1, a1 := mustScrape(b, k.mgrMetrics), k.apiserverMetrics(b)
	stop()
	sim.Wait()
	podWrites := func(m metrics) float64 {
		return m.sum("apiserver_request_total", func(l map[string]string) bool { return l["resource"] == "pods" && writeVerb(l) })
	}
	secs := runsWindow.Seconds()
	return runsWindowFigures{
		reconciles: (reconciles(m1) - reconciles(m0)) / secs,
		requests:   (requests(m1) - requests(m0)) / secs,
		podWrites:  (podWrites(a1) - podWrites(a0)) / secs,
		p50:        quantile(m0, m1, 0.50), p99: quantile(m0, m1, 0.99),
		rss:  rss(k.mgr.Process.Pid),
		heap: m1.sum("go_memstats_heap_inuse_bytes", nil),
	}
}

func waitRunsFinished(b *testing.B, k *kubeBench, ns string, want int) {
	b.Helper()
	deadline := time.Now().Add(40 * time.Minute)
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
			b.Fatalf("%d of %d runs finished after 40 minutes", n, want)
		}
		time.Sleep(5 * time.Second)
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

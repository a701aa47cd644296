package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/worker"
)

// statusWindow is how long each configuration is measured, workers
// reporting all along (RUNLEDGER_BENCH_STATUS_WINDOW overrides it).
func statusWindow() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("RUNLEDGER_BENCH_STATUS_WINDOW")); err == nil && d > 0 {
		return d
	}
	return 20 * time.Second
}

// The protocols measured side by side.
const (
	designReporter = "one reporter per run"
	designPods     = "each pod (before)"
)

// statusShardTime is how long every simulated shard takes to process its
// share: no shard finishes within a window, so progress moves all along.
const statusShardTime = 90 * time.Second

// statusRow is one configuration's figures.
type statusRow struct {
	design      string
	batch       string
	shards      int32
	runWrites   float64 // writes to the run object per second
	runBytes    int     // size of the run object (JSON), what etcd stores per write
	podWrites   float64 // writes to pods per second (the workers' reports)
	eventWrites float64 // Events written per second
	reconciles  float64 // the manager's reconciles per second
	etcdBytes   float64 // bytes put into etcd per second, all objects
	lagMean     time.Duration
	lagMax      time.Duration // how far the run's completed count was behind the simulated ledger
	countsExact bool
	latency     time.Duration // mean time of a write of the run
}

func (r statusRow) writes() float64 { return r.runWrites + r.podWrites + r.eventWrites }

// BenchmarkStatusWrites measures what the workers' progress reports cost the
// API server and etcd: the simulated workers of a run of 1, 16 and 256
// shards make progress (each shard takes 90 s over its share of 1,000,000
// items) while the real `runledger manager` reconciles the run; the
// apiserver's apiserver_request_total gives the writes to the run, its pods
// and Events per second, the manager's metrics its reconciles, etcd's
// etcd_debugging_mvcc_total_put_size_in_bytes the bytes written, and the
// run's status read every 500 ms how far its completed count is behind the
// simulated ledger. Each configuration runs with both protocols, one after
// the other: "one reporter per run" is the protocol as it is (the real
// worker.StatusReporter, publishing to a real ledger database, the lowest
// live shard writing every shard's progress on its pod), "each pod
// (before)" the protocol before it (every worker patched its own pod's
// report every 2 s). Then every shard finishes (final report, pod Succeeded
// with its termination message) and the run's counts must be exactly the sum
// of the final reports. Batches: a query and 10,000 inline items (the run
// object is about 1 MB). Targets: API writes caused by the run <= 1/s
// whatever the shards, reconciles <= 1/s, counts at most about 10 s behind
// the ledger, exact at the end.
func BenchmarkStatusWrites(b *testing.B) {
	bin := buildRunledger(b)
	k := startKubeBench(b)
	k.startManager(b, bin)
	store := ledger.NewStore(pgtest.Pool(b, pgtest.NewDatabase(b)))
	window := statusWindow()
	var rows []statusRow
	seq := 0
	for range b.N {
		rows = rows[:0]
		for _, batch := range []struct {
			name  string
			items int
		}{{"query", 0}, {"inline 10,000", v1alpha1.MaxInlineItems}} {
			for _, shards := range []int32{1, 16, 256} {
				for _, design := range []string{designReporter, designPods} {
					seq++
					k.drain(b)
					r := measureStatus(b, k, store, fmt.Sprintf("status-%d", seq), design, batch.name, batch.items, shards, window)
					fmt.Printf("measured: %s, %d shards, %s: %.2f writes/s (run %.2f, pods %.2f, events %.2f), %.2f reconciles/s, lag %s max %s, exact %v\n",
						r.batch, r.shards, r.design, r.writes(), r.runWrites, r.podWrites, r.eventWrites, r.reconciles,
						r.lagMean.Round(100*time.Millisecond), r.lagMax.Round(100*time.Millisecond), r.countsExact)
					rows = append(rows, r)
				}
			}
		}
	}
	printStatusRows(rows, window)
}

func printStatusRows(rows []statusRow, window time.Duration) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nstatus writes benchmark: envtest kube-apiserver + etcd, the real manager, simulated workers (each shard 90 s over its share of 1,000,000 items), measured over %s\n", window)
	fmt.Fprintln(w, "batch\tshards\tprotocol\tAPI writes/s\trun\tpods\tevents\treconciles/s\tcounts behind (mean, max)\tmean run write\trun object\tetcd bytes/s\tcounts exact\ttargets\t")
	missed := false
	for _, r := range rows {
		target := ""
		if r.design == designReporter {
			target = "met"
			if r.writes() > 1 || r.reconciles > 1 || r.lagMax > 12*time.Second || !r.countsExact {
				target, missed = "MISSED", true
			}
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s, %s\t%s\t%s\t%s/s\t%v\t%s\t\n", r.batch, r.shards, r.design,
			r.writes(), r.runWrites, r.podWrites, r.eventWrites, r.reconciles,
			r.lagMean.Round(100*time.Millisecond), r.lagMax.Round(100*time.Millisecond),
			r.latency.Round(time.Millisecond), bytesOf(float64(r.runBytes)), bytesOf(r.etcdBytes), r.countsExact, target)
	}
	fmt.Fprintln(w, "targets (one reporter per run): API writes caused by the run (its object, its pods, Events) <= 1/s and reconciles <= 1/s whatever the shards; counts at most about 10 s behind the ledger (12 s max sampled); exact at the end")
	_ = w.Flush()
	if missed {
		fmt.Println("TARGET MISSED")
	}
}

// statusSim is one configuration's simulated workers.
type statusSim struct {
	k      *kubeBench
	store  *ledger.Store
	run    *v1alpha1.ProcessingRun
	pods   []corev1.Pod
	design string
	total  int64 // each shard's share
	start  time.Time
}

// done is a shard's completed count after elapsed.
func (s *statusSim) done(elapsed time.Duration) int64 {
	return min(s.total, int64(float64(s.total)*elapsed.Seconds()/statusShardTime.Seconds()))
}

// behind is how long ago the simulated ledger held completed items of the
// whole run, at now.
func (s *statusSim) behind(completed int64, now time.Time) time.Duration {
	all := float64(s.total) * float64(len(s.pods))
	at := time.Duration(float64(completed) / all * float64(statusShardTime))
	return max(now.Sub(s.start)-at, 0)
}

func measureStatus(b *testing.B, k *kubeBench, store *ledger.Store, name, design, batch string, items int, shards int32, window time.Duration) statusRow {
	b.Helper()
	ctx := context.Background()
	ns := k.namespace(b, name)
	run := newBenchRun(ns, "run", shards, items)
	if err := k.c.Create(ctx, run); err != nil {
		b.Fatalf("creating the run: %v", err)
	}
	sim := &statusSim{k: k, store: store, run: run, pods: k.waitPods(b, run), design: design, total: int64(1_000_000) / int64(shards), start: time.Now()}
	simCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	reporters := sim.startWorkers(simCtx, b, &wg)
	time.Sleep(6 * time.Second) // every worker has reported, the reporter elected
	api0, etcd0, mgr0 := k.apiserverMetrics(b), mustScrape(b, k.env.EtcdURL()+"/metrics"), mustScrape(b, k.mgrMetrics)
	lagMean, lagMax := sim.sampleLag(b, window)
	api1, etcd1, mgr1 := k.apiserverMetrics(b), mustScrape(b, k.env.EtcdURL()+"/metrics"), mustScrape(b, k.mgrMetrics)
	stop()
	wg.Wait()

	secs := window.Seconds()
	// Writes that wrote: a refused one (409, 422) changes nothing in etcd.
	writes := func(m metrics, resource string) float64 {
		return m.sum("apiserver_request_total", func(l map[string]string) bool {
			return l["resource"] == resource && writeVerb(l) && strings.HasPrefix(l["code"], "2")
		})
	}
	rate := func(resource string) float64 { return (writes(api1, resource) - writes(api0, resource)) / secs }
	put := func(m metrics) float64 { return m.sum("etcd_debugging_mvcc_total_put_size_in_bytes", nil) }
	runWrite := func(l map[string]string) bool { return l["resource"] == "processingruns" && writeVerb(l) }
	latencySum := func(m metrics) float64 { return m.sum("apiserver_request_duration_seconds_sum", runWrite) }
	latencyCount := func(m metrics) float64 { return m.sum("apiserver_request_duration_seconds_count", runWrite) }
	row := statusRow{design: design, batch: batch, shards: shards,
		runWrites: rate("processingruns"), podWrites: rate("pods"), eventWrites: rate("events"),
		reconciles: (reconciles(mgr1) - reconciles(mgr0)) / secs,
		etcdBytes:  (put(etcd1) - put(etcd0)) / secs,
		lagMean:    lagMean, lagMax: lagMax,
	}
	if n := latencyCount(api1) - latencyCount(api0); n > 0 {
		row.latency = time.Duration((latencySum(api1) - latencySum(api0)) / n * float64(time.Second))
	}
	k.drain(b)
	got := &v1alpha1.ProcessingRun{}
	err := retry.OnError(wait.Backoff{Duration: time.Second, Factor: 1.5, Steps: 10}, func(error) bool { return true }, func() error {
		return k.c.Get(ctx, client.ObjectKeyFromObject(run), got)
	})
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := json.Marshal(got)
	row.runBytes = len(raw)
	row.countsExact = finishShards(b, k, run, sim.pods, reporters, sim.total)
	return row
}

// startWorkers starts a simulated worker per pod: the real StatusReporter
// on the ledger database (one reporter per run), or the reports of the
// protocol before (each pod patched every 2 s). It returns the reporters
// that write the final reports.
func (s *statusSim) startWorkers(ctx context.Context, b *testing.B, wg *sync.WaitGroup) []*worker.StatusReporter {
	b.Helper()
	interval := time.Duration(v1alpha1.ReportIntervalSeconds) * time.Second
	var reporters []*worker.StatusReporter
	for i := range s.pods {
		pod := &s.pods[i]
		shard := shardOf(b, pod)
		env := worker.PodEnv{Namespace: s.run.Namespace, Name: s.run.Name, UID: string(s.run.UID), Shard: shard, Shards: len(s.pods),
			PodName: pod.Name, PodUID: string(pod.UID)}
		rep := worker.NewStatusReporter(s.k.pods, env, interval, logr.Discard())
		reporters = append(reporters, rep)
		counts := func() v1alpha1.ItemCounts {
			return v1alpha1.ItemCounts{Total: s.total, Completed: s.done(time.Since(s.start))}
		}
		if s.design == designPods {
			wg.Go(func() { podReporterBefore(ctx, s.k.c, pod, shard, interval, counts) })
			continue
		}
		rep.SetBoard(s.store)
		wg.Go(func() { rep.Run(ctx) })
		wg.Go(func() {
			t := time.NewTicker(200 * time.Millisecond) // a chunk settled
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					rep.Update(worker.Report{Shard: shard, ItemCounts: counts(), TotalKnown: true}, 0)
				}
			}
		})
	}
	return reporters
}

// sampleLag reads the run every 500 ms for window and says how far its
// completed count was behind the simulated ledger, on average and at most.
func (s *statusSim) sampleLag(b *testing.B, window time.Duration) (mean, most time.Duration) {
	b.Helper()
	var sum time.Duration
	n := 0
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		got := &v1alpha1.ProcessingRun{}
		if err := s.k.c.Get(context.Background(), client.ObjectKeyFromObject(s.run), got); err != nil {
			continue
		}
		lag := s.behind(got.Status.Completed, time.Now())
		sum += lag
		most = max(most, lag)
		n++
	}
	if n == 0 {
		b.Fatal("the run could not be read")
	}
	return sum / time.Duration(n), most
}

// podReporterBefore is the worker's reporting before one reporter per run:
// every worker patched its own pod's report every interval.
func podReporterBefore(ctx context.Context, c client.Client, pod *corev1.Pod, shard int, interval time.Duration, counts func() v1alpha1.ItemCounts) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cs := counts()
		body, err := worker.ProgressPatch(string(pod.UID), v1alpha1.ShardReport{Shard: int32(shard), ItemCounts: cs,
			Message: fmt.Sprintf("processing: %d of %d items", cs.Completed, cs.Total), ReportTime: &metav1.Time{Time: time.Now()}})
		if err != nil {
			return
		}
		_ = c.Patch(ctx, &corev1.Pod{ObjectMeta: pod.ObjectMeta}, client.RawPatch(types.MergePatchType, body))
	}
}

// finishShards plays the end of every shard (final report, the pod
// Succeeded with its termination message) and reports whether the run
// then shows exactly the shards' final counts.
func finishShards(b *testing.B, k *kubeBench, run *v1alpha1.ProcessingRun, pods []corev1.Pod, reporters []*worker.StatusReporter, total int64) bool {
	b.Helper()
	ctx := context.Background()
	var want v1alpha1.ItemCounts
	for i := range pods {
		shard := shardOf(b, &pods[i])
		final := v1alpha1.ShardReport{Shard: int32(shard), ItemCounts: v1alpha1.ItemCounts{Total: total, Completed: total - 1, Failed: 1}, Message: "1 item failed"}
		rep := worker.Report{Shard: shard, ItemCounts: final.ItemCounts, TotalKnown: true, Done: true}
		if err := reporters[i].Final(ctx, rep, final.Message, 10*time.Second); err != nil {
			b.Fatal(err)
		}
		setSucceeded(b, k.c, &pods[i], final)
		want.Total += final.Total
		want.Completed += final.Completed
		want.Failed += final.Failed
	}
	if run.Spec.Batch.Items != nil {
		want.Total = int64(len(run.Spec.Batch.Items)) // inline: the declared items count
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		got := &v1alpha1.ProcessingRun{}
		if err := k.c.Get(ctx, client.ObjectKeyFromObject(run), got); err != nil {
			b.Fatal(err)
		}
		if got.Status.Phase == v1alpha1.RunFailed || got.Status.Phase == v1alpha1.RunSucceeded {
			return got.Status.ItemCounts == want
		}
		time.Sleep(250 * time.Millisecond)
	}
	return false
}

func shardOf(b *testing.B, pod *corev1.Pod) int {
	b.Helper()
	var shard int
	if _, err := fmt.Sscan(pod.Labels[v1alpha1.LabelShard], &shard); err != nil {
		b.Fatalf("pod %s: shard label: %v", pod.Name, err)
	}
	return shard
}

// bytesOf formats a byte count: 1.2 MiB, 340 KiB.
func bytesOf(n float64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", n/(1<<10))
	}
	return fmt.Sprintf("%.0f B", n)
}

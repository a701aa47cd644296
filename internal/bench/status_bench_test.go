package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	acv1alpha1 "github.com/runledger/runledger/api/applyconfiguration/api/v1alpha1"
	"github.com/runledger/runledger/api/v1alpha1"
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

// statusRow is one configuration's figures.
type statusRow struct {
	design          string
	batch           string
	shards          int32
	runWrites       float64 // writes to the run object per second
	runBytes        int     // size of the run object (JSON), what etcd stores per write
	podWrites       float64 // writes to pods per second (the workers' reports)
	etcdBytes       float64 // bytes put into etcd per second, all objects
	countsExact     bool
	latency         time.Duration // mean time of a write of the run
	reportsInterval time.Duration
}

// BenchmarkStatusWrites measures what the workers' progress reports cost the
// API server and etcd: simulated workers of a run with 1, 16 and 256 shards
// report every 2 s (the worker's default) while the real `runledger manager`
// reconciles the run; the apiserver's apiserver_request_total gives the
// writes to the run object and to pods per second, etcd's
// etcd_debugging_mvcc_total_put_size_in_bytes the bytes written. Each
// configuration runs twice, side by side: "pods" is the protocol as it is
// (each worker patches its own pod's progress annotation with the real
// worker.StatusReporter; the controller folds the reports into the run's
// status), "run status" the protocol before it (each worker read the run and
// applied its shard's status entry onto the run, every 2 s). Batches: 10,000
// inline items (the run object is about 1 MB) and a query. Target for
// "pods": at most 1 write of the run per status interval (2 s) whatever the
// shard count, and a run object whose size does not grow with the batch when
// the batch is not inline; counts exact once the shards finish.
func BenchmarkStatusWrites(b *testing.B) {
	bin := buildRunledger(b)
	k := startKubeBench(b)
	k.startManager(b, bin)
	window := statusWindow()
	var rows []statusRow
	seq := 0
	for range b.N {
		rows = rows[:0]
		// Query first, the new protocol before the old one: the old one's
		// backlog of writes of a 1 MB run must not land in another's window
		// (and each configuration waits for the apiserver to drain).
		for _, batch := range []struct {
			name  string
			items int
		}{{"query", 0}, {"inline 10,000", v1alpha1.MaxInlineItems}} {
			for _, shards := range []int32{1, 16, 256} {
				for _, design := range []string{"pods", "run status (before)"} {
					seq++
					k.drain(b)
					r := measureStatus(b, k, fmt.Sprintf("status-%d", seq), design, batch.name, batch.items, shards, window)
					fmt.Printf("measured: %s, %d shards, %s: %.2f run writes/s, %.1f pod writes/s, run write latency %s\n",
						r.batch, r.shards, r.design, r.runWrites, r.podWrites, r.latency.Round(time.Millisecond))
					rows = append(rows, r)
				}
			}
		}
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nstatus writes benchmark: envtest kube-apiserver + etcd, the real manager, simulated workers reporting every %s, measured over %s\n",
		time.Duration(v1alpha1.ReportIntervalSeconds)*time.Second, window)
	fmt.Fprintln(w, "batch\tshards\tprotocol\trun writes/s\t(asked)\ttarget\tmean write latency\trun object\trun bytes/s\tpod writes/s\tetcd bytes/s\tcounts exact\t")
	for _, r := range rows {
		target, exact := "", ""
		if r.design == "pods" {
			// At most one write per interval: window/interval writes, plus
			// one for the window's edges and one for the jitter of a write's
			// completion (the apiserver counts a write when it ends).
			most := math.Floor(window.Seconds()/r.reportsInterval.Seconds()) + 2
			target = fmt.Sprintf("<= %.0f in %s", most, window)
			if math.Round(r.runWrites*window.Seconds()) > most {
				target += " MISSED"
			}
			exact = fmt.Sprint(r.countsExact)
		}
		asked := "" // what the old protocol asks: every shard once per interval
		if r.design != "pods" {
			asked = fmt.Sprintf("%.1f/s", float64(r.shards)/r.reportsInterval.Seconds())
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%.2f/s\t%s\t%s\t%s\t%s\t%s/s\t%.1f/s\t%s/s\t%s\t\n", r.batch, r.shards, r.design, r.runWrites, asked, target,
			r.latency.Round(time.Millisecond), bytesOf(float64(r.runBytes)), bytesOf(r.runWrites*float64(r.runBytes)), r.podWrites, bytesOf(r.etcdBytes), exact)
	}
	fmt.Fprintln(w, "targets (pods): run writes <= 1 per 2 s status interval whatever the shards; run object independent of the batch's size when not inline; counts exact")
	fmt.Fprintln(w, "(asked): the writes of the run the protocol before asked for; a write the apiserver had not finished by the window's end is not counted")
	_ = w.Flush()
}

func measureStatus(b *testing.B, k *kubeBench, name, design, batch string, items int, shards int32, window time.Duration) statusRow {
	b.Helper()
	ctx := context.Background()
	ns := k.namespace(b, name)
	run := newBenchRun(ns, "run", shards, items)
	if err := k.c.Create(ctx, run); err != nil {
		b.Fatalf("creating the run: %v", err)
	}
	pods := k.waitPods(b, run)
	interval := time.Duration(v1alpha1.ReportIntervalSeconds) * time.Second

	// Every shard of every configuration processes the same number of items
	// per second; a shard's total is its share of 1,000,000.
	total := int64(1_000_000) / int64(shards)
	progress := func(shard int, elapsed time.Duration) v1alpha1.ShardReport {
		done := min(total, int64(elapsed/time.Millisecond)*10)
		return v1alpha1.ShardReport{Shard: int32(shard), ItemCounts: v1alpha1.ItemCounts{Total: total, Completed: done}}
	}

	simCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	start := time.Now()
	var reporters []*worker.StatusReporter
	for i := range pods {
		pod := &pods[i]
		shard := shardOf(b, pod)
		switch design {
		case "pods":
			env := worker.PodEnv{Namespace: ns, Name: run.Name, UID: string(run.UID), Shard: shard, Shards: int(shards),
				PodName: pod.Name, PodUID: string(pod.UID)}
			rep := worker.NewStatusReporter(k.c, env, interval, logr.Discard())
			reporters = append(reporters, rep)
			wg.Go(func() { rep.Run(simCtx) })
			wg.Go(func() {
				t := time.NewTicker(200 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-simCtx.Done():
						return
					case <-t.C:
						r := progress(shard, time.Since(start))
						rep.Update(worker.Report{Shard: shard, ItemCounts: r.ItemCounts, TotalKnown: true}, 0)
					}
				}
			})
		default:
			wg.Go(func() {
				oldStatusReporter(simCtx, k.c, run, shard, interval, func() v1alpha1.ShardReport { return progress(shard, time.Since(start)) })
			})
		}
	}
	time.Sleep(3 * time.Second) // every worker has reported once
	api0, etcd0 := k.apiserverMetrics(b), mustScrape(b, k.env.EtcdURL()+"/metrics")
	time.Sleep(window)
	api1, etcd1 := k.apiserverMetrics(b), mustScrape(b, k.env.EtcdURL()+"/metrics")
	stop()
	wg.Wait()

	secs := window.Seconds()
	// Writes that wrote: a refused one (409, 422) changes nothing in etcd.
	runs := func(m metrics) float64 {
		return m.sum("apiserver_request_total", func(l map[string]string) bool {
			return l["resource"] == "processingruns" && writeVerb(l) && strings.HasPrefix(l["code"], "2")
		})
	}
	podWrites := func(m metrics) float64 {
		return m.sum("apiserver_request_total", func(l map[string]string) bool { return l["resource"] == "pods" && writeVerb(l) })
	}
	put := func(m metrics) float64 { return m.sum("etcd_debugging_mvcc_total_put_size_in_bytes", nil) }
	runWrite := func(l map[string]string) bool { return l["resource"] == "processingruns" && writeVerb(l) }
	latencySum := func(m metrics) float64 { return m.sum("apiserver_request_duration_seconds_sum", runWrite) }
	latencyCount := func(m metrics) float64 { return m.sum("apiserver_request_duration_seconds_count", runWrite) }
	row := statusRow{design: design, batch: batch, shards: shards, reportsInterval: interval,
		runWrites: (runs(api1) - runs(api0)) / secs,
		podWrites: (podWrites(api1) - podWrites(api0)) / secs,
		etcdBytes: (put(etcd1) - put(etcd0)) / secs,
	}
	if n := latencyCount(api1) - latencyCount(api0); n > 0 {
		row.latency = time.Duration((latencySum(api1) - latencySum(api0)) / n * float64(time.Second))
	}
	// The old protocol's backlog may keep the apiserver busy for a while.
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

	if design == "pods" {
		row.countsExact = finishShards(b, k, run, pods, reporters, total)
	}
	return row
}

// finishShards plays the end of every shard (final report on the pod, the
// pod Succeeded with its termination message) and reports whether the run
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

// oldStatusReporter is the worker's reporting before reports moved to the
// pods: read the run (its UID check), then apply the shard's status entry
// by server-side apply with the shard's own field manager, every interval.
func oldStatusReporter(ctx context.Context, c client.Client, run *v1alpha1.ProcessingRun, shard int, interval time.Duration, progress func() v1alpha1.ShardReport) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		got := &v1alpha1.ProcessingRun{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(run), got); err != nil {
			continue
		}
		r := progress()
		entry := acv1alpha1.ShardStatus().WithIndex(int32(shard)).WithAttempt(0).
			WithTotal(r.Total).WithCompleted(r.Completed).WithAlreadyHandled(r.AlreadyHandled).WithFailed(r.Failed).
			WithMessage(fmt.Sprintf("processing: %d of %d items", r.Completed, r.Total))
		ac := acv1alpha1.ProcessingRun(run.Name, run.Namespace).WithUID(run.UID).
			WithStatus(acv1alpha1.ProcessingRunStatus().WithShards(entry))
		_ = c.Status().Apply(ctx, ac, client.FieldOwner(v1alpha1.WorkerFieldManager(int32(shard))), client.ForceOwnership)
	}
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

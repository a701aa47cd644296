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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/procmem"
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

// workerRun is one run of every shard, each in its own process, started
// together.
type workerRun struct {
	rate    float64 // items per second, wall clock of the slowest shard
	peakRSS []int64 // bytes, per shard
	// peakAnon: the private part of peakRSS (RssAnon: heap, stacks), per
	// shard; the rest is the binary's pages, shared by every process running it.
	peakAnon []int64
	counts   [4]int64              // total, completed, alreadyHandled, failed
	shards   []v1alpha1.ItemCounts // each shard's, as it reported them
	fifths   []float64             // items/s of each fifth of the items after the first tenth (fifths), on a fresh ledger
}

// BenchmarkWorker runs a batch of workerItems() rows from a query in 4
// shards, one process each, end to end on a durable cluster, fresh and then
// with every item already handled, against the ledger's ceiling (a) (bare
// set-based INSERT ... ON CONFLICT DO NOTHING in statements of 10,000 items
// on 4 connections) measured in the same process, and prints items/s, the
// ratios and each shard's peak RSS (the largest of the repetitions). Two
// ways, each on its own database:
//
//   - worker pods, what a shard is in production: the worker binary
//     (cmd/runledger-worker) as the pods of the manager's image run it, with
//     the pod's environment, run file and ServiceAccount token (bound to a
//     Pod object of a real kube-apiserver, envtest, which its reports go
//     to). The ratios and the RSS target are this way's.
//   - runledger run, the same run from a manifest on a laptop (the runledger
//     binary, validating the manifest in process as the API server would).
//
// Targets (#48, each against what a user could do by hand on the same
// server): fresh >= 0.90x (a); all already handled >= 1.50x (a); peak RSS
// <= 64 MiB per shard. (The relative target, all handled >= 2x fresh, is
// withdrawn: it penalised making the fresh run faster; its ratio is still
// printed.)
func BenchmarkWorker(b *testing.B) {
	n := workerItems()
	runledger := buildRunledger(b)
	workerBin := buildBinary(b, "runledger-worker", "github.com/runledger/runledger/cmd/runledger-worker")
	k := startKubeBench(b)
	ns := k.namespace(b, "bench")

	var ceilingRate float64
	var podFresh, podHandled, runFresh, runHandled workerRun
	for range b.N {
		for rep := range workerReps {
			ceilingRate = max(ceilingRate, measure(b, ceiling, n, workerShards, fresh))
			dsn := sourceDatabase(b, n)
			f := runPods(b, k, ns, workerBin, dsn, fmt.Sprintf("fresh-%d", rep))
			checkCounts(b, "fresh run (worker pods)", f, [4]int64{int64(n), int64(n), 0, 0})
			// Another run over the same batch: every item already handled.
			h := runPods(b, k, ns, workerBin, dsn, fmt.Sprintf("again-%d", rep))
			checkCounts(b, "handled run (worker pods)", h, [4]int64{int64(n), 0, int64(n), 0})
			podFresh, podHandled = best(podFresh, f), best(podHandled, h)

			dsn = sourceDatabase(b, n)
			f = runWorkers(b, runledger, dsn, fmt.Sprintf("fresh-%d", rep))
			checkCounts(b, "fresh run (runledger run)", f, [4]int64{int64(n), int64(n), 0, 0})
			h = runWorkers(b, runledger, dsn, fmt.Sprintf("again-%d", rep))
			checkCounts(b, "handled run (runledger run)", h, [4]int64{int64(n), 0, int64(n), 0})
			runFresh, runHandled = best(runFresh, f), best(runHandled, h)
		}
	}
	b.ReportMetric(podFresh.rate, "items/s")
	b.ReportMetric(podFresh.rate/ceilingRate, "x(a)")
	b.ReportMetric(podHandled.rate/ceilingRate, "handled-x(a)")
	b.ReportMetric(podHandled.rate/podFresh.rate, "handled/fresh")
	b.ReportMetric(float64(slices.Max(append(podFresh.peakRSS, podHandled.peakRSS...)))/(1<<20), "MiB/shard")

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nworker benchmark: %d items from a query, %d shards (one process each), chunks of %d, fsync on, best of %d (peak RSS: the largest)\n",
		n, workerShards, workerChunk, workerReps)
	fmt.Fprintln(w, "run\titems/s\tvs (a) ceiling\tpeak RSS per shard\tof which private\t")
	fmt.Fprintf(w, "(a) ceiling, %d conns\t%.0f/s\t1.00x\t\t\t\n", workerShards, ceilingRate)
	for _, r := range []struct {
		name string
		run  workerRun
	}{
		{"worker pods (runledger-worker): fresh", podFresh}, {"worker pods: all already handled", podHandled},
		{"runledger run: fresh", runFresh}, {"runledger run: all already handled", runHandled},
	} {
		fmt.Fprintf(w, "%s\t%.0f/s\t%.2fx\t%s\t%s\t\n", r.name, r.run.rate, r.run.rate/ceilingRate, mib(r.run.peakRSS), mib(r.run.peakAnon))
	}
	fmt.Fprintf(w, "already handled / fresh: %.2fx worker pods, %.2fx runledger run\n", podHandled.rate/podFresh.rate, runHandled.rate/runFresh.rate)
	fmt.Fprintln(w, "targets (worker pods, #48): fresh >= 0.90x (a); all already handled >= 1.50x (a); peak RSS <= 64 MiB per shard")
	_ = w.Flush()
}

func checkCounts(b *testing.B, what string, r workerRun, want [4]int64) {
	b.Helper()
	if r.counts != want {
		b.Fatalf("%s: counts (total, completed, already handled, failed) %v, want %v", what, r.counts, want)
	}
}

// buildRunledger builds the runledger binary the benchmarks run.
func buildRunledger(b *testing.B) string {
	return buildBinary(b, "runledger", "github.com/runledger/runledger")
}

// buildBinary builds the command pkg as name, static, as the image holds it.
func buildBinary(b *testing.B, name, pkg string) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), name)
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// best is the faster of two repetitions, with each shard's largest peak RSS
// of both.
func best(a, b workerRun) workerRun {
	out := a
	if b.rate > a.rate {
		out = b
	}
	out.peakRSS, out.peakAnon = largest(a.peakRSS, b.peakRSS), largest(a.peakAnon, b.peakAnon)
	return out
}

func largest(a, b []int64) []int64 {
	out := slices.Clone(b)
	for i := range min(len(a), len(out)) {
		out[i] = max(a[i], out[i])
	}
	return out
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

// writeManifest writes run name of the bench namespace, its batch (one
// YAML line under batch:), shards workers and more spec lines, and returns
// the file's path.
func writeManifest(b *testing.B, name, batch string, shards int, spec string) string {
	b.Helper()
	manifest := filepath.Join(b.TempDir(), name+".yaml")
	if err := os.WriteFile(manifest, []byte(fmt.Sprintf(`apiVersion: processing.runledger.dev/v1alpha1
kind: ProcessingRun
metadata: {name: %s, namespace: bench}
spec:
  database: {secretRef: {name: db, key: dsn}}
  batch:
    %s
  workers: %d
%s`, name, batch, shards, spec)), 0o600); err != nil {
		b.Fatal(err)
	}
	return manifest
}

// runShards runs shards processes of run name over the usage table, its spec
// completed by spec (YAML lines under spec:), with extra arguments.
func runShards(b *testing.B, bin, dsn, name string, shards int, spec string, extra ...string) workerRun {
	b.Helper()
	manifest := writeManifest(b, name, "query: SELECT account AS entity, period AS occurrence, payload FROM usage", shards, spec)
	cmds := make([]*exec.Cmd, shards)
	outs := make([]*bytes.Buffer, shards)
	for s := range cmds {
		args := append([]string{"run", "-f", manifest, "--dsn", dsn, "--shard", fmt.Sprintf("%d/%d", s, shards), "--output", "json"}, extra...)
		cmds[s] = exec.Command(bin, args...)
		outs[s] = &bytes.Buffer{}
		cmds[s].Stdout = outs[s]
	}
	return measureShards(b, dsn, name, cmds, func(s int) (v1alpha1.ItemCounts, error) {
		var out v1alpha1.ItemCounts
		err := json.Unmarshal(outs[s].Bytes(), &out)
		return out, err
	})
}

// runPods runs the shards of run name over the usage table as its worker
// pods would, one process of the worker binary bin each: the run created
// on the API server (its validation and defaults), its file as the
// controller writes it, a Pod object per shard, and the process given only
// what the kubelet gives the pod's container: the controller's environment,
// the token of the pod's ServiceAccount (bound to the pod, as the projected
// volume) and the API server's address.
func runPods(b *testing.B, k *kubeBench, ns, bin, dsn, name string) workerRun {
	b.Helper()
	ctx := context.Background()
	run := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.ProcessingRunSpec{
			Database:  v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}},
			Batch:     v1alpha1.BatchSpec{Query: "SELECT account AS entity, period AS occurrence, payload FROM usage"},
			Workers:   workerShards,
			ChunkSize: workerChunk,
		},
	}
	if err := k.c.Create(ctx, run); err != nil {
		b.Fatalf("creating run %s: %v", name, err)
	}
	file, err := v1alpha1.EncodeRunFile(run) // as stored: Create read the API server's answer into run
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	runFile := filepath.Join(dir, v1alpha1.WorkerRunFile)
	if err := os.WriteFile(runFile, file, 0o444); err != nil {
		b.Fatal(err)
	}
	cmds := make([]*exec.Cmd, workerShards)
	terms := make([]string, workerShards)
	for s := range cmds {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.PodName(name, int32(s), 0), Namespace: ns},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, ServiceAccountName: envtestutil.WorkerServiceAccount,
				Containers: []corev1.Container{{Name: v1alpha1.WorkerContainerName, Image: "runledger"}}},
		}
		if err := k.c.Create(ctx, pod); err != nil {
			b.Fatalf("creating pod %s: %v", pod.Name, err)
		}
		tokenDir, apiEnv := k.env.WorkerTokenDir(b, pod)
		terms[s] = filepath.Join(dir, fmt.Sprintf("termination-log-%d", s))
		cmds[s] = exec.Command(bin, "--termination-log", terms[s], "--token-dir", tokenDir)
		cmds[s].Env = append(apiEnv,
			v1alpha1.EnvRunNamespace+"="+ns, v1alpha1.EnvRunName+"="+name, v1alpha1.EnvRunUID+"="+string(run.UID),
			v1alpha1.EnvShard+"="+strconv.Itoa(s), v1alpha1.EnvShards+"="+strconv.Itoa(workerShards), v1alpha1.EnvAttempt+"=0",
			v1alpha1.EnvPodName+"="+pod.Name, v1alpha1.EnvPodUID+"="+string(pod.UID), v1alpha1.EnvDatabaseURL+"="+dsn,
			v1alpha1.EnvRunFile+"="+runFile, v1alpha1.EnvRunDigest+"="+v1alpha1.RunFileDigest(file))
	}
	return measureShards(b, dsn, name, cmds, func(s int) (v1alpha1.ItemCounts, error) {
		raw, err := os.ReadFile(terms[s])
		if err != nil {
			return v1alpha1.ItemCounts{}, err
		}
		rep, err := v1alpha1.ParseShardReport(string(raw))
		return rep.ItemCounts, err
	})
}

// measureShards starts the shards' processes cmds of run name at once and
// returns their combined rate, counts (each shard's from counts, once it
// exited) and peak RSS.
func measureShards(b *testing.B, dsn, name string, cmds []*exec.Cmd, counts func(shard int) (v1alpha1.ItemCounts, error)) workerRun {
	b.Helper()
	shards := len(cmds)
	errs := make([]*bytes.Buffer, shards)
	for s, cmd := range cmds {
		errs[s] = &bytes.Buffer{}
		cmd.Stderr = errs[s]
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
		wg.Go(func() { r.peakRSS[s], r.peakAnon[s] = procmem.Follow(cmd.Process.Pid, exited) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	samples := stopSampling()

	for s := range cmds {
		if failures[s] != nil {
			b.Fatalf("shard %d of %s: %v\n%s", s, name, failures[s], errs[s])
		}
		c, err := counts(s)
		if err != nil {
			b.Fatalf("shard %d of %s: its result: %v\n%s", s, name, err, errs[s])
		}
		r.shards = append(r.shards, c)
		r.counts[0] += c.Total
		r.counts[1] += c.Completed
		r.counts[2] += c.AlreadyHandled
		r.counts[3] += c.Failed
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

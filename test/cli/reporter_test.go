package clitest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

// progressOf is the progress annotation of a run's pod: its RunReport or
// its ShardReport, nil each when it has none.
func (k *kubeEnv) progressOf(t *testing.T, run *v1alpha1.ProcessingRun, shard, attempt int) (*v1alpha1.ShardReport, *v1alpha1.RunReport) {
	t.Helper()
	pod := &corev1.Pod{}
	require.NoError(t, k.c.Get(context.Background(), types.NamespacedName{Namespace: run.Namespace, Name: v1alpha1.PodName(run.Name, int32(shard), int32(attempt))}, pod))
	v, ok := pod.Annotations[v1alpha1.AnnotationProgress]
	if !ok {
		return nil, nil
	}
	s, r, err := v1alpha1.ParseProgress(v)
	require.NoError(t, err)
	return s, r
}

// TestOneReporterPerRun: the workers of a 4-shard run, with the ledger
// database as their board and a real kube-apiserver: only the lowest live
// shard writes on its pod, a RunReport of every shard's latest counts;
// the others' pods carry nothing until their final report. When the
// reporter finishes, the next shard takes over and reports the others.
// Without the board, a worker reports its own shard, spaced by the fallback
// interval (the publishing interval times the shard count).
func TestOneReporterPerRun(t *testing.T) {
	t.Parallel()
	k := startKube(t)
	d := newDB(t)
	ctx := context.Background()
	_, err := ledger.Migrate(ctx, d.pool)
	require.NoError(t, err)
	store := ledger.NewStore(d.pool)
	const shards = 4
	run := k.createRun(t, "elected", shards, inlineBatch(8))

	const interval = 250 * time.Millisecond // the run's reports every 500 ms
	repCtx, stop := context.WithCancel(ctx)
	reporters := make([]*worker.StatusReporter, shards)
	var wg sync.WaitGroup
	for shard := range shards {
		pod := k.workerPod(t, run, shard, 0)
		env := worker.PodEnv{Namespace: run.Namespace, Name: run.Name, UID: string(run.UID), Shard: shard, Shards: shards,
			PodName: pod.Name, PodUID: string(pod.UID)}
		reporters[shard] = worker.NewStatusReporter(k.podClient(t, pod), env, interval, discard())
		reporters[shard].SetBoard(store)
		wg.Go(func() { reporters[shard].Run(repCtx) })
	}
	defer func() { stop(); wg.Wait() }()
	update := func(shard int, completed int64) {
		reporters[shard].Update(worker.Report{Shard: shard, ItemCounts: v1alpha1.ItemCounts{Total: 2, Completed: completed}, TotalKnown: true}, 0)
	}
	for shard := range shards {
		update(shard, 1)
	}
	waitReport := func(reporter int, want func(v1alpha1.ShardReport) bool, what string) *v1alpha1.RunReport {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, rr := k.progressOf(t, run, reporter, 0)
			if rr != nil && len(rr.Shards) == shards {
				ok := true
				for _, e := range rr.Shards {
					ok = ok && want(e)
				}
				if ok {
					return rr
				}
			}
			require.True(t, time.Now().Before(deadline), "%s: shard %d's pod has %+v", what, reporter, rr)
			time.Sleep(100 * time.Millisecond)
		}
	}
	rr := waitReport(0, func(e v1alpha1.ShardReport) bool { return e.Completed == 1 }, "every shard's first counts on shard 0's pod")
	require.EqualValues(t, 0, rr.Reporter)
	for i, e := range rr.Shards {
		require.Equal(t, int32(i), e.Shard)
		require.Equal(t, "processing: 1 of 2 items", e.Message)
		require.NotNil(t, e.ReportTime)
	}
	for shard := 1; shard < shards; shard++ {
		s, r := k.progressOf(t, run, shard, 0)
		require.Nil(t, s, "shard %d reports nothing on its pod", shard)
		require.Nil(t, r, "shard %d reports nothing on its pod", shard)
	}

	// Nothing moves: the reporter writes nothing more.
	pod0 := k.workerPod(t, run, 0, 0)
	time.Sleep(4 * interval)
	require.Equal(t, pod0.ResourceVersion, k.workerPod(t, run, 0, 0).ResourceVersion, "no write while no count moves")

	// Shard 0 finishes: its final report on its pod; shard 1 takes over
	// and reports shard 3's progress.
	require.NoError(t, reporters[0].Final(ctx, worker.Report{Shard: 0, ItemCounts: v1alpha1.ItemCounts{Total: 2, Completed: 2}, Done: true}, "done", 5*time.Second))
	update(3, 2)
	rr = waitReport(1, func(e v1alpha1.ShardReport) bool { return e.Shard != 3 || e.Completed == 2 }, "shard 1 took over")
	require.EqualValues(t, 1, rr.Reporter)
	require.Equal(t, v1alpha1.ItemCounts{Total: 2, Completed: 2}, rr.Shards[0].ItemCounts, "the finished shard's final counts")
	final0, _ := k.progressOf(t, run, 0, 0)
	require.NotNil(t, final0)
	require.Equal(t, "done", final0.Message)
	for _, shard := range []int{2, 3} {
		s, r := k.progressOf(t, run, shard, 0)
		require.Nil(t, s)
		require.Nil(t, r)
	}

	// Off the board (a login or schema before 00015): each worker reports
	// its own shard, at once, then at most every 4 shards × 250 ms.
	other := k.createRun(t, "boardless", shards, inlineBatch(8))
	pod := k.workerPod(t, other, 2, 0)
	env := worker.PodEnv{Namespace: other.Namespace, Name: other.Name, UID: string(other.UID), Shard: 2, Shards: shards, PodName: pod.Name, PodUID: string(pod.UID)}
	lone := worker.NewStatusReporter(k.podClient(t, pod), env, interval, discard())
	wg.Go(func() { lone.Run(repCtx) })
	start := time.Now()
	var versions []string
	for time.Since(start) < 2500*time.Millisecond {
		lone.Update(worker.Report{Shard: 2, ItemCounts: v1alpha1.ItemCounts{Total: 2, Completed: int64(len(versions))}, TotalKnown: true}, 0)
		if p := k.workerPod(t, other, 2, 0); len(versions) == 0 || versions[len(versions)-1] != p.ResourceVersion {
			versions = append(versions, p.ResourceVersion)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The pod as created, then a write at once and at most two more in 2.5 s.
	require.GreaterOrEqual(t, len(versions), 2, "the first report is written at once")
	require.LessOrEqual(t, len(versions), 1+3, fmt.Sprintf("writes spaced by 1 s: %v", versions))
	s, _ := k.progressOf(t, other, 2, 0)
	require.NotNil(t, s, "its own shard's report")
}

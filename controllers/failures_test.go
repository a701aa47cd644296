package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/worker"
)

// TestFailureSampleKeepsTheRunSmall: a run of 1,000,000 items over 32
// shards, 100,000 of which fail, every shard reporting its first failures
// with keys, classes and errors as long as a report carries, and messages at
// their limit. The run's status shows the first failures (key and reason),
// 10 in all, the first shards', and says where to get the rest
// (status.failedItems); the run object stays well under 1 MiB (etcd's
// limit on an object is about 1.5 MiB).
func TestFailureSampleKeepsTheRunSmall(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	const shards, perShard, failedPerShard = 32, 31250, 3125
	run := newRun(ns, "big", shards, 0)
	run.Spec.Batch = v1alpha1.BatchSpec{Query: "SELECT entity, occurrence FROM invoices_due"}
	run.Spec.MaxFailedItems = 1 << 30
	create(t, env, run)
	names := make([]string, shards)
	for i := range names {
		names[i] = v1alpha1.PodName("big", int32(i), 0)
	}
	waitPods(t, env, ns, "big", append([]string(nil), names...)...) // it sorts what it is given

	long := strings.Repeat("x", 1500)
	counts := v1alpha1.ItemCounts{Total: perShard, Completed: perShard - failedPerShard, Failed: failedPerShard}
	for i := range int32(shards) {
		var sample []v1alpha1.FailureSample
		for j := range 5 { // more than a report carries
			sample = append(sample, v1alpha1.FailureSample{Entity: fmt.Sprintf("acct-%d-%d-%s", i, j, long), Occurrence: "2026-06-" + long,
				Class: "23503", Error: "running effect: ERROR: insert or update on table \"invoices\" violates foreign key constraint " + long})
		}
		rep := v1alpha1.ShardReport{Shard: i, ItemCounts: counts, Message: strings.Repeat("m", v1alpha1.MaxShardMessageLength), Failures: v1alpha1.BoundFailures(sample)}
		setPod(t, env, ns, names[i], corev1.PodRunning, 0, nil)
		reportOnPod(t, env, ns, names[i], rep)
		setPod(t, env, ns, names[i], corev1.PodSucceeded, 0, &rep)
	}

	r := waitRun(t, env, ns, "big", "Succeeded with its counts", all(phaseIs(v1alpha1.RunSucceeded),
		countsAre(v1alpha1.ItemCounts{Total: 1_000_000, Completed: 900_000, Failed: 100_000})))
	require.Equal(t, "runledger items big -n "+ns+" --failed", r.Status.FailedItems, "where to get the rest")
	var shown []v1alpha1.FailureSample
	for _, e := range r.Status.Shards {
		require.LessOrEqual(t, len(e.Failures), v1alpha1.MaxShardFailures)
		shown = append(shown, e.Failures...)
	}
	require.Len(t, shown, MaxRunFailureSamples, "the first 10 failures")
	require.Len(t, shardEntry(r, 0).Failures, 3)
	require.Len(t, shardEntry(r, 3).Failures, 1)
	require.Empty(t, shardEntry(r, 4).Failures, "the budget is spent")
	first := shardEntry(r, 0).Failures[0]
	require.True(t, strings.HasPrefix(first.Entity, "acct-0-0-x"), "the key: %.40s", first.Entity)
	require.LessOrEqual(t, len(first.Entity), v1alpha1.MaxFailureSampleBytes)
	require.Equal(t, "23503", first.Class)
	require.Contains(t, first.Error, "violates foreign key constraint")

	b, err := json.Marshal(r)
	require.NoError(t, err)
	t.Logf("the run object is %d bytes", len(b))
	require.Less(t, len(b), 256<<10, "well under 1 MiB")
}

// reportOnPod writes a whole report (failures included) as the worker's
// progress annotation.
func reportOnPod(t *testing.T, env *envtestutil.Env, ns, name string, rep v1alpha1.ShardReport) {
	t.Helper()
	ctx := context.Background()
	c := env.Client
	pod := &corev1.Pod{}
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod))
	rep.ReportTime = ptr.To(metav1.Now())
	body, err := worker.ProgressPatch(string(pod.UID), rep)
	require.NoError(t, err)
	require.NoError(t, c.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body)))
}

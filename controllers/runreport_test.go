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
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// runReport plays the run's reporter: the worker of shard on attempt
// attempt writes every shard's progress onto its own pod (a RunReport), as
// the contract says.
func runReport(t *testing.T, env *envtestutil.Env, run *v1alpha1.ProcessingRun, shard, attempt int32, shards ...v1alpha1.ShardReport) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: v1alpha1.PodName(run.Name, shard, attempt)}, pod))
	now := metav1.Now()
	for i := range shards {
		shards[i].ReportTime = &now
	}
	v, err := json.Marshal(v1alpha1.RunReport{Reporter: shard, Shards: shards, ReportTime: &now})
	require.NoError(t, err)
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID,
		"annotations": map[string]string{v1alpha1.AnnotationProgress: string(v)}}})
	require.NoError(t, err)
	require.NoError(t, env.Client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body)))
}

// TestRunReportCarriesEveryShard: one pod of the run carries the progress
// of every shard (its worker is the run's reporter); the run's status shows
// each shard's counts from it, while the other pods report nothing. When
// the reporter finishes and the next shard takes over, its report joins the
// first one's; the finished shards' counts are their termination messages'.
func TestRunReportCarriesEveryShard(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	run := create(t, env, newRun(ns, "wide", 3, 9))
	waitPods(t, env, ns, "wide", "wide-0-0", "wide-1-0", "wide-2-0")
	for _, p := range []string{"wide-0-0", "wide-1-0", "wide-2-0"} {
		setPod(t, env, ns, p, corev1.PodRunning, 0, nil)
	}
	c := func(completed int64) v1alpha1.ItemCounts { return v1alpha1.ItemCounts{Total: 3, Completed: completed} }
	runReport(t, env, run, 0, 0, *shardReport(0, 0, c(1), "processing: 1 of 3 items"),
		*shardReport(1, 0, c(2), "processing: 2 of 3 items"), *shardReport(2, 0, c(0), v1alpha1.ShardBusyMessage+": another process"))
	r := waitRun(t, env, ns, "wide", "every shard's progress from one pod", countsAre(v1alpha1.ItemCounts{Total: 9, Completed: 3}))
	require.EqualValues(t, 1, shardEntry(r, 0).Completed)
	require.EqualValues(t, 2, shardEntry(r, 1).Completed)
	require.Equal(t, "processing: 2 of 3 items", shardEntry(r, 1).Message)
	require.Contains(t, shardEntry(r, 2).Message, v1alpha1.ShardBusyMessage)
	require.NotNil(t, shardEntry(r, 1).LastReportTime)

	// The reporter finishes (its final report on its pod replaces its run
	// report); shard 1 takes over and reports shard 2's progress.
	final0 := c(3)
	workerReport(t, env, run, 0, 0, final0, "done")
	setPod(t, env, ns, "wide-0-0", corev1.PodSucceeded, 0, shardReport(0, 0, final0, "done"))
	runReport(t, env, run, 1, 0, *shardReport(0, 0, final0, "done"), *shardReport(1, 0, c(3), "processing: 3 of 3 items"),
		*shardReport(2, 0, c(2), "processing: 2 of 3 items"))
	waitRun(t, env, ns, "wide", "the next reporter's progress", countsAre(v1alpha1.ItemCounts{Total: 9, Completed: 8}))

	// Shards 1 and 2 finish: exact, from their termination messages, even
	// though no report on any pod says shard 2's final counts.
	setPod(t, env, ns, "wide-1-0", corev1.PodSucceeded, 0, shardReport(1, 0, c(3), "done"))
	setPod(t, env, ns, "wide-2-0", corev1.PodSucceeded, 0, shardReport(2, 0, v1alpha1.ItemCounts{Total: 3, Completed: 2, AlreadyHandled: 1}, "done"))
	r = waitRun(t, env, ns, "wide", "Succeeded", all(phaseIs(v1alpha1.RunSucceeded),
		countsAre(v1alpha1.ItemCounts{Total: 9, Completed: 8, AlreadyHandled: 1})))
	for i := range int32(3) {
		require.Equal(t, "done", shardEntry(r, i).Message, fmt.Sprintf("shard %d", i))
	}
}

// TestReplicationFromReports: what the run's workers read of the ledger's
// server reaches the run as its SynchronousReplication condition, from a
// RunReport while the shards run and from the termination message once
// they finish; and the metric counts the run by it.
func TestReplicationFromReports(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	startManager(t, env, ns, managerConfig{})
	create(t, env, newRun(ns, "promise", 2, 4))
	waitPods(t, env, ns, "promise", "promise-0-0", "promise-1-0")
	for _, p := range []string{"promise-0-0", "promise-1-0"} {
		setPod(t, env, ns, p, corev1.PodRunning, 0, nil)
	}
	replicationIs := func(status metav1.ConditionStatus, reason, says string) func(*v1alpha1.ProcessingRun) error {
		return func(r *v1alpha1.ProcessingRun) error {
			for _, c := range r.Status.Conditions {
				if c.Type == v1alpha1.ConditionSynchronousReplication {
					if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, says) {
						return fmt.Errorf("condition %s %s: %s", c.Status, c.Reason, c.Message)
					}
					return nil
				}
			}
			return fmt.Errorf("no %s condition", v1alpha1.ConditionSynchronousReplication)
		}
	}
	c := v1alpha1.ItemCounts{Total: 2}
	ctx := context.Background()
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "promise-0-0"}, pod))
	now := metav1.Now()
	async := &v1alpha1.LedgerReplication{SynchronousCommit: "on"}
	v, err := json.Marshal(v1alpha1.RunReport{Reporter: 0, ReportTime: &now, Replication: async, Shards: []v1alpha1.ShardReport{
		{Shard: 0, ItemCounts: c, ReportTime: &now}, {Shard: 1, ItemCounts: c, ReportTime: &now}}})
	require.NoError(t, err)
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID, "annotations": map[string]string{v1alpha1.AnnotationProgress: string(v)}}})
	require.NoError(t, err)
	require.NoError(t, env.Client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body)))
	waitRun(t, env, ns, "promise", "AsynchronousReplication from the RunReport",
		replicationIs(metav1.ConditionFalse, ReasonAsynchronousReplication, "a processor may get it again with the same idempotency key"))

	sync := &v1alpha1.LedgerReplication{Synchronous: true, Standby: "flushed", SynchronousCommit: "on", SynchronousStandbyNames: "standby1"}
	done := v1alpha1.ItemCounts{Total: 2, Completed: 2}
	for i, p := range []string{"promise-0-0", "promise-1-0"} {
		rep := shardReport(int32(i), 0, done, "done")
		rep.Replication = sync
		setPod(t, env, ns, p, corev1.PodSucceeded, 0, rep)
	}
	waitRun(t, env, ns, "promise", "Succeeded, SynchronousStandby from the termination messages", all(phaseIs(v1alpha1.RunSucceeded),
		replicationIs(metav1.ConditionTrue, ReasonSynchronousStandby, "synchronous_standby_names='standby1'")))
}

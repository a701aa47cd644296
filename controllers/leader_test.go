package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// creator is the manager (user agent) that created a pod.
func creator(p *corev1.Pod) string {
	for _, mf := range p.ManagedFields {
		if mf.Operation == "Update" && mf.Subresource == "" {
			return mf.Manager
		}
	}
	return ""
}

func leaseHolder(t *testing.T, c client.Client, ns string) string {
	t.Helper()
	var lease coordinationv1.Lease
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "runledger-test"}, &lease); err != nil {
		return ""
	}
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// Two managers against one apiserver: only the leader acts; when it stops
// without handing over (as if it crashed), the other takes over within the
// lease period and carries on, and no shard ever has two live pods.
func TestLeaderElection(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	livePodGuard(t, env, ns)

	a := startManager(t, env, ns, managerConfig{name: "manager-a", leaderElect: true})
	select {
	case <-a.mgr.Elected():
	case <-time.After(testTimeout):
		t.Fatal("manager-a was not elected")
	}
	b := startManager(t, env, ns, managerConfig{name: "manager-b", leaderElect: true})
	holderA := leaseHolder(t, env.Client, ns)
	require.NotEmpty(t, holderA)

	run := create(t, env, newRun(ns, "elected", 3, 9))
	pods := waitPods(t, env, ns, "elected", "elected-0-0", "elected-1-0", "elected-2-0")
	for _, p := range pods {
		require.Equal(t, "manager-a", creator(p), "pod %s", p.Name)
	}
	select {
	case <-b.mgr.Elected():
		t.Fatal("manager-b was elected while manager-a leads")
	default:
	}

	// Mid-run: shard 0 fails (its retry is due), shard 1 runs, shard 2 is
	// done. Then the leader stops without releasing its lease.
	setPod(t, env, ns, "elected-1-0", corev1.PodRunning, 0, nil)
	workerReport(t, env, run, 1, 0, v1alpha1.ItemCounts{Total: 3, Completed: 1}, "")
	setPod(t, env, ns, "elected-2-0", corev1.PodSucceeded, 0, shardReport(2, 0, v1alpha1.ItemCounts{Total: 3, Completed: 3}, ""))
	waitPods(t, env, ns, "elected", "elected-0-0", "elected-1-0", "elected-2-0")
	a.stop()
	stoppedAt := time.Now()
	setPod(t, env, ns, "elected-0-0", corev1.PodFailed, 1, shardReport(0, 0, v1alpha1.ItemCounts{Total: 3, Completed: 1, Failed: 1}, "boom"))

	select {
	case <-b.mgr.Elected():
	case <-time.After(testTimeout):
		t.Fatal("manager-b did not take over")
	}
	took := time.Since(stoppedAt)
	t.Logf("manager-b took over %s after manager-a stopped", took.Round(time.Millisecond))
	require.Less(t, took, 2*time.Second+3*time.Second, "within the lease duration (2s) plus a few retry periods")
	require.NotEqual(t, holderA, leaseHolder(t, env.Client, ns))

	pods = waitPods(t, env, ns, "elected", "elected-0-0", "elected-0-1", "elected-1-0", "elected-2-0")
	require.Equal(t, "manager-b", creator(pods["elected-0-1"]))
	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 1, Failed: 1}, parseFloor(pods["elected-0-1"].Annotations))

	setPod(t, env, ns, "elected-0-1", corev1.PodSucceeded, 0, shardReport(0, 1, v1alpha1.ItemCounts{Total: 3, Completed: 3}, ""))
	setPod(t, env, ns, "elected-1-0", corev1.PodSucceeded, 0, shardReport(1, 0, v1alpha1.ItemCounts{Total: 3, Completed: 2, AlreadyHandled: 1}, ""))
	waitRun(t, env, ns, "elected", "Succeeded", all(
		phaseIs(v1alpha1.RunSucceeded),
		countsAre(v1alpha1.ItemCounts{Total: 9, Completed: 8, AlreadyHandled: 1}),
	))
	stillPods(t, env, ns, "elected", 500*time.Millisecond, "elected-0-0", "elected-0-1", "elected-1-0", "elected-2-0")
}

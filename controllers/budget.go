package controllers

import (
	"fmt"
	"sort"
	"strings"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
)

// The connection budget: a run's worker pods hold at most
// v1alpha1.ConnectionsPerWorker connections each, so a budget of L
// connections is L / ConnectionsPerWorker pods at once. Everything here is
// pure: the pass's shard decisions in, the same decisions held within the
// budget out.

// ReasonWaitingForConnectionBudget: shards wait for the run's connection
// budget (spec.database.maxConnections, or the manager's default or
// maximum): they start as running pods finish.
const ReasonWaitingForConnectionBudget = "WaitingForConnectionBudget"

// runBudget is the connection budget a pass applies to a run.
type runBudget struct {
	v1alpha1.ConnectionBudget
	// parallelism is the most live pods at once: the budget's, never more
	// than the shards, nor than the pods Kueue admitted.
	parallelism int32
	// byKueue: Kueue admitted fewer pods than the budget allows, and
	// parallelism is Kueue's.
	byKueue bool
}

// budgetFor is the budget of run under the manager's settings; admitted,
// when positive, is the number of pods Kueue admitted the run with (its
// quota), which the pods never exceed either.
func budgetFor(run *v1alpha1.ProcessingRun, m v1alpha1.ConnectionBudgetSettings, admitted int32) runBudget {
	b := v1alpha1.ConnectionBudgetOf(&run.Spec, m)
	p := b.Parallelism(run.Spec.ShardCount())
	if admitted > 0 && admitted < p {
		return runBudget{ConnectionBudget: b, parallelism: admitted, byKueue: true}
	}
	return runBudget{ConnectionBudget: b, parallelism: p}
}

// admittedPods is the number of worker pods Kueue admitted a Workload with:
// its admission's count for the pod set, or the pod set's own count when
// the admission does not say; 0 when it is not admitted.
func admittedPods(wl *kueue.Workload) int32 {
	if wl == nil || wl.Status.Admission == nil {
		return 0
	}
	for _, psa := range wl.Status.Admission.PodSetAssignments {
		if psa.Name == workloadPodSet && psa.Count != nil {
			return *psa.Count
		}
	}
	return podSetCount(wl)
}

// budgetOutcome is what holding the shards within the budget found and
// decided.
type budgetOutcome struct {
	// active is the number of live pods (pods on lost nodes aside).
	active int32
	// waiting is the number of shards that wanted a pod now and wait for
	// the budget.
	waiting int32
	// stopped is the number of pods this pass stops because more run than
	// the budget allows (it was lowered).
	stopped int32
}

// decideBudget holds the shards' decisions within parallelism live pods.
// A shard takes a slot while it has a live pod (one being stopped
// included; one on a lost node aside: it is replaced without waiting for
// it, see docs/operations.md) or may have one the cache does not show yet.
// Shards that want a pod take the free slots, the lowest index first; the
// others wait (no create, waitsForBudget). When more shards hold slots
// than parallelism allows, the excess pods are stopped: those not yet
// running first, then the highest shards; pods already being stopped count
// towards it. A suspended or finished run's pods all stop anyway:
// decideBudget only counts them.
func decideBudget(shards []shardDecision, parallelism int32, stopping bool) budgetOutcome {
	var out budgetOutcome
	var held, leaving int32
	var want, stoppable []int
	for i := range shards {
		d := &shards[i]
		out.active += int32(d.live)
		if d.live > 0 || d.waitForCache {
			held++
			if d.stoppable == nil && !d.waitForCache {
				leaving++ // its live pods are all being deleted
			}
		}
		if d.stoppable != nil {
			stoppable = append(stoppable, i)
		}
		if d.create != nil {
			want = append(want, i)
		}
	}
	if stopping {
		return out
	}
	free := max(parallelism-held, 0)
	for k, i := range want { // shards are in index order
		if int32(k) < free {
			continue
		}
		shards[i].create = nil
		shards[i].waitsForBudget = true
		out.waiting++
	}
	excess := held - parallelism - leaving
	if excess <= 0 {
		return out
	}
	sort.SliceStable(stoppable, func(a, b int) bool {
		da, db := &shards[stoppable[a]], &shards[stoppable[b]]
		if da.stoppableRunning != db.stoppableRunning {
			return !da.stoppableRunning
		}
		return da.index > db.index
	})
	for _, i := range stoppable[:min(int(excess), len(stoppable))] {
		shards[i].overBudget = shards[i].stoppable
		out.stopped++
	}
	return out
}

// budgetStatus is status.connections: nil without a budget or once the
// run is finished.
func budgetStatus(b runBudget, o budgetOutcome, finished bool) *v1alpha1.ConnectionsStatus {
	if b.Limit <= 0 || finished {
		return nil
	}
	return &v1alpha1.ConnectionsStatus{Limit: b.Limit, Source: b.Source, Parallelism: b.parallelism, Waiting: o.waiting}
}

// budgetWait says how many shards wait for the budget and why, empty when
// none does.
func budgetWait(b runBudget, o budgetOutcome, shards int) string {
	if o.waiting == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d shards wait for the connection budget: %s", o.waiting, shards, b.describe())
}

// describe is the budget in words, e.g. "64 connections
// (spec.database.maxConnections): 32 pods at once, 2 connections each".
func (b runBudget) describe() string {
	var parts []string
	if b.Limit > 0 {
		from := map[v1alpha1.ConnectionBudgetSource]string{
			v1alpha1.BudgetFromRun:            "spec.database.maxConnections",
			v1alpha1.BudgetFromManagerDefault: "the manager's default",
			v1alpha1.BudgetFromManagerMaximum: "the manager's maximum",
		}[b.Source]
		parts = append(parts, fmt.Sprintf("%d connections (%s)", b.Limit, from))
	}
	if b.byKueue {
		parts = append(parts, "the pods Kueue admitted")
	}
	return fmt.Sprintf("%s: %d pods at once, %d connections each", strings.Join(parts, ", within "), b.parallelism, v1alpha1.ConnectionsPerWorker)
}

// overBudgetWhy is why a pod is stopped for the budget (its Event's note).
func overBudgetWhy(b runBudget) string {
	return fmt.Sprintf("more pods run than the connection budget allows (%s); the shard resumes from the ledger when a slot is free", b.describe())
}

// stoppablePod is a live pod the budget may stop: not being deleted, not
// on a lost node.
func stoppablePod(pi podInfo) bool {
	return pi.state == podLive && !pi.lost && !pi.deleting
}

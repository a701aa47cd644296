//go:build e2e

package e2e

// The soak's checker on made-up end states (no cluster: it runs in
// `go test -tags e2e -run TestSoakChecker`): it passes a correct one and
// names each kind of defect it exists to find.

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

// checkerRun is a run of keys acct-lo..acct-hi with the given status.
func checkerRun(name, kind string, policy v1alpha1.OnExistingPolicy, lo, hi int, cond string, st v1alpha1.ProcessingRunStatus) *soakRun {
	occ := soakOccurrence
	if kind == "processor" {
		occ = soakProcessorOccurrence
	}
	st.Total = int64(hi - lo + 1)
	st.Shards = []v1alpha1.ShardStatus{{Index: 0, ItemCounts: v1alpha1.ItemCounts{Total: st.Total}}}
	st.Conditions = []metav1.Condition{{Type: cond, Status: metav1.ConditionTrue, Reason: "R", Message: "because"}}
	obj := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}, Status: st}
	return &soakRun{name: name, tag: name, kind: kind, policy: policy, occurrence: occ, lo: lo, hi: hi, obj: obj}
}

func acct(i int, occ string) bizKey { return bizKey{fmt.Sprintf("acct-%d", i), occ} }

// applied records that run r applied keys lo..hi: its sink rows, effect
// calls and ledger rows (committed).
func (d *soakData) applied(r *soakRun, lo, hi int) {
	for i := lo; i <= hi; i++ {
		k := acct(i, r.occurrence)
		if r.processor() {
			idem := worker.IdempotencyKey(ledger.Key{Entity: k.entity, Occurrence: k.occurrence}, 0)
			d.work[k] = append(d.work[k], idem)
			d.request(r, k, idem)
		} else {
			d.sink[k] = append(d.sink[k], r.tag)
			d.sinkRows++
			if d.effectCalls[k] == nil {
				d.effectCalls[k] = map[string]int{}
			}
			d.effectCalls[k][r.tag]++
			d.effectRows++
		}
		uid := string(r.obj.UID)
		if d.ledger[uid] == nil {
			d.ledger[uid] = map[bizKey]int{}
		}
		d.ledger[uid][k]++
		d.committed[k]++
	}
}

// request records that run r sent the processor key k under idem.
func (d *soakData) request(r *soakRun, k bizKey, idem string) {
	if d.requested[r.name] == nil {
		d.requested[r.name] = map[bizKey]bool{}
		d.runIdems[r.name] = map[bizKey]map[string]bool{}
	}
	d.requested[r.name][k] = true
	if d.runIdems[r.name][k] == nil {
		d.runIdems[r.name][k] = map[string]bool{}
	}
	d.runIdems[r.name][k][idem] = true
	if d.keyBiz[idem] == nil {
		d.keyBiz[idem] = map[bizKey]bool{}
	}
	d.keyBiz[idem][k] = true
	d.requests++
}

func emptySoakData() *soakData {
	return &soakData{sink: map[bizKey][]string{}, effectCalls: map[bizKey]map[string]int{}, work: map[bizKey][]string{},
		requested: map[string]map[bizKey]bool{}, keyBiz: map[string]map[bizKey]bool{}, ledger: map[string]map[bizKey]int{},
		committed: map[bizKey]int{}, failureErrors: map[string][]string{}, runIdems: map[string]map[bizKey]map[string]bool{},
		proofs: map[string]runProof{}}
}

func TestSoakChecker(t *testing.T) {
	complete := v1alpha1.ConditionComplete
	verdict := func(runs []*soakRun, d *soakData) *soakReport {
		s := &soak{f: &fixture{mon: &podMonitor{seen: map[string][]string{}}}, start: time.Now()}
		// The ledger proves what a run reports unless the case says otherwise.
		for _, r := range runs {
			if _, ok := d.proofs[string(r.obj.UID)]; !ok && finished(r.obj) {
				c := r.obj.Status.ItemCounts
				c.PayloadChanged = 0
				d.proofs[string(r.obj.UID)] = runProof{ItemCounts: c, Proven: true}
			}
		}
		rep := &soakReport{}
		s.verdict(runs, d, rep)
		return rep
	}
	// Two Skip runs over 1..10 and 6..15; b finds 6..10 handled by a.
	healthy := func() ([]*soakRun, *soakData) {
		a := checkerRun("a", "query", v1alpha1.OnExistingSkip, 1, 10, complete, v1alpha1.ProcessingRunStatus{ItemCounts: v1alpha1.ItemCounts{Completed: 10}})
		b := checkerRun("b", "inline", v1alpha1.OnExistingSkip, 6, 15, complete, v1alpha1.ProcessingRunStatus{ItemCounts: v1alpha1.ItemCounts{Completed: 5, AlreadyHandled: 5}})
		p := checkerRun("p", "processor", v1alpha1.OnExistingSkip, 1, 4, complete, v1alpha1.ProcessingRunStatus{ItemCounts: v1alpha1.ItemCounts{Completed: 4}})
		d := emptySoakData()
		d.applied(a, 1, 10)
		d.applied(b, 11, 15)
		d.applied(p, 1, 4)
		return []*soakRun{a, b, p}, d
	}

	t.Run("healthy", func(t *testing.T) {
		runs, d := healthy()
		require.Empty(t, verdict(runs, d).problems())
	})
	t.Run("lost", func(t *testing.T) {
		runs, d := healthy()
		k := acct(15, soakOccurrence) // b reports it completed; nothing applied it
		d.sink[k], d.effectCalls[k] = nil, nil
		d.sinkRows--
		d.effectRows--
		delete(d.ledger["uid-b"], k)
		runs[1].obj.Status.Completed = 4
		rep := verdict(runs, d)
		require.Len(t, rep.lost, 1, "%v", rep.problems())
		require.NotEmpty(t, rep.mismatch, "and its counts do not add up")
	})
	t.Run("double", func(t *testing.T) {
		runs, d := healthy()
		k := acct(7, soakOccurrence) // b applied a key a had applied
		d.sink[k] = append(d.sink[k], "b")
		d.effectCalls[k]["b"]++
		d.sinkRows++
		d.effectRows++
		d.committed[k]++
		rep := verdict(runs, d)
		require.NotEmpty(t, rep.double, "%v", rep.problems())
	})
	t.Run("double effect call within a run", func(t *testing.T) {
		runs, d := healthy()
		d.effectCalls[acct(3, soakOccurrence)]["a"]++
		d.effectRows++
		rep := verdict(runs, d)
		require.NotEmpty(t, rep.double, "%v", rep.problems())
		require.NotEmpty(t, rep.mismatch, "the log and the sink disagree")
	})
	t.Run("processor work under two keys", func(t *testing.T) {
		runs, d := healthy()
		k := acct(2, soakProcessorOccurrence)
		d.work[k] = append(d.work[k], "another-key")
		require.NotEmpty(t, verdict(runs, d).double)
	})
	t.Run("count mismatch", func(t *testing.T) {
		runs, d := healthy()
		runs[0].obj.Status.Completed = 9
		runs[0].obj.Status.AlreadyHandled = 1
		rep := verdict(runs, d)
		require.NotEmpty(t, rep.mismatch, "%v", rep.problems())
		require.Empty(t, rep.lost)
	})
	t.Run("processor item committed never sent", func(t *testing.T) {
		runs, d := healthy()
		delete(d.requested["p"], acct(3, soakProcessorOccurrence))
		require.NotEmpty(t, verdict(runs, d).mismatch)
	})
	t.Run("failed visibly", func(t *testing.T) {
		runs, d := healthy()
		runs[1].obj.Status.Conditions[0].Type = v1alpha1.ConditionFailed
		runs[1].obj.Status.Completed, runs[1].obj.Status.Failed = 3, 2
		for i := 14; i <= 15; i++ {
			k := acct(i, soakOccurrence)
			delete(d.sink, k)
			delete(d.effectCalls, k)
			delete(d.ledger["uid-b"], k)
			d.sinkRows--
			d.effectRows--
		}
		rep := verdict(runs, d)
		require.Empty(t, rep.problems())
		require.EqualValues(t, 2, rep.failedVisibly)

		runs[1].obj.Status.Conditions[0].Message = ""
		require.NotEmpty(t, verdict(runs, d).lost, "a Failed run that does not say why lost its items")
	})
	t.Run("a succeeded run the ledger does not prove", func(t *testing.T) {
		runs, d := healthy()
		d.proofs["uid-a"] = runProof{ItemCounts: v1alpha1.ItemCounts{Total: 10, Completed: 9}, Unproven: []string{"acct-4/2026-01 Missing (...)"}}
		rep := verdict(runs, d)
		require.Len(t, rep.mismatch, 1, "%v", rep.problems())
		require.Contains(t, rep.mismatch[0], "does not prove")
	})
	t.Run("a succeeded run counts what the ledger proves otherwise", func(t *testing.T) {
		runs, d := healthy()
		d.proofs["uid-b"] = runProof{ItemCounts: v1alpha1.ItemCounts{Total: 10, Completed: 4, AlreadyHandled: 6}, Proven: true}
		rep := verdict(runs, d)
		require.Len(t, rep.mismatch, 1, "%v", rep.problems())
		require.Contains(t, rep.mismatch[0], "the ledger proves total=10 completed=4 alreadyHandled=6")
	})
	t.Run("a payloadChanged count is no proof's business", func(t *testing.T) {
		runs, d := healthy()
		runs[1].obj.Status.PayloadChanged = 5
		require.Empty(t, verdict(runs, d).problems())
	})
	t.Run("a failover's lost commit redone, the processor's redelivered under its key", func(t *testing.T) {
		// What the survivor holds after a failover lost p's commit of
		// acct-2 and p processed it again: the same as without the
		// failover, and a second request under the same key, which the
		// processor answered from its own record.
		runs, d := healthy()
		k := acct(2, soakProcessorOccurrence)
		d.request(runs[2], k, worker.IdempotencyKey(ledger.Key{Entity: k.entity, Occurrence: k.occurrence}, 0))
		rep := verdict(runs, d)
		require.Empty(t, rep.problems())
		require.Equal(t, 1, rep.redeliveries)
	})
	t.Run("a Skip run's redelivery under another key", func(t *testing.T) {
		runs, d := healthy()
		d.request(runs[2], acct(2, soakProcessorOccurrence), "another-key")
		rep := verdict(runs, d)
		require.Len(t, rep.double, 1, "%v", rep.problems())
		require.Contains(t, rep.double[0], "under 2 idempotency keys")
	})
	t.Run("a Skip run's first request under another key", func(t *testing.T) {
		runs, d := healthy()
		k := acct(3, soakProcessorOccurrence)
		d.runIdems["p"][k] = map[string]bool{"another-key": true}
		require.NotEmpty(t, verdict(runs, d).double)
	})
	t.Run("a Supersede run's keys name the row they replace", func(t *testing.T) {
		runs, d := healthy()
		s := checkerRun("s", "processor", v1alpha1.OnExistingSupersede, 1, 2, complete, v1alpha1.ProcessingRunStatus{ItemCounts: v1alpha1.ItemCounts{Completed: 2}})
		for i := 1; i <= 2; i++ {
			k := acct(i, soakProcessorOccurrence)
			d.committed[k]-- // p's rows are superseded
			idem := worker.IdempotencyKey(ledger.Key{Entity: k.entity, Occurrence: k.occurrence}, 100+int64(i))
			d.work[k] = append(d.work[k], idem)
			d.request(s, k, idem)
			d.ledger["uid-s"] = map[bizKey]int{acct(1, soakProcessorOccurrence): 1, acct(2, soakProcessorOccurrence): 1}
			d.committed[k]++
		}
		// Its second try replaced another run's commit of acct-2 meanwhile.
		k := acct(2, soakProcessorOccurrence)
		d.request(s, k, worker.IdempotencyKey(ledger.Key{Entity: k.entity, Occurrence: k.occurrence}, 200))
		rep := verdict(append(runs, s), d)
		require.Empty(t, rep.problems())
		require.Equal(t, 1, rep.supersedeRekeyed)
	})
	t.Run("supersede applies again", func(t *testing.T) {
		runs, d := healthy()
		s := checkerRun("s", "query", v1alpha1.OnExistingSupersede, 1, 5, complete, v1alpha1.ProcessingRunStatus{ItemCounts: v1alpha1.ItemCounts{Completed: 5}})
		d.applied(s, 1, 5)
		for i := 1; i <= 5; i++ {
			d.committed[acct(i, soakOccurrence)]-- // a's rows are superseded
		}
		require.Empty(t, verdict(append(runs, s), d).problems())
	})
}

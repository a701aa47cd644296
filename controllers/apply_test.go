package controllers

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/randfill"

	acv1alpha1 "github.com/runledger/runledger/api/applyconfiguration/api/v1alpha1"
	"github.com/runledger/runledger/api/v1alpha1"
)

// TestStatusApplyRoundTrip: what the controllers apply of a run's or a
// schedule's status, read back as the API server stores it, is that status,
// for statuses filled at random: no field is lost on the way. A field the
// generated apply configurations lack or spell otherwise (make generate
// not run after a change of the types) fails here.
func TestStatusApplyRoundTrip(t *testing.T) {
	f := randfill.NewWithSeed(49).NilChance(0.2).NumElements(1, 3)
	for range 300 {
		var run v1alpha1.ProcessingRunStatus
		f.Fill(&run)
		requireApplyRoundTrip[acv1alpha1.ProcessingRunStatusApplyConfiguration](t, &run)
		var sched v1alpha1.ProcessingScheduleStatus
		f.Fill(&sched)
		requireApplyRoundTrip[acv1alpha1.ProcessingScheduleStatusApplyConfiguration](t, &sched)
	}
}

// requireApplyRoundTrip: st through applyConfigurationOf and back (strict:
// the apply configuration names no field the type lacks) is st.
func requireApplyRoundTrip[AC, S any](t *testing.T, st *S) {
	t.Helper()
	ac, err := applyConfigurationOf[AC](st)
	require.NoError(t, err)
	raw, err := json.Marshal(ac)
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	back := new(S)
	require.NoError(t, dec.Decode(back))
	if !equality.Semantic.DeepEqual(st, back) {
		want, _ := json.Marshal(st)
		t.Fatalf("a status does not survive its apply configuration:\nstatus:  %s\napplied: %s", want, raw)
	}
}

// TestRunStatusApply: the run's apply configuration is pinned to its run
// (name, namespace, UID) and carries every shard's counts, reported or not,
// and the conditions, SynchronousReplication among them.
func TestRunStatusApply(t *testing.T) {
	run := testRun()
	run.UID = "uid-1"
	run.Spec.Workers = 2
	d0 := shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{Total: 9, Completed: 3})
	d1 := shard(1, v1alpha1.ShardPending, v1alpha1.ItemCounts{})
	shards := []shardDecision{d0, d1}
	st := buildStatus(run, statusInput{shards: shards, outcome: decideRun(run, shards, true), now: t0,
		replication: &v1alpha1.LedgerReplication{Synchronous: true, Standby: "flushed", SynchronousCommit: "on", SynchronousStandbyNames: "a"}})
	ac, err := runStatusApply(run, &st)
	require.NoError(t, err)
	require.Equal(t, run.Name, *ac.Name)
	require.Equal(t, run.Namespace, *ac.Namespace)
	require.Equal(t, run.UID, *ac.UID)
	require.Equal(t, int64(3), *ac.Status.Shards[0].Completed)
	require.Equal(t, int64(0), *ac.Status.Shards[1].Total, "a shard not reported yet shows its zero counts, as the status compared")
	var types []string
	for _, c := range ac.Status.Conditions {
		types = append(types, *c.Type)
	}
	require.Contains(t, types, v1alpha1.ConditionSynchronousReplication)
}

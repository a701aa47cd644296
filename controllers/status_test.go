package controllers

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

func runKey(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

func shard(i int32, phase v1alpha1.ShardPhase, c v1alpha1.ItemCounts) shardDecision {
	return shardDecision{index: i, phase: phase, counts: c, final: phase == v1alpha1.ShardSucceeded,
		pod: v1alpha1.PodName("invoices", i, 0)}
}

func cond(t *testing.T, st v1alpha1.ProcessingRunStatus, typ string) *metav1.Condition {
	t.Helper()
	return meta.FindStatusCondition(st.Conditions, typ)
}

func requireCond(t *testing.T, st v1alpha1.ProcessingRunStatus, typ string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	c := cond(t, st, typ)
	require.NotNil(t, c, "condition %s", typ)
	require.Equal(t, status, c.Status, "condition %s", typ)
	require.Equal(t, reason, c.Reason, "condition %s", typ)
}

func TestDecideRunAndStatus(t *testing.T) {
	now := t0
	started := &metav1.Time{Time: t0.Add(-time.Minute)}
	tests := []struct {
		name    string
		mutate  func(*v1alpha1.ProcessingRun)
		shards  []shardDecision
		started *metav1.Time
		stalled *problem
		// reconcileError ended the pass early.
		reconcileError string
		check          func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus)
	}{
		{
			name:   "nothing created yet: Pending, Reconciling",
			shards: []shardDecision{shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunPending, st.Phase)
				requireCond(t, st, v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonPending)
				requireCond(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonPending)
				require.Nil(t, cond(t, st, v1alpha1.ConditionStalled))
				require.Nil(t, st.StartTime)
				require.Equal(t, int64(1), st.ObservedGeneration)
			},
		},
		{
			name:    "running: totals add up the shards",
			started: started,
			shards: []shardDecision{
				shard(0, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 5, Completed: 3, AlreadyHandled: 2}),
				shard(1, v1alpha1.ShardRunning, v1alpha1.ItemCounts{Total: 6, Completed: 1}),
			},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunRunning, st.Phase)
				require.Equal(t, v1alpha1.ItemCounts{Total: 11, Completed: 4, AlreadyHandled: 2}, st.ItemCounts)
				requireCond(t, st, v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonRunning)
				require.Equal(t, "1/2 shards succeeded, 1 running", cond(t, st, v1alpha1.ConditionReconciling).Message)
				require.Equal(t, started, st.StartTime)
				require.Nil(t, st.CompletionTime)
				require.Len(t, st.Shards, 2)
				require.Equal(t, v1alpha1.ShardRunning, st.Shards[1].Phase)
				require.Equal(t, "invoices-1-0", st.Shards[1].Pod)
			},
		},
		{
			name:    "inline items: total is the declared count from the start",
			started: started,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Batch = v1alpha1.BatchSpec{Items: make([]v1alpha1.Item, 7)}
			},
			shards: []shardDecision{shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{Total: 3, Completed: 1})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, int64(7), st.Total)
			},
		},
		{
			name:    "counts never go down while running",
			started: started,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Status.Total, r.Status.Completed, r.Status.Failed = 10, 8, 1
			},
			shards: []shardDecision{shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{Total: 10, Completed: 2})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 8, Failed: 1}, st.ItemCounts)
			},
		},
		{
			name:    "all shards succeeded: Complete and Ready, exact totals",
			started: started,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Status.Total, r.Status.Completed, r.Status.Failed = 10, 8, 3 // an earlier attempt's failures
				r.Spec.MaxFailedItems = 1
			},
			shards: []shardDecision{
				shard(0, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 4, Completed: 4}),
				shard(1, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 6, Completed: 4, AlreadyHandled: 1, Failed: 1}),
			},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunSucceeded, st.Phase)
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 8, AlreadyHandled: 1, Failed: 1}, st.ItemCounts)
				requireCond(t, st, v1alpha1.ConditionComplete, metav1.ConditionTrue, ReasonSucceeded)
				requireCond(t, st, v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonSucceeded)
				require.Nil(t, cond(t, st, v1alpha1.ConditionReconciling))
				require.Nil(t, cond(t, st, v1alpha1.ConditionStalled))
				require.Nil(t, cond(t, st, v1alpha1.ConditionFailed))
				require.Equal(t, now, st.CompletionTime.Time)
				require.Equal(t, "10 items: 8 completed, 1 already handled, 1 failed", cond(t, st, v1alpha1.ConditionComplete).Message)
			},
		},
		{
			name:    "all shards done but too many failed items across shards: Failed",
			started: started,
			shards: []shardDecision{
				shard(0, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 4, Completed: 3, Failed: 1}),
			},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunFailed, st.Phase)
				requireCond(t, st, v1alpha1.ConditionFailed, metav1.ConditionTrue, ReasonTooManyFailedItems)
				requireCond(t, st, v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonTooManyFailedItems)
				requireCond(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonTooManyFailedItems)
			},
		},
		{
			name:    "a shard failed for good: Failed with its message, retrying shards shown Failed",
			started: started,
			shards: []shardDecision{
				{index: 0, phase: v1alpha1.ShardFailed, final: true, failure: &shardFailure{reason: ReasonBackoffLimitExceeded, message: "shard 0 failed 4 times"}},
				shard(1, v1alpha1.ShardRetrying, v1alpha1.ItemCounts{}),
			},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunFailed, st.Phase)
				requireCond(t, st, v1alpha1.ConditionFailed, metav1.ConditionTrue, ReasonBackoffLimitExceeded)
				require.Equal(t, "shard 0 failed 4 times", cond(t, st, v1alpha1.ConditionFailed).Message)
				require.Equal(t, v1alpha1.ShardFailed, st.Shards[1].Phase)
				require.NotNil(t, st.CompletionTime)
			},
		},
		{
			name:    "stalled: Stalled instead of Reconciling",
			stalled: &problem{reason: ReasonSecretNotFound, message: `Secret "db" not found`},
			shards:  []shardDecision{shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunPending, st.Phase)
				requireCond(t, st, v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonSecretNotFound)
				requireCond(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonSecretNotFound)
				require.Nil(t, cond(t, st, v1alpha1.ConditionReconciling))
			},
		},
		{
			name:    "unschedulable: Reconciling says so, with the scheduler's message",
			started: started,
			shards: []shardDecision{
				func() shardDecision {
					d := shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})
					d.unschedulable = "pod invoices-0-0: 0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
					return d
				}(),
				shard(1, v1alpha1.ShardRunning, v1alpha1.ItemCounts{}),
			},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunRunning, st.Phase)
				requireCond(t, st, v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonUnschedulable)
				requireCond(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonUnschedulable)
				require.Equal(t, "cannot be scheduled: pod invoices-0-0: 0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.; 0/2 shards succeeded, 1 running, 1 pending",
					cond(t, st, v1alpha1.ConditionReconciling).Message)
				require.Nil(t, cond(t, st, v1alpha1.ConditionStalled), "the scheduler keeps trying: not stalled")
			},
		},
		{
			name:           "a pass ended by an error: Reconciling and Ready say which",
			started:        started,
			reconcileError: "syncPods: create pod invoices-0-1: etcdserver: request timed out",
			shards:         []shardDecision{shard(0, v1alpha1.ShardRetrying, v1alpha1.ItemCounts{})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				requireCond(t, st, v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonReconcileError)
				requireCond(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonReconcileError)
				require.Equal(t, "syncPods: create pod invoices-0-1: etcdserver: request timed out (retrying); 0/1 shards succeeded, 1 retrying",
					cond(t, st, v1alpha1.ConditionReconciling).Message)
			},
		},
		{
			name:           "a stall outranks a pass's error",
			reconcileError: "syncPods: boom",
			stalled:        &problem{reason: ReasonSecretNotFound, message: `Secret "db" not found`},
			shards:         []shardDecision{shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				requireCond(t, st, v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonSecretNotFound)
				require.Nil(t, cond(t, st, v1alpha1.ConditionReconciling))
			},
		},
		{
			name:    "suspended",
			started: started,
			mutate:  func(r *v1alpha1.ProcessingRun) { r.Spec.Suspend = true },
			shards:  []shardDecision{shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{Total: 3, Completed: 1})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunSuspended, st.Phase)
				requireCond(t, st, v1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonSuspended)
				requireCond(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonSuspended)
				require.Nil(t, cond(t, st, v1alpha1.ConditionReconciling))
				require.Equal(t, int64(1), st.Completed)
			},
		},
		{
			name:    "resumed",
			started: started,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionSuspended, Status: metav1.ConditionTrue, Reason: ReasonSuspended}}
			},
			shards: []shardDecision{shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunRunning, st.Phase)
				requireCond(t, st, v1alpha1.ConditionSuspended, metav1.ConditionFalse, ReasonResumed)
				requireCond(t, st, v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonRunning)
			},
		},
		{
			name:    "finished is sticky",
			started: started,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Status.Phase = v1alpha1.RunSucceeded
				r.Status.CompletionTime = &metav1.Time{Time: t0.Add(-time.Hour)}
				r.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionComplete, Status: metav1.ConditionTrue, Reason: ReasonSucceeded}}
				r.Generation = 2
			},
			shards: []shardDecision{shard(0, v1alpha1.ShardPending, v1alpha1.ItemCounts{})},
			check: func(t *testing.T, o runOutcome, st v1alpha1.ProcessingRunStatus) {
				require.Equal(t, v1alpha1.RunSucceeded, st.Phase)
				require.Equal(t, t0.Add(-time.Hour), st.CompletionTime.Time)
				require.Len(t, st.Conditions, 1)
				require.Equal(t, int64(2), st.Conditions[0].ObservedGeneration)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := testRun()
			run.Spec.Workers = int32(len(tt.shards))
			if tt.mutate != nil {
				tt.mutate(run)
			}
			o := decideRun(run, tt.shards, tt.started != nil)
			st := buildStatus(run, statusInput{shards: tt.shards, outcome: o, stalled: tt.stalled, startTime: tt.started, now: now,
				reconcileError: tt.reconcileError})
			tt.check(t, o, st)
		})
	}
}

func TestBuildStatusKeepsWorkerFieldsAndTransitionTimes(t *testing.T) {
	run := testRun()
	run.Spec.Workers = 1
	old := metav1.NewTime(t0.Add(-time.Hour))
	run.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReconciling, Status: metav1.ConditionTrue,
		Reason: ReasonRunning, LastTransitionTime: old}}
	rt := metav1.NewTime(t0)
	run.Status.Shards = []v1alpha1.ShardStatus{{Index: 0, Attempt: 0, ItemCounts: v1alpha1.ItemCounts{Completed: 3, Total: 9}, Message: "working", LastReportTime: &rt}}
	d := shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{Total: 9, Completed: 3})
	st := buildStatus(run, statusInput{shards: []shardDecision{d}, outcome: decideRun(run, []shardDecision{d}, true),
		startTime: &metav1.Time{Time: t0}, now: t0})
	require.Equal(t, old, cond(t, st, v1alpha1.ConditionReconciling).LastTransitionTime)
	require.Equal(t, "working", st.Shards[0].Message)
	require.Equal(t, &rt, st.Shards[0].LastReportTime)
	require.Equal(t, int64(3), st.Shards[0].Completed)

	// A finished shard's entry gets the final report when the worker's
	// last status write was lost.
	d = shardDecision{index: 0, phase: v1alpha1.ShardSucceeded, final: true, counts: v1alpha1.ItemCounts{Total: 9, Completed: 9},
		report: &v1alpha1.ShardReport{Shard: 0, Attempt: 0, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 9}, Message: "done"}}
	st = buildStatus(run, statusInput{shards: []shardDecision{d}, outcome: decideRun(run, []shardDecision{d}, true), now: t0})
	require.Equal(t, int64(9), st.Shards[0].Completed)
	require.Equal(t, "done", st.Shards[0].Message)
	require.Equal(t, int64(9), st.Completed)

	ac, err := runStatusApply(run, &st)
	require.NoError(t, err)
	require.Equal(t, int64(9), *ac.Status.Shards[0].Completed)
	require.True(t, rt.Equal(ac.Status.Shards[0].LastReportTime), "the controller writes the report time the worker put on its pod")

	// The reports folded in from the pods replace the entry's report fields
	// and keep the controller's.
	d = shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{Total: 9, Completed: 7})
	later := metav1.NewTime(t0.Add(time.Minute))
	st = buildStatus(run, statusInput{shards: []shardDecision{d}, outcome: decideRun(run, []shardDecision{d}, true),
		entries:   map[int32]*v1alpha1.ShardStatus{0: {Index: 0, Attempt: 1, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 7}, Message: "further", LastReportTime: &later}},
		startTime: &metav1.Time{Time: t0}, now: t0})
	require.Equal(t, v1alpha1.ShardStatus{Index: 0, Attempt: 1, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 7}, Message: "further", LastReportTime: &later,
		Pod: "invoices-0-0", Phase: v1alpha1.ShardRunning}, st.Shards[0])
}

func TestProgressOnlyChange(t *testing.T) {
	rt := metav1.NewTime(t0)
	base := v1alpha1.ProcessingRunStatus{Phase: v1alpha1.RunRunning, ItemCounts: v1alpha1.ItemCounts{Completed: 1}, Shards: []v1alpha1.ShardStatus{
		{Index: 0, Phase: v1alpha1.ShardRunning, Pod: "r-0-0", ItemCounts: v1alpha1.ItemCounts{Completed: 1}, Message: "processing: 1 of 9"},
		{Index: 1, Phase: v1alpha1.ShardRunning, Pod: "r-1-0"},
	}}
	tests := []struct {
		name   string
		mutate func(*v1alpha1.ProcessingRunStatus)
		want   bool
	}{
		{"nothing", func(*v1alpha1.ProcessingRunStatus) {}, true},
		{"run counts", func(s *v1alpha1.ProcessingRunStatus) { s.Completed = 5 }, true},
		{"a shard's counts, message and report time", func(s *v1alpha1.ProcessingRunStatus) {
			s.Shards[1].Completed, s.Shards[1].Total, s.Shards[1].Message, s.Shards[1].LastReportTime = 4, 9, "processing: 4 of 9", &rt
		}, true},
		{"run phase", func(s *v1alpha1.ProcessingRunStatus) { s.Phase = v1alpha1.RunSucceeded }, false},
		{"a shard's phase", func(s *v1alpha1.ProcessingRunStatus) { s.Shards[0].Phase = v1alpha1.ShardSucceeded }, false},
		{"a shard's attempt", func(s *v1alpha1.ProcessingRunStatus) { s.Shards[0].Attempt = 1 }, false},
		{"a shard's pod", func(s *v1alpha1.ProcessingRunStatus) { s.Shards[0].Pod = "r-0-1" }, false},
		{"a counted failure", func(s *v1alpha1.ProcessingRunStatus) { s.Shards[0].FailedAttempts = 1 }, false},
		{"a shard more", func(s *v1alpha1.ProcessingRunStatus) {
			s.Shards = append(s.Shards, v1alpha1.ShardStatus{Index: 2})
		}, false},
		{"a condition", func(s *v1alpha1.ProcessingRunStatus) {
			s.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady}}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			desired := base.DeepCopy()
			tt.mutate(desired)
			require.Equal(t, tt.want, progressOnlyChange(&base, desired))
		})
	}
}

func TestDeadlineLeft(t *testing.T) {
	t.Parallel()
	start := metav1.NewTime(time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC))
	for _, tt := range []struct {
		name     string
		deadline *int64
		start    *metav1.Time
		suspend  bool
		now      time.Duration // after start
		left     time.Duration
		applies  bool
	}{
		{name: "no deadline", start: &start, now: time.Hour},
		{name: "not started", deadline: ptr.To[int64](60), now: time.Hour},
		{name: "suspended", deadline: ptr.To[int64](60), start: &start, suspend: true, now: time.Hour},
		{name: "before", deadline: ptr.To[int64](60), start: &start, now: 45 * time.Second, left: 15 * time.Second, applies: true},
		{name: "at", deadline: ptr.To[int64](60), start: &start, now: time.Minute, left: 0, applies: true},
		{name: "after", deadline: ptr.To[int64](60), start: &start, now: 2 * time.Minute, left: -time.Minute, applies: true},
	} {
		run := &v1alpha1.ProcessingRun{Spec: v1alpha1.ProcessingRunSpec{ActiveDeadlineSeconds: tt.deadline, Suspend: tt.suspend}}
		left, applies := deadlineLeft(run, tt.start, start.Add(tt.now))
		require.Equal(t, tt.applies, applies, tt.name)
		require.Equal(t, tt.left, left, tt.name)
	}
}

func TestStartProblemOf(t *testing.T) {
	t.Parallel()
	run := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Namespace: "billing"},
		Spec: v1alpha1.ProcessingRunSpec{Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}}}}
	for _, tt := range []struct{ what, reason, message string }{
		{`pod r-0-0: CreateContainerConfigError: secret "db" not found`, ReasonSecretNotFound,
			`Secret "db" not found in namespace "billing": create it with the key "dsn" holding the ledger's PostgreSQL connection string (pod r-0-0: CreateContainerConfigError: secret "db" not found)`},
		{`pod r-0-0: CreateContainerConfigError: couldn't find key dsn in Secret billing/db`, ReasonSecretKeyNotFound,
			`Secret "db" in namespace "billing" has no key "dsn": add the ledger's PostgreSQL connection string under that key (pod r-0-0: CreateContainerConfigError: couldn't find key dsn in Secret billing/db)`},
		// Another Secret, another key, another reason: the kubelet's words.
		{`pod r-0-0: CreateContainerConfigError: secret "other" not found`, ReasonWorkerNotStarting, `pod r-0-0: CreateContainerConfigError: secret "other" not found`},
		{`pod r-0-0: CreateContainerConfigError: couldn't find key url in Secret billing/db`, ReasonWorkerNotStarting, `pod r-0-0: CreateContainerConfigError: couldn't find key url in Secret billing/db`},
		{`pod r-0-0: ErrImagePull: secret "db" not found`, ReasonWorkerNotStarting, `pod r-0-0: ErrImagePull: secret "db" not found`},
	} {
		p := startProblemOf(run, tt.what)
		require.Equal(t, tt.reason, p.reason, tt.what)
		require.Equal(t, tt.message, p.message, tt.what)
	}
}

// TestBuildStatusShardCountsNeverGoDown: while a new attempt catches up, its
// reports are below what the previous attempt reached; the shard's entry
// shows, per field, the most any attempt reported (the decision's counts, as
// the run's totals do), with the new attempt's message and report time. Once
// finished it shows the final report's exact numbers.
func TestBuildStatusShardCountsNeverGoDown(t *testing.T) {
	run := testRun()
	run.Spec.Workers = 1
	reached := v1alpha1.ItemCounts{Total: 9, Completed: 5, Failed: 1}
	t1, t2 := metav1.NewTime(t0), metav1.NewTime(t0.Add(time.Minute))
	run.Status.ItemCounts = reached
	run.Status.Shards = []v1alpha1.ShardStatus{{Index: 0, Attempt: 0, ItemCounts: reached, Message: "processing", LastReportTime: &t1}}
	catchingUp := &v1alpha1.ShardStatus{Index: 0, Attempt: 1, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 2}, Message: "attempt 1", LastReportTime: &t2}
	d := shard(0, v1alpha1.ShardRunning, reached) // the floor: decidePods' counts
	st := buildStatus(run, statusInput{shards: []shardDecision{d}, entries: map[int32]*v1alpha1.ShardStatus{0: catchingUp},
		outcome: decideRun(run, []shardDecision{d}, true), startTime: &t1, now: t0})
	require.Equal(t, reached, st.ItemCounts)
	require.Equal(t, reached, st.Shards[0].ItemCounts, "the shard's counts do not go down")
	require.Equal(t, int32(1), st.Shards[0].Attempt)
	require.Equal(t, "attempt 1", st.Shards[0].Message)
	require.Equal(t, &t2, st.Shards[0].LastReportTime)

	final := v1alpha1.ItemCounts{Total: 9, Completed: 9}
	d = shardDecision{index: 0, phase: v1alpha1.ShardSucceeded, final: true, counts: final,
		report: &v1alpha1.ShardReport{Shard: 0, Attempt: 1, ItemCounts: final, Message: "done"}}
	st = buildStatus(run, statusInput{shards: []shardDecision{d}, outcome: decideRun(run, []shardDecision{d}, true), now: t0})
	require.Equal(t, final, st.Shards[0].ItemCounts, "finished: the final report's exact numbers (failed went down)")
	require.Equal(t, final, st.ItemCounts)
}

// The run's duration is the difference of the two times the status shows
// (they are stored to the second), and a later pass, starting from the
// stored status, writes the same duration: a run that started at .9s and
// finished 0.3s later, across a second boundary, shows 1s, never 0s then 1s.
func TestBuildStatusDurationIsWhatTheTimesShow(t *testing.T) {
	run := testRun()
	run.Spec.Workers = 1
	start := t0.Truncate(time.Second).Add(900 * time.Millisecond)
	d := shardDecision{index: 0, phase: v1alpha1.ShardSucceeded, final: true, counts: v1alpha1.ItemCounts{Total: 1, Completed: 1}}
	in := statusInput{shards: []shardDecision{d}, outcome: decideRun(run, []shardDecision{d}, true),
		startTime: &metav1.Time{Time: start}, now: start.Add(300 * time.Millisecond)}
	st := buildStatus(run, in)

	stored := roundTrip(t, run)
	stored.Status = st
	stored = roundTrip(t, stored)
	shown := stored.Status.CompletionTime.Sub(stored.Status.StartTime.Time)
	require.Equal(t, time.Second, shown)
	require.Equal(t, shown, st.Duration.Duration, "the duration is what completionTime - startTime shows")
	require.True(t, st.StartTime.Equal(stored.Status.StartTime), "the start time written is the one stored")
	require.True(t, st.CompletionTime.Equal(stored.Status.CompletionTime), "the completion time written is the one stored")

	in.startTime, in.now = stored.Status.StartTime, in.now.Add(time.Minute)
	again := buildStatus(stored, in)
	require.Equal(t, st.Duration, again.Duration, "a later pass writes the same duration")
	require.True(t, st.CompletionTime.Equal(again.CompletionTime))
}

func roundTrip(t *testing.T, run *v1alpha1.ProcessingRun) *v1alpha1.ProcessingRun {
	t.Helper()
	b, err := json.Marshal(run)
	require.NoError(t, err)
	out := &v1alpha1.ProcessingRun{}
	require.NoError(t, json.Unmarshal(b, out))
	return out
}

// TestRefusedConnectionsCondition: while a live shard's worker reports that
// the database refuses it connections (53300), the run's Ready and
// Reconciling conditions say so (reason DatabaseRefusingConnections) with
// the shard and the worker's message; once it runs again, the reason goes.
func TestRefusedConnectionsCondition(t *testing.T) {
	run := testRun()
	run.Spec.Workers = 2
	waiting := v1alpha1.DatabaseRefusingMessage + ": the database refuses new connections (too many connections, SQLSTATE 53300); retrying"
	d0, d1 := shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{}), shard(1, v1alpha1.ShardRunning, v1alpha1.ItemCounts{})
	d0.live, d1.live = 1, 1
	shards := []shardDecision{d0, d1}
	entries := map[int32]*v1alpha1.ShardStatus{1: {Index: 1, Message: waiting}}
	st := buildStatus(run, statusInput{shards: shards, entries: entries, outcome: decideRun(run, shards, true), startTime: &metav1.Time{Time: t0}, now: t0})
	requireCond(t, st, v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonDatabaseRefusingConnections)
	requireCond(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonDatabaseRefusingConnections)
	require.Contains(t, cond(t, st, v1alpha1.ConditionReconciling).Message, "shard 1: "+waiting)

	entries[1] = &v1alpha1.ShardStatus{Index: 1, Message: "processing: 10 of 20 items"}
	st = buildStatus(run, statusInput{shards: shards, entries: entries, outcome: decideRun(run, shards, true), startTime: &metav1.Time{Time: t0}, now: t0})
	requireCond(t, st, v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonRunning)
}

// TestBuildStatusPayloadChanged: the shards' payloadChanged counts add up
// into the run's, each shard's entry and the status the controller applies
// carry them, and the finished run's message says how many.
func TestBuildStatusPayloadChanged(t *testing.T) {
	run := testRun()
	run.Spec.Workers = 2
	var shards []shardDecision
	for i, c := range []v1alpha1.ItemCounts{{Total: 5, AlreadyHandled: 5, PayloadChanged: 2}, {Total: 4, Completed: 1, AlreadyHandled: 3, PayloadChanged: 1}} {
		shards = append(shards, shardDecision{index: int32(i), phase: v1alpha1.ShardSucceeded, final: true, counts: c,
			report: &v1alpha1.ShardReport{Shard: int32(i), ItemCounts: c, Message: "done"}})
	}
	o := decideRun(run, shards, true)
	require.Equal(t, v1alpha1.RunSucceeded, o.phase)
	require.Equal(t, "9 items: 1 completed, 8 already handled, 0 failed (3 with a payload that differs from the committed row's)", o.message)
	st := buildStatus(run, statusInput{shards: shards, outcome: o, now: t0})
	require.Equal(t, int64(3), st.PayloadChanged)
	require.Equal(t, int64(2), st.Shards[0].PayloadChanged)
	ac, err := runStatusApply(run, &st)
	require.NoError(t, err)
	require.Equal(t, int64(3), *ac.Status.PayloadChanged)
	require.Equal(t, int64(1), *ac.Status.Shards[1].PayloadChanged)
}

// TestReplicationCondition: what the workers read of the ledger's server
// becomes the run's SynchronousReplication condition, True (reason
// SynchronousStandby) or False (AsynchronousReplication), with a message
// naming the settings and, when asynchronous, what a failover costs; a pass
// without such a report keeps the condition as it was, and a finished run's
// conditions stay as they are.
func TestReplicationCondition(t *testing.T) {
	run := testRun()
	d := shard(0, v1alpha1.ShardRunning, v1alpha1.ItemCounts{})
	d.live = 1
	shards := []shardDecision{d}
	pass := func(r *v1alpha1.LedgerReplication) v1alpha1.ProcessingRunStatus {
		return buildStatus(run, statusInput{shards: shards, outcome: decideRun(run, shards, true), startTime: &metav1.Time{Time: t0}, now: t0, replication: r})
	}
	st := pass(nil)
	require.Nil(t, cond(t, st, v1alpha1.ConditionSynchronousReplication), "absent until a worker says")

	st = pass(&v1alpha1.LedgerReplication{SynchronousCommit: "on"})
	requireCond(t, st, v1alpha1.ConditionSynchronousReplication, metav1.ConditionFalse, ReasonAsynchronousReplication)
	msg := cond(t, st, v1alpha1.ConditionSynchronousReplication).Message
	require.Contains(t, msg, "synchronous_commit=on, synchronous_standby_names=''")
	require.Contains(t, msg, "a failover can lose the latest commits")
	require.Contains(t, msg, "the counts are proven from the ledger")
	require.Contains(t, msg, "a processor may get it again with the same idempotency key")
	run.Status = st

	st = pass(nil)
	requireCond(t, st, v1alpha1.ConditionSynchronousReplication, metav1.ConditionFalse, ReasonAsynchronousReplication)

	st = pass(&v1alpha1.LedgerReplication{Synchronous: true, Standby: "flushed", SynchronousCommit: "on", SynchronousStandbyNames: "ANY 1 (a, b)"})
	requireCond(t, st, v1alpha1.ConditionSynchronousReplication, metav1.ConditionTrue, ReasonSynchronousStandby)
	require.Equal(t, "the ledger's server acknowledges a commit only once a synchronous standby has flushed it to disk "+
		"(synchronous_commit=on, synchronous_standby_names='ANY 1 (a, b)'): a failover to that standby keeps every acknowledged commit",
		cond(t, st, v1alpha1.ConditionSynchronousReplication).Message)

	// Finished: sticky, whatever a late report says.
	done := shard(0, v1alpha1.ShardSucceeded, v1alpha1.ItemCounts{Total: 1, Completed: 1})
	done.report = &v1alpha1.ShardReport{ItemCounts: done.counts}
	run.Status = buildStatus(run, statusInput{shards: []shardDecision{done}, outcome: decideRun(run, []shardDecision{done}, true), now: t0,
		replication: &v1alpha1.LedgerReplication{SynchronousCommit: "local"}})
	requireCond(t, run.Status, v1alpha1.ConditionComplete, metav1.ConditionTrue, ReasonSucceeded)
	requireCond(t, run.Status, v1alpha1.ConditionSynchronousReplication, metav1.ConditionFalse, ReasonAsynchronousReplication)
	st = buildStatus(run, statusInput{shards: []shardDecision{done}, outcome: decideRun(run, []shardDecision{done}, true), now: t0,
		replication: &v1alpha1.LedgerReplication{Synchronous: true, Standby: "flushed", SynchronousCommit: "on", SynchronousStandbyNames: "a"}})
	requireCond(t, st, v1alpha1.ConditionSynchronousReplication, metav1.ConditionFalse, ReasonAsynchronousReplication)
}

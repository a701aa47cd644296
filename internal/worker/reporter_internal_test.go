package worker

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

func TestDecideReport(t *testing.T) {
	t.Parallel()
	const runInterval, fallback = 4 * time.Second, 32 * time.Second
	tests := []struct {
		name string
		turn reportTurn
		want reportAction
	}{
		{"the only live shard reports the run", reportTurn{shard: 3, published: true, lowestOther: -1, sinceRun: never, sincePublishing: time.Minute}, writeRun},
		{"the lowest live shard reports the run", reportTurn{shard: 1, published: true, lowestOther: 2, sinceRun: never, sincePublishing: time.Minute}, writeRun},
		{"not within the run interval", reportTurn{shard: 1, published: true, lowestOther: 2, sinceRun: 3 * time.Second, sincePublishing: time.Minute}, writeNothing},
		{"after it", reportTurn{shard: 1, published: true, lowestOther: 2, sinceRun: 4 * time.Second, sincePublishing: time.Minute}, writeRun},
		{"shard 0 reports at once", reportTurn{shard: 0, published: true, lowestOther: 1, sinceRun: never, sincePublishing: 0}, writeRun},
		{"another shard waits for the lower ones to show up", reportTurn{shard: 3, published: true, lowestOther: -1, sinceRun: never, sincePublishing: 3 * time.Second}, writeNothing},
		{"and reports once none did", reportTurn{shard: 3, published: true, lowestOther: -1, sinceRun: never, sincePublishing: 4 * time.Second}, writeRun},
		{"a lower live shard reports: nothing on this pod", reportTurn{shard: 5, published: true, lowestOther: 0, pending: true, sinceRun: never, sinceOwn: never}, writeNothing},
		{"off the board: its own shard, at once the first time", reportTurn{shard: 5, published: false, lowestOther: -1, pending: true, sinceOwn: never, sinceRun: never}, writeOwnShard},
		{"off the board: not within the fallback interval", reportTurn{shard: 5, pending: true, sinceOwn: 31 * time.Second}, writeNothing},
		{"off the board: after it", reportTurn{shard: 5, pending: true, sinceOwn: 32 * time.Second}, writeOwnShard},
		{"off the board, nothing new", reportTurn{shard: 5, pending: false, sinceOwn: never}, writeNothing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, decideReport(tt.turn, runInterval, fallback))
		})
	}
}

func TestFallbackInterval(t *testing.T) {
	t.Parallel()
	// A run's fallback reports add up to at most one pod write per 2 s.
	for _, shards := range []int{0, 1, 16, 256} {
		env := PodEnv{Shards: shards}
		r := NewStatusReporter(nil, env, 0, logr.Discard())
		require.Equal(t, time.Duration(max(shards, 1))*2*time.Second, r.fallback, "%d shards", shards)
		require.Equal(t, 4*time.Second, r.runInterval)
	}
	// A shorter publishing interval (tests) scales them.
	r := NewStatusReporter(nil, PodEnv{Shards: 16}, 500*time.Millisecond, logr.Discard())
	require.Equal(t, 8*time.Second, r.fallback)
	require.Equal(t, time.Second, r.runInterval)
}

func TestRunReport(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 10, 500_000_000, time.UTC)
	long := make([]byte, 600)
	for i := range long {
		long[i] = 'x'
	}
	rows := []ledger.ShardProgress{
		{Shard: 0, Attempt: 1, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 4}, Message: "processing: 4 of 9 items", Age: 2 * time.Second},
		{Shard: 1, Attempt: 0, ItemCounts: v1alpha1.ItemCounts{Total: 8, Failed: 8}, Message: string(long), Done: true},
	}
	got := runReport(0, rows, now)
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: now.Add(-d).Truncate(time.Second)} }
	require.Equal(t, v1alpha1.RunReport{Reporter: 0, ReportTime: at(0), Shards: []v1alpha1.ShardReport{
		{Shard: 0, Attempt: 1, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 4}, Message: "processing: 4 of 9 items", ReportTime: at(2 * time.Second)},
		{Shard: 1, Attempt: 0, ItemCounts: v1alpha1.ItemCounts{Total: 8, Failed: 8}, Message: v1alpha1.Truncate(string(long), v1alpha1.MaxRunReportMessageBytes), ReportTime: at(0)},
	}}, got)
	require.LessOrEqual(t, len(got.Shards[1].Message), v1alpha1.MaxRunReportMessageBytes)

	// Report times aside, the same progress is no reason to write.
	later := runReport(0, rows, now.Add(time.Minute))
	require.True(t, sameProgress(got.Shards, later.Shards))
	rows[0].Completed++
	require.False(t, sameProgress(got.Shards, runReport(0, rows, now).Shards))
	require.False(t, sameProgress(got.Shards, got.Shards[:1]))
	require.False(t, sameProgress(nil, got.Shards))
}

// TestRunReportFitsAnnotations: 256 shards' entries, every message at its
// bound, stay within the API server's 256 KiB of annotations per object.
func TestRunReportFitsAnnotations(t *testing.T) {
	t.Parallel()
	long := make([]byte, 4096)
	for i := range long {
		long[i] = 'é' & 0x7f
	}
	rows := make([]ledger.ShardProgress, v1alpha1.MaxWorkers)
	for i := range rows {
		rows[i] = ledger.ShardProgress{Shard: i, Attempt: 1 << 20, Message: string(long),
			ItemCounts: v1alpha1.ItemCounts{Total: 1 << 62, Completed: 1 << 62, AlreadyHandled: 1 << 62, Failed: 1 << 62, PayloadChanged: 1 << 62}}
	}
	body, err := progressPatch("00000000-0000-0000-0000-000000000000", runReport(0, rows, time.Now()))
	require.NoError(t, err)
	require.Less(t, len(body), 200<<10, "a run report of %d shards", v1alpha1.MaxWorkers)
}

// TestReportsSayReplication: once the worker read what the ledger's server
// promises of a commit, its shard's reports and its termination message
// say it, for the controller's SynchronousReplication condition.
func TestReportsSayReplication(t *testing.T) {
	env := PodEnv{Shard: 1, Shards: 2}
	r := NewStatusReporter(nil, env, 0, logr.Discard())
	require.Nil(t, r.report(Report{Shard: 1}, "").Replication, "not read yet")
	rep := Replication(ledger.Durability{SynchronousCommit: "on", SynchronousStandbyNames: "a", MaxWALSenders: 10})
	require.Equal(t, &v1alpha1.LedgerReplication{Synchronous: true, Standby: "flushed", SynchronousCommit: "on", SynchronousStandbyNames: "a"}, rep)
	r.SetReplication(rep)
	require.Equal(t, rep, r.report(Report{Shard: 1}, "").Replication)

	path := filepath.Join(t.TempDir(), "termination-log")
	require.NoError(t, WriteTerminationMessage(path, env, Report{Shard: 1, Replication: rep, ServerChanges: 2, Reproven: 1, Reprocessed: 40}, "done"))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	got, err := v1alpha1.ParseShardReport(string(b))
	require.NoError(t, err)
	require.Equal(t, rep, got.Replication)
	// And what the controller's LedgerServerChanged Event says.
	require.Equal(t, [3]int64{2, 1, 40}, [3]int64{int64(got.ServerChanges), int64(got.Reproven), got.Reprocessed})
}

// TestOnStandby: what a proven shard says of the ledger's standbys, from
// what ledger.AwaitStandby read, and the run's word is its weakest shard's.
func TestOnStandby(t *testing.T) {
	readErr := errors.New("conn closed")
	for _, tc := range []struct {
		st   ledger.Standbys
		err  error
		want string
	}{
		{ledger.Standbys{Position: "0/1"}, nil, ""},
		{ledger.Standbys{Position: "0/1", Streaming: 2, Flushed: 1}, nil, OnStandbyConfirmed},
		{ledger.Standbys{Position: "0/1", Streaming: 1}, nil, OnStandbyNotConfirmed},
		{ledger.Standbys{Position: "0/1", Streaming: 2, Hidden: 1}, nil, OnStandbyNotConfirmed},
		{ledger.Standbys{Position: "0/1", Streaming: 1, Hidden: 1}, nil, OnStandbyUnknown},
		// A standby the server keeps a slot for, not connected now: its
		// position is the slot's, which any login reads.
		{ledger.Standbys{Position: "0/1", Disconnected: 1}, nil, OnStandbyNotConfirmed},
		{ledger.Standbys{Position: "0/1", Disconnected: 1, Flushed: 1}, nil, OnStandbyConfirmed},
		{ledger.Standbys{Position: "0/1", Streaming: 1, Hidden: 1, Disconnected: 1}, nil, OnStandbyNotConfirmed},
		{ledger.Standbys{}, readErr, OnStandbyUnknown},
		{ledger.Standbys{Position: "0/1", Streaming: 1}, readErr, OnStandbyUnknown},
		{ledger.Standbys{Position: "0/1"}, readErr, OnStandbyUnknown},
	} {
		require.Equal(t, tc.want, onStandby(tc.st, tc.err), "%+v %v", tc.st, tc.err)
	}
	all := []string{"", OnStandbyConfirmed, OnStandbyUnknown, OnStandbyNotConfirmed}
	for i, a := range all {
		for j, b := range all {
			require.Equal(t, all[max(i, j)], weakerOnStandby(a, b), "%q %q", a, b)
		}
	}
}

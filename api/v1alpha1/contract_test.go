package v1alpha1

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNames(t *testing.T) {
	if got := WorkerFieldManager(7); got != "runledger-worker-7" {
		t.Fatalf("WorkerFieldManager(7) = %q", got)
	}
	if got := PodName("invoices", 3, 12); got != "invoices-3-12" {
		t.Fatalf("PodName = %q", got)
	}
}

func TestShardReportRoundTrip(t *testing.T) {
	r := ShardReport{Shard: 2, Attempt: 1, ItemCounts: ItemCounts{Total: 10, Completed: 7, AlreadyHandled: 2, Failed: 1, PayloadChanged: 1}, Message: "item a/1: boom",
		Failures: []FailureSample{{Entity: "a", Occurrence: "1", Class: "23503", Error: "boom"}}}
	b, err := r.TerminationMessage()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseShardReport(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip: %+v != %+v", got, r)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"shard", "attempt", "total", "completed", "alreadyHandled", "failed", "payloadChanged", "message", "failures"} {
		if _, ok := m[k]; !ok {
			t.Errorf("field %q missing from %s", k, b)
		}
	}
}

func TestTerminationMessageFitsTheKubeletLimit(t *testing.T) {
	for _, msg := range []string{
		strings.Repeat("x", 10000),
		strings.Repeat("é", 5000),      // multi-byte: cut on a rune boundary
		strings.Repeat("\"\x01", 3000), // escaping makes the JSON longer than the text
	} {
		b, err := ShardReport{Shard: 1, ItemCounts: ItemCounts{Completed: 5}, Message: msg}.TerminationMessage()
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > MaxTerminationMessageBytes {
			t.Fatalf("%d bytes", len(b))
		}
		r, err := ParseShardReport(string(b))
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed != 5 || !strings.HasSuffix(r.Message, "…") {
			t.Fatalf("report %+v", r)
		}
	}
}

// TestFailureSampleIsBounded: a report's failures, however many and long
// (escaping included), fit the termination message with the counts: the
// latest go first, then the message is cut; parsed, they are within the
// status' bounds whatever the worker sent.
func TestFailureSampleIsBounded(t *testing.T) {
	long := strings.Repeat("\"\x01é", 2000)
	var many []FailureSample
	for range 10 {
		many = append(many, FailureSample{Entity: long, Occurrence: long, Class: long, Error: long})
	}
	bounded := BoundFailures(many)
	if len(bounded) != MaxShardFailures {
		t.Fatalf("%d failures kept", len(bounded))
	}
	for _, f := range bounded {
		if len(f.Entity) > MaxFailureSampleBytes || len(f.Occurrence) > MaxFailureSampleBytes || len(f.Error) > MaxFailureSampleBytes ||
			len(f.Class) > MaxFailureClassBytes || !strings.HasSuffix(f.Error, "…") {
			t.Fatalf("not bounded: %+v", f)
		}
	}
	b, err := ShardReport{Shard: 1, ItemCounts: ItemCounts{Failed: 10}, Message: long, Failures: bounded}.TerminationMessage()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxTerminationMessageBytes {
		t.Fatalf("%d bytes", len(b))
	}
	r, err := ParseShardReport(string(b))
	if err != nil || r.Failed != 10 {
		t.Fatalf("report %+v: %v", r, err)
	}
	unbounded, err := json.Marshal(ShardReport{Shard: 1, Failures: many})
	if err != nil {
		t.Fatal(err)
	}
	r, err = ParseShardReport(string(unbounded))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r.Failures, bounded) {
		t.Fatalf("parsed failures not bounded: %d", len(r.Failures))
	}
}

func TestParseShardReportRejectsOtherText(t *testing.T) {
	for _, msg := range []string{
		"",
		"panic: runtime error\ngoroutine 1 [running]:",
		`{"shard": 1, "completed": -1}`,
		`{"shard": 1, "unknown": true}`,
		`{"shard": 1} {"shard": 2}`,
		// Issue #20.5: a report is read as written, or not at all.
		`{"shard": 1, "completed": 5, "completed": 500}`,
		`{"shard": 1, "Completed": 500, "completed": 5}`,
		`{"shard": 1, "message": "a\ud800"}`,
		"{\"shard\": 1, \"message\": \"a\xff\"}",
	} {
		if _, err := ParseShardReport(msg); err == nil {
			t.Errorf("%q parsed", msg)
		}
	}
}

func TestTruncate(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdefghij", 8, "abcde…"},
		{"héllo wörld", 5, "h…"}, // "é" is two bytes: cut before it, not inside
		{"ééé", 4, "…"},          // no whole rune fits beside the mark
		{"abcdef", 2, "…"},       // the mark alone when n is below its size
		{"abcdef", 0, "…"},
	} {
		got := Truncate(c.s, c.n)
		if got != c.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
		if len(c.s) > c.n && c.n >= len("…") && len(got) > c.n {
			t.Errorf("Truncate(%q, %d) = %q: longer than %d bytes", c.s, c.n, got, c.n)
		}
	}
}

// TestRunFile: the run's file carries the run's kind, identity and spec and
// nothing else (no status, labels or annotations), decodes to what was
// encoded, and anything else (not gzip, not a run, too large) is an error.
func TestRunFile(t *testing.T) {
	run := &ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: "invoices", Namespace: "billing", UID: "uid-1", Generation: 3,
			Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"x": "y"}},
		Spec: ProcessingRunSpec{Workers: 4, Database: DatabaseSpec{SecretRef: SecretKeyRef{Name: "db", Key: "dsn"}},
			Batch: BatchSpec{Items: []Item{{Entity: "acct-1", Occurrence: "2026-01"}}}},
		Status: ProcessingRunStatus{Phase: RunRunning},
	}
	b, err := EncodeRunFile(run)
	require.NoError(t, err)
	again, err := EncodeRunFile(run.DeepCopy())
	require.NoError(t, err)
	require.Equal(t, b, again, "deterministic")

	got, err := DecodeRunFile(b)
	require.NoError(t, err)
	require.Equal(t, run.Spec, got.Spec)
	require.Equal(t, "invoices", got.Name)
	require.Equal(t, "billing", got.Namespace)
	require.EqualValues(t, "uid-1", got.UID)
	require.Zero(t, got.Generation)
	require.Empty(t, got.Labels)
	require.Empty(t, got.Annotations)
	require.Empty(t, got.Status.Phase)

	gz := func(s string) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, err := zw.Write([]byte(s))
		require.NoError(t, err)
		require.NoError(t, zw.Close())
		return buf.Bytes()
	}
	for name, tc := range map[string]struct {
		in   []byte
		want string
	}{
		"not gzip":       {[]byte(`{"kind":"ProcessingRun"}`), "reading the run's file: gzip: invalid header"},
		"not JSON":       {gz("kind: ProcessingRun"), "reading the run's file: invalid character"},
		"another kind":   {gz(`{"apiVersion":"v1","kind":"ConfigMap"}`), "it holds v1 ConfigMap, not a processing.runledger.dev/v1alpha1 ProcessingRun"},
		"truncated gzip": {b[:len(b)/2], "reading the run's file: unexpected EOF"},
		"too large":      {gz(`{"spec":"` + strings.Repeat("x", MaxRunFileBytes) + `"}`), "more than 16777216 bytes"},
	} {
		_, err := DecodeRunFile(tc.in)
		require.ErrorContains(t, err, tc.want, name)
	}
}

// TestReportsCarryReplication: a worker's report says what the ledger's
// server promises of a commit, and the controller reads it back from a
// termination message, a progress annotation and a RunReport; the
// termination message stays within the kubelet's bound with the longest
// standby names a report carries.
func TestReportsCarryReplication(t *testing.T) {
	rep := &LedgerReplication{Synchronous: true, Standby: "flushed", SynchronousCommit: "on",
		SynchronousStandbyNames: strings.Repeat("s", MaxStandbyNamesBytes)}
	r := ShardReport{Shard: 1, Attempt: 2, ItemCounts: ItemCounts{Total: 3}, Message: strings.Repeat("m", 5000), Replication: rep}
	b, err := r.TerminationMessage()
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), MaxTerminationMessageBytes)
	got, err := ParseShardReport(string(b))
	require.NoError(t, err)
	require.Equal(t, rep, got.Replication)

	run, err := json.Marshal(RunReport{Reporter: 0, Shards: []ShardReport{{Shard: 0}}, Replication: rep})
	require.NoError(t, err)
	_, rr, err := ParseProgress(string(run))
	require.NoError(t, err)
	require.Equal(t, rep, rr.Replication)

	// Without it (a worker of an earlier release): no replication.
	got, err = ParseShardReport(`{"shard":0,"attempt":0,"total":1,"completed":1,"alreadyHandled":0,"failed":0}`)
	require.NoError(t, err)
	require.Nil(t, got.Replication)
}

// TestReplicationMessage: the message says in words what a failover costs
// at each level, with the settings it read.
func TestReplicationMessage(t *testing.T) {
	for _, tc := range []struct {
		r    LedgerReplication
		want []string
	}{
		{LedgerReplication{Synchronous: true, Standby: "applied", SynchronousCommit: "remote_apply", SynchronousStandbyNames: "a"},
			[]string{"has flushed it to disk and applied it", "synchronous_commit=remote_apply, synchronous_standby_names='a'", "keeps every acknowledged commit"}},
		{LedgerReplication{Synchronous: true, Standby: "written", SynchronousCommit: "remote_write", SynchronousStandbyNames: "a"},
			[]string{"has written it, not yet flushed it to disk", "unless the standby's operating system crashes too"}},
		{LedgerReplication{SynchronousCommit: "local", SynchronousStandbyNames: "a"},
			[]string{"before any standby has it", "a failover can lose the latest commits", "same idempotency key"}},
		{LedgerReplication{SynchronousCommit: "off"},
			[]string{"before it is flushed to disk, even its own", "a crash or a failover can lose the latest commits"}},
		{LedgerReplication{SynchronousCommit: "on", InRecovery: true},
			[]string{"was a standby in recovery"}},
	} {
		for _, w := range tc.want {
			require.Contains(t, tc.r.Message(), w)
		}
	}
}

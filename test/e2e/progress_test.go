//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// progressSample is the run's completed count and, read right after, the
// ledger's committed rows of the run.
type progressSample struct {
	at                   time.Time
	completed, committed int64
}

// TestProgressArrives: while a 4-shard run runs (1 s per chunk), its counts
// arrive in the status and are never ahead of the ledger, nor more than
// 15 s behind it (the target is about 10 s; the slack is the busy
// machine's); one pod of the run carries every shard's progress (a
// RunReport) while the others' pods carry no report until their final one;
// at the end the counts are exact.
func TestProgressArrives(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "progress", 1.0)
	run := f.createRun("progress", runSpec{workers: 4, chunk: 50, batch: queryBatch(1, 2000, 0)})

	var samples []progressSample
	sawRunReport, sawPartial := false, false
	for deadline := time.Now().Add(runTimeout); ; time.Sleep(500 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the run did not finish")
		r := f.get(run.Name)
		if r.Status.Phase == v1alpha1.RunSucceeded || r.Status.Phase == v1alpha1.RunFailed {
			break
		}
		if !f.ledgerExists() {
			continue
		}
		s := progressSample{at: time.Now(), completed: r.Status.Completed, committed: f.committedRows(string(r.UID))}
		require.LessOrEqual(t, s.completed, s.committed, "the status is never ahead of the ledger")
		samples = append(samples, s)
		sawPartial = sawPartial || (s.completed > 0 && s.completed < 2000)
		sawRunReport = f.checkReports(r) || sawRunReport
	}
	require.True(t, sawPartial, "counts arrived while the run ran: %+v", samples)
	require.True(t, sawRunReport, "one pod carried every shard's progress")

	// Behind: each count the status showed, the ledger had held for at most
	// 15 s (the latest ledger sample at least 15 s before it is covered).
	var worst time.Duration
	for i, s := range samples {
		for j := i; j >= 0; j-- {
			if s.at.Sub(samples[j].at) >= 15*time.Second {
				require.GreaterOrEqual(t, s.completed, samples[j].committed,
					"at %s the status showed %d completed; the ledger had %d 15 s before", s.at.Format(time.TimeOnly), s.completed, samples[j].committed)
				break
			}
		}
		// How long ago the ledger first held what the status shows.
		for j := 0; j <= i; j++ {
			if samples[j].committed >= s.completed {
				worst = max(worst, s.at.Sub(samples[j].at))
				break
			}
		}
	}
	t.Logf("%d samples; the status was at most about %s behind the ledger", len(samples), worst.Round(100*time.Millisecond))

	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: 2000, Completed: 2000}, countsOf(run), "exact at the end")
	f.requireShardsAddUp(run)
	require.EqualValues(t, 2000, f.committedRows(string(run.UID)))
	f.requireExactlyOnce(2000)
}

// checkReports looks at the run's pods: a pod whose worker runs carries a
// RunReport or nothing (its own shard's report only once it finished, or
// when it could not publish, which this test's database never refuses). It
// reports whether a RunReport of every shard was among them.
func (f *fixture) checkReports(run *v1alpha1.ProcessingRun) bool {
	f.t.Helper()
	whole := false
	for _, p := range f.runPods(run) {
		v, ok := p.Annotations[v1alpha1.AnnotationProgress]
		if !ok {
			continue
		}
		shard, rr, err := v1alpha1.ParseProgress(v)
		require.NoError(f.t, err, "pod %s's progress annotation", p.Name)
		if rr != nil {
			whole = whole || len(rr.Shards) == 4
			continue
		}
		if p.Status.Phase == corev1.PodRunning && shard.Message != "done" {
			// A running worker's own report: its final one, just written
			// before it exits, or none at all.
			f.t.Logf("pod %s is running with its own shard's report: %q", p.Name, shard.Message)
		}
	}
	return whole
}

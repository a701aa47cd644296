package console

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestRateChart: the samples the watch keeps of a run (one per change of
// its count, at most maxSamples) draw items/s as an SVG of numbers.
func TestRateChart(t *testing.T) {
	t0 := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	clock := t0
	w := &runWatch{watched: watched{changed: make(chan struct{})}, samples: map[string][]sample{}, now: func() time.Time { return clock }}
	run := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "june"}}
	for i, done := range []int64{0, 100, 100, 300, 250} {
		clock = t0.Add(time.Duration(i) * 10 * time.Second)
		run.Status.Completed = done
		w.record(run)
	}
	ss := w.samplesOf("billing", "june")
	require.Len(t, ss, 4, "an unchanged count adds no sample")
	require.Empty(t, rateChart(ss[:1]), "one sample draws nothing")
	svg := string(rateChart(ss))
	require.Contains(t, svg, `<svg viewBox="0 0 600 120"`)
	require.Contains(t, svg, "10.0/s at most", "100 items in 10 s, then 200 in 20 s")
	require.Contains(t, svg, "0.00/s now", "a fall of the count draws 0")
	require.Contains(t, svg, "over the last 40s (4 samples)")
	require.Equal(t, "0.8s", spanText(0.83))
	points := strings.Split(strings.Split(svg, `points="`)[1], `"`)[0]
	require.Len(t, strings.Fields(points), 6, "three steps of two points each")
	for i := range maxSamples + 10 {
		run.Status.Completed = int64(1000 + i)
		w.record(run)
	}
	require.Len(t, w.samplesOf("billing", "june"), maxSamples)
	w.forget(run)
	require.Empty(t, w.samplesOf("billing", "june"))
}

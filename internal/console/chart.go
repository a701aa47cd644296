package console

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/runledger/runledger/api/v1alpha1"
)

// maxSamples bounds the progress samples the console keeps of a run (the
// latest: a run's chart covers what the console saw of it, in memory only).
const maxSamples = 240

// sample is a run's processed items (completed, already handled and
// failed) when its status said so.
type sample struct {
	at        time.Time
	processed int64
}

// record keeps a sample of run's progress, when it moved.
func (w *runWatch) record(obj any) {
	run, ok := obj.(*v1alpha1.ProcessingRun)
	if !ok {
		return
	}
	key := run.Namespace + "/" + run.Name
	p := run.Status.Processed()
	now := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	ss := w.samples[key]
	if n := len(ss); n > 0 && ss[n-1].processed == p {
		return
	}
	ss = append(ss, sample{at: now, processed: p})
	if len(ss) > maxSamples {
		ss = ss[len(ss)-maxSamples:]
	}
	w.samples[key] = ss
}

// forget drops a deleted run's samples.
func (w *runWatch) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	run, ok := obj.(*v1alpha1.ProcessingRun)
	if !ok {
		return
	}
	w.mu.Lock()
	delete(w.samples, run.Namespace+"/"+run.Name)
	w.mu.Unlock()
}

// samplesOf are run ns/name's samples, oldest first.
func (w *runWatch) samplesOf(ns, name string) []sample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]sample(nil), w.samples[ns+"/"+name]...)
}

// The chart's size, in SVG user units.
const (
	chartW, chartH = 600.0, 120.0
	chartPad       = 4.0
)

// rateChart draws items/s between consecutive samples as an inline SVG
// step line (a fall of the count, a status reset, counts 0); "" with
// fewer than two samples. Only numbers reach the markup.
func rateChart(ss []sample) template.HTML {
	if len(ss) < 2 {
		return ""
	}
	span := ss[len(ss)-1].at.Sub(ss[0].at).Seconds()
	if span <= 0 {
		return ""
	}
	rates := make([]float64, len(ss)-1)
	peak := 0.0
	for i := 1; i < len(ss); i++ {
		dt := ss[i].at.Sub(ss[i-1].at).Seconds()
		if d := ss[i].processed - ss[i-1].processed; d > 0 && dt > 0 {
			rates[i-1] = float64(d) / dt
		}
		peak = max(peak, rates[i-1])
	}
	x := func(t time.Time) float64 { return chartPad + (chartW-2*chartPad)*t.Sub(ss[0].at).Seconds()/span }
	y := func(r float64) float64 {
		if peak == 0 {
			return chartH - chartPad
		}
		return chartH - chartPad - (chartH-2*chartPad)*r/peak
	}
	var pts strings.Builder
	for i, r := range rates {
		fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", x(ss[i].at), y(r), x(ss[i+1].at), y(r))
	}
	label := fmt.Sprintf("items per second: %s now, %s at most, over the last %s (%d samples)",
		rateText(rates[len(rates)-1]), rateText(peak), spanText(span), len(ss))
	return template.HTML(fmt.Sprintf(`<figure class="chart" id="rate"><svg viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="%s">`+ //nolint:gosec // numbers only
		`<line class="axis" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/><polyline class="rate" points="%s"/></svg>`+
		`<figcaption>%s</figcaption></figure>`,
		chartW, chartH, chartW, chartH, template.HTMLEscapeString(label), chartH-chartPad, chartW, chartH-chartPad, strings.TrimSpace(pts.String()),
		template.HTMLEscapeString(label)))
}

// rateText is a rate of items per second, as a person reads it.
func rateText(r float64) string {
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f/s", r)
	case r >= 1:
		return fmt.Sprintf("%.1f/s", r)
	}
	return fmt.Sprintf("%.2f/s", r)
}

// spanText is a span of seconds as a person reads it: 0.8s, 42s, 3m20s.
func spanText(seconds float64) string {
	if seconds < 10 {
		return fmt.Sprintf("%.1fs", seconds)
	}
	return time.Duration(seconds * float64(time.Second)).Round(time.Second).String()
}

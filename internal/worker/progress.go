package worker

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/runledger/runledger/api/v1alpha1"
)

// ProgressPrinter shows the progress of the shards of a run on a terminal (a
// line redrawn in place, with items/s and ETA) or, when the output is not a
// terminal, as a log line every Interval. Update is safe from any goroutine.
type ProgressPrinter struct {
	w        io.Writer
	tty      bool
	interval time.Duration
	shards   int

	mu      sync.Mutex
	reports map[int]Report
	start   time.Time
	drawn   bool // a terminal line is on screen
	stop    chan struct{}
	done    chan struct{}
}

// NewProgressPrinter prints to w the progress of shards shards. tty selects
// the redrawn line; interval is the time between two lines otherwise.
func NewProgressPrinter(w io.Writer, tty bool, shards int, interval time.Duration) *ProgressPrinter {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	return &ProgressPrinter{w: w, tty: tty, interval: interval, shards: shards, reports: map[int]Report{}}
}

// Update records a shard's latest report.
func (p *ProgressPrinter) Update(r Report) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reports[r.Shard] = r
}

// Start draws until ctx is done or Stop is called.
func (p *ProgressPrinter) Start(ctx context.Context) {
	p.mu.Lock()
	p.start = time.Now()
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	p.mu.Unlock()
	every := p.interval
	if p.tty {
		every = 250 * time.Millisecond
	}
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.stop:
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
}

// Stop ends the drawing and clears the terminal line.
func (p *ProgressPrinter) Stop() {
	if p.stop == nil {
		return
	}
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.drawn = false
	}
}

// Line renders the progress of the shards as one line.
func (p *ProgressPrinter) Line() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.line(time.Since(p.start))
}

func (p *ProgressPrinter) line(elapsed time.Duration) string {
	var c v1alpha1.ItemCounts
	known, done, standby := true, 0, 0
	for _, r := range p.reports {
		c.Add(r.ItemCounts)
		known = known && r.TotalKnown
		if r.Done {
			done++
		}
		if r.WaitingForStandby {
			standby++
		}
	}
	known = known && len(p.reports) == p.shards
	processed := c.Processed()
	var b strings.Builder
	if known && c.Total > 0 {
		fmt.Fprintf(&b, "%s/%s items (%.0f%%)", thousands(processed), thousands(c.Total), 100*float64(processed)/float64(c.Total))
	} else {
		fmt.Fprintf(&b, "%s items", thousands(processed))
	}
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(processed) / s
	}
	fmt.Fprintf(&b, ", %s items/s", thousands(int64(rate)))
	if known && rate > 0 && processed < c.Total {
		eta := time.Duration(float64(c.Total-processed) / rate * float64(time.Second))
		fmt.Fprintf(&b, ", ETA %s", eta.Round(time.Second))
	}
	fmt.Fprintf(&b, ", completed %s, already handled %s, failed %s", thousands(c.Completed), thousands(c.AlreadyHandled), thousands(c.Failed))
	if p.shards > 1 {
		fmt.Fprintf(&b, ", shards done %d/%d", done, p.shards)
	}
	if standby > 0 { // proven, and nothing else moves meanwhile
		fmt.Fprintf(&b, ", %d waiting for a standby of the ledger to have the shard's proof", standby)
	}
	return b.String()
}

func (p *ProgressPrinter) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.line(time.Since(p.start))
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[K"+l)
		p.drawn = true
		return
	}
	fmt.Fprintln(p.w, "progress: "+l)
}

// thousands formats n with thin separators: 1234567 -> "1,234,567".
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

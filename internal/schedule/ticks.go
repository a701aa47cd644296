// Package schedule holds the pure decisions of ProcessingSchedules: which
// ticks are due, which of them start runs and which are missed, each tick's
// occurrence and the name of its run. No I/O (package manualrun creates a
// manual run through the API): the controller and `runledger schedule` feed it a spec, the status's last
// tick and a clock.
package schedule

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // zones known whatever the image holds: a zone must never fall back to UTC silently

	"github.com/robfig/cron/v3"

	"github.com/runledger/runledger/api/v1alpha1"
)

// WallLayout is how a wall-clock time is written in status
// (lastScheduleLocalTime).
const WallLayout = "2006-01-02T15:04:05"

// The reasons a schedule cannot be read (the Stalled condition's).
var (
	ErrInvalidSchedule = errors.New("invalid schedule")
	ErrInvalidTimeZone = errors.New("invalid time zone")
)

// parser reads cron as CronJob does (robfig/cron/v3's standard parser:
// five fields and the @ macros).
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Schedule is a spec made ready to compute ticks. Ticks are computed on
// wall-clock times (a time.Time in UTC whose fields are the local ones), so
// DST never repeats or skips one; instantOf maps a wall-clock time to the
// moment it is due.
type Schedule struct {
	cron   cron.Schedule
	loc    *time.Location
	format string
	shift  v1alpha1.OccurrenceShift
	name   string
}

// Parse reads a schedule's spec. Errors wrap ErrInvalidSchedule or
// ErrInvalidTimeZone.
func Parse(name string, spec *v1alpha1.ProcessingScheduleSpec) (*Schedule, error) {
	zone := spec.TimeZoneName()
	if zone == "Local" {
		return nil, fmt.Errorf("%w %q: name the zone (e.g. UTC, Europe/Paris)", ErrInvalidTimeZone, zone)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("%w %q: not an IANA time zone name", ErrInvalidTimeZone, zone)
	}
	expr := strings.TrimSpace(spec.Schedule)
	if strings.HasPrefix(expr, "@every") || strings.Contains(expr, "TZ=") {
		return nil, fmt.Errorf("%w %q: use five cron fields or a macro such as @monthly, and spec.timeZone for the zone", ErrInvalidSchedule, spec.Schedule)
	}
	c, err := parser.Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalidSchedule, spec.Schedule, err)
	}
	sc, ok := c.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("%w %q: not a calendar schedule", ErrInvalidSchedule, spec.Schedule)
	}
	// Evaluated on wall-clock times, which are UTC times here.
	sc.Location = time.UTC
	return &Schedule{cron: sc, loc: loc, format: spec.OccurrenceFormat(), shift: spec.OccurrenceShift(), name: name}, nil
}

// Location is the schedule's time zone.
func (s *Schedule) Location() *time.Location { return s.loc }

// Tick is one scheduled time of a schedule.
type Tick struct {
	// Wall is the wall-clock time in the schedule's zone (as a UTC time).
	Wall time.Time
	// Time is when it is due: the first moment the zone's clock reads Wall
	// or later (the end of the gap for a time DST skips).
	Time time.Time
	// Occurrence is the tick's occurrence, RunName its run's name.
	Occurrence string
	RunName    string
}

// LocalTime is the tick's wall-clock time as status writes it.
func (t Tick) LocalTime() string { return t.Wall.Format(WallLayout) }

// WallOf is the wall-clock time of instant t in the schedule's zone.
func (s *Schedule) WallOf(t time.Time) time.Time {
	l := t.In(s.loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), 0, time.UTC)
}

// instantOf is the first moment at which the zone's clock reads w or later.
func (s *Schedule) instantOf(w time.Time) time.Time {
	c := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), 0, s.loc)
	cw := s.WallOf(c)
	if cw.Equal(w) {
		// A time repeated by a fall-back: time.Date may answer either
		// moment; take the first.
		if start, _ := c.ZoneBounds(); !start.IsZero() {
			_, off := start.Add(-time.Nanosecond).Zone()
			if e := time.Unix(w.Unix()-int64(off), 0); e.Before(c) && s.WallOf(e).Equal(w) {
				return e
			}
		}
		return c
	}
	// w falls in a gap (spring forward): due when the gap ends.
	start, end := c.ZoneBounds()
	if cw.After(w) {
		return start
	}
	return end
}

// TickAt is the tick of wall-clock time w (which the schedule need not
// name: a manual trigger).
func (s *Schedule) TickAt(w time.Time) Tick {
	occ := s.OccurrenceOf(w)
	return Tick{Wall: w, Time: s.instantOf(w), Occurrence: occ, RunName: RunName(s.name, occ)}
}

// NextAfter is the schedule's first tick after wall-clock time w, false when
// it names no time in the next five years (robfig/cron's horizon, e.g. 30
// February).
func (s *Schedule) NextAfter(w time.Time) (Tick, bool) {
	n := s.cron.Next(w)
	if n.IsZero() {
		return Tick{}, false
	}
	return s.TickAt(n), true
}

// OccurrenceOf is the occurrence of wall-clock time w: shifted on the
// calendar, then formatted, zone names and offsets being the zone's at that
// time.
func (s *Schedule) OccurrenceOf(w time.Time) string {
	sw := Shift(w, s.shift)
	name, off := s.instantOf(sw).In(s.loc).Zone()
	return time.Date(sw.Year(), sw.Month(), sw.Day(), sw.Hour(), sw.Minute(), sw.Second(), 0,
		time.FixedZone(name, off)).Format(s.format)
}

// Shift moves wall-clock time w by sh: years and months to the same day or
// the month's last (31 March - 1 month = the last day of February), then
// days, then hours and minutes.
func Shift(w time.Time, sh v1alpha1.OccurrenceShift) time.Time {
	months := int(w.Month()) - 1 + int(sh.Months) + 12*int(sh.Years)
	y := w.Year() + floorDiv(months, 12)
	m := time.Month(months - 12*floorDiv(months, 12) + 1)
	d := min(w.Day(), daysIn(y, m))
	t := time.Date(y, m, d, w.Hour(), w.Minute(), w.Second(), 0, time.UTC)
	return t.AddDate(0, 0, int(sh.Days)).Add(time.Duration(sh.Hours)*time.Hour + time.Duration(sh.Minutes)*time.Minute)
}

func floorDiv(a, b int) int {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// runNameHashLen is the length of the hash suffix of a run name whose
// occurrence is not kept as is.
const runNameHashLen = 10

// RunName is the name of the run of schedule's occurrence: schedule-occurrence
// when the occurrence is made of lower-case letters, digits and hyphens and
// the whole fits in MaxRunNameLength; otherwise the occurrence written in
// those characters, cut to fit, and a hash of the exact occurrence, so two
// occurrences never share a name (and one occurrence always gets the same).
func RunName(schedule, occurrence string) string {
	var b strings.Builder
	kept := true
	for _, r := range occurrence {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		case r >= 'A' && r <= 'Z':
			b.WriteRune(r - 'A' + 'a')
			kept = false
		default:
			b.WriteByte('-')
			kept = false
		}
	}
	clean := strings.Trim(b.String(), "-")
	if clean != b.String() {
		kept = false
	}
	name := schedule + "-" + clean
	if kept && clean != "" && len(name) <= v1alpha1.MaxRunNameLength {
		return name
	}
	sum := sha256.Sum256([]byte(schedule + "\x00" + occurrence))
	suffix := hex.EncodeToString(sum[:])[:runNameHashLen]
	keep := v1alpha1.MaxRunNameLength - 1 - runNameHashLen
	if len(name) > keep {
		name = name[:keep]
	}
	return strings.TrimRight(name, "-") + "-" + suffix
}

// Input is what a pass knows about a schedule besides its spec.
type Input struct {
	// Last is the wall-clock time of the latest tick dealt with (started or
	// missed); zero when none was yet: then ticks after Since count.
	Last  time.Time
	Since time.Time
	Now   time.Time
	// Suspended, Active (unfinished runs), and the policies.
	Suspended bool
	// Active are the occurrences of the unfinished runs. A run of a due
	// tick's own occurrence is that tick's run (a pass that did not see its
	// own last write yet), not a concurrent one.
	Active []string
	// Started are the scheduled times of the runs the controller created
	// (every one still there, finished or not). A due tick among them
	// started its run in a pass whose status write was lost (a leader
	// killed before it, an edit that made it conflict): it is started,
	// whatever the suspension, the deadline, catchUp or concurrency say now,
	// so that its run is found again rather than its tick called missed.
	Started     []time.Time
	Concurrency v1alpha1.ConcurrencyPolicy
	CatchUp     v1alpha1.CatchUpPolicy
	Deadline    time.Duration
	// MaxStart bounds the runs one pass starts, MaxScan the ticks it looks
	// at (a longer backlog is dealt with over several passes: More).
	MaxStart, MaxScan int
}

// Missed is a tick that starts no run, and why.
type Missed struct {
	Tick
	Reason v1alpha1.MissedReason
}

// Decision is what a pass does (Decide).
type Decision struct {
	// Start are the ticks whose runs to create, oldest first; Replace: the
	// unfinished runs are deleted first.
	Start   []Tick
	Replace bool
	// Missed are the ticks missed in this pass, oldest first (at most
	// MaxMissedListed: the latest); MissedCount counts them all.
	Missed      []Missed
	MissedCount int64
	// MissedBy counts them by reason.
	MissedBy map[v1alpha1.MissedReason]int64
	// Last is the latest tick dealt with in this pass (the new
	// lastSchedule); nil when none was due.
	Last *Tick
	// Next is the first tick after Last (or after Input.Last), nil when the
	// schedule names no further time.
	Next *Tick
	// More: the pass stopped early (MaxStart or MaxScan) with ticks still
	// due: look again at once.
	More bool
}

// Decide is the pure heart of the controller: the ticks due between the
// last one dealt with and now, and what becomes of each. A tick is missed
// when it is older than the deadline, when the schedule is suspended, when
// it is one of several due at once and catchUp is not All (with Forbid and
// Replace, only one run may be active, so All acts as Latest), when catchUp
// None finds several due, or when Forbid finds a run unfinished.
func (s *Schedule) Decide(in Input) Decision {
	from := in.Last
	if from.IsZero() {
		from = s.WallOf(in.Since)
	}
	due, next, more := s.due(from, in.Now, in.MaxScan)
	started := func(t Tick) bool { return slices.ContainsFunc(in.Started, t.Time.Equal) }
	var p Decision
	var cands []Tick
	for _, t := range due {
		switch {
		case started(t):
			cands = append(cands, t)
		case in.Deadline > 0 && in.Now.Sub(t.Time) > in.Deadline:
			p.miss(t, v1alpha1.MissedDeadlineExceeded)
		case in.Suspended:
			p.miss(t, v1alpha1.MissedSuspended)
		default:
			cands = append(cands, t)
		}
	}
	start := s.choose(cands, in, more)
	for _, t := range cands {
		if _, ok := start[t.Wall]; !ok && !started(t) {
			p.miss(t, v1alpha1.MissedNotCaughtUp)
			continue
		}
		if !started(t) && others(in.Active, t.Occurrence) > 0 && in.Concurrency == v1alpha1.ConcurrencyForbid {
			p.miss(t, v1alpha1.MissedConcurrencyForbidden)
			continue
		}
		if len(p.Start) > 0 && p.Start[len(p.Start)-1].Occurrence == t.Occurrence {
			continue // the same occurrence: the same run
		}
		p.Start = append(p.Start, t)
		if len(p.Start) == in.MaxStart && in.MaxStart > 0 {
			// Stop the pass at this tick; later ones wait for the next.
			p.More = true
			last := t
			p.Last = &last
			p.trimMissedAfter(t.Wall)
			if n, ok := s.NextAfter(t.Wall); ok {
				p.Next = &n
			}
			p.Replace = others(in.Active, t.Occurrence) > 0 && in.Concurrency == v1alpha1.ConcurrencyReplace
			return p
		}
	}
	if len(due) > 0 {
		last := due[len(due)-1]
		p.Last = &last
	}
	p.Next, p.More = next, more
	p.Replace = len(p.Start) > 0 && in.Concurrency == v1alpha1.ConcurrencyReplace &&
		others(in.Active, p.Start[len(p.Start)-1].Occurrence) > 0
	return p
}

// others counts the active occurrences other than occ.
func others(active []string, occ string) int {
	n := 0
	for _, a := range active {
		if a != occ {
			n++
		}
	}
	return n
}

// choose picks the candidates that start, by catchUp.
func (s *Schedule) choose(cands []Tick, in Input, more bool) map[time.Time]struct{} {
	out := map[time.Time]struct{}{}
	if len(cands) == 0 {
		return out
	}
	policy := in.CatchUp
	if policy == "" {
		policy = v1alpha1.DefaultCatchUp
	}
	if policy == v1alpha1.CatchUpAll && in.Concurrency != v1alpha1.ConcurrencyForbid && in.Concurrency != v1alpha1.ConcurrencyReplace {
		for _, t := range cands {
			out[t.Wall] = struct{}{}
		}
		return out
	}
	switch {
	case more:
		// The latest is further on: every candidate here is an earlier one.
	case policy == v1alpha1.CatchUpNone && len(cands) > 1:
	default:
		out[cands[len(cands)-1].Wall] = struct{}{}
	}
	return out
}

func (p *Decision) miss(t Tick, reason v1alpha1.MissedReason) {
	p.MissedCount++
	if p.MissedBy == nil {
		p.MissedBy = map[v1alpha1.MissedReason]int64{}
	}
	p.MissedBy[reason]++
	p.Missed = append(p.Missed, Missed{Tick: t, Reason: reason})
	if len(p.Missed) > v1alpha1.MaxMissedListed {
		p.Missed = p.Missed[len(p.Missed)-v1alpha1.MaxMissedListed:]
	}
}

// trimMissedAfter drops the missed ticks after wall-clock time w (a pass
// that stopped at w leaves them for the next).
func (p *Decision) trimMissedAfter(w time.Time) {
	out := p.Missed[:0]
	for _, m := range p.Missed {
		if m.Wall.After(w) {
			p.MissedCount--
			p.MissedBy[m.Reason]--
			continue
		}
		out = append(out, m)
	}
	p.Missed = out
}

// due lists the ticks after wall-clock time from that are due at now, at
// most maxScan of them (more: the list stopped there), and the first tick
// not yet due.
func (s *Schedule) due(from, now time.Time, maxScan int) (due []Tick, next *Tick, more bool) {
	w := from
	for {
		t, ok := s.NextAfter(w)
		if !ok {
			return due, nil, false
		}
		if t.Time.After(now) {
			return due, &t, false
		}
		if maxScan > 0 && len(due) == maxScan {
			return due, nil, true
		}
		due = append(due, t)
		w = t.Wall
	}
}

// Between lists the schedule's ticks whose wall-clock times are in [from,
// to], at most limit (a backfill).
func (s *Schedule) Between(from, to time.Time, limit int) ([]Tick, error) {
	var out []Tick
	w := from.Add(-time.Second)
	for {
		t, ok := s.NextAfter(w)
		if !ok || t.Wall.After(to) {
			return out, nil
		}
		if len(out) == limit {
			return nil, fmt.Errorf("more than %d ticks between %s and %s: backfill a shorter range", limit,
				from.Format(WallLayout), to.Format(WallLayout))
		}
		out = append(out, t)
		w = t.Wall
	}
}

package schedule

import (
	"fmt"
	"time"
)

// The manual runs of a schedule (runledger schedule trigger and backfill,
// the console's trigger and backfill): which ticks (manualrun creates them).

// TriggerTick is the tick of the current minute in the schedule's zone: the
// occurrence a trigger that names none starts.
func (s *Schedule) TriggerTick(now time.Time) Tick {
	return s.TickAt(s.WallOf(now).Truncate(time.Minute))
}

// wallLayouts are the forms of a wall-clock time without an offset.
var wallLayouts = []string{"2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02", "2006-01"}

// ParseWall reads a time as a wall-clock time of the schedule's zone (an
// RFC 3339 time with an offset is converted to it).
func (s *Schedule) ParseWall(text string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, text); err == nil {
		return s.WallOf(t), nil
	}
	for _, l := range wallLayouts {
		if t, err := time.Parse(l, text); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time: use 2006-01, 2006-01-02, 2006-01-02T15:04[:05] (the schedule's zone) or RFC 3339", text)
}

// Backfill is the ticks of a backfill from wall-clock time from to to
// (inclusive), oldest first, one per occurrence (the first tick of each),
// at most limit ticks scanned. None is an error.
func (s *Schedule) Backfill(spec string, from, to time.Time, limit int) ([]Tick, error) {
	if to.Before(from) {
		return nil, fmt.Errorf("%s is before %s", to.Format(WallLayout), from.Format(WallLayout))
	}
	ticks, err := s.Between(from, to, limit)
	if err != nil {
		return nil, err
	}
	if len(ticks) == 0 {
		return nil, fmt.Errorf("schedule %q names no time from %s to %s (%s)", spec, from.Format(WallLayout), to.Format(WallLayout), s.loc)
	}
	var out []Tick
	for _, t := range ticks {
		if len(out) > 0 && out[len(out)-1].Occurrence == t.Occurrence {
			continue // one run per occurrence
		}
		out = append(out, t)
	}
	return out, nil
}

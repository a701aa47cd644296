package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// The manual runs of a schedule (runledger schedule trigger and backfill,
// the console's trigger and backfill): which ticks, and their creation.

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

// ErrNameTaken: the name of an occurrence's run is taken by a run that is
// not the schedule's run of that occurrence.
var ErrNameTaken = errors.New("is taken by a ProcessingRun that is not this schedule's run of that occurrence")

// CreateManualRun creates the run of occurrence occ of sched (at: its
// scheduled time, zero for none), as NewRun makes it, with createdBy
// CreatedByTrigger or CreatedByBackfill: created false when the
// occurrence's run was there already (found, not duplicated). A name taken
// by any other run is ErrNameTaken; an invalid run is the API server's
// Invalid error, wrapped.
func CreateManualRun(ctx context.Context, c client.Client, sched *v1alpha1.ProcessingSchedule, occ string, at time.Time, createdBy string) (name string, created bool, err error) {
	run := NewRun(sched, occ, at, createdBy)
	err = c.Create(ctx, run)
	switch {
	case err == nil:
		return run.Name, true, nil
	case apierrors.IsAlreadyExists(err):
		existing := &v1alpha1.ProcessingRun{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(run), existing); err != nil {
			return run.Name, false, fmt.Errorf("reading run %s, which exists: %w", run.Name, err)
		}
		if !IsRunOf(existing, sched, occ) {
			return run.Name, false, fmt.Errorf("run name %s (occurrence %s) %w", run.Name, occ, ErrNameTaken)
		}
		return run.Name, false, nil
	case apierrors.IsInvalid(err):
		return run.Name, false, fmt.Errorf("run %s of occurrence %s: %w", run.Name, occ, err)
	default:
		return run.Name, false, fmt.Errorf("creating run %s: %w", run.Name, err)
	}
}

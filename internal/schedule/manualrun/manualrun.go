// Package manualrun creates the run of a schedule's occurrence through the
// API server, or finds it there: for runledger schedule trigger and backfill,
// the console's, and the schedule controller's ticks and trigger annotation.
// The one place of that I/O, apart from the pure decisions of package
// schedule.
package manualrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/schedule"
)

// ErrNameTaken: the name of an occurrence's run is taken by a run that is
// not the schedule's run of that occurrence.
var ErrNameTaken = errors.New("is taken by a ProcessingRun that is not this schedule's run of that occurrence")

// Create creates the run of occurrence occ of sched (at: its
// scheduled time, zero for none), as schedule.NewRun makes it, with createdBy
// schedule.CreatedByTrigger or schedule.CreatedByBackfill: created false when the
// occurrence's run was there already (found, not duplicated). A name taken
// by any other run is ErrNameTaken; an invalid run is the API server's
// Invalid error, wrapped.
func Create(ctx context.Context, c client.Client, sched *v1alpha1.ProcessingSchedule, occ string, at time.Time, createdBy string) (name string, created bool, err error) {
	run, created, err := CreateOrFind(ctx, c, sched, occ, at, createdBy)
	return run.Name, created, err
}

// CreateOrFind is Create returning the run: the one created, or the
// occurrence's run found there (created false; with ErrNameTaken, the run
// that has its name). opts are the Create's (the controller's field owner).
// An AlreadyExists is never a second run.
func CreateOrFind(ctx context.Context, c client.Client, sched *v1alpha1.ProcessingSchedule, occ string, at time.Time, createdBy string,
	opts ...client.CreateOption) (run *v1alpha1.ProcessingRun, created bool, err error) {
	run = schedule.NewRun(sched, occ, at, createdBy)
	err = c.Create(ctx, run, opts...)
	switch {
	case err == nil:
		return run, true, nil
	case apierrors.IsAlreadyExists(err):
		existing := &v1alpha1.ProcessingRun{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(run), existing); err != nil {
			return run, false, fmt.Errorf("reading run %s, which exists: %w", run.Name, err)
		}
		if !schedule.IsRunOf(existing, sched, occ) {
			return existing, false, fmt.Errorf("run name %s (occurrence %s) %w", run.Name, occ, ErrNameTaken)
		}
		return existing, false, nil
	case apierrors.IsInvalid(err):
		return run, false, fmt.Errorf("run %s of occurrence %s: %w", run.Name, occ, err)
	default:
		return run, false, fmt.Errorf("creating run %s: %w", run.Name, err)
	}
}

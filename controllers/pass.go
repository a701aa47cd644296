package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// step is one named stage of a reconcile pass over a scope S; its name is
// the step label of runledger_reconcile_errors_total and prefixes its error.
type step[S any] struct {
	name string
	run  func(context.Context, S) error
}

// passScope is what a pass runner needs of a controller's scope.
type passScope interface {
	// stepFailed records the error that ended the steps: the status
	// written at the end of the pass says so.
	stepFailed(err error)
	// requeueDelay is when the object wants to be looked at again, 0 for
	// no later look.
	requeueDelay() time.Duration
}

// pass is the shape of both controllers' reconcile passes, held once as
// Cluster API's doReconcile holds its phases: observe reads what the pass
// decides from, and without it there is no status to write; then the steps
// run in order, the first error ending them (the workqueue retries the pass
// with back-off); write publishes the status on every path once observed,
// as Cluster API's patch helper does, so a failing step still publishes
// what the pass learnt and its error.
type pass[S passScope] struct {
	// metric prefixes every step label ("" for runs, "schedule." for
	// schedules).
	metric  string
	observe []step[S]
	steps   []step[S]
	write   func(context.Context, S) error
}

// run runs the pass over s. The result asks for s's requeueDelay unless an
// error ended the pass.
func (p pass[S]) run(ctx context.Context, s S) (result ctrl.Result, err error) {
	for _, st := range p.observe {
		if err := st.run(ctx, s); err != nil {
			reconcileErrors.WithLabelValues(p.metric + st.name).Inc()
			return ctrl.Result{}, fmt.Errorf("%s: %w", st.name, err)
		}
	}
	defer func() {
		if werr := p.write(ctx, s); werr != nil {
			reconcileErrors.WithLabelValues(p.metric + "writeStatus").Inc()
			result, err = ctrl.Result{}, errors.Join(err, fmt.Errorf("writeStatus: %w", werr))
			return
		}
		if err == nil {
			// The write may ask for a later look (a spaced count write).
			result = ctrl.Result{RequeueAfter: s.requeueDelay()}
		}
	}()
	for _, st := range p.steps {
		if err := st.run(ctx, s); err != nil {
			reconcileErrors.WithLabelValues(p.metric + st.name).Inc()
			err = fmt.Errorf("%s: %w", st.name, err)
			s.stepFailed(err)
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil // the deferred write sets RequeueAfter
}

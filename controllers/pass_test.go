package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	ctrl "sigs.k8s.io/controller-runtime"
)

// fakePass records what a pass did.
type fakePass struct {
	did     []string
	failed  error
	requeue time.Duration
}

func (f *fakePass) stepFailed(err error)        { f.failed = err }
func (f *fakePass) requeueDelay() time.Duration { return f.requeue }

// TestPassRun: the steps run in order after the observation; an observation
// that fails ends the pass with no status written; a step that fails ends
// the steps, is recorded on the scope and counted under its label, and the
// status is still written; the write's own error joins the step's; a pass
// without error asks for the scope's requeue delay.
func TestPassRun(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	stepOf := func(name string, err error) step[*fakePass] {
		return step[*fakePass]{name, func(_ context.Context, f *fakePass) error { f.did = append(f.did, name); return err }}
	}
	build := func(observeErr, stepErr, writeErr error) pass[*fakePass] {
		return pass[*fakePass]{
			metric:  "test.",
			observe: []step[*fakePass]{stepOf("observe", observeErr)},
			steps:   []step[*fakePass]{stepOf("one", nil), stepOf("two", stepErr), stepOf("three", nil)},
			write: func(_ context.Context, f *fakePass) error {
				f.did = append(f.did, "write")
				f.requeue = 5 * time.Second
				return writeErr
			},
		}
	}

	f := &fakePass{}
	res, err := build(nil, nil, nil).run(ctx, f)
	require.NoError(t, err)
	require.Equal(t, ctrl.Result{RequeueAfter: 5 * time.Second}, res, "the write may ask for a later look")
	require.Equal(t, []string{"observe", "one", "two", "three", "write"}, f.did)

	f = &fakePass{}
	before := testutil.ToFloat64(reconcileErrors.WithLabelValues("test.observe"))
	_, err = build(boom, nil, nil).run(ctx, f)
	require.EqualError(t, err, "observe: boom")
	require.Equal(t, []string{"observe"}, f.did, "nothing observed, nothing written")
	require.Equal(t, before+1, testutil.ToFloat64(reconcileErrors.WithLabelValues("test.observe")))

	f = &fakePass{}
	before = testutil.ToFloat64(reconcileErrors.WithLabelValues("test.two"))
	res, err = build(nil, boom, nil).run(ctx, f)
	require.EqualError(t, err, "two: boom")
	require.Equal(t, ctrl.Result{}, res)
	require.Equal(t, []string{"observe", "one", "two", "write"}, f.did, "the status is written after a failed step")
	require.EqualError(t, f.failed, "two: boom", "the written status says why")
	require.Equal(t, before+1, testutil.ToFloat64(reconcileErrors.WithLabelValues("test.two")))

	f = &fakePass{}
	before = testutil.ToFloat64(reconcileErrors.WithLabelValues("test.writeStatus"))
	_, err = build(nil, boom, errors.New("conflict")).run(ctx, f)
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "writeStatus: conflict")
	require.Equal(t, before+1, testutil.ToFloat64(reconcileErrors.WithLabelValues("test.writeStatus")))
}

package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// A reconcile that read a run before it was deleted and created again under
// the same name must not write the old run's status onto the new one: a
// sticky Failed would keep the new run from ever starting.
func TestStaleReconcileDoesNotWriteOntoARunCreatedAgain(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	tm := startManager(t, env, ns, managerConfig{})
	ctx := context.Background()
	old := create(t, env, newRun(ns, "twice", 2, 4))
	waitPods(t, env, ns, "twice", "twice-0-0", "twice-1-0")
	setPod(t, env, ns, "twice-1-0", corev1.PodRunning, 0, nil)
	stale := waitRun(t, env, ns, "twice", "Running", phaseIs(v1alpha1.RunRunning))

	// The old run fails for good while shard 1 is busy.
	setPod(t, env, ns, "twice-0-0", corev1.PodFailed, v1alpha1.ExitBadInput, shardReport(0, 0, v1alpha1.ItemCounts{}, "line 1: bad"))
	waitRun(t, env, ns, "twice", "Failed", phaseIs(v1alpha1.RunFailed))
	oldPod := runPods(t, env, ns, "twice")["twice-0-0"]
	require.NotNil(t, oldPod)

	require.NoError(t, env.Client.Delete(ctx, getRun(t, env, ns, "twice")))
	waitFor(t, "old run gone", func() error {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "twice"}, &v1alpha1.ProcessingRun{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %w", err)
	})
	fresh := create(t, env, newRun(ns, "twice", 2, 4))
	require.NotEqual(t, old.UID, fresh.UID)
	waitRun(t, env, ns, "twice", "new run observed", func(r *v1alpha1.ProcessingRun) error {
		if r.Status.ObservedGeneration == 0 {
			return fmt.Errorf("not reconciled yet")
		}
		return nil
	})

	// A pass from a stale view: the old run as it was while Running, and
	// its failed pod, which makes the pass decide Failed.
	_, err := tm.r.runSteps(ctx, stale.DeepCopy(), 0)
	require.NoError(t, err)
	r := getRun(t, env, ns, "twice")
	require.Nil(t, finishedCondition(&r.Status), "the new run got the old run's outcome: %+v", r.Status.Conditions)
	require.NotEqual(t, v1alpha1.RunFailed, r.Status.Phase)

	// envtest runs no garbage collector: play it for the old pod; the new
	// run then starts every shard.
	require.NoError(t, env.Client.Delete(ctx, oldPod, client.Preconditions{UID: &oldPod.UID}))
	pods := waitPods(t, env, ns, "twice", "twice-0-0", "twice-1-0")
	for _, p := range pods {
		require.Equal(t, string(fresh.UID), p.Labels[v1alpha1.LabelRunUID], "pod %s", p.Name)
	}
	waitRun(t, env, ns, "twice", "new run Running", all(phaseIs(v1alpha1.RunRunning), noCondition(v1alpha1.ConditionFailed)))
	stillPods(t, env, ns, "twice", 500*time.Millisecond, "twice-0-0", "twice-1-0")
}

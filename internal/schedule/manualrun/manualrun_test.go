package manualrun

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/schedule"
)

// TestCreate: the occurrence's run is created once; created again, it is
// found (not duplicated); a name another run holds is ErrNameTaken.
func TestCreate(t *testing.T) {
	t.Parallel()
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	ctx := context.Background()
	sched := &v1alpha1.ProcessingSchedule{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "invoices", UID: "sched-uid"}}
	at := time.Date(2026, 10, 1, 2, 0, 0, 0, time.UTC)

	name, created, err := Create(ctx, c, sched, "2026-10", at, schedule.CreatedByTrigger)
	require.NoError(t, err)
	require.True(t, created)
	var run v1alpha1.ProcessingRun
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "billing", Name: name}, &run))
	require.True(t, schedule.IsRunOf(&run, sched, "2026-10"))
	require.Equal(t, schedule.CreatedByTrigger, run.Annotations[v1alpha1.AnnotationCreatedBy])

	again, created, err := Create(ctx, c, sched, "2026-10", at, schedule.CreatedByBackfill)
	require.NoError(t, err)
	require.False(t, created, "the occurrence's run was there: found, not duplicated")
	require.Equal(t, name, again)

	other := &v1alpha1.ProcessingSchedule{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "invoices", UID: "another-uid"}}
	_, created, err = Create(ctx, c, other, "2026-10", at, schedule.CreatedByTrigger)
	require.ErrorIs(t, err, ErrNameTaken)
	require.False(t, created)
}

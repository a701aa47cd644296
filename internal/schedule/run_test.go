package schedule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestStartedAt: only a run the controller created for a tick has a tick;
// the template's annotations cannot give one to a triggered run.
func TestStartedAt(t *testing.T) {
	t.Parallel()
	sched := &v1alpha1.ProcessingSchedule{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "daily", UID: "u"}}
	sched.Spec.RunTemplate.Metadata = &v1alpha1.RunTemplateMetadata{Annotations: map[string]string{
		v1alpha1.AnnotationScheduledTime: "2026-01-01T09:00:00Z", v1alpha1.AnnotationCreatedBy: CreatedByController,
	}}
	tick := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		run  *v1alpha1.ProcessingRun
		want time.Time
		ok   bool
	}{
		{"the controller's, for a tick", NewRun(sched, "2026-01-01", tick, CreatedByController), tick, true},
		{"a trigger's, with the template's annotations", NewRun(sched, "2026-01-01", time.Time{}, CreatedByTrigger), time.Time{}, false},
		{"a backfill's", NewRun(sched, "2026-01-01", tick, CreatedByBackfill), time.Time{}, false},
		{"no annotations", &v1alpha1.ProcessingRun{}, time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, ok := StartedAt(tc.run)
			require.Equal(t, tc.ok, ok)
			require.True(t, tc.want.Equal(at), "%s, want %s", at, tc.want)
		})
	}
}

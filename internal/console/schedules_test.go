package console

import (
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestPlanned: what a schedule's trigger and backfill create, as the
// confirmation lists it and the POST creates it: the current minute's
// occurrence with its scheduled time, a typed occurrence without one, a
// backfill's occurrences; bad input refused.
func TestPlanned(t *testing.T) {
	sc := &v1alpha1.ProcessingSchedule{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "invoices"},
		Spec: v1alpha1.ProcessingScheduleSpec{Schedule: "@monthly", TimeZone: "Europe/Paris",
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01", Shift: &v1alpha1.OccurrenceShift{Months: -1}}}}
	now, err := planned(sc, "trigger", url.Values{})
	require.NoError(t, err)
	require.Len(t, now, 1)
	require.False(t, now[0].Time.IsZero(), "the current minute's tick has its time")
	again, err := planned(sc, "trigger", url.Values{"occurrence": {now[0].Occurrence}, "at": {now[0].Time.UTC().Format(time.RFC3339)}})
	require.NoError(t, err)
	require.Equal(t, now[0].Time, again[0].Time, "confirmed with its time")
	typed, err := planned(sc, "trigger", url.Values{"occurrence": {"2026-03"}, "at": {now[0].Time.UTC().Format(time.RFC3339)}})
	require.NoError(t, err)
	require.True(t, typed[0].Time.IsZero(), "a time that is not the occurrence's is not recorded")
	require.Equal(t, "invoices-2026-03", typed[0].RunName)
	_, err = planned(sc, "trigger", url.Values{"occurrence": {" "}})
	require.Error(t, err)

	ticks, err := planned(sc, "backfill", url.Values{"from": {"2026-02"}, "to": {"2026-05"}})
	require.NoError(t, err)
	var occs []string
	for _, tk := range ticks {
		occs = append(occs, tk.Occurrence)
	}
	require.Equal(t, []string{"2026-01", "2026-02", "2026-03", "2026-04"}, occs, "as runledger schedule backfill's test")
	for _, form := range []url.Values{{"from": {"June"}, "to": {"2026-05"}}, {"from": {"2026-06"}, "to": {"2026-05"}}, {"from": {"1900-01"}, "to": {"2026-05"}}} {
		_, err := planned(sc, "backfill", form)
		require.Error(t, err, "%v", form)
	}
}

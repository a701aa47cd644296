package schedule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

func TestBackfillAndParseWall(t *testing.T) {
	spec := &v1alpha1.ProcessingScheduleSpec{Schedule: "0 0,12 * * *", TimeZone: "Europe/Paris",
		Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01-02"}}
	p, err := Parse("daily", spec)
	require.NoError(t, err)
	from, err := p.ParseWall("2026-03-01")
	require.NoError(t, err)
	to, err := p.ParseWall("2026-03-02T23:59")
	require.NoError(t, err)
	ticks, err := p.Backfill(spec.Schedule, from, to, 10)
	require.NoError(t, err)
	var occs []string
	for _, tk := range ticks {
		occs = append(occs, tk.Occurrence)
	}
	require.Equal(t, []string{"2026-03-01", "2026-03-02"}, occs, "two ticks a day, one run per occurrence")
	require.Equal(t, "2026-02-28T23:00:00Z", ticks[0].Time.UTC().Format(time.RFC3339), "the first tick of the day")

	off, err := p.ParseWall("2026-03-01T12:00:00Z")
	require.NoError(t, err)
	require.Equal(t, "2026-03-01T13:00:00", off.Format(WallLayout), "an offset's time read in the zone")
	_, err = p.ParseWall("June")
	require.ErrorContains(t, err, "is not a time")
	_, err = p.Backfill(spec.Schedule, to, from, 10)
	require.ErrorContains(t, err, "is before")
	_, err = p.Backfill(spec.Schedule, from.Add(time.Hour), from.Add(2*time.Hour), 10)
	require.ErrorContains(t, err, "names no time")
	_, err = p.Backfill(spec.Schedule, from, to.AddDate(1, 0, 0), 10)
	require.ErrorContains(t, err, "more than 10 ticks")

	now := time.Date(2026, 3, 1, 10, 30, 42, 0, time.UTC)
	tk := p.TriggerTick(now)
	require.Equal(t, "2026-03-01T11:30:00", tk.LocalTime(), "the current minute in Paris")
}

package schedule

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/runledger/runledger/api/v1alpha1"
)

func wall(s string) time.Time {
	t, err := time.Parse(WallLayout, s)
	if err != nil {
		panic(err)
	}
	return t
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

type want struct {
	start   []string // "wall@instant=occurrence"
	missed  []string // "wall:reason"
	count   int64
	last    string // wall, "" for none
	next    string // "wall@instant", "" for none
	more    bool
	replace bool
}

func tickString(t Tick) string {
	return t.Wall.Format(WallLayout) + "@" + t.Time.UTC().Format(time.RFC3339) + "=" + t.Occurrence
}

// TestDecide is the table of the tick computation: DST in two zones, month
// ends, 29 February, @monthly at local midnight, a schedule changed
// between ticks, a controller down for several ticks, clock skew, and each
// policy.
func TestDecide(t *testing.T) {
	t.Parallel()
	deadline := func(s int64) *int64 { return &s }
	cases := []struct {
		name string
		spec v1alpha1.ProcessingScheduleSpec
		in   Input
		want want
	}{{
		name: "New York spring forward: 02:30 does not exist, due when the gap ends (03:00 EDT)",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "30 2 * * *", TimeZone: "America/New_York"},
		in:   Input{Last: wall("2026-03-07T02:30:00"), Now: utc("2026-03-08T08:00:00Z")},
		want: want{start: []string{"2026-03-08T02:30:00@2026-03-08T07:00:00Z=2026-03-08-0230"},
			last: "2026-03-08T02:30:00", next: "2026-03-09T02:30:00@2026-03-09T06:30:00Z"},
	}, {
		name: "Berlin spring forward: 02:30 due at 03:00 CEST",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "30 2 * * *", TimeZone: "Europe/Berlin"},
		in:   Input{Last: wall("2026-03-28T02:30:00"), Now: utc("2026-03-29T01:00:00Z")},
		want: want{start: []string{"2026-03-29T02:30:00@2026-03-29T01:00:00Z=2026-03-29-0230"},
			last: "2026-03-29T02:30:00", next: "2026-03-30T02:30:00@2026-03-30T00:30:00Z"},
	}, {
		name: "New York spring forward, hourly: 02:00 and 03:00 are both due at 03:00 EDT, each its own occurrence",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", TimeZone: "America/New_York", CatchUp: v1alpha1.CatchUpAll},
		in:   Input{Last: wall("2026-03-08T01:00:00"), Now: utc("2026-03-08T07:00:00Z")},
		want: want{start: []string{
			"2026-03-08T02:00:00@2026-03-08T07:00:00Z=2026-03-08-0200",
			"2026-03-08T03:00:00@2026-03-08T07:00:00Z=2026-03-08-0300"},
			last: "2026-03-08T03:00:00", next: "2026-03-08T04:00:00@2026-03-08T08:00:00Z"},
	}, {
		name: "New York fall back: 01:30 happens twice, due once (the first)",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "30 1 * * *", TimeZone: "America/New_York"},
		in:   Input{Last: wall("2026-10-31T01:30:00"), Now: utc("2026-11-01T05:31:00Z")},
		want: want{start: []string{"2026-11-01T01:30:00@2026-11-01T05:30:00Z=2026-11-01-0130"},
			last: "2026-11-01T01:30:00", next: "2026-11-02T01:30:00@2026-11-02T06:30:00Z"},
	}, {
		name: "New York fall back: at the second 01:30 (EST) nothing is due again",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "30 1 * * *", TimeZone: "America/New_York"},
		in:   Input{Last: wall("2026-11-01T01:30:00"), Now: utc("2026-11-01T06:31:00Z")},
		want: want{next: "2026-11-02T01:30:00@2026-11-02T06:30:00Z"},
	}, {
		name: "Berlin fall back: 02:30 once, at 02:30 CEST",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "30 2 * * *", TimeZone: "Europe/Berlin"},
		in:   Input{Last: wall("2026-10-24T02:30:00"), Now: utc("2026-10-25T02:00:00Z")},
		want: want{start: []string{"2026-10-25T02:30:00@2026-10-25T00:30:00Z=2026-10-25-0230"},
			last: "2026-10-25T02:30:00", next: "2026-10-26T02:30:00@2026-10-26T01:30:00Z"},
	}, {
		name: "New York fall back, hourly with the offset in the occurrence: 01:00 once, then 02:00 EST",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", TimeZone: "America/New_York", CatchUp: v1alpha1.CatchUpAll,
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01-02T15Z07"}},
		in: Input{Last: wall("2026-11-01T00:00:00"), Now: utc("2026-11-01T07:00:00Z")},
		want: want{start: []string{
			"2026-11-01T01:00:00@2026-11-01T05:00:00Z=2026-11-01T01-04",
			"2026-11-01T02:00:00@2026-11-01T07:00:00Z=2026-11-01T02-05"},
			last: "2026-11-01T02:00:00", next: "2026-11-01T03:00:00@2026-11-01T08:00:00Z"},
	}, {
		name: "day 31: only months that have one",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 0 31 * *", CatchUp: v1alpha1.CatchUpAll,
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01-02"}},
		in: Input{Last: wall("2026-01-31T00:00:00"), Now: utc("2026-06-01T00:00:00Z")},
		want: want{start: []string{"2026-03-31T00:00:00@2026-03-31T00:00:00Z=2026-03-31", "2026-05-31T00:00:00@2026-05-31T00:00:00Z=2026-05-31"},
			last: "2026-05-31T00:00:00", next: "2026-07-31T00:00:00@2026-07-31T00:00:00Z"},
	}, {
		name: "the last of the month minus one month is February's last day",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 6 31 3 *", CatchUp: v1alpha1.CatchUpAll,
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01-02", Shift: &v1alpha1.OccurrenceShift{Months: -1}}},
		in: Input{Last: wall("2026-01-01T00:00:00"), Now: utc("2028-04-01T00:00:00Z")},
		want: want{start: []string{"2026-03-31T06:00:00@2026-03-31T06:00:00Z=2026-02-28", "2027-03-31T06:00:00@2027-03-31T06:00:00Z=2027-02-28",
			"2028-03-31T06:00:00@2028-03-31T06:00:00Z=2028-02-29"},
			last: "2028-03-31T06:00:00", next: "2029-03-31T06:00:00@2029-03-31T06:00:00Z"},
	}, {
		name: "29 February: the next one is in 2028",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 12 29 2 *", Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01-02"}},
		in:   Input{Since: utc("2026-03-01T00:00:00Z"), Now: utc("2026-03-01T00:00:00Z")},
		want: want{next: "2028-02-29T12:00:00@2028-02-29T12:00:00Z"},
	}, {
		name: "29 February due, one year later: the shift lands on 28 February",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 12 29 2 *",
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01-02", Shift: &v1alpha1.OccurrenceShift{Years: -1}}},
		in: Input{Last: wall("2024-02-29T12:00:00"), Now: utc("2028-02-29T12:00:01Z")},
		want: want{start: []string{"2028-02-29T12:00:00@2028-02-29T12:00:00Z=2027-02-28"},
			last: "2028-02-29T12:00:00", next: "2032-02-29T12:00:00@2032-02-29T12:00:00Z"},
	}, {
		name: "@monthly in Paris is 00:00 local (23:00 UTC the day before), billing the month before",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "@monthly", TimeZone: "Europe/Paris",
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01", Shift: &v1alpha1.OccurrenceShift{Months: -1}}},
		in: Input{Last: wall("2026-10-01T00:00:00"), Now: utc("2026-10-31T23:00:00Z")},
		want: want{start: []string{"2026-11-01T00:00:00@2026-10-31T23:00:00Z=2026-10"},
			last: "2026-11-01T00:00:00", next: "2026-12-01T00:00:00@2026-11-30T23:00:00Z"},
	}, {
		name: "@monthly in Paris, one second before local midnight: not due",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "@monthly", TimeZone: "Europe/Paris"},
		in:   Input{Last: wall("2026-10-01T00:00:00"), Now: utc("2026-10-31T22:59:59Z")},
		want: want{next: "2026-11-01T00:00:00@2026-10-31T23:00:00Z"},
	}, {
		name: "schedule changed between ticks: the new one counts from the last tick",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 0 * * 1"},
		in:   Input{Last: wall("2026-05-01T00:00:00"), Now: utc("2026-05-05T12:00:00Z")},
		want: want{start: []string{"2026-05-04T00:00:00@2026-05-04T00:00:00Z=2026-05-04-0000"},
			last: "2026-05-04T00:00:00", next: "2026-05-11T00:00:00@2026-05-11T00:00:00Z"},
	}, {
		name: "controller down for four ticks, Latest: the last starts, three missed",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T14:30:00Z")},
		want: want{start: []string{"2026-01-01T14:00:00@2026-01-01T14:00:00Z=2026-01-01-1400"},
			missed: []string{"2026-01-01T11:00:00:NotCaughtUp", "2026-01-01T12:00:00:NotCaughtUp", "2026-01-01T13:00:00:NotCaughtUp"}, count: 3,
			last: "2026-01-01T14:00:00", next: "2026-01-01T15:00:00@2026-01-01T15:00:00Z"},
	}, {
		name: "controller down for four ticks, All: each starts, oldest first",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", CatchUp: v1alpha1.CatchUpAll},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T14:30:00Z")},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100", "2026-01-01T12:00:00@2026-01-01T12:00:00Z=2026-01-01-1200",
			"2026-01-01T13:00:00@2026-01-01T13:00:00Z=2026-01-01-1300", "2026-01-01T14:00:00@2026-01-01T14:00:00Z=2026-01-01-1400"},
			last: "2026-01-01T14:00:00", next: "2026-01-01T15:00:00@2026-01-01T15:00:00Z"},
	}, {
		name: "controller down for four ticks, All within a two-hour deadline",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", CatchUp: v1alpha1.CatchUpAll, StartingDeadlineSeconds: deadline(7200)},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T14:30:00Z")},
		want: want{start: []string{"2026-01-01T13:00:00@2026-01-01T13:00:00Z=2026-01-01-1300", "2026-01-01T14:00:00@2026-01-01T14:00:00Z=2026-01-01-1400"},
			missed: []string{"2026-01-01T11:00:00:DeadlineExceeded", "2026-01-01T12:00:00:DeadlineExceeded"}, count: 2,
			last: "2026-01-01T14:00:00", next: "2026-01-01T15:00:00@2026-01-01T15:00:00Z"},
	}, {
		name: "controller down for four ticks, None: all missed, waits for the next",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", CatchUp: v1alpha1.CatchUpNone},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T14:30:00Z")},
		want: want{missed: []string{"2026-01-01T11:00:00:NotCaughtUp", "2026-01-01T12:00:00:NotCaughtUp",
			"2026-01-01T13:00:00:NotCaughtUp", "2026-01-01T14:00:00:NotCaughtUp"}, count: 4,
			last: "2026-01-01T14:00:00", next: "2026-01-01T15:00:00@2026-01-01T15:00:00Z"},
	}, {
		name: "None, one tick due: it starts",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", CatchUp: v1alpha1.CatchUpNone},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T11:00:01Z")},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100"},
			last: "2026-01-01T11:00:00", next: "2026-01-01T12:00:00@2026-01-01T12:00:00Z"},
	}, {
		name: "a tick past the deadline is missed even alone",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", StartingDeadlineSeconds: deadline(60)},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T11:01:01Z")},
		want: want{missed: []string{"2026-01-01T11:00:00:DeadlineExceeded"}, count: 1,
			last: "2026-01-01T11:00:00", next: "2026-01-01T12:00:00@2026-01-01T12:00:00Z"},
	}, {
		name: "clock skew: the last tick was written by a manager whose clock runs ahead",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T09:59:58Z")},
		want: want{next: "2026-01-01T11:00:00@2026-01-01T11:00:00Z"},
	}, {
		name: "clock skew: one second before the tick it is not due",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T09:00:00"), Now: utc("2026-01-01T09:59:59Z")},
		want: want{next: "2026-01-01T10:00:00@2026-01-01T10:00:00Z"},
	}, {
		name: "a new schedule counts from its creation",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "*/5 * * * *"},
		in:   Input{Since: utc("2026-01-01T10:03:00Z"), Now: utc("2026-01-01T10:05:00Z")},
		want: want{start: []string{"2026-01-01T10:05:00@2026-01-01T10:05:00Z=2026-01-01-1005"},
			last: "2026-01-01T10:05:00", next: "2026-01-01T10:10:00@2026-01-01T10:10:00Z"},
	}, {
		name: "suspended: the ticks are missed, never run later",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T12:00:00Z"), Suspended: true},
		want: want{missed: []string{"2026-01-01T11:00:00:Suspended", "2026-01-01T12:00:00:Suspended"}, count: 2,
			last: "2026-01-01T12:00:00", next: "2026-01-01T13:00:00@2026-01-01T13:00:00Z"},
	}, {
		name: "suspended, and the tick's run exists (its pass's status write was lost): found again, not missed",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in: Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T12:00:00Z"), Suspended: true,
			Started: []time.Time{utc("2026-01-01T11:00:00Z")}, Active: []string{"2026-01-01-1100"}},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100"},
			missed: []string{"2026-01-01T12:00:00:Suspended"}, count: 1,
			last: "2026-01-01T12:00:00", next: "2026-01-01T13:00:00@2026-01-01T13:00:00Z"},
	}, {
		name: "a run of the same occurrence from another tick (hourly ticks of a daily occurrence): suspended still misses",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01-02"}},
		in: Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T11:00:00Z"), Suspended: true,
			Started: []time.Time{utc("2026-01-01T10:00:00Z")}},
		want: want{missed: []string{"2026-01-01T11:00:00:Suspended"}, count: 1,
			last: "2026-01-01T11:00:00", next: "2026-01-01T12:00:00@2026-01-01T12:00:00Z"},
	}, {
		name: "past the deadline, and the tick's run exists: found again, not missed",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", StartingDeadlineSeconds: deadline(60)},
		in: Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T11:05:00Z"),
			Started: []time.Time{utc("2026-01-01T11:00:00Z")}},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100"},
			last: "2026-01-01T11:00:00", next: "2026-01-01T12:00:00@2026-01-01T12:00:00Z"},
	}, {
		name: "Latest, an earlier tick's run exists: it is found again, the latest starts, the ticks between are missed",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in: Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T13:30:00Z"),
			Started: []time.Time{utc("2026-01-01T11:00:00Z")}},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100", "2026-01-01T13:00:00@2026-01-01T13:00:00Z=2026-01-01-1300"},
			missed: []string{"2026-01-01T12:00:00:NotCaughtUp"}, count: 1,
			last: "2026-01-01T13:00:00", next: "2026-01-01T14:00:00@2026-01-01T14:00:00Z"},
	}, {
		name: "Forbid, the tick's own run exists and is unfinished: found again; the next tick is skipped",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", CatchUp: v1alpha1.CatchUpAll},
		in: Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T12:00:00Z"), Concurrency: v1alpha1.ConcurrencyForbid,
			Started: []time.Time{utc("2026-01-01T11:00:00Z")}, Active: []string{"2026-01-01-1100"}},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100"},
			missed: []string{"2026-01-01T12:00:00:ConcurrencyForbidden"}, count: 1,
			last: "2026-01-01T12:00:00", next: "2026-01-01T13:00:00@2026-01-01T13:00:00Z"},
	}, {
		name: "Forbid with a run unfinished: skipped",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T11:00:00Z"), Active: []string{"2026-01-01-1000"}, Concurrency: v1alpha1.ConcurrencyForbid},
		want: want{missed: []string{"2026-01-01T11:00:00:ConcurrencyForbidden"}, count: 1,
			last: "2026-01-01T11:00:00", next: "2026-01-01T12:00:00@2026-01-01T12:00:00Z"},
	}, {
		name: "Replace with a run unfinished: replaced",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T11:00:00Z"), Active: []string{"2026-01-01-1000"}, Concurrency: v1alpha1.ConcurrencyReplace},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100"}, replace: true,
			last: "2026-01-01T11:00:00", next: "2026-01-01T12:00:00@2026-01-01T12:00:00Z"},
	}, {
		name: "Forbid, and the unfinished run is this tick's own (a pass behind its last write): it is the tick's run",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T11:00:00Z"), Active: []string{"2026-01-01-1100"}, Concurrency: v1alpha1.ConcurrencyForbid},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100"},
			last: "2026-01-01T11:00:00", next: "2026-01-01T12:00:00@2026-01-01T12:00:00Z"},
	}, {
		name: "Replace, and the unfinished run is this tick's own: nothing is replaced",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T11:00:00Z"), Active: []string{"2026-01-01-1100"}, Concurrency: v1alpha1.ConcurrencyReplace},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100"},
			last: "2026-01-01T11:00:00", next: "2026-01-01T12:00:00@2026-01-01T12:00:00Z"},
	}, {
		name: "Forbid, All and three due: only the latest may run",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", CatchUp: v1alpha1.CatchUpAll},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T13:00:00Z"), Concurrency: v1alpha1.ConcurrencyForbid},
		want: want{start: []string{"2026-01-01T13:00:00@2026-01-01T13:00:00Z=2026-01-01-1300"},
			missed: []string{"2026-01-01T11:00:00:NotCaughtUp", "2026-01-01T12:00:00:NotCaughtUp"}, count: 2,
			last: "2026-01-01T13:00:00", next: "2026-01-01T14:00:00@2026-01-01T14:00:00Z"},
	}, {
		name: "All with a bound of two runs per pass: the pass stops at the second",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", CatchUp: v1alpha1.CatchUpAll},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T14:30:00Z"), MaxStart: 2},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01-1100", "2026-01-01T12:00:00@2026-01-01T12:00:00Z=2026-01-01-1200"},
			last: "2026-01-01T12:00:00", next: "2026-01-01T13:00:00@2026-01-01T13:00:00Z", more: true},
	}, {
		name: "a backlog longer than the scan: Latest misses this part and goes on",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"},
		in:   Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T14:30:00Z"), MaxScan: 2},
		want: want{missed: []string{"2026-01-01T11:00:00:NotCaughtUp", "2026-01-01T12:00:00:NotCaughtUp"}, count: 2,
			last: "2026-01-01T12:00:00", more: true},
	}, {
		name: "hourly ticks of one daily occurrence start one run",
		spec: v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", CatchUp: v1alpha1.CatchUpAll,
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01-02"}},
		in: Input{Last: wall("2026-01-01T10:00:00"), Now: utc("2026-01-01T12:00:00Z")},
		want: want{start: []string{"2026-01-01T11:00:00@2026-01-01T11:00:00Z=2026-01-01"},
			last: "2026-01-01T12:00:00", next: "2026-01-01T13:00:00@2026-01-01T13:00:00Z"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := Parse("invoices", &tc.spec)
			require.NoError(t, err)
			tc.in.Concurrency = cmpOr(tc.in.Concurrency, tc.spec.Concurrency())
			tc.in.CatchUp = tc.spec.CatchUpPolicy()
			tc.in.Deadline = tc.spec.StartingDeadline()
			p := s.Decide(tc.in)
			var got want
			for _, st := range p.Start {
				got.start = append(got.start, tickString(st))
				require.Equal(t, RunName("invoices", st.Occurrence), st.RunName)
			}
			for _, m := range p.Missed {
				got.missed = append(got.missed, m.Wall.Format(WallLayout)+":"+string(m.Reason))
			}
			got.count = p.MissedCount
			if p.Last != nil {
				got.last = p.Last.LocalTime()
			}
			if p.Next != nil {
				got.next = p.Next.Wall.Format(WallLayout) + "@" + p.Next.Time.UTC().Format(time.RFC3339)
			}
			got.more, got.replace = p.More, p.Replace
			require.Equal(t, tc.want, got)
		})
	}
}

func cmpOr[T comparable](a, b T) T {
	var zero T
	if a != zero {
		return a
	}
	return b
}

// TestMissedListIsBoundedCountIsNot: a year of missed hourly ticks lists
// the latest MaxMissedListed and counts every one.
func TestMissedListIsBoundedCountIsNot(t *testing.T) {
	t.Parallel()
	s, err := Parse("x", &v1alpha1.ProcessingScheduleSpec{Schedule: "@hourly"})
	require.NoError(t, err)
	p := s.Decide(Input{Last: wall("2025-01-01T00:00:00"), Now: utc("2026-01-01T00:30:00Z"), Suspended: true})
	require.Equal(t, int64(365*24), p.MissedCount)
	require.Len(t, p.Missed, v1alpha1.MaxMissedListed)
	require.Equal(t, "2026-01-01T00:00:00", p.Missed[len(p.Missed)-1].LocalTime())
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spec v1alpha1.ProcessingScheduleSpec
		want error
	}{
		{v1alpha1.ProcessingScheduleSpec{Schedule: "61 * * * *"}, ErrInvalidSchedule},
		{v1alpha1.ProcessingScheduleSpec{Schedule: "* * * *"}, ErrInvalidSchedule},
		{v1alpha1.ProcessingScheduleSpec{Schedule: "@every 1h"}, ErrInvalidSchedule},
		{v1alpha1.ProcessingScheduleSpec{Schedule: "CRON_TZ=UTC 0 * * * *"}, ErrInvalidSchedule},
		{v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", TimeZone: "Mars/Olympus"}, ErrInvalidTimeZone},
		{v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *", TimeZone: "Local"}, ErrInvalidTimeZone},
	} {
		_, err := Parse("x", &tc.spec)
		require.ErrorIs(t, err, tc.want, "%+v", tc.spec)
	}
	s, err := Parse("x", &v1alpha1.ProcessingScheduleSpec{Schedule: "0 * * * *"})
	require.NoError(t, err)
	require.Equal(t, "UTC", s.Location().String())
}

// TestRunName: deterministic, a valid object name and label value, at most
// 63 characters, with a hash exactly when the occurrence is not kept as is.
func TestRunName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", v1alpha1.MaxScheduleNameLength)
	for _, tc := range []struct{ schedule, occ, want string }{
		{"invoices", "2026-10", "invoices-2026-10"},
		{"invoices", "2026-10-31-2300", "invoices-2026-10-31-2300"},
		{"invoices", "2026-10-31T23:00", ""},
		{"invoices", "October 2026", ""},
		{"invoices", "-2026-", ""},
		{"invoices", "€", ""},
		{long, "2026-10-31-2300", ""},
	} {
		got := RunName(tc.schedule, tc.occ)
		require.Equal(t, got, RunName(tc.schedule, tc.occ))
		require.LessOrEqual(t, len(got), v1alpha1.MaxRunNameLength, got)
		require.Empty(t, validation.IsDNS1123Subdomain(got), got)
		require.Empty(t, validation.IsValidLabelValue(got), got)
		if tc.want != "" {
			require.Equal(t, tc.want, got)
		} else {
			require.Regexp(t, `-[0-9a-f]{10}$`, got)
		}
	}
	require.NotEqual(t, RunName("invoices", "2026-10-31T23:00"), RunName("invoices", "2026-10-31t23:00"))
	require.NotEqual(t, RunName(long, "2026-10-31-2300"), RunName(long, "2026-10-31-2301"))
}

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProcessingSchedule starts a ProcessingRun at each tick of a cron schedule.
// Each tick has an occurrence, a string made from its scheduled time in the
// schedule's time zone (spec.occurrence), and the run's name is made from
// the schedule's name and that occurrence: a second fire for the same
// occurrence (a DST fall-back, a restarted or failed-over controller, a
// manual trigger) finds the run already there and never starts a second one.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=psched,categories=runledger
// +kubebuilder:printcolumn:name="Schedule",type=string,JSONPath=`.spec.schedule`
// +kubebuilder:printcolumn:name="Time-Zone",type=string,JSONPath=`.status.timeZone`,description="The time zone the schedule is read in (UTC unless spec.timeZone says otherwise)"
// +kubebuilder:printcolumn:name="Suspended",type=boolean,JSONPath=`.spec.suspend`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.activeCount`,description="Runs of this schedule that have not finished"
// +kubebuilder:printcolumn:name="Last-Schedule",type=date,JSONPath=`.status.lastScheduleTime`
// +kubebuilder:printcolumn:name="Last-Successful",type=date,JSONPath=`.status.lastSuccessfulTime`
// +kubebuilder:printcolumn:name="Next",type=string,JSONPath=`.status.nextScheduleTime`,description="When the next tick is due"
// +kubebuilder:printcolumn:name="Missed",type=integer,JSONPath=`.status.missedTicks`,priority=1,description="Ticks that started no run (see status.missed)"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 52",message="metadata.name must be at most 52 characters: the names of its runs are made from it and the occurrence (at most 63)"
type ProcessingSchedule struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says when to start runs and what they are.
	// +required
	Spec ProcessingScheduleSpec `json:"spec"`

	// status is written by the controller. Until it first writes it, it
	// reads {observedGeneration: 0}, behind metadata.generation, so kstatus
	// and Argo CD read a new schedule as in progress.
	// +optional
	// +kubebuilder:default={observedGeneration: 0}
	Status ProcessingScheduleStatus `json:"status,omitempty"`
}

// ProcessingScheduleList is a list of ProcessingSchedules.
//
// +kubebuilder:object:root=true
type ProcessingScheduleList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProcessingSchedule `json:"items"`
}

// ProcessingScheduleSpec is the desired state of a ProcessingSchedule.
type ProcessingScheduleSpec struct {
	// schedule in cron syntax: five fields (minute, hour, day of month,
	// month, day of week) or a macro (@yearly, @annually, @monthly, @weekly,
	// @daily, @midnight, @hourly), read as CronJob reads it (robfig/cron/v3),
	// in timeZone. Each wall-clock time it names is one tick, whatever DST
	// does: a time the clocks skip (spring forward) is due when the gap
	// ends, a time they repeat (fall back) is due once, the first time.
	// @every and TZ= prefixes are refused: use timeZone.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule=`self.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[^@\\s]\\S*(\\s+\\S+){4})$')`,message="must be five cron fields (minute hour day-of-month month day-of-week) or one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"
	// +kubebuilder:validation:XValidation:rule="!self.contains('TZ=')",message="must not hold a time zone: set spec.timeZone"
	Schedule string `json:"schedule"`

	// timeZone is the IANA name of the time zone (e.g. Europe/Paris) the
	// schedule and the occurrences are read in. Default UTC, never the
	// controller's own zone (status.timeZone shows the zone in use). An
	// unknown name stalls the schedule (reason InvalidTimeZone).
	// +optional
	// +kubebuilder:default=UTC
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z][-+_A-Za-z0-9]*(/[-+_A-Za-z0-9]+)*$`
	// +kubebuilder:validation:XValidation:rule="self != 'Local'",message="Local would be the controller's own zone: name the zone (e.g. UTC, Europe/Paris)"
	TimeZone string `json:"timeZone,omitempty"`

	// suspend stops new ticks from starting runs (runs already started go
	// on). Ticks that pass while suspended are recorded in status.missed
	// (reason Suspended) and never run later.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// startingDeadlineSeconds: a tick whose run could not be started within
	// this many seconds of its scheduled time (the controller was down, a
	// catch-up came too late) is missed (reason DeadlineExceeded). Unset: no
	// deadline.
	// +optional
	// +kubebuilder:validation:Minimum=1
	StartingDeadlineSeconds *int64 `json:"startingDeadlineSeconds,omitempty"`

	// concurrencyPolicy says what a tick does while an earlier run of this
	// schedule has not finished: Allow (start it as well; different
	// occurrences are different business keys), Forbid (skip the tick:
	// recorded as missed, reason ConcurrencyForbidden), or Replace (delete
	// the unfinished runs, then start it; what they committed stays
	// committed).
	// +optional
	// +kubebuilder:default=Allow
	ConcurrencyPolicy ConcurrencyPolicy `json:"concurrencyPolicy,omitempty"`

	// catchUp says what happens when several ticks are due at once (the
	// controller was down): Latest starts the most recent one and records
	// the others as missed (CronJob's behaviour); All starts every one, the
	// oldest first, each with its own occurrence; None starts none of them
	// (all are recorded as missed) and waits for the next tick. Ticks older
	// than startingDeadlineSeconds are missed in every case.
	// +optional
	// +kubebuilder:default=Latest
	CatchUp CatchUpPolicy `json:"catchUp,omitempty"`

	// successfulRunsHistoryLimit is how many succeeded runs of this schedule
	// are kept; older ones are deleted (their ledger rows stay).
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	SuccessfulRunsHistoryLimit *int32 `json:"successfulRunsHistoryLimit,omitempty"`

	// failedRunsHistoryLimit is how many failed runs of this schedule are
	// kept; older ones are deleted (their ledger rows stay).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	FailedRunsHistoryLimit *int32 `json:"failedRunsHistoryLimit,omitempty"`

	// occurrence says how a tick's scheduled time becomes its occurrence.
	// +optional
	// +kubebuilder:default={}
	Occurrence *OccurrenceSpec `json:"occurrence,omitempty"`

	// runTemplate is the run each tick starts. Its spec.occurrence is set to
	// the tick's occurrence (so it cannot be set here).
	// +required
	RunTemplate RunTemplate `json:"runTemplate"`
}

// OccurrenceSpec makes a tick's scheduled time (in the schedule's time zone)
// into its occurrence: shift it, then format it.
type OccurrenceSpec struct {
	// format is a Go time layout (the reference time is Mon Jan 2 15:04:05
	// 2006): 2006-01 gives 2026-11, 2006-01-02 gives 2026-11-30. Ticks whose
	// times format the same are one occurrence: one run. The default names
	// the minute, so every tick is its own occurrence except a wall-clock
	// time repeated by a DST fall-back; add Z07:00 to keep those apart.
	// +optional
	// +kubebuilder:default="2006-01-02-1504"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.trim() != ''",message="must not be only white space"
	Format string `json:"format,omitempty"`

	// shift moves the scheduled time on the calendar before formatting:
	// {months: -1} on a tick of 1 March gives February (a run on the 1st
	// usually bills the month before). Months move to the same day, or the
	// month's last day when it has fewer (31 March - 1 month = 28/29
	// February); then days, then hours and minutes, on the wall clock.
	// +optional
	Shift *OccurrenceShift `json:"shift,omitempty"`
}

// OccurrenceShift is a calendar offset.
type OccurrenceShift struct {
	// +optional
	// +kubebuilder:validation:Minimum=-100
	// +kubebuilder:validation:Maximum=100
	Years int32 `json:"years,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=-1200
	// +kubebuilder:validation:Maximum=1200
	Months int32 `json:"months,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=-36500
	// +kubebuilder:validation:Maximum=36500
	Days int32 `json:"days,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=-876000
	// +kubebuilder:validation:Maximum=876000
	Hours int32 `json:"hours,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=-52560000
	// +kubebuilder:validation:Maximum=52560000
	Minutes int32 `json:"minutes,omitempty"`
}

// RunTemplate is the ProcessingRun a tick starts.
type RunTemplate struct {
	// metadata holds labels and annotations added to the runs. The
	// processing.runledger.dev/ ones are the controller's.
	// +optional
	Metadata *RunTemplateMetadata `json:"metadata,omitempty"`
	// spec of the runs.
	// +required
	// +kubebuilder:validation:XValidation:rule="!has(self.occurrence)",message="runTemplate.spec.occurrence is set by the schedule for each tick: remove it (the batch reads it as $(OCCURRENCE) or current_setting('runledger.occurrence'))"
	Spec ProcessingRunSpec `json:"spec"`
}

// RunTemplateMetadata is what a schedule adds to its runs' metadata.
type RunTemplateMetadata struct {
	// labels added to the runs.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('processing.runledger.dev/'))",message="labels processing.runledger.dev/* are set by the controller and cannot be overridden"
	Labels map[string]string `json:"labels,omitempty"`
	// annotations added to the runs.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('processing.runledger.dev/'))",message="annotations processing.runledger.dev/* are set by the controller and cannot be overridden"
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ConcurrencyPolicy says what a tick does while a run of the schedule is
// still unfinished.
// +kubebuilder:validation:Enum=Allow;Forbid;Replace
type ConcurrencyPolicy string

const (
	// ConcurrencyAllow starts the tick's run next to the unfinished ones.
	ConcurrencyAllow ConcurrencyPolicy = "Allow"
	// ConcurrencyForbid skips the tick (recorded as missed).
	ConcurrencyForbid ConcurrencyPolicy = "Forbid"
	// ConcurrencyReplace deletes the unfinished runs, then starts the tick's.
	ConcurrencyReplace ConcurrencyPolicy = "Replace"
)

// CatchUpPolicy says which of several ticks due at once start runs.
// +kubebuilder:validation:Enum=None;Latest;All
type CatchUpPolicy string

const (
	// CatchUpNone starts none of them.
	CatchUpNone CatchUpPolicy = "None"
	// CatchUpLatest starts the most recent one.
	CatchUpLatest CatchUpPolicy = "Latest"
	// CatchUpAll starts every one, oldest first.
	CatchUpAll CatchUpPolicy = "All"
)

// MissedReason says why a tick started no run.
// +kubebuilder:validation:Enum=DeadlineExceeded;NotCaughtUp;Suspended;ConcurrencyForbidden
type MissedReason string

const (
	// MissedDeadlineExceeded: not started within startingDeadlineSeconds.
	MissedDeadlineExceeded MissedReason = "DeadlineExceeded"
	// MissedNotCaughtUp: one of several ticks due at once, not started
	// under catchUp None or Latest.
	MissedNotCaughtUp MissedReason = "NotCaughtUp"
	// MissedSuspended: the schedule was suspended at the tick.
	MissedSuspended MissedReason = "Suspended"
	// MissedConcurrencyForbidden: a run was unfinished at the tick and
	// concurrencyPolicy is Forbid.
	MissedConcurrencyForbidden MissedReason = "ConcurrencyForbidden"
)

// ProcessingScheduleStatus is the observed state of a ProcessingSchedule.
type ProcessingScheduleStatus struct {
	// observedGeneration is the metadata.generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// timeZone is the time zone the schedule is read in.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TimeZone string `json:"timeZone,omitempty"`

	// activeCount is the number of runs of this schedule that have not
	// finished.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ActiveCount int32 `json:"activeCount,omitempty"`
	// active lists the unfinished runs, the most recent last (at most 16).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Active []ScheduledRun `json:"active,omitempty"`

	// lastScheduleTime is when the latest tick that was dealt with (started
	// or missed) was due.
	// +optional
	LastScheduleTime *metav1.Time `json:"lastScheduleTime,omitempty"`
	// lastScheduleLocalTime is that tick's wall-clock time in timeZone
	// (2006-01-02T15:04:05): the next tick is the schedule's next time after
	// it.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	LastScheduleLocalTime string `json:"lastScheduleLocalTime,omitempty"`
	// lastRun is the run the latest started tick created (or found).
	// +optional
	LastRun *ScheduledRun `json:"lastRun,omitempty"`
	// lastSuccessfulTime is when the latest succeeded run of this schedule
	// completed.
	// +optional
	LastSuccessfulTime *metav1.Time `json:"lastSuccessfulTime,omitempty"`
	// lastSuccessfulRun is that run.
	// +optional
	LastSuccessfulRun *ScheduledRun `json:"lastSuccessfulRun,omitempty"`
	// nextScheduleTime is when the next tick is due (unset while suspended
	// or stalled).
	// +optional
	NextScheduleTime *metav1.Time `json:"nextScheduleTime,omitempty"`
	// nextOccurrence is the occurrence of the next tick.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	NextOccurrence string `json:"nextOccurrence,omitempty"`

	// trigger is what became of the latest processing.runledger.dev/trigger
	// annotation the controller read: its occurrence's run was created, was
	// there already, or was refused. The controller starts the run of an
	// annotation's occurrence once, when the annotation's value differs from
	// trigger.occurrence.
	// +optional
	Trigger *TriggerStatus `json:"trigger,omitempty"`

	// missedTicks counts the ticks that started no run, ever: never capped.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MissedTicks int64 `json:"missedTicks,omitempty"`
	// missed lists the most recent of them (at most 20), the latest last.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=20
	Missed []MissedTick `json:"missed,omitempty"`

	// conditions: Ready, Stalled and Reconciling as kstatus reads them, and
	// Suspended.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ScheduledRun is a run of a schedule.
type ScheduledRun struct {
	// name of the run.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// occurrence of the run.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Occurrence string `json:"occurrence,omitempty"`
}

// TriggerStatus is what became of a trigger annotation.
type TriggerStatus struct {
	// occurrence the annotation named (cut to 1024 bytes with an ellipsis
	// if it was longer, and then refused).
	// +required
	// +kubebuilder:validation:MaxLength=1024
	Occurrence string `json:"occurrence"`
	// result: Created (the controller created the occurrence's run),
	// Exists (the run was there already: a tick, the CLI or an earlier
	// trigger made it), or Refused (no run: see message).
	// +required
	Result TriggerResult `json:"result"`
	// run is the occurrence's run (unset when Refused).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Run string `json:"run,omitempty"`
	// message says why a trigger was refused.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// time the controller dealt with the annotation.
	// +required
	Time metav1.Time `json:"time"`
}

// TriggerResult is what became of a trigger annotation.
// +kubebuilder:validation:Enum=Created;Exists;Refused
type TriggerResult string

const (
	// TriggerCreated: the controller created the occurrence's run.
	TriggerCreated TriggerResult = "Created"
	// TriggerExists: the occurrence's run was there already.
	TriggerExists TriggerResult = "Exists"
	// TriggerRefused: no run was created (status.trigger.message says why).
	TriggerRefused TriggerResult = "Refused"
)

// MissedTick is a tick that started no run.
type MissedTick struct {
	// scheduledTime is when the tick was due.
	// +required
	ScheduledTime metav1.Time `json:"scheduledTime"`
	// occurrence of the tick.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Occurrence string `json:"occurrence,omitempty"`
	// reason it started no run.
	// +required
	Reason MissedReason `json:"reason"`
}

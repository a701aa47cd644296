package v1alpha1

import "time"

// The rules and defaults of a ProcessingSchedule's spec, as rules.go has
// them for a run: each value is also written in a marker of
// processingschedule_types.go, and rules_test.go checks that the generated
// CRD says the same. The controller and `runledger schedule` read them here.
const (
	// MaxScheduleNameLength bounds a schedule's metadata.name, so that
	// "<schedule>-<occurrence>" leaves room in MaxRunNameLength.
	MaxScheduleNameLength = 52
	// DefaultTimeZone is spec.timeZone when it is not set.
	DefaultTimeZone = "UTC"
	// DefaultOccurrenceFormat is spec.occurrence.format when it is not set:
	// the minute of the tick, in characters a run's name can hold.
	DefaultOccurrenceFormat = "2006-01-02-1504"
	// DefaultConcurrencyPolicy is spec.concurrencyPolicy when it is not set.
	DefaultConcurrencyPolicy = ConcurrencyAllow
	// DefaultCatchUp is spec.catchUp when it is not set.
	DefaultCatchUp = CatchUpLatest
	// DefaultSuccessfulRunsHistoryLimit and DefaultFailedRunsHistoryLimit
	// are the history limits when they are not set (CronJob's).
	DefaultSuccessfulRunsHistoryLimit = 3
	DefaultFailedRunsHistoryLimit     = 1
	// MaxActiveListed bounds status.active; status.activeCount counts all.
	MaxActiveListed = 16
	// MaxMissedListed bounds status.missed; status.missedTicks counts all.
	MaxMissedListed = 20
	// MaxTriggerMessageLength bounds status.trigger.message.
	MaxTriggerMessageLength = 1024

	// OccurrencePlaceholder in an item's occurrence is replaced by the
	// run's spec.occurrence.
	OccurrencePlaceholder = "$(OCCURRENCE)"
	// OccurrenceSetting is the setting a batch.query reads the run's
	// spec.occurrence from: current_setting('runledger.occurrence').
	OccurrenceSetting = "runledger.occurrence"

	// LabelSchedule is the name of the schedule that created a run.
	LabelSchedule = Group + "/schedule"
	// AnnotationOccurrence is a scheduled run's occurrence (spec.occurrence
	// says it too; the annotation is for selecting by eye and for tools).
	AnnotationOccurrence = Group + "/occurrence"
	// AnnotationScheduledTime is the RFC 3339 time of the tick that created
	// a run; absent on a run created by `runledger schedule trigger
	// --occurrence`, which names no time.
	AnnotationScheduledTime = Group + "/scheduled-time"
	// AnnotationCreatedBy says who created a scheduled run: the controller
	// (a tick), a trigger (`runledger schedule trigger` or the trigger
	// annotation) or `runledger schedule backfill`.
	AnnotationCreatedBy = Group + "/created-by"
	// AnnotationTrigger on a schedule names an occurrence whose run the
	// controller starts, as `runledger schedule trigger --occurrence` does:
	// the kubectl-only trigger (kubectl annotate). status.trigger says what
	// became of it.
	AnnotationTrigger = Group + "/trigger"
)

// TimeZoneName is spec.timeZone with its default.
func (s *ProcessingScheduleSpec) TimeZoneName() string {
	if s.TimeZone == "" {
		return DefaultTimeZone
	}
	return s.TimeZone
}

// OccurrenceFormat is spec.occurrence.format with its default.
func (s *ProcessingScheduleSpec) OccurrenceFormat() string {
	if s.Occurrence == nil || s.Occurrence.Format == "" {
		return DefaultOccurrenceFormat
	}
	return s.Occurrence.Format
}

// OccurrenceShift is spec.occurrence.shift, zero when unset.
func (s *ProcessingScheduleSpec) OccurrenceShift() OccurrenceShift {
	if s.Occurrence == nil || s.Occurrence.Shift == nil {
		return OccurrenceShift{}
	}
	return *s.Occurrence.Shift
}

// Concurrency is spec.concurrencyPolicy with its default.
func (s *ProcessingScheduleSpec) Concurrency() ConcurrencyPolicy {
	if s.ConcurrencyPolicy == "" {
		return DefaultConcurrencyPolicy
	}
	return s.ConcurrencyPolicy
}

// CatchUpPolicy is spec.catchUp with its default.
func (s *ProcessingScheduleSpec) CatchUpPolicy() CatchUpPolicy {
	if s.CatchUp == "" {
		return DefaultCatchUp
	}
	return s.CatchUp
}

// StartingDeadline is spec.startingDeadlineSeconds, 0 for none.
func (s *ProcessingScheduleSpec) StartingDeadline() time.Duration {
	if s.StartingDeadlineSeconds == nil {
		return 0
	}
	return time.Duration(*s.StartingDeadlineSeconds) * time.Second
}

// HistoryLimits are the history limits with their defaults.
func (s *ProcessingScheduleSpec) HistoryLimits() (succeeded, failed int) {
	succeeded, failed = DefaultSuccessfulRunsHistoryLimit, DefaultFailedRunsHistoryLimit
	if s.SuccessfulRunsHistoryLimit != nil {
		succeeded = int(*s.SuccessfulRunsHistoryLimit)
	}
	if s.FailedRunsHistoryLimit != nil {
		failed = int(*s.FailedRunsHistoryLimit)
	}
	return succeeded, failed
}

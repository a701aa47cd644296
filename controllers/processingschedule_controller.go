package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"

	acv1alpha1 "github.com/runledger/runledger/api/applyconfiguration/api/v1alpha1"
	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/schedule"
	"github.com/runledger/runledger/internal/schedule/manualrun"
)

// The schedule controller's permissions, on top of the run controller's
// (which already gets, lists, watches and deletes runs): read schedules,
// write their status, create runs.
//
// +kubebuilder:rbac:groups=processing.runledger.dev,resources=processingschedules,verbs=get;list;watch
// +kubebuilder:rbac:groups=processing.runledger.dev,resources=processingschedules/status,verbs=get;patch
// +kubebuilder:rbac:groups=processing.runledger.dev,resources=processingschedules/finalizers,verbs=update
// +kubebuilder:rbac:groups=processing.runledger.dev,resources=processingruns,verbs=create

// runScheduleKey indexes runs by the name of the schedule that controls them.
const runScheduleKey = ".metadata.controller.processingschedule"

// Defaults of the ScheduleReconciler's bounds.
const (
	// DefaultMaxRunsPerPass bounds the runs one pass creates (a catch-up of
	// All goes on in the next pass at once).
	DefaultMaxRunsPerPass = 10
	// DefaultMaxTicksPerPass bounds the ticks one pass looks at.
	DefaultMaxTicksPerPass = 100000
)

// Condition reasons of a ProcessingSchedule.
const (
	ReasonScheduled       = "Scheduled"
	ReasonInvalidSchedule = "InvalidSchedule"
	ReasonInvalidTimeZone = "InvalidTimeZone"
	ReasonRunNameTaken    = "RunNameTaken"
	ReasonCatchingUp      = "CatchingUp"
	ReasonNoMoreTicks     = "NoMoreTicks"
)

// ScheduleReconciler starts the ProcessingRuns of ProcessingSchedules, one
// per occurrence. The tick decisions are internal/schedule's (pure); this
// reconciler observes the schedule's runs, creates, replaces and prunes
// them, and writes the status.
type ScheduleReconciler struct {
	Client client.Client
	// APIReader reads the schedule past the cache, to tell a pass behind
	// the schedule's last status write (nil: every pass is taken as current).
	APIReader client.Reader
	Recorder  events.EventRecorder
	Clock     clock.PassiveClock
	// MaxRunsPerPass and MaxTicksPerPass bound a pass's work.
	MaxRunsPerPass, MaxTicksPerPass int
}

// SetupWithManager registers the reconciler, its run index and its watches.
func (r *ScheduleReconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	r.MaxRunsPerPass = cmp.Or(r.MaxRunsPerPass, DefaultMaxRunsPerPass)
	r.MaxTicksPerPass = cmp.Or(r.MaxTicksPerPass, DefaultMaxTicksPerPass)
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.ProcessingRun{}, runScheduleKey, indexRunSchedule); err != nil {
		return fmt.Errorf("index runs by schedule: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ProcessingSchedule{}).
		Owns(&v1alpha1.ProcessingRun{}).
		Named("processingschedule").
		WithOptions(opts).
		Complete(r)
}

func indexRunSchedule(obj client.Object) []string {
	owner := metav1.GetControllerOf(obj)
	if owner == nil || owner.APIVersion != v1alpha1.GroupVersion.String() || owner.Kind != "ProcessingSchedule" {
		return nil
	}
	return []string{owner.Name}
}

// schedScope is what one pass knows and decides about a schedule.
type schedScope struct {
	sched    *v1alpha1.ProcessingSchedule
	now      time.Time
	parsed   *schedule.Schedule
	runs     []v1alpha1.ProcessingRun // controlled by this schedule, oldest first
	active   []*v1alpha1.ProcessingRun
	decision schedule.Decision
	stalled  *problem
	lastRun  *v1alpha1.ScheduledRun
	requeue  time.Duration
	stepErr  error
	missed   []schedule.Missed
	created  []string
	replaced []string
	// trigger: what became of a trigger annotation this pass dealt with;
	// triggered: the run it created.
	trigger   *v1alpha1.TriggerStatus
	triggered string
	// live is the schedule's status read past the cache (once, on demand).
	live *v1alpha1.ProcessingScheduleStatus
}

// Reconcile fetches the schedule and runs the steps: observe its runs,
// decide the due ticks, replace, create, prune; the status is written on
// every path (deferred).
func (r *ScheduleReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("schedule", req.Namespace+"/"+req.Name))
	sched := &v1alpha1.ProcessingSchedule{}
	if err := r.Client.Get(ctx, req.NamespacedName, sched); err != nil {
		if apierrors.IsNotFound(err) {
			forgetScheduleMetrics(req.Namespace, req.Name)
			return ctrl.Result{}, nil // its runs go with it (owner references)
		}
		return ctrl.Result{}, fmt.Errorf("get processingschedule: %w", err)
	}
	if sched.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	s := &schedScope{sched: sched, now: r.Clock.Now()}
	return pass[*schedScope]{
		metric:  "schedule.",
		observe: []step[*schedScope]{{"observeRuns", r.observeRuns}},
		steps: []step[*schedScope]{
			{"decideTicks", r.decideTicks},
			{"replaceRuns", r.replaceRuns},
			{"createRuns", r.createRuns},
			{"triggerRun", r.triggerRun},
			{"pruneHistory", r.pruneHistory},
		},
		write: r.writeScheduleStatus,
	}.run(ctx, s)
}

func (s *schedScope) stepFailed(err error)        { s.stepErr = err }
func (s *schedScope) requeueDelay() time.Duration { return s.requeue }

// observeRuns lists the schedule's runs (from the cache, by the index) and
// tells the unfinished ones.
func (r *ScheduleReconciler) observeRuns(ctx context.Context, s *schedScope) error {
	var list v1alpha1.ProcessingRunList
	if err := r.Client.List(ctx, &list, client.InNamespace(s.sched.Namespace), client.MatchingFields{runScheduleKey: s.sched.Name}); err != nil {
		return fmt.Errorf("list runs: %w", err)
	}
	for i := range list.Items {
		if owner := metav1.GetControllerOf(&list.Items[i]); owner != nil && owner.UID == s.sched.UID {
			s.runs = append(s.runs, list.Items[i])
		}
	}
	slices.SortFunc(s.runs, func(a, b v1alpha1.ProcessingRun) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), strings.Compare(a.Name, b.Name))
	})
	for i := range s.runs {
		if finishedCondition(&s.runs[i].Status) == nil && s.runs[i].DeletionTimestamp == nil {
			s.active = append(s.active, &s.runs[i])
		}
	}
	return nil
}

// lastWall is the wall-clock time of the last tick dealt with, in the
// schedule's current zone (re-read from the instant when the zone changed).
func lastWall(st *v1alpha1.ProcessingScheduleStatus, p *schedule.Schedule) time.Time {
	if st.LastScheduleLocalTime != "" && st.TimeZone == p.Location().String() {
		if w, err := time.Parse(schedule.WallLayout, st.LastScheduleLocalTime); err == nil {
			return w
		}
	}
	if st.LastScheduleTime != nil {
		return p.WallOf(st.LastScheduleTime.Time)
	}
	return time.Time{}
}

// decideTicks parses the schedule and decides the due ticks (pure).
func (r *ScheduleReconciler) decideTicks(_ context.Context, s *schedScope) error {
	spec := &s.sched.Spec
	p, err := schedule.Parse(s.sched.Name, spec)
	if err != nil {
		reason := ReasonInvalidSchedule
		if errors.Is(err, schedule.ErrInvalidTimeZone) {
			reason = ReasonInvalidTimeZone
		}
		s.stalled = &problem{reason: reason, message: err.Error()}
		return nil
	}
	s.parsed = p
	active := make([]string, 0, len(s.active))
	for _, run := range s.active {
		active = append(active, run.Spec.Occurrence)
	}
	var started []time.Time
	for i := range s.runs {
		if at, ok := schedule.StartedAt(&s.runs[i]); ok {
			started = append(started, at)
		}
	}
	s.decision = p.Decide(schedule.Input{
		Last: lastWall(&s.sched.Status, p), Since: s.sched.CreationTimestamp.Time, Now: s.now,
		Suspended: spec.Suspend, Active: active, Started: started, Concurrency: spec.Concurrency(), CatchUp: spec.CatchUpPolicy(),
		Deadline: spec.StartingDeadline(), MaxStart: r.MaxRunsPerPass, MaxScan: r.MaxTicksPerPass,
	})
	s.missed = s.decision.Missed
	switch {
	case s.decision.More:
		s.requeue = time.Millisecond
	case s.decision.Next != nil:
		s.requeue = max(s.decision.Next.Time.Sub(s.now), time.Millisecond)
	}
	return nil
}

// replaceRuns deletes the unfinished runs of other occurrences before a
// tick starts under concurrencyPolicy Replace.
func (r *ScheduleReconciler) replaceRuns(ctx context.Context, s *schedScope) error {
	if !s.decision.Replace {
		return nil
	}
	starting := map[string]bool{}
	for _, t := range s.decision.Start {
		starting[t.Occurrence] = true
	}
	for _, run := range s.active {
		if starting[run.Spec.Occurrence] {
			continue
		}
		err := r.Client.Delete(ctx, run, client.Preconditions{UID: &run.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete run %s to replace it: %w", run.Name, err)
		}
		s.replaced = append(s.replaced, run.Name)
		r.event(s.sched, run, corev1.EventTypeNormal, "Replaced", "Replace",
			fmt.Sprintf("Deleted unfinished run %s (occurrence %s): concurrencyPolicy is Replace", run.Name, run.Spec.Occurrence))
	}
	return nil
}

// createRuns creates the run of each starting tick. AlreadyExists is this
// occurrence's run being there already (a second fire, a second manager, a
// manual trigger): it is never a second run. A name taken by something that
// is not this occurrence's run stalls the schedule.
func (r *ScheduleReconciler) createRuns(ctx context.Context, s *schedScope) error {
	for _, t := range s.decision.Start {
		run, created, err := manualrun.CreateOrFind(ctx, r.Client, s.sched, t.Occurrence, t.Time, schedule.CreatedByController,
			client.FieldOwner(v1alpha1.ControllerFieldManager))
		switch {
		case errors.Is(err, manualrun.ErrNameTaken):
			s.stalled = &problem{reason: ReasonRunNameTaken, message: fmt.Sprintf(
				"run name %s (occurrence %s) is taken by a ProcessingRun this schedule does not control, or of another occurrence: delete or rename it",
				run.Name, t.Occurrence)}
			// The tick stays due, and the ticks missed before it are
			// counted when the pass that gets past it writes.
			s.decision.Last, s.decision.Next = nil, nil
			s.decision.MissedCount, s.decision.MissedBy, s.missed = 0, nil, nil
			return nil
		case err != nil:
			return err
		case created:
			s.created = append(s.created, run.Name)
			schedRunsCreated.WithLabelValues(s.sched.Namespace, s.sched.Name).Inc()
			r.event(s.sched, run, corev1.EventTypeNormal, "RunCreated", "Create",
				fmt.Sprintf("Created run %s for occurrence %s (scheduled %s)", run.Name, t.Occurrence, t.Time.UTC().Format(time.RFC3339)))
			log.FromContext(ctx).Info("created scheduled run", "run", run.Name, "occurrence", t.Occurrence)
		default: // the occurrence's run, there already
			if st := r.liveStatus(ctx, s); st != nil && st.LastScheduleTime != nil && !st.LastScheduleTime.Time.Before(t.Time) {
				// A pass behind the write of the pass that dealt with the
				// tick (the run's own watch event started it): nothing new.
				log.FromContext(ctx).V(1).Info("the tick's run exists and the tick was dealt with", "run", run.Name)
			} else {
				r.event(s.sched, run, corev1.EventTypeNormal, "RunExists", "Create",
					fmt.Sprintf("Run %s of occurrence %s already exists: not started again", run.Name, t.Occurrence))
			}
		}
		s.lastRun = &v1alpha1.ScheduledRun{Name: run.Name, Occurrence: t.Occurrence}
	}
	return nil
}

// triggerRun starts the run of the occurrence the trigger annotation names,
// once: when its value is not the occurrence status.trigger records. As
// with `runledger schedule trigger --occurrence`, suspension and
// concurrencyPolicy do not apply, and AlreadyExists is the occurrence's run
// being there: never a second run.
func (r *ScheduleReconciler) triggerRun(ctx context.Context, s *schedScope) error {
	occ, ok := s.sched.Annotations[v1alpha1.AnnotationTrigger]
	if !ok {
		return nil
	}
	// An occurrence too long to record is refused, and recorded cut: the
	// same cut value is not dealt with again.
	recorded := v1alpha1.Truncate(occ, v1alpha1.MaxKeyPartBytes)
	if t := s.sched.Status.Trigger; t != nil && t.Occurrence == recorded {
		return nil
	}
	tr := &v1alpha1.TriggerStatus{Occurrence: recorded, Time: metav1.Time{Time: s.now}}
	refuse := func(msg string) {
		tr.Result, tr.Message = v1alpha1.TriggerRefused, v1alpha1.Truncate(msg, v1alpha1.MaxTriggerMessageLength)
		r.event(s.sched, nil, corev1.EventTypeWarning, "TriggerRefused", "Trigger", msg)
	}
	if problem := v1alpha1.KeyPartProblem(occ); problem != "" {
		refuse(fmt.Sprintf("annotation %s: the occurrence %s: no run started", v1alpha1.AnnotationTrigger, problem))
		s.trigger = tr
		return nil
	}
	run, created, err := manualrun.CreateOrFind(ctx, r.Client, s.sched, occ, time.Time{}, schedule.CreatedByTrigger,
		client.FieldOwner(v1alpha1.ControllerFieldManager))
	switch {
	case errors.Is(err, manualrun.ErrNameTaken):
		refuse(fmt.Sprintf("annotation %s: run name %s (occurrence %s) is taken by a ProcessingRun this schedule does not control, or of another occurrence: no run started",
			v1alpha1.AnnotationTrigger, run.Name, occ))
	case apierrors.IsInvalid(err):
		refuse(fmt.Sprintf("annotation %s: the run of occurrence %s is invalid: %v", v1alpha1.AnnotationTrigger, occ, errors.Unwrap(err)))
	case err != nil:
		return fmt.Errorf("the trigger annotation: %w", err)
	case created:
		tr.Result, tr.Run, s.triggered = v1alpha1.TriggerCreated, run.Name, run.Name
		schedRunsCreated.WithLabelValues(s.sched.Namespace, s.sched.Name).Inc()
		r.event(s.sched, run, corev1.EventTypeNormal, "RunCreated", "Trigger",
			fmt.Sprintf("Created run %s for occurrence %s (annotation %s)", run.Name, occ, v1alpha1.AnnotationTrigger))
		log.FromContext(ctx).Info("created triggered run", "run", run.Name, "occurrence", occ)
	default: // the occurrence's run, there already
		if st := r.liveStatus(ctx, s); st != nil && st.Trigger != nil && st.Trigger.Occurrence == recorded {
			return nil // a pass behind the write of the pass that dealt with it
		}
		tr.Result, tr.Run = v1alpha1.TriggerExists, run.Name
		r.event(s.sched, run, corev1.EventTypeNormal, "RunExists", "Trigger",
			fmt.Sprintf("Run %s of occurrence %s already exists: not started again (annotation %s)", run.Name, occ, v1alpha1.AnnotationTrigger))
	}
	s.trigger = tr
	return nil
}

// liveStatus is the schedule's status read past the cache, nil when it
// cannot be read (then the pass is taken as current).
func (r *ScheduleReconciler) liveStatus(ctx context.Context, s *schedScope) *v1alpha1.ProcessingScheduleStatus {
	if s.live != nil || r.APIReader == nil {
		return s.live
	}
	live := &v1alpha1.ProcessingSchedule{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.sched), live); err != nil || live.UID != s.sched.UID {
		return nil
	}
	s.live = &live.Status
	return s.live
}

// pruneHistory deletes the oldest finished runs beyond the history limits;
// an unfinished run is never deleted.
func (r *ScheduleReconciler) pruneHistory(ctx context.Context, s *schedScope) error {
	keepOK, keepFailed := s.sched.Spec.HistoryLimits()
	var ok, failed []*v1alpha1.ProcessingRun
	for i := range s.runs {
		run := &s.runs[i]
		c := finishedCondition(&run.Status)
		switch {
		case c == nil || run.DeletionTimestamp != nil:
		case c.Type == v1alpha1.ConditionComplete:
			ok = append(ok, run)
		default:
			failed = append(failed, run)
		}
	}
	for _, set := range []struct {
		runs []*v1alpha1.ProcessingRun
		keep int
	}{{ok, keepOK}, {failed, keepFailed}} {
		slices.SortStableFunc(set.runs, func(a, b *v1alpha1.ProcessingRun) int { return finishedAt(a).Compare(finishedAt(b)) })
		for _, run := range set.runs[:max(0, len(set.runs)-set.keep)] {
			err := r.Client.Delete(ctx, run, client.Preconditions{UID: &run.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete run %s beyond the history limit: %w", run.Name, err)
			}
			log.FromContext(ctx).Info("deleted run beyond the history limit", "run", run.Name, "phase", run.Status.Phase)
		}
	}
	return nil
}

// finishedAt is when a finished run completed (its creation if unknown).
func finishedAt(run *v1alpha1.ProcessingRun) time.Time {
	if run.Status.CompletionTime != nil {
		return run.Status.CompletionTime.Time
	}
	return run.CreationTimestamp.Time
}

func (r *ScheduleReconciler) event(sched *v1alpha1.ProcessingSchedule, related *v1alpha1.ProcessingRun, eventType, reason, action, note string) {
	if r.Recorder == nil {
		return
	}
	note = v1alpha1.Truncate(note, maxEventNote)
	if related == nil {
		r.Recorder.Eventf(sched, nil, eventType, reason, action, "%s", note)
		return
	}
	r.Recorder.Eventf(sched, related, eventType, reason, action, "%s", note)
}

// buildScheduleStatus is the status the schedule should have after the pass.
func buildScheduleStatus(s *schedScope) v1alpha1.ProcessingScheduleStatus {
	sched := s.sched
	st := *sched.Status.DeepCopy()
	st.ObservedGeneration = sched.Generation
	if s.parsed != nil {
		st.TimeZone = s.parsed.Location().String()
	} else {
		st.TimeZone = sched.Spec.TimeZoneName()
	}
	if last := s.decision.Last; last != nil {
		st.LastScheduleTime = &metav1.Time{Time: last.Time}
		st.LastScheduleLocalTime = last.LocalTime()
	}
	if s.lastRun != nil {
		st.LastRun = s.lastRun
	}
	if s.trigger != nil {
		st.Trigger = s.trigger
	}
	st.NextScheduleTime, st.NextOccurrence = nil, ""
	if n := s.decision.Next; n != nil && !sched.Spec.Suspend && s.stalled == nil {
		st.NextScheduleTime = &metav1.Time{Time: n.Time}
		st.NextOccurrence = n.Occurrence
	}
	st.MissedTicks += s.decision.MissedCount
	for _, m := range s.missed {
		st.Missed = append(st.Missed, v1alpha1.MissedTick{ScheduledTime: metav1.Time{Time: m.Time}, Occurrence: m.Occurrence, Reason: m.Reason})
	}
	if len(st.Missed) > v1alpha1.MaxMissedListed {
		st.Missed = st.Missed[len(st.Missed)-v1alpha1.MaxMissedListed:]
	}

	// Active: the unfinished runs this pass saw, less those it replaced,
	// plus those it created (the cache shows them later).
	replaced := map[string]bool{}
	for _, n := range s.replaced {
		replaced[n] = true
	}
	var active []v1alpha1.ScheduledRun
	seen := map[string]bool{}
	for _, run := range s.active {
		if !replaced[run.Name] {
			active = append(active, v1alpha1.ScheduledRun{Name: run.Name, Occurrence: run.Spec.Occurrence})
			seen[run.Name] = true
		}
	}
	for _, t := range s.decision.Start {
		if n := t.RunName; !seen[n] && slices.Contains(s.created, n) {
			active = append(active, v1alpha1.ScheduledRun{Name: n, Occurrence: t.Occurrence})
			seen[n] = true
		}
	}
	if n := s.triggered; n != "" && !seen[n] {
		active = append(active, v1alpha1.ScheduledRun{Name: n, Occurrence: s.trigger.Occurrence})
	}
	st.ActiveCount = int32(len(active))
	if len(active) > v1alpha1.MaxActiveListed {
		active = active[len(active)-v1alpha1.MaxActiveListed:]
	}
	st.Active = active

	for i := range s.runs {
		run := &s.runs[i]
		if c := finishedCondition(&run.Status); c != nil && c.Type == v1alpha1.ConditionComplete && run.Status.CompletionTime != nil &&
			(st.LastSuccessfulTime == nil || run.Status.CompletionTime.After(st.LastSuccessfulTime.Time)) {
			st.LastSuccessfulTime = run.Status.CompletionTime.DeepCopy()
			st.LastSuccessfulRun = &v1alpha1.ScheduledRun{Name: run.Name, Occurrence: run.Spec.Occurrence}
		}
	}
	st.Conditions = scheduleConditions(s, &st)
	return st
}

// scheduleConditions: Ready, Stalled and Reconciling as kstatus reads them
// (Stalled and Reconciling only when True), and Suspended.
func scheduleConditions(s *schedScope, st *v1alpha1.ProcessingScheduleStatus) []metav1.Condition {
	conds := make([]metav1.Condition, 0, 4)
	for _, c := range s.sched.Status.Conditions {
		conds = append(conds, *c.DeepCopy())
	}
	gen := s.sched.Generation
	set := func(t string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&conds, metav1.Condition{Type: t, Status: status, Reason: reason, Message: truncateMessage(msg), ObservedGeneration: gen})
	}
	unset := func(t string) { meta.RemoveStatusCondition(&conds, t) }
	if s.sched.Spec.Suspend {
		set(v1alpha1.ConditionSuspended, metav1.ConditionTrue, ReasonSuspended, "suspended: ticks start no run (they are recorded as missed); set spec.suspend to false to resume")
	} else if c := meta.FindStatusCondition(conds, v1alpha1.ConditionSuspended); c != nil {
		set(v1alpha1.ConditionSuspended, metav1.ConditionFalse, ReasonResumed, "resumed")
	}
	switch {
	case s.stalled != nil:
		set(v1alpha1.ConditionStalled, metav1.ConditionTrue, s.stalled.reason, s.stalled.message)
		set(v1alpha1.ConditionReady, metav1.ConditionFalse, s.stalled.reason, s.stalled.message)
		unset(v1alpha1.ConditionReconciling)
		return conds
	case s.stepErr != nil:
		set(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonReconcileError, s.stepErr.Error()+" (retrying)")
	case s.decision.More:
		set(v1alpha1.ConditionReconciling, metav1.ConditionTrue, ReasonCatchingUp, "more ticks are due than one pass starts: going on")
	default:
		unset(v1alpha1.ConditionReconciling)
	}
	unset(v1alpha1.ConditionStalled)
	switch {
	case s.sched.Spec.Suspend:
		set(v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonSuspended, "suspended")
	case st.NextScheduleTime == nil:
		set(v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonNoMoreTicks, "the schedule names no time in the next five years")
	default:
		set(v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonScheduled, fmt.Sprintf("next tick at %s (%s), occurrence %s",
			st.NextScheduleTime.UTC().Format(time.RFC3339), st.TimeZone, st.NextOccurrence))
	}
	return conds
}

// writeScheduleStatus writes the status by server-side apply, pinned to the
// resourceVersion read (a stale pass never moves lastScheduleTime back),
// and the schedule's metrics.
func (r *ScheduleReconciler) writeScheduleStatus(ctx context.Context, s *schedScope) error {
	desired := buildScheduleStatus(s)
	recordScheduleMetrics(s.sched, &desired)
	if equality.Semantic.DeepEqual(s.sched.Status, desired) {
		return nil
	}
	status, err := applyConfigurationOf[acv1alpha1.ProcessingScheduleStatusApplyConfiguration](&desired)
	if err != nil {
		return err
	}
	apply := func(resourceVersion string) error {
		ac := acv1alpha1.ProcessingSchedule(s.sched.Name, s.sched.Namespace).WithUID(s.sched.UID).
			WithResourceVersion(resourceVersion).WithStatus(status)
		return r.Client.Status().Apply(ctx, ac, client.FieldOwner(v1alpha1.ControllerFieldManager), client.ForceOwnership)
	}
	err = apply(s.sched.ResourceVersion)
	if apierrors.IsConflict(err) {
		statusConflicts.Inc()
		var retry bool
		if retry, err = r.recordStartedTicks(ctx, s, &desired, apply); !retry && err == nil {
			log.FromContext(ctx).V(1).Info("schedule status not written: the schedule changed since it was read")
			s.requeue = cacheWaitRequeue
			return nil
		}
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("apply status: %w", err)
	}
	// Once written, so that a pass whose write was refused announces
	// nothing the next pass announces again.
	r.missedEvents(s)
	for reason, n := range s.decision.MissedBy {
		if n > 0 {
			schedMissed.WithLabelValues(s.sched.Namespace, s.sched.Name, string(reason)).Add(float64(n))
		}
	}
	return nil
}

// recordStartedTicks writes, after the schedule changed under a pass that
// started the runs of ticks (a user's edit between its read and its write),
// the status that records them, on the schedule as it is now (apply with its
// resourceVersion): the runs exist whatever changed, and a next pass that
// found those ticks due again would report the runs as found again, or the
// ticks as missed if the edit suspended the schedule. It does not when the
// pass started no tick, or a later write already recorded its last tick
// (retried is false then).
func (r *ScheduleReconciler) recordStartedTicks(ctx context.Context, s *schedScope, desired *v1alpha1.ProcessingScheduleStatus,
	apply func(resourceVersion string) error) (retried bool, err error) {
	if len(s.created) == 0 || desired.LastScheduleTime == nil || r.APIReader == nil {
		return false, nil
	}
	live := &v1alpha1.ProcessingSchedule{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.sched), live); err != nil {
		return false, fmt.Errorf("get processingschedule to record started ticks: %w", err)
	}
	if live.UID != s.sched.UID || (live.Status.LastScheduleTime != nil && !live.Status.LastScheduleTime.Before(desired.LastScheduleTime)) {
		return false, nil
	}
	log.FromContext(ctx).V(1).Info("the schedule changed during the pass that started runs: recording them on its latest version", "runs", s.created)
	return true, apply(live.ResourceVersion)
}

// missedEvents records an Event per missed tick listed, and one for the
// rest. Each names as related the run its tick did not start: the event
// recorder merges Events of the same reason about the same object version
// and related object into one series that keeps the first note, which
// would leave one tick of a catch-up pass visible.
func (r *ScheduleReconciler) missedEvents(s *schedScope) {
	for _, m := range s.missed {
		notStarted := &v1alpha1.ProcessingRun{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProcessingRun"},
			ObjectMeta: metav1.ObjectMeta{Namespace: s.sched.Namespace, Name: m.RunName},
		}
		reason, note := "Missed", fmt.Sprintf("Tick %s (occurrence %s) started no run: %s", m.Time.UTC().Format(time.RFC3339), m.Occurrence, m.Reason)
		if m.Reason == v1alpha1.MissedConcurrencyForbidden {
			reason = "Skipped"
			note = fmt.Sprintf("Tick %s (occurrence %s) skipped: a run is unfinished and concurrencyPolicy is Forbid", m.Time.UTC().Format(time.RFC3339), m.Occurrence)
		}
		r.event(s.sched, notStarted, corev1.EventTypeWarning, reason, "Schedule", note)
	}
	if n := s.decision.MissedCount - int64(len(s.missed)); n > 0 {
		r.event(s.sched, nil, corev1.EventTypeWarning, "Missed", "Schedule", fmt.Sprintf("%d more ticks started no run (status.missedTicks counts them)", n))
	}
}

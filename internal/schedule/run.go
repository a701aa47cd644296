package schedule

import (
	"maps"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

// Who created a scheduled run (AnnotationCreatedBy).
const (
	CreatedByController = "controller"
	CreatedByTrigger    = "trigger"
	CreatedByBackfill   = "backfill"
)

// NewRun is the run of occurrence occ of sched: the runTemplate, named
// RunName(schedule, occ), owned by the schedule (so its garbage collection
// goes with it), labelled with the schedule, its spec.occurrence set. at is
// the tick's scheduled time, zero for a trigger that names no time.
func NewRun(sched *v1alpha1.ProcessingSchedule, occ string, at time.Time, createdBy string) *v1alpha1.ProcessingRun {
	t := sched.Spec.RunTemplate
	labels := map[string]string{}
	annotations := map[string]string{}
	if t.Metadata != nil {
		maps.Copy(labels, t.Metadata.Labels)
		maps.Copy(annotations, t.Metadata.Annotations)
	}
	labels[v1alpha1.LabelSchedule] = sched.Name
	annotations[v1alpha1.AnnotationOccurrence] = occ
	annotations[v1alpha1.AnnotationCreatedBy] = createdBy
	if !at.IsZero() {
		annotations[v1alpha1.AnnotationScheduledTime] = at.UTC().Format(time.RFC3339)
	}
	spec := *t.Spec.DeepCopy()
	spec.Occurrence = occ
	return &v1alpha1.ProcessingRun{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProcessingRun"},
		ObjectMeta: metav1.ObjectMeta{
			Name: RunName(sched.Name, occ), Namespace: sched.Namespace, Labels: labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProcessingSchedule", Name: sched.Name, UID: sched.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: spec,
	}
}

// IsRunOf reports whether run is sched's run of occurrence occ: controlled
// by this schedule (its UID, not only its name) with that occurrence. A
// name already taken by anything else is not this occurrence's run.
func IsRunOf(run *v1alpha1.ProcessingRun, sched *v1alpha1.ProcessingSchedule, occ string) bool {
	owner := metav1.GetControllerOf(run)
	return owner != nil && owner.UID == sched.UID && owner.Kind == "ProcessingSchedule" && run.Spec.Occurrence == occ
}

// StartedAt is the scheduled time of the tick that started run, when the
// controller created it for a tick (AnnotationCreatedBy and
// AnnotationScheduledTime, both the controller's, never the template's).
func StartedAt(run *v1alpha1.ProcessingRun) (time.Time, bool) {
	if run.Annotations[v1alpha1.AnnotationCreatedBy] != CreatedByController {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339, run.Annotations[v1alpha1.AnnotationScheduledTime])
	return at, err == nil
}

package console

import (
	"fmt"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/controllers"
)

// runWatch holds the runs of the console's namespace (all namespaces for
// "") and the progress samples of each (its chart).
type runWatch struct {
	watched
	// samples are each run's progress as the watch saw it (its chart),
	// under watched.mu.
	samples map[string][]sample
	now     func() time.Time
}

func newRunWatch(c client.WithWatch, namespace string) *runWatch {
	w := &runWatch{samples: map[string][]sample{}, now: time.Now}
	w.init(c, namespace, func() client.ObjectList { return &v1alpha1.ProcessingRunList{} }, &v1alpha1.ProcessingRun{}, func(obj any, deleted bool) {
		if deleted {
			w.forget(obj)
		} else {
			w.record(obj)
		}
	})
	return w
}

// state is the runs now, a channel closed at the next change, and the
// error of the last list or watch.
func (w *runWatch) state() ([]*v1alpha1.ProcessingRun, <-chan struct{}, error) {
	changed, err := w.next()
	return objects[v1alpha1.ProcessingRun](&w.watched), changed, err
}

// run is run ns/name as the informer holds it (nil: it has none).
func (w *runWatch) run(ns, name string) *v1alpha1.ProcessingRun {
	return object[v1alpha1.ProcessingRun](&w.watched, ns, name)
}

// runRow is one line of the runs page, as the page renders it and the
// event stream sends it.
type runRow struct {
	Namespace      string `json:"namespace"`
	Name           string `json:"name"`
	Phase          string `json:"phase"`
	Total          int64  `json:"total"`
	Completed      int64  `json:"completed"`
	AlreadyHandled int64  `json:"alreadyHandled"`
	Failed         int64  `json:"failed"`
	// Percent processed (completed, already handled and failed) of total.
	Percent  int    `json:"percent"`
	Age      string `json:"age"`
	Schedule string `json:"schedule"`
	// Queue is the run's Kueue LocalQueue (its queue-name label), Admission
	// its Admitted condition's reason (Queued, Admitted, Evicted: the
	// Admission printer column's value).
	Queue     string `json:"queue,omitempty"`
	Admission string `json:"admission,omitempty"`
	// Ledger: the row comes from the ledger database alone (no cluster).
	Ledger bool `json:"ledger,omitempty"`
}

func rowOf(run *v1alpha1.ProcessingRun, now time.Time) runRow {
	st := run.Status
	phase := string(st.Phase)
	if phase == "" {
		phase = "Pending"
	}
	return runRow{
		Namespace: run.Namespace, Name: run.Name, Phase: phase,
		Total: st.Total, Completed: st.Completed, AlreadyHandled: st.AlreadyHandled, Failed: st.Failed,
		Percent:   percent(st.Processed(), st.Total),
		Age:       age(now.Sub(run.CreationTimestamp.Time)),
		Schedule:  scheduleOf(run),
		Queue:     run.Labels[controllers.LabelQueueName],
		Admission: admission(run),
	}
}

// admission is the reason of run's Admitted condition ("" without one: a
// run in no Kueue queue).
func admission(run *v1alpha1.ProcessingRun) string {
	if c := meta.FindStatusCondition(run.Status.Conditions, v1alpha1.ConditionAdmitted); c != nil {
		return c.Reason
	}
	return ""
}

// scheduleOf is the name of the schedule that created run, if one did.
func scheduleOf(run *v1alpha1.ProcessingRun) string {
	for _, ref := range run.OwnerReferences {
		if ref.Kind == "ProcessingSchedule" {
			return ref.Name
		}
	}
	return run.Labels[v1alpha1.LabelSchedule]
}

func percent(done, total int64) int {
	if total <= 0 {
		return 0
	}
	return int(min(100, done*100/total))
}

// age is d as kubectl prints an age: 42s, 5m, 3h, 2d.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// rows are runs in namespace ns ("" for all), newest first.
func rows(runs []*v1alpha1.ProcessingRun, ns string, now time.Time) []runRow {
	sort.Slice(runs, func(i, j int) bool {
		a, b := runs[i], runs[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return b.CreationTimestamp.Before(&a.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	out := []runRow{}
	for _, run := range runs {
		if ns == "" || run.Namespace == ns {
			out = append(out, rowOf(run, now))
		}
	}
	return out
}

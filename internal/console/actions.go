package console

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/controllers"
)

// action is what the console may do to a run, each through the API server
// as the user.
type action struct {
	Name     string
	Verb     string // the confirmation's button
	Question string // what the confirmation asks, of the run's name
	do       func(ctx context.Context, c client.Client, run *v1alpha1.ProcessingRun) (result, error)
}

// result is where an action sends the browser: the page of run (the
// runs' without one), with a note.
type result struct {
	run, note string
}

var actions = map[string]action{
	"retry": {Name: "retry", Verb: "Create the retry run",
		Question: "Create a run whose batch is the failed items of %s (batch.fromRun), with its spec otherwise?", do: retry},
	"suspend": {Name: "suspend", Verb: "Suspend",
		Question: "Suspend %s (spec.suspend: true): its worker pods stop, and it waits?", do: suspend(true)},
	"resume": {Name: "resume", Verb: "Resume",
		Question: "Resume %s (spec.suspend: false)?", do: suspend(false)},
	"delete": {Name: "delete", Verb: "Delete",
		Question: "Delete the finished run %s? Its ledger rows stay (runledger items and key still read them).", do: remove},
}

// RetryName is the name of the run retrying the failed items of the run
// named name whose uid is uid: NAME-retry-HASH, HASH the first hex digits
// of the uid's SHA-256, so that a second retry of the same run (a double
// submit, a second tab) finds the first instead of creating another, and a
// run of the same name made later (another uid) gets a retry of its own.
func RetryName(name string, uid types.UID) string {
	sum := sha256.Sum256([]byte(uid))
	suffix := "-retry-" + hex.EncodeToString(sum[:])[:retryHashLen]
	if len(name) > v1alpha1.MaxRunNameLength-len(suffix) {
		name = strings.TrimRight(name[:v1alpha1.MaxRunNameLength-len(suffix)], "-.")
	}
	return name + suffix
}

// retryHashLen is the length of the hash of a retry's name.
const retryHashLen = 6

// errNotTheRetry: a retry's name is taken by a run that does not retry
// that run's failed items.
var errNotTheRetry = errors.New("is taken by a run that does not retry this run's failed items")

// retry creates the run whose batch is run's failed items (retryRun), or
// finds it there already (its name is the run's own: a second submit
// creates nothing).
func retry(ctx context.Context, c client.Client, run *v1alpha1.ProcessingRun) (result, error) {
	next := retryRun(run)
	err := c.Create(ctx, next)
	if apierrors.IsAlreadyExists(err) {
		existing := &v1alpha1.ProcessingRun{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(next), existing); err != nil {
			return result{}, fmt.Errorf("reading run %s, which exists: %w", next.Name, err)
		}
		if from := existing.Spec.Batch.FromRun; from == nil || from.Name != run.Name || from.Verdict != v1alpha1.FromRunFailed {
			return result{}, fmt.Errorf("creating a run retrying %s/%s: the name %s %w", run.Namespace, run.Name, next.Name, errNotTheRetry)
		}
		return result{run: next.Name, note: noteRetryFound}, nil
	}
	if err != nil {
		return result{}, fmt.Errorf("creating a run retrying %s/%s: %w", run.Namespace, run.Name, err)
	}
	return result{run: next.Name}, nil
}

// retryRun is the run retrying run's failed items: run's spec, with batch
// {fromRun: {name: run}} and not suspended, in run's Kueue queue if it has
// one (no other label: a schedule's would make it look like one of its
// occurrences).
func retryRun(run *v1alpha1.ProcessingRun) *v1alpha1.ProcessingRun {
	spec := *run.Spec.DeepCopy()
	spec.Batch = v1alpha1.BatchSpec{FromRun: &v1alpha1.FromRunSource{Name: run.Name, Verdict: v1alpha1.FromRunFailed}}
	spec.Suspend = false
	next := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: run.Namespace, Name: RetryName(run.Name, run.UID)},
		Spec:       spec,
	}
	if q, ok := run.Labels[controllers.LabelQueueName]; ok {
		next.Labels = map[string]string{controllers.LabelQueueName: q}
	}
	return next
}

func suspend(on bool) func(ctx context.Context, c client.Client, run *v1alpha1.ProcessingRun) (result, error) {
	return func(ctx context.Context, c client.Client, run *v1alpha1.ProcessingRun) (result, error) {
		patch := fmt.Appendf(nil, `{"metadata":{"uid":%q},"spec":{"suspend":%t}}`, run.UID, on)
		if err := c.Patch(ctx, run, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return result{}, fmt.Errorf("setting spec.suspend of %s/%s to %t: %w", run.Namespace, run.Name, on, err)
		}
		return result{run: run.Name}, nil
	}
}

var errUnfinished = errors.New("the run has not finished (phase Succeeded or Failed): suspend it first, or wait")

func remove(ctx context.Context, c client.Client, run *v1alpha1.ProcessingRun) (result, error) {
	if !finished(run) {
		return result{}, fmt.Errorf("deleting %s/%s: %w", run.Namespace, run.Name, errUnfinished)
	}
	if err := c.Delete(ctx, run, client.Preconditions{UID: &run.UID, ResourceVersion: &run.ResourceVersion}); err != nil {
		return result{}, fmt.Errorf("deleting %s/%s: %w", run.Namespace, run.Name, err)
	}
	return result{}, nil
}

// confirmData is a confirmation page's.
type confirmData struct {
	Namespace, Name string
	Action          action
	Question        string
}

// actionOf is the request's action and run, or false once it answered
// that there is no such action (or no cluster to act on).
func (s *Server) actionOf(w http.ResponseWriter, r *http.Request) (a action, ns, name string, ok bool) {
	a, ok = actions[r.PathValue("action")]
	if !ok || s.o.Kube == nil {
		s.fail(w, "action", fmt.Errorf("action %q: %w (actions need a cluster)", r.PathValue("action"), errNotFound))
		return action{}, "", "", false
	}
	return a, r.PathValue("namespace"), r.PathValue("name"), true
}

func (s *Server) confirmPage(w http.ResponseWriter, r *http.Request) {
	a, ns, name, ok := s.actionOf(w, r)
	if !ok {
		return
	}
	s.render(w, http.StatusOK, "confirm", a.Verb+" "+ns+"/"+name, confirmData{
		Namespace: ns, Name: name, Action: a, Question: fmt.Sprintf(a.Question, ns+"/"+name),
	})
}

// act does a confirmed action (ServeHTTP checked its origin and token)
// and sends the browser on to the run's page (the new run's for a retry,
// the runs' after a delete).
func (s *Server) act(w http.ResponseWriter, r *http.Request) {
	a, ns, name, ok := s.actionOf(w, r)
	if !ok {
		return
	}
	what := a.Verb + " " + ns + "/" + name
	run := &v1alpha1.ProcessingRun{}
	if err := s.o.Kube.Get(r.Context(), types.NamespacedName{Namespace: ns, Name: name}, run); err != nil {
		s.fail(w, what, err)
		return
	}
	res, err := a.do(r.Context(), s.o.Kube, run)
	if err != nil {
		if errors.Is(err, errUnfinished) || errors.Is(err, errNotTheRetry) {
			err = apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("processingruns").GroupResource(), name, err)
		}
		s.fail(w, what, err)
		return
	}
	s.o.Log.Info("action done", "action", a.Name, "run", ns+"/"+name, "result", res.run, "note", res.note)
	target := "/"
	if res.run != "" {
		target = "/runs/" + ns + "/" + res.run
	}
	if res.note != "" {
		target += "?note=" + res.note
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

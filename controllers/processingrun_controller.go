package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
)

// The manager's permissions, least privilege (make manifests turns these
// into config/rbac/role.yaml). Secrets: none at all, so the manager never
// receives a DSN; a missing Secret shows on the worker pod (see
// checkDependencies). Update on
// processingruns/finalizers lets its pods' owner references set
// blockOwnerDeletion where OwnerReferencesPermissionEnforcement is on.
//
// +kubebuilder:rbac:groups=processing.runledger.dev,resources=processingruns,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=processing.runledger.dev,resources=processingruns/status,verbs=get;patch
// +kubebuilder:rbac:groups=processing.runledger.dev,resources=processingruns/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// labelRunUIDKey selects worker pods.
const labelRunUIDKey = v1alpha1.LabelRunUID

// runOwnerKey indexes worker pods, and the Workloads of queued runs, by the
// name of the run that controls them.
const runOwnerKey = ".metadata.controller.processingrun"

// podNodeKey indexes worker pods by their node's name.
const podNodeKey = ".spec.nodeName"

// Defaults of the Reconciler's tunables.
const (
	DefaultBackoffBase     = 10 * time.Second
	DefaultBackoffMax      = 6 * time.Minute
	DefaultDependencyRetry = 15 * time.Second
	DefaultStatusInterval  = 2 * time.Second
	cacheWaitRequeue       = 2 * time.Second
)

// Reconciler turns ProcessingRuns into worker pods, one per shard, and keeps
// their status honest. See doc.go for the protocol.
type Reconciler struct {
	Client client.Client
	// APIReader reads around the cache: ConfigMaps and ServiceAccounts (not worth caching cluster-wide), and pods the cache
	// may not show yet.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Clock     clock.PassiveClock
	Pods      PodOptions
	// WorkerNetwork, when set, is what worker pods may reach: each run gets
	// a NetworkPolicy saying it before its first pod (netpol.go).
	WorkerNetwork *WorkerNetwork

	// BackoffBase and BackoffMax bound the exponential back-off between a
	// shard's failed attempt and its retry.
	BackoffBase, BackoffMax time.Duration
	// DependencyRetry is how often a run waiting for its Secret, ConfigMap
	// or ServiceAccount looks again.
	DependencyRetry time.Duration
	// StatusInterval is the least time between two status writes that only
	// change counts (workers report every 2 s each; phases and conditions
	// are always written at once).
	StatusInterval time.Duration

	// ConnectionBudget is the manager's default and maximum of every run's
	// connection budget (--run-max-connections-default and -maximum).
	ConnectionBudget v1alpha1.ConnectionBudgetSettings

	// Kueue turns on the Kueue integration: runs labelled
	// kueue.x-k8s.io/queue-name wait for their Workload's admission. It
	// needs Kueue's CRDs.
	Kueue bool

	expectations *expectations
	lastWrites   sync.Map // types.NamespacedName -> lastWrite
}

// lastWrite is when the controller last wrote a run's status.
type lastWrite struct {
	uid types.UID
	at  time.Time
}

// SetupWithManager registers the reconciler, its pod index and its watches.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.BackoffBase <= 0 {
		r.BackoffBase = DefaultBackoffBase
	}
	if r.BackoffMax <= 0 {
		r.BackoffMax = DefaultBackoffMax
	}
	if r.DependencyRetry <= 0 {
		r.DependencyRetry = DefaultDependencyRetry
	}
	if r.StatusInterval < 0 {
		r.StatusInterval = 0
	}
	r.expectations = newExpectations(r.Clock.Now)
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, runOwnerKey, indexRunOwner); err != nil {
		return fmt.Errorf("index pods by owner run: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, podNodeKey, indexPodNode); err != nil {
		return fmt.Errorf("index pods by node: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ProcessingRun{}).
		Owns(&corev1.Pod{})
	if r.Kueue {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &kueue.Workload{}, runOwnerKey, indexRunOwner); err != nil {
			return fmt.Errorf("index workloads by owner run: %w", err)
		}
		b = b.Owns(&kueue.Workload{})
	}
	return b.
		// A node going NotReady changes none of its pods at first: look at
		// the runs with pods there (podOnLostNode).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.runsOnNode),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: nodeReadyChanged})).
		Named("processingrun").
		WithOptions(opts).
		Complete(r)
}

func indexPodNode(obj client.Object) []string {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return nil
	}
	return []string{pod.Spec.NodeName}
}

// runsOnNode are the runs with a worker pod on a node.
func (r *Reconciler) runsOnNode(ctx context.Context, node client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.MatchingFields{podNodeKey: node.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "list pods of a node", "node", node.GetName())
		return nil
	}
	seen := map[types.NamespacedName]bool{}
	var out []reconcile.Request
	for i := range pods.Items {
		for _, owner := range indexRunOwner(&pods.Items[i]) {
			key := types.NamespacedName{Namespace: pods.Items[i].Namespace, Name: owner}
			if !seen[key] {
				seen[key] = true
				out = append(out, reconcile.Request{NamespacedName: key})
			}
		}
	}
	return out
}

// nodeReadyChanged: a node's Ready condition changed status.
func nodeReadyChanged(e event.UpdateEvent) bool {
	ready := func(o client.Object) corev1.ConditionStatus {
		if n, ok := o.(*corev1.Node); ok {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					return c.Status
				}
			}
		}
		return ""
	}
	return ready(e.ObjectOld) != ready(e.ObjectNew)
}

func indexRunOwner(obj client.Object) []string {
	owner := metav1.GetControllerOf(obj)
	if owner == nil || owner.APIVersion != v1alpha1.GroupVersion.String() || owner.Kind != "ProcessingRun" {
		return nil
	}
	return []string{owner.Name}
}

// scope is what one reconcile pass knows and decides about a run.
type scope struct {
	run    *v1alpha1.ProcessingRun
	key    types.NamespacedName
	now    time.Time
	inputs []shardInput
	shards []shardDecision
	// outcome is the run's phase and result after this pass.
	outcome runOutcome
	// stalled is what keeps the run from progressing, if anything.
	stalled   *problem
	startTime *metav1.Time
	// createBlocked: a pod create was Forbidden or Invalid in this pass; no
	// other pod is created in it. podsBlocked counts the creates skipped.
	createBlocked bool
	podsBlocked   int
	// requeueAfter collects when the run wants to be looked at again.
	requeueAfter time.Duration
	// stepErr is the error that ended the pass's steps, if any; the status
	// written at the end says so.
	stepErr error
	// queue is the run's Kueue Workload and what the pass decided about
	// it; nil for a run outside Kueue (or with the integration off).
	queue *queueView
	// budget is the run's connection budget in this pass, budgetOut what
	// holding the shards within it decided (decideBudget).
	budget    runBudget
	budgetOut budgetOutcome
	// replication is what the latest report of the run's workers says of
	// the ledger's replication, nil when none says.
	replication *v1alpha1.LedgerReplication
}

func (s *scope) requeueIn(d time.Duration) {
	if d > 0 && (s.requeueAfter == 0 || d < s.requeueAfter) {
		s.requeueAfter = d
	}
}

// decide sets the run's outcome from its shards (decideRun), failing a run
// that outlived spec.activeDeadlineSeconds, and asks to look again when its
// deadline comes.
func (s *scope) decide() {
	s.outcome = decideRun(s.run, s.shards, s.startTime != nil)
	if s.outcome.finished {
		return
	}
	if s.held() {
		// Kueue holds it: suspended, and no deadline runs meanwhile.
		s.outcome.phase = v1alpha1.RunSuspended
		return
	}
	left, ok := deadlineLeft(s.run, s.startTime, s.now)
	switch {
	case !ok:
	case left > 0:
		s.requeueIn(left)
	default:
		s.outcome = runOutcome{phase: v1alpha1.RunFailed, reason: ReasonDeadlineExceeded, finished: true,
			counts: sumCounts(s.run, s.shards, false),
			message: fmt.Sprintf("the run was active longer than activeDeadlineSeconds (%ds); its pods are stopped",
				*s.run.Spec.ActiveDeadlineSeconds)}
	}
}

// needsPods reports whether any shard wants a pod created now.
func (s *scope) needsPods() bool {
	for _, d := range s.shards {
		if d.create != nil {
			return true
		}
	}
	return false
}

func (s *scope) stepFailed(err error)        { s.stepErr = err }
func (s *scope) requeueDelay() time.Duration { return s.requeueAfter }

// Reconcile fetches the run, lets it go when it is deleted or expired, and
// otherwise runs a pass (runSteps): observe the queue and the pods, sync
// the queue, check what the pods need, create or delete pods, write the
// status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	// The same key as the workers' and runledger run's logs.
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("run", req.Namespace+"/"+req.Name))
	run := &v1alpha1.ProcessingRun{}
	if err := r.Client.Get(ctx, req.NamespacedName, run); err != nil {
		if apierrors.IsNotFound(err) {
			// Its pods go with it (owner references); its ledger rows stay.
			r.expectations.forget(req.NamespacedName)
			r.lastWrites.Delete(req.NamespacedName)
			return ctrl.Result{}, r.cleanupWorkloads(ctx, req.NamespacedName, "")
		}
		return ctrl.Result{}, fmt.Errorf("get processingrun: %w", err)
	}
	if run.DeletionTimestamp != nil {
		return ctrl.Result{}, r.cleanupWorkloads(ctx, req.NamespacedName, run.UID)
	}
	if run.Spec.ManagedByOther() {
		// Another controller runs it (spec.managedBy): no pod, no status.
		return ctrl.Result{}, r.reconcileManagedElsewhere(ctx, run)
	}
	expired, ttlWait, err := r.expireTTL(ctx, run)
	if expired || err != nil {
		return ctrl.Result{}, err
	}
	return r.runSteps(ctx, run, ttlWait)
}

// runSteps runs a pass (pass.run) over a fresh scope: observe the queue
// and the pods; sync the Workload, check what the pods need, create or
// delete pods; write the status, on every path once the pods were observed,
// the error that ended the steps as Reconciling's reason.
func (r *Reconciler) runSteps(ctx context.Context, run *v1alpha1.ProcessingRun, requeue time.Duration) (ctrl.Result, error) {
	s := &scope{run: run, key: client.ObjectKeyFromObject(run), now: r.Clock.Now()}
	s.requeueIn(requeue)
	result, err := pass[*scope]{
		observe: []step[*scope]{{"observeQueue", r.observeQueue}, {"observe", r.observe}},
		steps:   []step[*scope]{{"syncQueue", r.syncQueue}, {"checkDependencies", r.checkDependencies}, {"syncPods", r.syncPods}},
		write:   r.writeStatus,
	}.run(ctx, s)
	if err == nil {
		log.FromContext(ctx).V(1).Info("reconciled", "phase", s.outcome.phase)
	}
	return result, err
}

package controllers

import (
	"context"
	"fmt"
	"github.com/distribution/reference"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	acv1alpha1 "github.com/runledger/runledger/api/applyconfiguration/api/v1alpha1"
	"github.com/runledger/runledger/api/v1alpha1"
)

// observe reads the run's pods from the cache and decides, per shard, what
// they mean and what to do (decideShard), then what that means for the run
// (decideRun).
func (r *Reconciler) observe(ctx context.Context, s *scope) error {
	run := s.run
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(run.Namespace), client.MatchingFields{runOwnerKey: run.Name}); err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	n := run.Spec.ShardCount()
	byShard := make([][]podInfo, n)
	s.startTime = run.Status.StartTime
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Labels[v1alpha1.LabelRunUID] != string(run.UID) {
			continue // a pod of an earlier run of the same name, on its way out
		}
		shard, err := strconv.ParseInt(pod.Labels[v1alpha1.LabelShard], 10, 32)
		if err != nil || shard < 0 || shard >= int64(n) {
			continue
		}
		info, ok := observePod(pod, int32(shard))
		if !ok {
			continue
		}
		if info.state == podLive {
			if err := r.observeNode(ctx, run, &info, s.now); err != nil {
				return err
			}
		}
		byShard[shard] = append(byShard[shard], info)
		if s.startTime == nil || pod.CreationTimestamp.Before(s.startTime) {
			s.startTime = pod.CreationTimestamp.DeepCopy()
		}
	}

	// The run's reporter's pod carries every shard's progress.
	foldRunReports(byShard)
	s.replication = latestReplication(byShard)

	entries := make(map[int32]*v1alpha1.ShardStatus, len(run.Status.Shards))
	for i := range run.Status.Shards {
		entries[run.Status.Shards[i].Index] = &run.Status.Shards[i]
	}
	s.inputs = make([]shardInput, n)
	for i := range n {
		// The entry as the latest report on the shard's pods leaves it.
		in := shardInput{runName: run.Name, index: i, pods: byShard[i], entry: withProgress(entries[i], i, byShard[i]), recordedAttempt: -1}
		if in.entry != nil && in.entry.Pod != "" {
			in.recordedAttempt = attemptOfPodName(in.entry.Pod, i)
		}
		cached := int32(-1)
		for _, p := range in.pods {
			cached = max(cached, p.attempt)
		}
		if pending, ok := r.expectations.pending(s.key, run.UID, i, cached); ok {
			// Created by this process, not in the cache yet: wait for it.
			in.recordedAttempt = max(in.recordedAttempt, pending)
		} else if in.recordedAttempt > cached && (s.suspended() || finishedCondition(&run.Status) != nil) {
			// Nothing will be created: no need to ask the API server.
			in.recordedGone = true
		} else if in.recordedAttempt > cached {
			gone, err := r.podGone(ctx, run, in.entry.Pod)
			if err != nil {
				return err
			}
			in.recordedGone = gone
		}
		s.inputs[i] = in
	}

	finishedBefore := finishedCondition(&run.Status) != nil
	var admitted int32
	if s.queue != nil && !s.queue.decision.held {
		admitted = admittedPods(s.queue.wl)
	}
	s.budget = budgetFor(run, r.ConnectionBudget, admitted)
	s.shards = r.decideShards(s, finishedBefore)
	s.decide()
	if s.outcome.finished && !finishedBefore {
		// The run just finished: no more pods, and the live ones stop.
		s.shards = r.decideShards(s, true)
	}
	return nil
}

// observeNode marks a live pod lost when its node is (podOnLostNode).
func (r *Reconciler) observeNode(ctx context.Context, run *v1alpha1.ProcessingRun, info *podInfo, now time.Time) error {
	name := info.pod.Spec.NodeName
	if name == "" {
		return nil
	}
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, node); apierrors.IsNotFound(err) {
		node = nil
	} else if err != nil {
		return fmt.Errorf("get node %s: %w", name, err)
	}
	info.lost, info.lostIn, info.lostWhy = podOnLostNode(info.pod, node, run.Spec.NodeLostAfter(), now)
	return nil
}

func (r *Reconciler) decideShards(s *scope, stopped bool) []shardDecision {
	p := shardPolicy{
		backoffLimit: s.run.Spec.BackoffLimitOrDefault(),
		backoffBase:  r.BackoffBase,
		backoffMax:   r.BackoffMax,
		suspended:    s.suspended(),
		stopped:      stopped,
	}
	out := make([]shardDecision, len(s.inputs))
	for i, in := range s.inputs {
		out[i] = decideShard(in, p, s.now)
	}
	s.budgetOut = decideBudget(out, s.budget.parallelism, p.suspended || p.stopped)
	return out
}

// podGone asks the API server (not the cache) whether a recorded pod still
// exists. A pod of the same name that belongs to another run counts as
// existing: nothing is created under its name until it is gone.
func (r *Reconciler) podGone(ctx context.Context, run *v1alpha1.ProcessingRun, name string) (bool, error) {
	pod := &metav1.PartialObjectMetadata{}
	pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: name}, pod)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get pod %s: %w", name, err)
	default:
		return false, nil
	}
}

// checkDependencies makes sure a pod can start before creating it: a valid
// image, the ConfigMap and the ServiceAccount exist. A missing one stalls the
// run (condition and Event) and no pod is created, so nothing crash-loops;
// the run looks again every DependencyRetry. The Secret is not looked at:
// the manager may not read Secrets, so a missing Secret or key shows as the
// kubelet's CreateContainerConfigError on the pod (startProblemOf), and the
// kubelet starts the worker once it exists.
func (r *Reconciler) checkDependencies(ctx context.Context, s *scope) error {
	for _, d := range s.shards {
		if d.startProblem != "" {
			s.stalled = startProblemOf(s.run, d.startProblem)
			s.requeueIn(r.DependencyRetry)
		}
	}
	if !s.needsPods() {
		return nil
	}
	p, err := r.dependencyProblem(ctx, s.run)
	if err != nil {
		return err
	}
	if p != nil {
		s.stallStart(p, r.DependencyRetry)
	}
	return nil
}

// stallStart records p as why no pod starts, creates none in this pass and
// looks again after retry.
func (s *scope) stallStart(p *problem, retry time.Duration) {
	s.stalled = p
	for i := range s.shards {
		s.shards[i].create = nil
	}
	// No shard waits for the connection budget now: none may start at all.
	s.budgetOut.waiting = 0
	s.requeueIn(retry)
}

// configMapProblem is the problem of a ConfigMap key the run names that
// is missing (holding says what the key should hold), or nil.
func (r *Reconciler) configMapProblem(ctx context.Context, ns string, cm *v1alpha1.ConfigMapKeyRef, holding string) (*problem, error) {
	var obj corev1.ConfigMap
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: cm.Name}, &obj)
	switch {
	case apierrors.IsNotFound(err):
		return &problem{reason: ReasonConfigMapNotFound, message: fmt.Sprintf(
			"ConfigMap %q not found in namespace %q: create it with the key %q holding %s",
			cm.Name, ns, cm.Key, holding)}, nil
	case err != nil:
		return nil, fmt.Errorf("get configmap %s: %w", cm.Name, err)
	}
	_, inData := obj.Data[cm.Key]
	_, inBinary := obj.BinaryData[cm.Key]
	if !inData && !inBinary {
		return &problem{reason: ReasonConfigMapKeyNotFound, message: fmt.Sprintf(
			"ConfigMap %q in namespace %q has no key %q: add %s under that key",
			cm.Name, ns, cm.Key, holding)}, nil
	}
	return nil, nil
}

func (r *Reconciler) dependencyProblem(ctx context.Context, run *v1alpha1.ProcessingRun) (*problem, error) {
	if p := imageProblem(workerImage(run, r.Pods)); p != nil {
		return p, nil
	}
	if e := run.Spec.Effect; e != nil && e.Processor != nil {
		if _, err := reference.ParseNormalizedNamed(e.Processor.Image); err != nil {
			return &problem{reason: ReasonInvalidImage, message: fmt.Sprintf(
				"invalid processor image %q: %v: spec.effect.processor.image is immutable, create a new ProcessingRun", e.Processor.Image, err)}, nil
		}
	}
	ns := run.Namespace

	if cm := run.Spec.Batch.ConfigMapRef; cm != nil {
		if p, err := r.configMapProblem(ctx, ns, cm, "the batch as JSON Lines"); p != nil || err != nil {
			return p, err
		}
	}
	if obj := run.Spec.Batch.Object; obj != nil && obj.CAConfigMapRef != nil {
		if p, err := r.configMapProblem(ctx, ns, obj.CAConfigMapRef, "the PEM CA certificates of batch.object.endpoint"); p != nil || err != nil {
			return p, err
		}
	}

	if sa := r.serviceAccount(run); sa != "" {
		found, err := r.exists(ctx, "ServiceAccount", client.ObjectKey{Namespace: ns, Name: sa})
		if err != nil {
			return nil, err
		}
		if !found {
			return &problem{reason: ReasonServiceAccountNotFound, message: fmt.Sprintf(
				"ServiceAccount %q not found in namespace %q: create it and bind it to the ClusterRole runledger-worker with a RoleBinding (see config/samples)",
				sa, ns)}, nil
		}
	}
	return nil, nil
}

// startProblemOf is the problem of a worker pod that cannot start (what,
// the pod's name and the kubelet's waiting reason and message): named after
// the run's Secret when the kubelet cannot find it or its key
// (CreateContainerConfigError, in the kubelet's own words), else the
// kubelet's words as they are.
func startProblemOf(run *v1alpha1.ProcessingRun, what string) *problem {
	ref := run.Spec.Database.SecretRef
	if strings.Contains(what, "CreateContainerConfigError") {
		switch {
		case strings.Contains(what, fmt.Sprintf("secret %q not found", ref.Name)):
			return &problem{reason: ReasonSecretNotFound, message: fmt.Sprintf(
				"Secret %q not found in namespace %q: create it with the key %q holding the ledger's PostgreSQL connection string (%s)",
				ref.Name, run.Namespace, ref.Key, what)}
		case strings.Contains(what, fmt.Sprintf("couldn't find key %s in Secret %s/%s", ref.Key, run.Namespace, ref.Name)):
			return &problem{reason: ReasonSecretKeyNotFound, message: fmt.Sprintf(
				"Secret %q in namespace %q has no key %q: add the ledger's PostgreSQL connection string under that key (%s)",
				ref.Name, run.Namespace, ref.Key, what)}
		}
	}
	return &problem{reason: ReasonWorkerNotStarting, message: what}
}

// imageProblem says why the worker image cannot be used, nil when it can.
func imageProblem(image string) *problem {
	err := validateImage(image)
	if err == nil {
		return nil
	}
	return &problem{reason: ReasonInvalidImage, message: err.Error() +
		": fix spec.workerTemplate.image or the manager's --worker-image"}
}

func (r *Reconciler) serviceAccount(run *v1alpha1.ProcessingRun) string {
	if t := run.Spec.WorkerTemplate; t != nil && t.ServiceAccountName != "" {
		return t.ServiceAccountName
	}
	return r.Pods.ServiceAccountName
}

// exists reads only the metadata of a core object, from the API server.
func (r *Reconciler) exists(ctx context.Context, kind string, key client.ObjectKey) (bool, error) {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind))
	err := r.APIReader.Get(ctx, key, obj)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("get %s %s: %w", kind, key.Name, err)
	}
	return true, nil
}

// syncPods deletes the pods that must stop and creates the ones decided.
func (r *Reconciler) syncPods(ctx context.Context, s *scope) error {
	// Once per pass that creates pods: the run's ConfigMap and NetworkPolicy
	// come first, and every pod of the pass mounts that run's file.
	var rf runFile
	dependenciesEnsured := false
	for i := range s.shards {
		d := &s.shards[i]
		for _, pod := range d.deletePods {
			if err := r.deletePod(ctx, s, pod, ""); err != nil {
				return err
			}
		}
		for _, pod := range d.lostPods {
			if err := r.deletePod(ctx, s, pod, "its node is lost; replaced without waiting for it (the shard's lock and the ledger keep the two from counting or committing an item twice)"); err != nil {
				return err
			}
		}
		if d.overBudget != nil {
			if err := r.deletePod(ctx, s, d.overBudget, overBudgetWhy(s.budget)); err != nil {
				return err
			}
		}
		s.requeueIn(d.lostIn)
		if d.waitForCache {
			s.requeueIn(cacheWaitRequeue)
		}
		if d.create == nil && !d.retryAt.IsZero() && s.now.Before(d.retryAt) && !s.outcome.finished {
			s.requeueIn(d.retryAt.Sub(s.now))
		}
		if d.create != nil && !s.createBlocked && !dependenciesEnsured {
			var err error
			if rf, err = r.ensurePodDependencies(ctx, s); err != nil {
				return err
			}
			dependenciesEnsured = true
		}
		if d.create != nil && s.createBlocked {
			d.create = nil
			s.podsBlocked++
		}
		if d.create != nil {
			if err := r.createPod(ctx, s, d, rf); err != nil {
				return err
			}
		}
	}
	if s.createBlocked && s.stalled != nil {
		s.stalled.message += fmt.Sprintf("; %d more pods wait (no more creates until the next try in %s)",
			s.podsBlocked, r.DependencyRetry)
	}
	return nil
}

// ensurePodDependencies writes what the run's pods need before the first
// of a pass is created: the run's ConfigMap (its spec for the workers) and,
// unless turned off, its NetworkPolicy. It returns the run's file the pass's
// pods mount. A problem blocks this pass's creates.
func (r *Reconciler) ensurePodDependencies(ctx context.Context, s *scope) (runFile, error) {
	rf, p, err := r.ensureRunConfigMap(ctx, s.run)
	if err == nil && p == nil && r.WorkerNetwork != nil {
		p, err = r.ensureWorkerNetworkPolicy(ctx, s.run)
	}
	if err != nil {
		return runFile{}, err
	}
	if p != nil {
		s.createBlocked, s.stalled = true, p
		s.requeueIn(r.DependencyRetry)
	}
	return rf, nil
}

// createPod creates the pod of the shard's decided attempt, mounting rf,
// the run's file ensurePodDependencies wrote in this pass.
func (r *Reconciler) createPod(ctx context.Context, s *scope, d *shardDecision, rf runFile) error {
	attempt := *d.create
	d.create = nil
	in := workerPodParams{shard: d.index, attempt: attempt, floor: d.createFloor, runFile: rf}
	if s.queue != nil {
		in.placement = s.queue.placement
	}
	pod, err := buildWorkerPod(s.run, in, r.Pods)
	if err != nil {
		return err
	}
	logger := log.FromContext(ctx).WithValues("pod", klog.KObj(pod), "shard", d.index, "attempt", attempt)
	r.expectations.expectCreate(s.key, s.run.UID, d.index, attempt)
	err = r.Client.Create(ctx, pod)
	switch {
	case err == nil:
	case apierrors.IsAlreadyExists(err):
		// Ours, not yet in the cache, or an earlier run's of the same name
		// still being deleted: look again shortly.
		r.expectations.cancel(s.key, d.index)
		s.requeueIn(cacheWaitRequeue)
		logger.V(1).Info("worker pod already exists")
		return nil
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsNotFound(err):
		// Admission said no (quota, pod security, a missing service
		// account, a terminating namespace): someone has to act, and the
		// other shards' creates would fail the same way (as the Job
		// controller, stop creating for this pass).
		r.expectations.cancel(s.key, d.index)
		s.createBlocked = true
		s.stalled = &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf("cannot create pod %s: %v", pod.Name, err)}
		s.requeueIn(r.DependencyRetry)
		logger.Info("worker pod rejected", "error", err.Error())
		return nil
	default:
		r.expectations.cancel(s.key, d.index)
		return fmt.Errorf("create pod %s: %w", pod.Name, err)
	}
	podsCreated.Inc()
	s.budgetOut.active++ // live from now on
	if s.startTime == nil {
		s.startTime = &metav1.Time{Time: s.now}
	}
	d.phase = v1alpha1.ShardPending
	d.pod = pod.Name
	d.retryAt = time.Time{}
	note := fmt.Sprintf("Created pod %s for shard %d", pod.Name, d.index)
	if d.lostWhy != "" {
		note += fmt.Sprintf(" to replace a pod on a lost node (%s)", d.lostWhy)
	}
	if d.failures > 0 {
		note += fmt.Sprintf(" (retry %d of %d)", d.failures, s.run.Spec.BackoffLimitOrDefault())
	}
	r.event(s.run, pod, corev1.EventTypeNormal, "PodCreated", "CreatePod", note)
	logger.Info("created worker pod")
	return nil
}

// deletePod deletes a pod the shard no longer needs; why says why, empty
// for the usual reasons read from the pod and the run.
func (r *Reconciler) deletePod(ctx context.Context, s *scope, pod *corev1.Pod, why string) error {
	err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete pod %s: %w", pod.Name, err)
	}
	switch cs := workerStatus(pod); {
	case why != "":
	case cs != nil && cs.State.Terminated != nil:
		why = "its worker container finished, another container kept the pod running"
	case s.outcome.finished:
		why = "the run is finished"
	case s.held() && !s.run.Spec.Suspend:
		why = "Kueue holds the run (" + s.queue.decision.reason + ")"
	default:
		why = "the run is suspended"
	}
	r.event(s.run, pod, corev1.EventTypeNormal, "PodDeleted", "DeletePod", fmt.Sprintf("Deleted pod %s: %s", pod.Name, why))
	log.FromContext(ctx).Info("deleted worker pod", "pod", klog.KObj(pod), "reason", why)
	return nil
}

// writeStatus rebuilds the status, the workers' reports on their pods folded
// in, and writes it by server-side apply when it differs from what the run
// shows. Writes that only move progress (counts, the shards' messages and
// report times) are spaced by StatusInterval, whatever the number of shards.
func (r *Reconciler) writeStatus(ctx context.Context, s *scope) error {
	run := s.run
	s.decide()
	reported := make(map[int32]*v1alpha1.ShardStatus, len(s.inputs))
	for _, in := range s.inputs {
		reported[in.index] = in.entry
	}
	desired := buildStatus(run, statusInput{
		shards: s.shards, entries: reported, outcome: s.outcome, stalled: s.stalled, startTime: s.startTime, now: s.now,
		reconcileError: errorMessage(s.stepErr), queue: s.queueStatus(), budget: s.budget, budgetOut: s.budgetOut,
		replication: s.replication,
	})
	if equality.Semantic.DeepEqual(run.Status, desired) {
		return nil
	}
	if r.StatusInterval > 0 && progressOnlyChange(&run.Status, &desired) {
		if v, ok := r.lastWrites.Load(s.key); ok {
			last := v.(lastWrite)
			if wait := last.at.Add(r.StatusInterval).Sub(s.now); last.uid == run.UID && wait > 0 {
				s.requeueIn(wait)
				return nil
			}
		}
	}
	ac, err := runStatusApply(run, &desired)
	if err != nil {
		return err
	}
	applied, err := r.applyStatus(ctx, run, ac)
	if err != nil {
		return err
	}
	if !applied {
		// The watch brings the newer run; this is only a safety net.
		s.requeueIn(cacheWaitRequeue)
		return nil
	}
	r.lastWrites.Store(s.key, lastWrite{uid: run.UID, at: s.now})
	recordItems(run.Status.ItemCounts, desired.ItemCounts)
	r.transitionEvents(ctx, s, &run.Status, &desired)
	return nil
}

// errorMessage is err's text, empty for nil.
func errorMessage(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// applyStatus writes the controller's status fields onto the run as this
// pass read it, or not at all: the apply carries the resourceVersion read,
// so the API server answers Conflict when the run changed since, whether
// its status moved on (a stale view must never undo a counted failure) or
// it is another run created under the same name (the status subresource
// ignores metadata.uid in an apply). A refused write is not an error: the
// newer version's watch event brings another pass. It reports whether the
// status was written.
func (r *Reconciler) applyStatus(ctx context.Context, run *v1alpha1.ProcessingRun, ac *acv1alpha1.ProcessingRunApplyConfiguration) (bool, error) {
	ac.WithResourceVersion(run.ResourceVersion)
	err := r.Client.Status().Apply(ctx, ac, client.FieldOwner(v1alpha1.ControllerFieldManager), client.ForceOwnership)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil // deleted meanwhile
	case apierrors.IsConflict(err):
		statusConflicts.Inc()
		log.FromContext(ctx).V(1).Info("status not written: the run changed since it was read")
		return false, nil
	case err != nil:
		return false, fmt.Errorf("apply status: %w", err)
	}
	return true, nil
}

// expireTTL deletes a finished run once ttlSecondsAfterFinished has passed,
// and otherwise says how long to wait. It re-reads the run from the API
// server first: the TTL may have been changed.
func (r *Reconciler) expireTTL(ctx context.Context, run *v1alpha1.ProcessingRun) (bool, time.Duration, error) {
	ttl := run.Spec.TTLSecondsAfterFinished
	if ttl == nil || finishedCondition(&run.Status) == nil || run.Status.CompletionTime == nil {
		return false, 0, nil
	}
	now := r.Clock.Now()
	expireAt := run.Status.CompletionTime.Add(time.Duration(*ttl) * time.Second)
	if now.Before(expireAt) {
		return false, expireAt.Sub(now), nil
	}
	fresh := &v1alpha1.ProcessingRun{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(run), fresh); err != nil {
		return false, 0, client.IgnoreNotFound(err)
	}
	ttl = fresh.Spec.TTLSecondsAfterFinished
	if fresh.UID != run.UID || ttl == nil || fresh.Status.CompletionTime == nil ||
		now.Before(fresh.Status.CompletionTime.Add(time.Duration(*ttl)*time.Second)) {
		return false, time.Second, nil // changed meanwhile: look again
	}
	err := r.Client.Delete(ctx, fresh, client.Preconditions{UID: &fresh.UID},
		client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false, 0, fmt.Errorf("delete expired run: %w", err)
	}
	log.FromContext(ctx).Info("deleted finished run: ttlSecondsAfterFinished passed", "ttlSeconds", *ttl)
	return true, 0, nil
}

package controllers

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

// This file decides, for one shard, what its pods mean and what to do next.
// Everything here is pure: the inputs are what the cache shows.

// podState is what a pod means for its shard.
type podState int

const (
	podLive      podState = iota // pending, running or unknown: it may still run
	podSucceeded                 // the worker exited 0
	podFailed                    // the worker (or the pod) failed
)

// podInfo is what the controller reads from one worker pod.
type podInfo struct {
	pod      *corev1.Pod
	attempt  int32
	state    podState
	deleting bool // deletionTimestamp set: someone (suspend, a user) deleted it
	// exitCode of the worker container, when it terminated.
	exitCode *int32
	// finishedAt is when the pod failed or succeeded.
	finishedAt time.Time
	// report is the worker's termination message, when it is a ShardReport
	// of this shard and attempt.
	report *v1alpha1.ShardReport
	// progress is the worker's latest report on the pod (annotation
	// AnnotationProgress), when it is a report of this shard and attempt.
	progress *v1alpha1.ShardReport
	// runReport is the RunReport on the pod, when its worker is or was the
	// run's reporter: the reports of every shard (foldRunReports).
	runReport *v1alpha1.RunReport
	floor     v1alpha1.ItemCounts
	// startProblem says why a live pod's worker cannot start (image pull,
	// a missing Secret key), empty when there is none.
	startProblem string
	// processorFailure: the pod's processor crashed or never became ready
	// before its worker started; the attempt failed.
	processorFailure string
	// unschedulable is the scheduler's message when it cannot place the
	// pod (its PodScheduled condition), empty otherwise.
	unschedulable string
	running       bool
	// busy: the worker exited ExitShardBusy (another process held the
	// shard's lock); not a failure of the shard.
	busy bool
	// readRefused: its worker, of an earlier release, exited as bad input
	// because RBAC refused it a read this release's workers no longer make
	// (its run, a ConfigMap): a pod the previous manager created that started
	// after the upgrade's RBAC. Retried like any failed attempt; the next pod
	// is this release's.
	readRefused bool
	// lingering: the worker container terminated but another container (an
	// injected sidecar) keeps the pod running.
	lingering bool
	// lost: a live pod on a lost node (see podOnLostNode); the shard gets a
	// replacement without waiting for it to be confirmed gone. lostWhy says
	// why; lostIn, when positive, is how long until it would count as lost.
	lost    bool
	lostWhy string
	lostIn  time.Duration
}

// podOnLostNode decides whether a live pod sits on a lost node: its node no
// longer exists, or its node's Ready condition has been False or Unknown
// (the node controller's mark of an unreachable kubelet) for at least after;
// a pod already being deleted is lost as soon as its node is not Ready, as
// no kubelet will confirm its end. node is nil when the pod's node is not
// found. When the node is not Ready yet not for long enough, wait says how
// long until the pod counts as lost.
func podOnLostNode(pod *corev1.Pod, node *corev1.Node, after time.Duration, now time.Time) (lost bool, wait time.Duration, why string) {
	name := pod.Spec.NodeName
	if name == "" {
		return false, 0, "" // not scheduled: nothing runs yet
	}
	if node == nil {
		return true, 0, fmt.Sprintf("node %s no longer exists", name)
	}
	var ready *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			ready = &node.Status.Conditions[i]
		}
	}
	if ready == nil || ready.Status == corev1.ConditionTrue {
		return false, 0, "" // Ready, or the kubelet has not reported yet
	}
	state := "NotReady"
	if ready.Status == corev1.ConditionUnknown {
		state = "unreachable"
	}
	since := now.Sub(ready.LastTransitionTime.Time)
	switch {
	case pod.DeletionTimestamp != nil:
		return true, 0, fmt.Sprintf("node %s is %s and the pod is being deleted", name, state)
	case since >= after:
		return true, 0, fmt.Sprintf("node %s has been %s for %s (nodeLostAfterSeconds: %d)",
			name, state, since.Truncate(time.Second), int64(after/time.Second))
	default:
		return false, after - since, ""
	}
}

// reasons a container waits that need someone to act.
var stuckWaitingReasons = map[string]bool{
	"ErrImagePull":               true,
	"ImagePullBackOff":           true,
	"InvalidImageName":           true,
	"ErrImageNeverPull":          true,
	"CreateContainerConfigError": true,
	"CreateContainerError":       true,
}

// observePod reads one worker pod. ok is false for pods that are not worker
// pods of the shard (no attempt label).
func observePod(pod *corev1.Pod, shard int32) (podInfo, bool) {
	attempt, err := strconv.ParseInt(pod.Labels[v1alpha1.LabelAttempt], 10, 32)
	if err != nil || attempt < 0 {
		return podInfo{}, false
	}
	info := podInfo{
		pod:       pod,
		attempt:   int32(attempt),
		deleting:  pod.DeletionTimestamp != nil,
		floor:     parseFloor(pod.Annotations),
		progress:  parseProgress(pod.Annotations, shard, int32(attempt)),
		runReport: parseRunReport(pod.Annotations),
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		info.state = podSucceeded
	case corev1.PodFailed:
		info.state = podFailed
	default:
		info.state = podLive
		info.running = pod.Status.Phase == corev1.PodRunning
	}
	observeWorker(&info, pod, shard)
	if info.state == podLive {
		switch failed, stuck := processorProblem(pod); {
		case failed != "":
			// The worker never starts without its processor: the attempt has
			// failed, counted against backoffLimit, and the pod goes once
			// that is recorded (lingeringToStop).
			info.state, info.running, info.lingering = podFailed, false, true
			info.processorFailure = failed
		case stuck != "" && info.startProblem == "":
			info.startProblem = stuck
		}
	}
	if info.state == podLive && !info.running && pod.Spec.NodeName == "" {
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				info.unschedulable = fmt.Sprintf("pod %s: %s", pod.Name, c.Message)
			}
		}
	}
	info.busy = info.state == podFailed && info.exitCode != nil && *info.exitCode == v1alpha1.ExitShardBusy
	if info.state != podLive && info.finishedAt.IsZero() {
		info.finishedAt = podFinishTime(pod)
	}
	return info, true
}

// observeWorker reads the worker container's state into info: its exit,
// final report and whether it finished while the pod runs on; why it
// cannot start.
func observeWorker(info *podInfo, pod *corev1.Pod, shard int32) {
	if cs := workerStatus(pod); cs != nil {
		if t := cs.State.Terminated; t != nil {
			info.exitCode = &t.ExitCode
			info.finishedAt = t.FinishedAt.Time
			info.readRefused = t.ExitCode == v1alpha1.ExitBadInput && earlierReleaseReadRefused(t.Message)
			if r, err := v1alpha1.ParseShardReport(t.Message); err == nil && r.Shard == shard && r.Attempt == info.attempt {
				info.report = &r
			}
			if info.state == podLive {
				// The shard is done when its worker is (restartPolicy Never),
				// whatever keeps the pod running.
				info.state, info.running = podFailed, false
				// Only a container still alive keeps the pod: without one,
				// the kubelet is about to report the phase, and the pod stays
				// (with its logs) like any finished worker pod.
				info.lingering = otherContainerAlive(pod)
				if t.ExitCode == v1alpha1.ExitSucceeded {
					info.state = podSucceeded
				}
			}
		}
		if w := cs.State.Waiting; w != nil && stuckWaitingReasons[w.Reason] && info.state == podLive {
			info.startProblem = fmt.Sprintf("pod %s: %s: %s", pod.Name, w.Reason, w.Message)
		}
	}
}

// earlierReleaseReadRefused reports whether a worker's last words are an
// earlier release's refused read of its run or of a configMapRef batch
// through the API (the API server's RBAC message), which the workers' role
// no longer allows.
func earlierReleaseReadRefused(msg string) bool {
	return readRefusedRE.MatchString(msg)
}

// readRefusedRE is the API server's refusal of a get of runs or ConfigMaps,
// as written or inside a termination message's JSON.
var readRefusedRE = regexp.MustCompile(`cannot get resource \\?"(processingruns|configmaps)\\?"`)

// processorProblem reads the processor sidecar (spec.effect.processor) of a
// pod whose worker has not started: failed says that it crashed or never
// became ready processorMaxRestarts times, stuck that it waits for something
// someone must fix (its image); both name the container. Empty when the pod
// has no processor, or its worker has started (then a crashing processor is
// restarted by the kubelet, and the worker retries its calls).
func processorProblem(pod *corev1.Pod) (failed, stuck string) {
	if w := workerStatus(pod); w != nil && w.State.Waiting == nil {
		return "", ""
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		if cs.Name != v1alpha1.ProcessorContainerName {
			continue
		}
		if cs.RestartCount >= processorMaxRestarts {
			why := fmt.Sprintf("pod %s: container %s crashed or never became ready (restarted %d times)", pod.Name, cs.Name, cs.RestartCount)
			if t := cs.LastTerminationState.Terminated; t != nil {
				why += fmt.Sprintf("; it last exited %d (%s)", t.ExitCode, t.Reason)
				if t.Message != "" {
					why += ": " + strings.TrimSpace(t.Message)
				}
			}
			return why, ""
		}
		if w := cs.State.Waiting; w != nil && stuckWaitingReasons[w.Reason] {
			return "", fmt.Sprintf("pod %s: container %s: %s: %s", pod.Name, cs.Name, w.Reason, w.Message)
		}
	}
	return "", ""
}

// workerStatus is the status of a pod's worker container, nil before the
// kubelet reports one.
func workerStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == v1alpha1.WorkerContainerName {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// otherContainerAlive reports whether a regular container other than the
// worker has not terminated (an injected sidecar).
func otherContainerAlive(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != v1alpha1.WorkerContainerName && cs.State.Terminated == nil {
			return true
		}
	}
	return false
}

// podFinishTime guesses when a pod without a terminated container ended
// (evicted, or lost with its node).
func podFinishTime(pod *corev1.Pod) time.Time {
	var t time.Time
	for _, c := range pod.Status.Conditions {
		if c.LastTransitionTime.After(t) {
			t = c.LastTransitionTime.Time
		}
	}
	if t.IsZero() {
		t = pod.CreationTimestamp.Time
	}
	return t
}

// describeFailure is one line on why a failed pod failed.
func describeFailure(p podInfo) string {
	if p.processorFailure != "" {
		return p.processorFailure
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s", p.pod.Name)
	switch {
	case p.exitCode != nil:
		fmt.Fprintf(&b, " exited %d", *p.exitCode)
		for _, cs := range p.pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; cs.Name == v1alpha1.WorkerContainerName && t != nil && t.Reason != "" && t.Reason != "Error" && t.Reason != "Completed" {
				fmt.Fprintf(&b, " (%s)", t.Reason)
			}
		}
	case p.pod.Status.Reason != "":
		fmt.Fprintf(&b, " failed (%s)", p.pod.Status.Reason)
	default:
		b.WriteString(" failed")
	}
	switch {
	case p.report != nil && p.report.Message != "":
		fmt.Fprintf(&b, ": %s", p.report.Message)
	case p.pod.Status.Message != "":
		fmt.Fprintf(&b, ": %s", p.pod.Status.Message)
	}
	return b.String()
}

// shardInput is everything known about one shard.
type shardInput struct {
	runName string
	index   int32
	// pods of the shard, any order.
	pods []podInfo
	// entry is the shard's status entry (the worker's last report, and the
	// controller's last pod and phase), nil when there is none.
	entry *v1alpha1.ShardStatus
	// recordedAttempt is the attempt of entry.pod, -1 when there is none.
	recordedAttempt int32
	// recordedGone: the API (not the cache) confirmed that the recorded pod
	// no longer exists.
	recordedGone bool
}

// shardPolicy is what the run's spec and the controller's settings say.
type shardPolicy struct {
	backoffLimit int32
	backoffBase  time.Duration
	backoffMax   time.Duration
	// suspended: no new pods, live ones are deleted.
	suspended bool
	// stopped: the run is finished; no new pods, live ones are deleted.
	stopped bool
}

// shardFailure is why a shard failed for good.
type shardFailure struct {
	reason  string
	message string
}

// shardDecision is what was observed of a shard (its fields) and what to
// do about it (shardActions); every phase of decideShard fills the same one.
type shardDecision struct {
	shardActions
	index int32
	phase v1alpha1.ShardPhase
	// pod is the shard's current (latest) pod name, empty before the first.
	pod string
	// counts are the shard's counts to show: exact when final, otherwise
	// never below what any attempt of the shard reported.
	counts v1alpha1.ItemCounts
	// final: the shard is done (succeeded or failed for good) and counts
	// are its final report's numbers.
	final bool
	// report is the final report when it is known, used to restore the
	// shard's entry if the worker's last status write was lost.
	report *v1alpha1.ShardReport
	// failure is set when the shard failed for good.
	failure *shardFailure
	// failures is the number of failed attempts counted against
	// backoffLimit, the status's count plus the failed pods it does not
	// count yet; lastFailedAttempt is the latest counted attempt, nil before
	// the first; lastFailure describes the latest.
	failures          int32
	lastFailedAttempt *int32
	lastFailure       string
	// failedPod and failedAttempt are the latest failed attempt's.
	failedPod     string
	failedAttempt int32
	// busyPod is the latest pod that found the shard's lock taken (exit
	// ExitShardBusy), busyAttempt its attempt.
	busyPod     string
	busyAttempt int32
	// lostWhy says why the latest pod on a lost node was given up.
	lostWhy string
	// live is the number of live pods (never more than one).
	live int
	// startProblem says why the live pod's worker cannot start.
	startProblem string
	// unschedulable is the scheduler's word on the live pod it cannot
	// place, empty otherwise.
	unschedulable string
	// stoppable is the shard's live pod that is neither being deleted nor
	// on a lost node, nil when there is none; stoppableRunning: it runs.
	// The connection budget stops it when more pods run than it allows.
	stoppable        *corev1.Pod
	stoppableRunning bool
	// waitsForBudget: the shard wanted a pod now and waits for the run's
	// connection budget (decideBudget).
	waitsForBudget bool
}

// shardActions is the controller's next move for a shard; the zero value
// is "nothing to do".
type shardActions struct {
	// create, when set, is the attempt to create now, with createFloor as
	// its counts floor.
	create      *int32
	createFloor v1alpha1.ItemCounts
	// retryAt is when the next attempt may start, while Retrying.
	retryAt time.Time
	// awaitRecord: the latest attempt's failure is not in the status yet;
	// the next attempt is created once it is.
	awaitRecord bool
	// waitForCache: the recorded pod is missing from the cache but may
	// exist; decide nothing until the cache or the API says more.
	waitForCache bool
	// deletePods are live pods to delete (suspended or stopped run).
	deletePods []*corev1.Pod
	// lostPods are live pods on lost nodes, replaced without waiting for
	// them; they are deleted, so their node's kubelet stops them if it comes
	// back.
	lostPods []*corev1.Pod
	// lostIn, when positive, is how long until a pod on a not-Ready node
	// counts as lost: look again then.
	lostIn time.Duration
	// overBudget is a live pod to stop because more pods run than the
	// run's connection budget allows (decideBudget).
	overBudget *corev1.Pod
}

// backoff is the delay before the retry that follows the n-th failure
// (n >= 1): base, 2·base, 4·base, ... capped at max.
func backoff(n int32, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := int32(1); i < n; i++ {
		d *= 2
		if d >= maxDelay {
			return maxDelay
		}
	}
	return min(d, maxDelay)
}

// decideShard is the heart of the controller: what one shard's pods mean,
// and which pod to create or delete. It never asks for a pod while another
// pod of the shard may still run.
func decideShard(in shardInput, p shardPolicy, now time.Time) shardDecision {
	d := decidePods(in, p, now)
	d.deletePods = append(d.deletePods, lingeringToStop(in, p, d)...)
	return d
}

// lingeringToStop are the pods whose worker finished while another
// container (a service mesh's sidecar) keeps them running, and holding
// quota, forever. They go once the status holds what they tell (their
// outcome, their counted failure) and nothing still needs them: a later
// attempt exists or is created now, or the shard or run is done.
func lingeringToStop(in shardInput, p shardPolicy, d shardDecision) []*corev1.Pod {
	var out []*corev1.Pod
	current := attemptOfPodName(d.pod, in.index)
	for _, pi := range in.pods {
		if !pi.lingering || pi.deleting {
			continue
		}
		var recorded bool
		switch {
		case pi.state == podSucceeded:
			recorded = in.entry != nil && in.entry.Pod == pi.pod.Name && in.entry.Phase == v1alpha1.ShardSucceeded
		case pi.busy:
			recorded = true // nothing to count
		default:
			recorded = in.entry != nil && in.entry.LastFailedAttempt != nil && *in.entry.LastFailedAttempt >= pi.attempt
		}
		needed := pi.attempt >= current && !d.final && d.create == nil && !p.suspended && !p.stopped
		if pi.processorFailure != "" {
			needed = false // it holds the next attempt back
		}
		if recorded && !needed {
			out = append(out, pi.pod)
		}
	}
	return out
}

// shardObservation is what a shard's pods and its status entry say, before
// anything is decided.
type shardObservation struct {
	// pods are the shard's pods by attempt; latest is the last of them (nil
	// without pods) and latestAttempt its attempt (-1 without pods).
	pods          []podInfo
	latest        *podInfo
	latestAttempt int32
	// floor is the most any attempt reported, per field (the entry holds the
	// latest report that reached the API).
	floor v1alpha1.ItemCounts
	// entryCurrent: the status entry holds the latest attempt's report.
	entryCurrent bool
	// counted is the latest attempt whose failure the status counts, -1
	// before the first.
	counted int32
}

// observeShard reads the shard's pods and status entry; it decides nothing.
func observeShard(in shardInput) shardObservation {
	o := shardObservation{pods: append([]podInfo(nil), in.pods...), latestAttempt: -1, counted: -1}
	sort.Slice(o.pods, func(i, j int) bool { return o.pods[i].attempt < o.pods[j].attempt })
	if len(o.pods) > 0 {
		o.latest = &o.pods[len(o.pods)-1]
		o.latestAttempt = o.latest.attempt
	}
	o.floor = countsOfEntry(in.entry)
	for _, pi := range o.pods {
		o.floor = o.floor.MaxEach(pi.floor)
		if pi.report != nil && pi.attempt != o.latestAttempt {
			o.floor = o.floor.MaxEach(pi.report.ItemCounts)
		}
	}
	o.entryCurrent = in.entry != nil && o.latestAttempt >= 0 && in.entry.Attempt == o.latestAttempt
	if in.entry != nil && in.entry.LastFailedAttempt != nil {
		o.counted = *in.entry.LastFailedAttempt
	}
	return o
}

// latestFailed: the latest pod failed and nobody is deleting it.
func (o shardObservation) latestFailed() bool {
	return o.latest != nil && o.latest.state == podFailed && !o.latest.deleting
}

// shardPass is one decision over one shard: its input, the policy, the
// time, and what was observed.
type shardPass struct {
	in  shardInput
	p   shardPolicy
	now time.Time
	shardObservation
}

// decidePods is decideShard without the lingering pods to stop. classifyPods fills
// what every outcome reports about the pods; then the first phase that
// decides the shard's state ends the pass, each filling the same decision.
func decidePods(in shardInput, p shardPolicy, now time.Time) shardDecision {
	s := shardPass{in: in, p: p, now: now, shardObservation: observeShard(in)}
	d := s.classifyPods()
	for _, phase := range []func(*shardDecision) bool{
		s.awaitCache, s.succeeded, s.live, s.failedForGood, s.nextAttempt,
	} {
		if phase(&d) {
			break
		}
	}
	return d
}

// classifyPods is what the shard's pods say whatever its state: its current pod,
// its failures, and its lost, live, busy and failed pods.
func (s shardPass) classifyPods() shardDecision {
	in, p := s.in, s.p
	d := shardDecision{index: in.index, phase: v1alpha1.ShardPending}
	// The shard's pod is the latest one, or the recorded one when the cache
	// shows no later pod: the record keeps the attempt numbers going up even
	// after pods are deleted (suspend, a user).
	switch {
	case s.latest != nil && s.latestAttempt >= in.recordedAttempt:
		d.pod = s.latest.pod.Name
	case in.entry != nil:
		d.pod = in.entry.Pod
	}
	// Failures are durable, as a Job's status.failed: the status counts
	// them, so deleting a failed pod does not give the shard more retries.
	if in.entry != nil {
		d.failures = in.entry.FailedAttempts
		if in.entry.LastFailedAttempt != nil {
			d.lastFailedAttempt = ptr.To(s.counted)
		}
	}
	for _, pi := range s.pods {
		if pi.lostIn > 0 && (d.lostIn == 0 || pi.lostIn < d.lostIn) {
			d.lostIn = pi.lostIn
		}
		switch {
		case pi.state == podLive && pi.lost:
			// Not live for the shard: correctness never rests on it being
			// gone (the shard's lock makes its replacement wait for it; the
			// ledger commits each item once). Its failure is never counted:
			// it is deleted, and deleted pods' failures are not.
			if pi.attempt == s.latestAttempt {
				d.lostWhy = fmt.Sprintf("pod %s: %s", pi.pod.Name, pi.lostWhy)
			}
			if !pi.deleting {
				d.lostPods = append(d.lostPods, pi.pod)
			}
		case pi.state == podLive:
			d.live++
			if stoppablePod(pi) {
				d.stoppable, d.stoppableRunning = pi.pod, pi.running
			}
			if (p.suspended || p.stopped) && !pi.deleting {
				d.deletePods = append(d.deletePods, pi.pod)
			}
		case pi.state == podFailed && !pi.deleting && pi.busy:
			d.busyPod, d.busyAttempt = pi.pod.Name, pi.attempt
		case pi.state == podFailed && !pi.deleting:
			if pi.attempt > s.counted {
				d.failures++
				d.lastFailedAttempt = ptr.To(pi.attempt)
			}
			d.lastFailure = describeFailure(pi)
			d.failedPod, d.failedAttempt = pi.pod.Name, pi.attempt
		}
	}
	return d
}

// awaitCache: a pod the controller recorded but the cache does not show.
// Wait until the API confirms it is gone, so that a lagging cache never
// leads to a second live pod.
func (s shardPass) awaitCache(d *shardDecision) bool {
	in := s.in
	if in.recordedAttempt <= s.latestAttempt || in.recordedGone {
		return false
	}
	d.waitForCache = true
	d.pod = v1alpha1.PodName(in.runName, in.index, in.recordedAttempt)
	if in.entry != nil && in.entry.Pod == d.pod && in.entry.Phase != "" {
		d.phase = in.entry.Phase
	}
	d.counts = s.floor
	return true
}

// succeeded: by its pod or (once the pod is gone) by the record.
func (s shardPass) succeeded(d *shardDecision) bool {
	in := s.in
	if s.latest != nil && s.latest.state == podSucceeded {
		d.phase, d.final = v1alpha1.ShardSucceeded, true
		switch {
		case s.latest.report != nil:
			d.report = s.latest.report
			d.counts = s.latest.report.ItemCounts
		case s.entryCurrent:
			d.counts = countsOfEntry(in.entry)
		default:
			d.counts = s.floor
		}
		return true
	}
	if in.entry != nil && in.entry.Phase == v1alpha1.ShardSucceeded && d.live == 0 && in.recordedAttempt >= s.latestAttempt {
		d.phase, d.final = v1alpha1.ShardSucceeded, true
		d.pod = in.entry.Pod
		d.counts = countsOfEntry(in.entry)
		return true
	}
	return false
}

// live: a pod of the shard is live (pending, running or terminating); what
// it shows is the shard's state.
func (s shardPass) live(d *shardDecision) bool {
	if d.live == 0 {
		return false
	}
	d.phase = v1alpha1.ShardPending
	for _, pi := range s.pods {
		if pi.state != podLive || pi.lost {
			continue
		}
		if pi.running {
			d.phase = v1alpha1.ShardRunning
		}
		if pi.startProblem != "" {
			d.startProblem = pi.startProblem
		}
		if pi.unschedulable != "" {
			d.unschedulable = pi.unschedulable
		}
	}
	d.counts = s.floor
	return true
}

// failedForGood: no live pod, and the latest failed with bad input, or the
// shard has failed more than backoffLimit times.
func (s shardPass) failedForGood(d *shardDecision) bool {
	latest := s.latest
	if !s.latestFailed() {
		return false
	}
	last := s.floor
	if latest.report != nil {
		last = latest.report.ItemCounts
	}
	var failure *shardFailure
	switch {
	case latest.exitCode != nil && *latest.exitCode == v1alpha1.ExitBadInput && !latest.readRefused:
		failure = &shardFailure{reason: ReasonBadInput, message: fmt.Sprintf(
			"shard %d: bad input or configuration, not retried: %s", s.in.index, d.lastFailure)}
	case !latest.busy && d.failures > s.p.backoffLimit:
		reason := ReasonBackoffLimitExceeded
		if latest.processorFailure != "" {
			reason = ReasonProcessorFailed
		}
		failure = &shardFailure{reason: reason, message: fmt.Sprintf(
			"shard %d failed %d times (backoffLimit %d); last error: %s", s.in.index, d.failures, s.p.backoffLimit, d.lastFailure)}
	default:
		return false
	}
	d.phase = v1alpha1.ShardFailed
	d.final, d.report, d.counts, d.failure = true, latest.report, last, failure
	return true
}

// nextAttempt: the shard needs a new attempt, now or after a back-off.
func (s shardPass) nextAttempt(d *shardDecision) bool {
	in, p, latest := s.in, s.p, s.latest
	next := max(s.latestAttempt, in.recordedAttempt) + 1
	d.createFloor = s.floor
	if latest != nil && latest.report != nil {
		d.createFloor = d.createFloor.MaxEach(latest.report.ItemCounts)
	}
	d.counts = d.createFloor
	if s.latestFailed() {
		d.phase = v1alpha1.ShardRetrying
		d.retryAt = latest.finishedAt.Add(backoff(d.failures, p.backoffBase, p.backoffMax))
	}
	if p.suspended || p.stopped || s.now.Before(d.retryAt) {
		return true
	}
	for _, pi := range s.pods {
		if pi.processorFailure != "" {
			// Its pod goes first (lingeringToStop): its worker must never
			// start beside the next attempt's.
			return true
		}
	}
	if s.latestFailed() && !latest.busy && latest.attempt > s.counted && s.latestAttempt >= in.recordedAttempt {
		// The failure is counted first: the status write records it, and
		// its watch event brings the pass that creates. Creating now would
		// lose it if the write were refused (a stale view) and the failed
		// pod deleted before the next pass, giving the shard a free retry.
		d.awaitRecord = true
		return true
	}
	d.create = &next
	return true
}

// attemptOfPodName is the attempt of a pod named <run>-<shard>-<attempt>, or
// -1.
func attemptOfPodName(pod string, shard int32) int32 {
	suffix := fmt.Sprintf("-%d-", shard)
	i := strings.LastIndex(pod, suffix)
	if i < 0 {
		return -1
	}
	a, err := strconv.ParseInt(pod[i+len(suffix):], 10, 32)
	if err != nil || a < 0 {
		return -1
	}
	return int32(a)
}

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// This file is the worker's side of the contract with the controller
// (api/v1alpha1/contract.go): its configuration from the environment, the
// ConfigMap source as the file the kubelet mounted, its shard's reports on its own pod, and
// its termination message.

// PodEnv is what the controller tells a worker pod through its environment.
type PodEnv struct {
	Namespace, Name, UID string
	Shard, Shards        int
	Attempt              int
	PodName              string
	// PodUID is the pod's UID, the precondition of its reports (empty on a
	// pod an earlier release created: then the name alone).
	PodUID string
	DSN    string
}

// PodEnvFrom reads the worker's environment (getenv is os.Getenv in a pod).
// A missing or malformed variable is an *InputErrors naming every one.
func PodEnvFrom(getenv func(string) string) (PodEnv, error) {
	errs := &InputErrors{Source: "worker environment"}
	str := func(name string) string {
		v := getenv(name)
		if v == "" {
			errs.add(&InputError{Where: name, Msg: "is not set (the controller sets it on worker pods)"})
		}
		return v
	}
	num := func(name string, lo, hi int) int {
		v := str(name)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			errs.add(&InputError{Where: name, Msg: fmt.Sprintf("is %q: want an integer from %d to %d", v, lo, hi)})
		}
		return n
	}
	e := PodEnv{
		Namespace: str(v1alpha1.EnvRunNamespace),
		Name:      str(v1alpha1.EnvRunName),
		UID:       str(v1alpha1.EnvRunUID),
		Shards:    num(v1alpha1.EnvShards, 1, v1alpha1.MaxWorkers),
		Attempt:   num(v1alpha1.EnvAttempt, 0, 1<<20),
		PodName:   str(v1alpha1.EnvPodName),
		PodUID:    getenv(v1alpha1.EnvPodUID),
		DSN:       str(v1alpha1.EnvDatabaseURL),
	}
	e.Shard = num(v1alpha1.EnvShard, 0, v1alpha1.MaxWorkers-1)
	if errs.Count == 0 && e.Shard >= e.Shards {
		errs.add(&InputError{Where: v1alpha1.EnvShard, Msg: fmt.Sprintf("is %d, but there are only %d shards", e.Shard, e.Shards)})
	}
	return e, errs.orNil()
}

// GetRun reads the worker's run and checks that it is the one the pod was
// created for (a run deleted and created again under the same name is
// another run, with another UID).
func GetRun(ctx context.Context, c client.Reader, env PodEnv) (*v1alpha1.ProcessingRun, error) {
	run := &v1alpha1.ProcessingRun{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: env.Namespace, Name: env.Name}, run); err != nil {
		return nil, fmt.Errorf("reading ProcessingRun %s/%s: %w", env.Namespace, env.Name, err)
	}
	if string(run.UID) != env.UID {
		return nil, &InputError{Where: fmt.Sprintf("ProcessingRun %s/%s", env.Namespace, env.Name),
			Msg: fmt.Sprintf("has UID %s, not %s: the run this pod was created for is gone", run.UID, env.UID)}
	}
	return run, nil
}

// MountedBatchData returns the BatchData of a pod: the ConfigMap key the
// controller mounted as the file $RUNLEDGER_BATCH_FILE (path), so that the
// worker reads no ConfigMap through the API. A missing file is a ConfigMap or
// key deleted after the controller checked them: bad input.
func MountedBatchData(path, namespace string) BatchData {
	return func(_ context.Context, ref v1alpha1.ConfigMapKeyRef) ([]byte, string, error) {
		where := "spec.batch.configMapRef:"
		if path == "" {
			return nil, "", &InputError{Where: where, Msg: v1alpha1.EnvBatchFile + " is not set (the controller mounts the ConfigMap's key on worker pods)"}
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", &InputError{Where: where, Msg: fmt.Sprintf("ConfigMap %s/%s or its key %q is gone (the pod's volume has no %s)", namespace, ref.Name, ref.Key, path)}
		}
		if err != nil {
			return nil, "", fmt.Errorf("reading ConfigMap %s/%s key %s from %s: %w", namespace, ref.Name, ref.Key, path, err)
		}
		return b, fmt.Sprintf("ConfigMap %s key %s", ref.Name, ref.Key), nil
	}
}

// ShardMessage is a shard's last word for its status entry and termination
// message: why it stopped, or its first failure.
func ShardMessage(r Report, maxFailed int) string {
	first := ""
	if len(r.Failures) > 0 {
		f := r.Failures[0]
		first = fmt.Sprintf("; first: %s/%s: %s", f.Entity, f.Occurrence, f.Error)
	}
	switch {
	case r.WaitingForConnection:
		return v1alpha1.DatabaseRefusingMessage + ": the database refuses new connections (too many connections, SQLSTATE 53300); retrying"
	case r.WaitingForLock:
		return v1alpha1.ShardBusyMessage + ": another process still runs this shard (an earlier pod finishing its chunk)"
	case errors.Is(r.Err, ledger.ErrShardBusy):
		return v1alpha1.ShardBusyMessage + ": gave up, " + r.Err.Error()
	case r.Err != nil:
		return r.Err.Error()
	case r.Interrupted:
		return fmt.Sprintf("interrupted after %d of %s", r.Processed(), Items(r.Total))
	case r.TooManyFailures:
		return fmt.Sprintf("stopped: %s failed, more than maxFailedItems (%d)%s", Items(r.Failed), maxFailed, first)
	case r.Failed > 0:
		return fmt.Sprintf("%s failed%s", Items(r.Failed), first)
	case r.Done:
		return "done"
	}
	return fmt.Sprintf("processing: %d of %s", r.Processed(), Items(r.Total))
}

// Items renders a count of items: "1 item", "3 items".
func Items(n int64) string {
	if n == 1 {
		return "1 item"
	}
	return fmt.Sprintf("%d items", n)
}

// StatusReporter reports the worker's shard on its own pod, as the contract
// (api/v1alpha1/contract.go, "Reports") says. Reports are cumulative and
// exact, so a lost write loses nothing: the next one (or the termination
// message) carries the numbers.
type StatusReporter struct {
	c        client.Client
	env      PodEnv
	interval time.Duration
	log      logr.Logger
	now      func() time.Time

	mu      sync.Mutex
	latest  v1alpha1.ShardReport
	pending bool // latest not yet written
	wake    chan struct{}
}

// NewStatusReporter reports for env's shard at most every interval
// (v1alpha1.ReportIntervalSeconds when 0).
func NewStatusReporter(c client.Client, env PodEnv, interval time.Duration, log logr.Logger) *StatusReporter {
	if interval <= 0 {
		interval = v1alpha1.ReportIntervalSeconds * time.Second
	}
	return &StatusReporter{c: c, env: env, interval: interval, log: log, now: time.Now, wake: make(chan struct{}, 1)}
}

// Update records the shard's latest counts; Run writes them.
func (s *StatusReporter) Update(r Report, maxFailed int) {
	rep := s.report(r, ShardMessage(r, maxFailed))
	s.mu.Lock()
	s.latest, s.pending = rep, true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *StatusReporter) report(r Report, message string) v1alpha1.ShardReport {
	return v1alpha1.ShardReport{
		Shard: int32(s.env.Shard), Attempt: int32(s.env.Attempt),
		ItemCounts: r.ItemCounts,
		Message:    v1alpha1.Truncate(message, v1alpha1.MaxShardMessageLength),
		Failures:   failureSample(r),
		ReportTime: &metav1.Time{Time: s.now()},
	}
}

// failureSample is the report's sample of the shard's failed items: the
// first few, bounded (every one is recorded in the ledger database).
func failureSample(r Report) []v1alpha1.FailureSample {
	out := make([]v1alpha1.FailureSample, 0, min(len(r.Failures), v1alpha1.MaxShardFailures))
	for _, f := range r.Failures[:min(len(r.Failures), v1alpha1.MaxShardFailures)] {
		out = append(out, v1alpha1.FailureSample{Entity: f.Entity, Occurrence: f.Occurrence, Class: f.Class, Error: f.Error})
	}
	return v1alpha1.BoundFailures(out)
}

// Run writes pending updates, at most one per interval, until ctx is done.
func (s *StatusReporter) Run(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		if wait := s.interval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		s.mu.Lock()
		rep, pending := s.latest, s.pending
		s.pending = false
		s.mu.Unlock()
		if !pending {
			continue
		}
		last = time.Now()
		if err := s.patch(ctx, rep); err != nil && ctx.Err() == nil {
			if IsInputError(err) {
				s.log.Error(err, "status reports stopped")
				return
			}
			s.log.Info("status report not written; the next one carries the same counts", "error", err.Error())
			s.mu.Lock()
			if !s.pending { // nothing newer: retry this one
				s.pending = true
			}
			s.mu.Unlock()
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

// Final writes the final report now, retrying for up to timeout.
func (s *StatusReporter) Final(ctx context.Context, r Report, message string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	rep := s.report(r, message)
	policy := Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, MaxAttempts: math.MaxInt, MaxElapsed: timeout}
	return policy.DoWhile(ctx, "writing the final status report",
		func(err error) bool { return !IsInputError(err) }, // the pod is another one: retrying cannot help
		nil, func(int) error { return s.patch(ctx, rep) })
}

// patch writes rep onto the worker's pod. A pod that is gone, or is another
// pod of the same name (a force-deleted pod's successor: the UID
// precondition fails), is an *InputError: retrying cannot help.
func (s *StatusReporter) patch(ctx context.Context, rep v1alpha1.ShardReport) error {
	body, err := ProgressPatch(s.env.PodUID, rep)
	if err != nil {
		return err
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.env.Namespace, Name: s.env.PodName}}
	err = s.c.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body))
	switch {
	case apierrors.IsNotFound(err):
		return &InputError{Where: "pod " + s.env.PodName, Msg: "is gone: nothing to report onto"}
	case apierrors.IsConflict(err) || uidMismatch(err):
		return &InputError{Where: "pod " + s.env.PodName, Msg: fmt.Sprintf("is not pod %s any more: another pod took its name", s.env.PodUID)}
	case err != nil:
		return fmt.Errorf("patching pod %s with the shard's report: %w", s.env.PodName, err)
	}
	return nil
}

// uidMismatch reports whether the API server refused a patch because the
// pod's UID is not the one the patch names (the UID is immutable, so a merge
// patch carrying another one is Invalid on field metadata.uid).
func uidMismatch(err error) bool {
	var st apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &st) || st.Status().Details == nil {
		return false
	}
	for _, c := range st.Status().Details.Causes {
		if c.Field == "metadata.uid" {
			return true
		}
	}
	return false
}

// ProgressPatch is the JSON merge patch of a worker's report onto its pod:
// the annotation v1alpha1.AnnotationProgress and, when known, the pod's UID,
// which the API server checks as a precondition.
func ProgressPatch(podUID string, rep v1alpha1.ShardReport) ([]byte, error) {
	val, err := json.Marshal(rep)
	if err != nil {
		return nil, fmt.Errorf("encoding the shard's report: %w", err)
	}
	meta := map[string]any{"annotations": map[string]string{v1alpha1.AnnotationProgress: string(val)}}
	if podUID != "" {
		meta["uid"] = podUID
	}
	b, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, fmt.Errorf("encoding the shard's report: %w", err)
	}
	return b, nil
}

// WriteTerminationMessage writes the final report, as the controller reads
// it (v1alpha1.ParseShardReport), to path.
func WriteTerminationMessage(path string, env PodEnv, r Report, message string) error {
	rep := v1alpha1.ShardReport{
		Shard: int32(env.Shard), Attempt: int32(env.Attempt),
		ItemCounts: r.ItemCounts,
		Message:    message,
		Failures:   failureSample(r),
	}
	b, err := rep.TerminationMessage()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("writing the termination message: %w", err)
	}
	return nil
}

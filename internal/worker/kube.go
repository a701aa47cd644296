package worker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/phrase"
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
	// RunFile is the file the run's ConfigMap is mounted as (DecodeRunFile),
	// RunDigest the digest the controller wrote it with.
	RunFile, RunDigest string
}

// PodEnvFrom reads the worker's environment (getenv is os.Getenv in a pod).
// A missing or malformed variable is an *InputErrors naming every one.
func PodEnvFrom(getenv func(string) string) (PodEnv, error) {
	errs := &InputErrors{Source: "worker environment"}
	str := func(name string) string {
		v := getenv(name)
		if v == "" {
			errs.Add(&InputError{Where: name, Msg: "is not set (the controller sets it on worker pods)"})
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
			errs.Add(&InputError{Where: name, Msg: fmt.Sprintf("is %q: want an integer from %d to %d", v, lo, hi)})
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
		RunFile:   str(v1alpha1.EnvRunFile),
		RunDigest: str(v1alpha1.EnvRunDigest),
	}
	e.Shard = num(v1alpha1.EnvShard, 0, v1alpha1.MaxWorkers-1)
	if errs.Count == 0 && e.Shard >= e.Shards {
		errs.Add(&InputError{Where: v1alpha1.EnvShard, Msg: fmt.Sprintf("is %d, but there are only %d shards", e.Shard, e.Shards)})
	}
	return e, errs.OrNil()
}

// ReadRun reads the worker's run from the file the kubelet mounted from
// the run's ConfigMap (the worker has no right to read runs through the API)
// and checks that it is the file the controller wrote for this pod (its
// digest: a ConfigMap someone replaced is not the run the API server
// validated) and the run the pod was created for (a run deleted and created
// again under the same name is another run, with another UID). Any error is
// bad input: the controller wrote the file before creating the pod.
func ReadRun(env PodEnv) (*v1alpha1.ProcessingRun, error) {
	where := fmt.Sprintf("ProcessingRun %s/%s", env.Namespace, env.Name)
	cm := v1alpha1.RunConfigMapName(env.Name, env.RunDigest)
	b, err := os.ReadFile(env.RunFile)
	if err != nil {
		return nil, &InputError{Where: where, Msg: fmt.Sprintf("cannot be read from %s (%s, mounted from ConfigMap %s): %v",
			env.RunFile, v1alpha1.EnvRunFile, cm, err)}
	}
	if got := v1alpha1.RunFileDigest(b); got != env.RunDigest {
		return nil, &InputError{Where: where, Msg: fmt.Sprintf(
			"%s (ConfigMap %s) is not the file the controller wrote for this pod: its digest is %s, not %s (%s): the ConfigMap was replaced",
			env.RunFile, cm, got, env.RunDigest, v1alpha1.EnvRunDigest)}
	}
	run, err := v1alpha1.DecodeRunFile(b)
	if err != nil {
		return nil, &InputError{Where: where, Msg: fmt.Sprintf("in %s: %v", env.RunFile, err)}
	}
	if run.Namespace != env.Namespace || run.Name != env.Name || string(run.UID) != env.UID {
		return nil, &InputError{Where: where, Msg: fmt.Sprintf("%s holds run %s/%s with UID %s, not UID %s: the run this pod was created for is gone",
			env.RunFile, run.Namespace, run.Name, run.UID, env.UID)}
	}
	return run, nil
}

// MountedBatchData returns the BatchData of a pod: the ConfigMap key the
// controller mounted as the file $RUNLEDGER_BATCH_FILE (path), so that the
// worker reads no ConfigMap through the API. A missing file is a ConfigMap or
// key deleted after the controller checked them: bad input.
func MountedBatchData(path, namespace string) BatchData {
	return mountedKey(path, namespace, "spec.batch.configMapRef:", v1alpha1.EnvBatchFile)
}

// MountedObjectCA is MountedBatchData for the CA bundle of
// spec.batch.object.caConfigMapRef, mounted as $RUNLEDGER_OBJECT_CA_FILE.
func MountedObjectCA(path, namespace string) BatchData {
	return mountedKey(path, namespace, "spec.batch.object.caConfigMapRef:", v1alpha1.EnvObjectCAFile)
}

func mountedKey(path, namespace, where, env string) BatchData {
	return func(_ context.Context, ref v1alpha1.ConfigMapKeyRef) ([]byte, string, error) {
		if path == "" {
			return nil, "", &InputError{Where: where, Msg: env + " is not set (the controller mounts the ConfigMap's key on worker pods)"}
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
	case r.WaitingForStandby:
		return v1alpha1.StandbyWaitMessage + ": the shard's counts are proven and are reported once a standby (streaming, or one a physical replication slot is kept for) has flushed the proof, a failover has them proven again on the server promoted, or the wait ends"
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
func Items(n int64) string { return phrase.Count(n, "item", "items") }

// podPatchError is the error of a patch of env's pod: a pod that is gone,
// or is another pod of the same name (a force-deleted pod's successor: the
// UID precondition fails), is an *InputError: retrying cannot help.
func podPatchError(err error, env PodEnv) error {
	switch {
	case apierrors.IsNotFound(err):
		return &InputError{Where: "pod " + env.PodName, Msg: "is gone: nothing to report onto"}
	case apierrors.IsConflict(err) || uidMismatch(err):
		return &InputError{Where: "pod " + env.PodName, Msg: fmt.Sprintf("is not pod %s any more: another pod took its name", env.PodUID)}
	case err != nil:
		return fmt.Errorf("patching pod %s with the shard's report: %w", env.PodName, err)
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

// WriteTerminationMessage writes the final report, as the controller reads
// it (v1alpha1.ParseShardReport), to path.
func WriteTerminationMessage(path string, env PodEnv, r Report, message string) error {
	rep := v1alpha1.ShardReport{
		Shard: int32(env.Shard), Attempt: int32(env.Attempt),
		ItemCounts:    r.ItemCounts,
		Message:       message,
		Failures:      failureSample(r),
		Replication:   r.Replication,
		ServerChanges: int32(min(r.ServerChanges, math.MaxInt32)), Reproven: int32(min(r.Reproven, math.MaxInt32)),
		Reprocessed: r.Reprocessed,
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

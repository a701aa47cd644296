package v1alpha1

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/internal/strictjson"
)

// The contract between the controller and the worker pods it creates.
//
// Pods. The controller creates one pod per shard and attempt, named
// PodName(run, shard, attempt) = "<run>-<shard>-<attempt>", with
// restartPolicy Never, the labels below, a controller owner reference to the
// run, and the worker container's command [WorkerBinary], the worker binary
// of the manager's image; a run that names its own image
// (spec.workerTemplate.image), which may be an earlier release's, gets the
// args [WorkerSubcommand] instead, the image's entrypoint being the
// runledger binary (`runledger worker`, the same worker). The worker learns
// everything else from the environment variables below and from its run's
// file: before a pass creates pods, the controller writes the run (its
// identity and spec, EncodeRunFile) into an immutable ConfigMap named by the
// file's digest, RunConfigMapName(run, RunFileDigest(file)), owned by the
// run, which the pod mounts (the kubelet reads it), so workers need no right
// to read runs.
// The pod's EnvRunDigest is that digest: the worker reads the file at start
// (DecodeRunFile), refuses it unless its digest is EnvRunDigest (a ConfigMap
// someone replaced is not the run the API server validated), and must check
// that the run's UID is EnvRunUID: a run deleted and created again under the
// same name is another run.
//
// Reports. A worker reports on its OWN pod, never on the run: a JSON merge
// patch of the pod's annotation AnnotationProgress, with the pod's UID
// (EnvPodUID) as precondition. The numbers are cumulative and exact for the
// whole shard: items an earlier attempt of the same run committed count as
// completed, so a later attempt's final report is the truth for the shard.
//
// One reporter per run. So that a run's progress costs the API server one
// pod write per RunReportInterval whatever its number of shards, the shards
// of a run hand their counts to one of them through the ledger database
// (table runledger.shard_progress): every ReportInterval each worker
// upserts its shard's row (its latest counts, attempt and message; an older
// attempt never overwrites a newer one's), and the live shard with the
// lowest index (its row not done and written within ReporterStaleSeconds,
// by the database's clock) is the run's reporter (a shard other than 0 only
// once it has published for RunReportInterval, so that the lower shards
// starting about when it does are on the board first): at most every
// RunReportInterval, and only when something changed, it writes on its own
// pod a RunReport, every shard's row as a ShardReport (reportTime: when the
// row was written, message cut to MaxRunReportMessageBytes, no failures).
// When the reporter finishes or dies, its row stops being live and the next
// shard takes over within ReporterStaleSeconds. The other workers write no
// periodic report. A worker that cannot publish (the database refuses it, a
// login or schema before migration 00015) reports its own shard instead, a
// ShardReport on its pod, at most every ReportInterval times the run's
// shard count (FallbackReportInterval): the run's writes stay bounded.
//
// The controller reads the annotations from its pod cache: a ShardReport
// is the report of its pod's shard and attempt; a RunReport's entries are
// the reports of those shards and attempts, whatever pod carries them. Of
// the reports of one shard and attempt it keeps, per count, the highest
// (counts only grow within an attempt) and the latest message. It writes the
// run at most once per status interval whatever the number of shards (as
// Argo Workflows' executors report on their pods).
//
// Final report. At exit the worker marks its row done with its final counts,
// patches its final ShardReport onto its pod (one write per shard and
// attempt, as the pod's own creation and phase changes are) and writes it
// to TerminationMessagePath (see Termination). The final report, not the
// RunReport, is the truth for a finished shard.
//
// Status. The controller is the only writer of the run's status (field
// manager ControllerFieldManager, server-side apply on the status
// subresource); workers never write the run. StatusSources names, for each
// field of a shard's entry, whether the controller decides it or copies it
// from the worker's report; the CRD's descriptions say the same, and a test
// holds them to it.
//
// Termination. At exit the worker writes the JSON of its final ShardReport to
// TerminationMessagePath (see ShardReport.TerminationMessage) and exits with
// one of the Exit* codes. The controller takes a finished shard's counts,
// message and failures from that message, and never lets a shard's counts
// go down while a new attempt catches up: during an attempt it shows, per
// field, the maximum of what earlier attempts last reported and what the
// current one reports; once the shard is finished it shows the final
// report's exact numbers.
const (
	// EnvRunNamespace is the namespace of the run.
	EnvRunNamespace = "RUNLEDGER_RUN_NAMESPACE"
	// EnvRunName is the name of the run.
	EnvRunName = "RUNLEDGER_RUN_NAME"
	// EnvRunUID is the UID of the run.
	EnvRunUID = "RUNLEDGER_RUN_UID"
	// EnvShard is the shard index, 0 <= shard < shards.
	EnvShard = "RUNLEDGER_SHARD"
	// EnvShards is the number of shards (spec.workers).
	EnvShards = "RUNLEDGER_SHARDS"
	// EnvAttempt is the attempt number of this pod, 0 for the first one.
	EnvAttempt = "RUNLEDGER_ATTEMPT"
	// EnvDatabaseURL holds the DSN, from the Secret spec.database.secretRef
	// through a secretKeyRef (never an argument, never logged).
	EnvDatabaseURL = "RUNLEDGER_DATABASE_URL"
	// EnvPodName is the pod's own name (downward API).
	EnvPodName = "POD_NAME"
	// EnvPodUID is the pod's own UID (downward API): the precondition of the
	// worker's reports, so that a worker whose pod was force-deleted never
	// reports onto a newer pod of the same name.
	EnvPodUID = "POD_UID"
	// EnvBatchFile, set on the pods of a spec.batch.configMapRef run, is the
	// file the ConfigMap's key is mounted as (the kubelet reads the
	// ConfigMap: workers have no right to read ConfigMaps).
	EnvBatchFile = "RUNLEDGER_BATCH_FILE"
	// EnvObjectCAFile, set on the pods of a spec.batch.object run with a
	// caConfigMapRef, is the file that ConfigMap key is mounted as.
	EnvObjectCAFile = "RUNLEDGER_OBJECT_CA_FILE"
	// EnvRunFile is the file the run's ConfigMap (RunConfigMapName) is
	// mounted as: the run the worker works for (DecodeRunFile).
	EnvRunFile = "RUNLEDGER_RUN_FILE"
	// EnvRunDigest is RunFileDigest of the run's file the controller wrote
	// for this pod: the worker reads no other.
	EnvRunDigest = "RUNLEDGER_RUN_DIGEST"

	// WorkerBinary is the worker binary in runledger's image
	// (cmd/runledger-worker, beside the runledger binary): the command of
	// the worker container of the manager's image.
	WorkerBinary = "/runledger-worker"
	// WorkerSubcommand is the argument the worker container runs with when
	// the run names its own image (the image's entrypoint, the runledger
	// binary, runs the worker).
	WorkerSubcommand = "worker"
	// WorkerContainerName is the name of the worker container.
	WorkerContainerName = "worker"
	// ProcessorContainerName is the name of the processor sidecar
	// (spec.effect.processor), a restartable init container.
	ProcessorContainerName = "processor"

	// AnnotationProgress is the worker's latest report on its own pod: the
	// JSON of a RunReport (the run's reporter) or of a ShardReport with
	// reportTime (see ParseProgress).
	AnnotationProgress = Group + "/progress"

	// ControllerFieldManager is the controller's server-side apply field
	// manager on the status subresource.
	ControllerFieldManager = "runledger-controller"
	// WorkerFieldManagerPrefix prefixes the field managers of workers of
	// earlier releases, which applied their reports onto the run's status.
	WorkerFieldManagerPrefix = "runledger-worker-"

	// TerminationMessagePath is where the worker writes its final
	// ShardReport (the pod's terminationMessagePath).
	TerminationMessagePath = "/dev/termination-log"
	// MaxTerminationMessageBytes is the most the kubelet keeps of a
	// termination message.
	MaxTerminationMessageBytes = 4096

	// ReportIntervalSeconds is how often a worker publishes its shard's
	// progress to the ledger database, and the least time between two
	// reports of one worker on its pod.
	ReportIntervalSeconds = 2
	// RunReportIntervalSeconds is the least time between two RunReports of a
	// run's reporter on its pod.
	RunReportIntervalSeconds = 4
	// ReporterStaleSeconds is how old a shard's progress row may be and the
	// shard still count as live, a candidate for the run's reporter.
	ReporterStaleSeconds = 8
	// MaxRunReportMessageBytes bounds each shard's message in a RunReport:
	// 256 shards' entries stay far within the API server's 256 KiB of
	// annotations per object.
	MaxRunReportMessageBytes = 256
)

// FallbackReportInterval is the least time between two reports of a worker
// on its own pod while it cannot publish its progress to the ledger
// database: ReportInterval times the run's shard count, so that a run's
// fallback reports cost at most one pod write per ReportInterval.
func FallbackReportInterval(shards int) time.Duration {
	return time.Duration(max(shards, 1)) * ReportIntervalSeconds * time.Second
}

// StatusSource is where the controller takes a status field from.
type StatusSource string

const (
	// FromController: the controller decides the field itself (from the
	// pods it observed and the run's spec).
	FromController StatusSource = "controller"
	// FromWorkerReport: the controller copies the field from the shard's
	// worker's report (its pod's AnnotationProgress, or its termination
	// message when the last report was lost).
	FromWorkerReport StatusSource = "worker report"
)

// StatusSources says, for each field of a shard's entry in status.shards[]
// (by its JSON name), where its value comes from. The controller writes all
// of them; every field of the run's status outside shards[] is the
// controller's own (FromController).
var StatusSources = map[string]StatusSource{
	"index":             FromController,
	"pod":               FromController,
	"phase":             FromController,
	"failedAttempts":    FromController,
	"lastFailedAttempt": FromController,
	"attempt":           FromWorkerReport,
	"total":             FromWorkerReport,
	"completed":         FromWorkerReport,
	"alreadyHandled":    FromWorkerReport,
	"failed":            FromWorkerReport,
	"payloadChanged":    FromWorkerReport,
	"message":           FromWorkerReport,
	"failures":          FromWorkerReport,
	"lastReportTime":    FromWorkerReport,
}

// Worker exit codes. Any other exit (a crash, OOM kill, eviction) is a failed
// attempt too and is retried like ExitFailed.
const (
	// ExitSucceeded: the shard is done (failed items within maxFailedItems).
	ExitSucceeded = 0
	// ExitFailed: the shard failed (more failed items than maxFailedItems, or
	// an error that outlived the retries). The controller retries the shard
	// up to spec.backoffLimit times.
	ExitFailed = 1
	// ExitBadInput: bad input or configuration (malformed items, a missing
	// column, an unusable DSN). Retrying cannot help: the controller fails the
	// run at once with the report's message.
	ExitBadInput = 2
	// ExitShardBusy: the shard's lock stayed taken for the whole lock wait:
	// another process (an earlier pod the controller replaced, still
	// finishing) runs the shard. Nothing was processed. The controller
	// retries after a back-off and does not count it against backoffLimit.
	// While it waits, the worker's status message starts with
	// ShardBusyMessage.
	ExitShardBusy = 3
	// ExitRunsInFlight (runledger prune, never a worker): some old batches
	// were left unpruned because their run is in flight (a shard of it holds
	// its lock); every other batch was pruned, and the rest of the command
	// ran. Nothing is wrong: prune again once those runs are over.
	ExitRunsInFlight = 4
	// ExitNotFound (runledger items and runledger key, never a worker): the
	// ledger database has no run of that name, or knows nothing of that key
	// (no ledger row, no failure record).
	ExitNotFound = 5
)

// ShardBusyMessage starts the worker's status message (and final report's
// message) while, or because, another process holds the shard's lock.
const ShardBusyMessage = "waiting for the shard's lock"

// DatabaseRefusingMessage starts the worker's status message while the
// database refuses it a connection because it has as many as it allows
// (SQLSTATE 53300, too_many_connections) and the worker waits to try again.
const DatabaseRefusingMessage = "waiting for a database connection"

// StandbyWaitMessage starts the worker's status message while its shard,
// proven, waits for a standby of the ledger's server to have the proof
// (docs/guarantee.md, "The counts are proven by the ledger").
const StandbyWaitMessage = "waiting for a standby of the ledger"

// Labels on worker pods.
const (
	// LabelRun is the name of the pod's run.
	LabelRun = Group + "/run"
	// LabelRunUID is the UID of the pod's run.
	LabelRunUID = Group + "/run-uid"
	// LabelShard is the pod's shard index.
	LabelShard = Group + "/shard"
	// LabelAttempt is the pod's attempt number.
	LabelAttempt = Group + "/attempt"
)

// WorkerFieldManager is the server-side apply field manager of the worker of
// the given shard, e.g. "runledger-worker-3".
func WorkerFieldManager(shard int32) string {
	return WorkerFieldManagerPrefix + strconv.Itoa(int(shard))
}

// PodName is the deterministic name of a shard's pod for an attempt:
// "<run>-<shard>-<attempt>".
func PodName(run string, shard, attempt int32) string {
	return fmt.Sprintf("%s-%d-%d", run, shard, attempt)
}

// RunConfigMapName is the name of the immutable ConfigMap that holds a
// run's file (WorkerRunFile) of the given digest (RunFileDigest) for its
// pods: "runledger-<run>-<the digest's first 10 hex digits>". An edited
// spec is another file, so another ConfigMap.
func RunConfigMapName(run, digest string) string {
	return "runledger-" + run + "-" + digest[:min(len(digest), 10)]
}

// RunFileDigest is the hex SHA-256 of a run's file.
func RunFileDigest(file []byte) string {
	sum := sha256.Sum256(file)
	return hex.EncodeToString(sum[:])
}

// MaxRunFileBytes bounds a run's file once decompressed: far more than the
// API server stores in one object.
const MaxRunFileBytes = 16 << 20

// EncodeRunFile is the run's file: the gzip of the JSON of the run's kind,
// identity (name, namespace, UID) and spec, nothing else. The same run
// gives the same bytes (no time or name in the gzip header), so the same
// digest: the controller writes another ConfigMap only when the spec changed.
func EncodeRunFile(run *ProcessingRun) ([]byte, error) {
	doc := ProcessingRun{
		TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: "ProcessingRun"},
		ObjectMeta: metav1.ObjectMeta{Name: run.Name, Namespace: run.Namespace, UID: run.UID},
		Spec:       run.Spec,
	}
	js, err := json.Marshal(&doc)
	if err != nil {
		return nil, fmt.Errorf("encoding run %s/%s: %w", run.Namespace, run.Name, err)
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(js); err != nil {
		return nil, fmt.Errorf("compressing run %s/%s: %w", run.Namespace, run.Name, err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("compressing run %s/%s: %w", run.Namespace, run.Name, err)
	}
	return b.Bytes(), nil
}

// DecodeRunFile reads a run's file (EncodeRunFile).
func DecodeRunFile(b []byte) (*ProcessingRun, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("reading the run's file: %w", err)
	}
	js, err := io.ReadAll(io.LimitReader(zr, MaxRunFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the run's file: %w", err)
	}
	if len(js) > MaxRunFileBytes {
		return nil, fmt.Errorf("reading the run's file: more than %d bytes", MaxRunFileBytes)
	}
	// encoding/json, as the API client decodes a run: the file is the
	// controller's own encoding of what the API server stored.
	run := &ProcessingRun{}
	if err := json.Unmarshal(js, run); err != nil {
		return nil, fmt.Errorf("reading the run's file: %w", err)
	}
	if run.Kind != "ProcessingRun" || run.APIVersion != GroupVersion.String() {
		return nil, fmt.Errorf("reading the run's file: it holds %s %s, not a %s ProcessingRun", run.APIVersion, run.Kind, GroupVersion)
	}
	return run, nil
}

// +kubebuilder:object:generate=false

// ShardReport is a worker's report: the JSON of its termination message (the
// final one) and of its pod's AnnotationProgress (the latest one, with
// ReportTime). Its counts are cumulative and exact for the whole shard.
type ShardReport struct {
	Shard      int32 `json:"shard"`
	Attempt    int32 `json:"attempt"`
	ItemCounts `json:",inline"`
	Message    string `json:"message,omitempty"`
	// Failures are the shard's first failed items (BoundFailures).
	Failures []FailureSample `json:"failures,omitempty"`
	// ReportTime is when the worker wrote the report (progress annotations
	// only: the termination message has the container's finish time).
	ReportTime *metav1.Time `json:"reportTime,omitempty"`
	// Replication is what the ledger's server promises of a commit, as the
	// worker read it at start; absent before it could, and from workers of
	// earlier releases.
	Replication *LedgerReplication `json:"replication,omitempty"`
	// ServerChanges counts the times the shard's sessions reached another
	// ledger server, or another life of it (a failover, a restart);
	// Reproven counts the passes the shard made again because the ledger no
	// longer held items it had counted, Reprocessed those items (their
	// commits lost with the old server, processed again). The controller
	// records an Event for a shard that succeeded after any of them. Absent
	// from workers of earlier releases.
	ServerChanges int32 `json:"serverChanges,omitempty"`
	Reproven      int32 `json:"reproven,omitempty"`
	Reprocessed   int64 `json:"reprocessed,omitempty"`
}

// +kubebuilder:object:generate=false

// LedgerReplication is what the ledger's server promises of a commit it
// acknowledges, as a worker's login read it at start (ledger.Durability):
// the run's SynchronousReplication condition and runledger run's summary
// show it.
type LedgerReplication struct {
	// Synchronous: the server acknowledges a commit only once a synchronous
	// standby has it (synchronousStandbyNames names one and
	// synchronousCommit is remote_write, on or remote_apply), so a failover
	// to that standby keeps every acknowledged commit. Otherwise a failover
	// can lose the latest ones (asynchronous replication, or none).
	Synchronous bool `json:"synchronous"`
	// Standby is how far the synchronous standby has a commit when the
	// server acknowledges it: written (remote_write: not yet flushed, a
	// crash of the standby's operating system can lose it), flushed (on) or
	// applied (remote_apply); empty when Synchronous is false.
	Standby string `json:"standby,omitempty"`
	// SynchronousCommit is the login's synchronous_commit (what its
	// sessions start with).
	SynchronousCommit string `json:"synchronousCommit"`
	// SynchronousStandbyNames is the server's synchronous_standby_names,
	// cut to MaxStandbyNamesBytes.
	SynchronousStandbyNames string `json:"synchronousStandbyNames,omitempty"`
	// InRecovery: the server was a standby in recovery (it accepts no
	// commit).
	InRecovery bool `json:"inRecovery,omitempty"`
}

// Message says r in a sentence for users: the message of the run's
// SynchronousReplication condition and the line of runledger run's
// summary.
func (r LedgerReplication) Message() string {
	settings := fmt.Sprintf("synchronous_commit=%s, synchronous_standby_names='%s'", r.SynchronousCommit, r.SynchronousStandbyNames)
	const lost = "the counts are proven from the ledger, an item whose commit was lost is processed again, and a processor may get it again with the same idempotency key"
	var msg string
	switch {
	case r.Synchronous:
		has := map[string]string{"written": "written it, not yet flushed it to disk", "flushed": "flushed it to disk",
			"applied": "flushed it to disk and applied it"}[r.Standby]
		msg = fmt.Sprintf("the ledger's server acknowledges a commit only once a synchronous standby has %s (%s): a failover to that standby keeps every acknowledged commit", cmp.Or(has, "it"), settings)
		if r.Standby == "written" {
			msg += ", unless the standby's operating system crashes too"
		}
	case r.SynchronousCommit == "off":
		msg = fmt.Sprintf("the ledger's server acknowledges a commit before it is flushed to disk, even its own (%s): a crash or a failover can lose the latest commits; %s", settings, lost)
	default:
		msg = fmt.Sprintf("the ledger's server acknowledges a commit before any standby has it (%s): a failover can lose the latest commits; %s", settings, lost)
	}
	if r.InRecovery {
		msg = "the ledger's server was a standby in recovery when the worker read it; " + msg
	}
	return msg
}

// MaxStandbyNamesBytes bounds LedgerReplication.SynchronousStandbyNames in
// a report (within the termination message's bytes).
const MaxStandbyNamesBytes = 256

// TerminationMessage encodes the report for TerminationMessagePath, within
// MaxTerminationMessageBytes: the message cut first, to minKeptMessage,
// then the failures dropped (the latest first), then the message cut
// further.
func (r ShardReport) TerminationMessage() ([]byte, error) {
	for {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encode shard report: %w", err)
		}
		excess := len(b) - MaxTerminationMessageBytes
		switch {
		case excess <= 0:
			return b, nil
		case len(r.Message) > minKeptMessage:
			r.Message = Truncate(r.Message, max(len(r.Message)-excess, minKeptMessage))
		case len(r.Failures) > 0:
			r.Failures = r.Failures[:len(r.Failures)-1]
		case len(r.Message) > len("…"):
			n := len(r.Message) - excess
			if n < len("…") { // escaping makes the JSON longer than the text
				n = max(len(r.Message)/2, len("…"))
			}
			r.Message = Truncate(r.Message, n)
		case r.Message != "":
			r.Message = ""
		default:
			return nil, errors.New("encode shard report: too long without a message")
		}
	}
}

// +kubebuilder:object:generate=false

// RunReport is the report of a run's reporter (see the contract above): the
// latest progress of every shard of its run, the JSON of its pod's
// AnnotationProgress.
type RunReport struct {
	// Reporter is the shard whose worker wrote it.
	Reporter int32 `json:"reporter"`
	// Shards are the shards' reports, by shard; each ReportTime is when the
	// shard's worker published it.
	Shards []ShardReport `json:"shards"`
	// ReportTime is when the reporter wrote it.
	ReportTime *metav1.Time `json:"reportTime,omitempty"`
	// Replication is what the ledger's server promises of a commit, as the
	// reporter read it at start (ShardReport.Replication).
	Replication *LedgerReplication `json:"replication,omitempty"`
}

// ParseProgress decodes a pod's AnnotationProgress: a RunReport (run non-nil)
// or a ShardReport (shard non-nil); anything else is an error.
func ParseProgress(v string) (shard *ShardReport, run *RunReport, err error) {
	if r, err := ParseShardReport(v); err == nil {
		return &r, nil, nil
	}
	var rr RunReport
	if err := strictjson.Unmarshal([]byte(v), &rr, true); err != nil {
		return nil, nil, fmt.Errorf("decode progress report: %w", err)
	}
	if rr.Reporter < 0 || rr.Shards == nil {
		return nil, nil, errors.New("decode progress report: neither a shard's nor a run's report")
	}
	for i := range rr.Shards {
		if e := rr.Shards[i]; e.Shard < 0 || e.Attempt < 0 || e.Negative() {
			return nil, nil, errors.New("decode progress report: negative field")
		}
		rr.Shards[i].Failures = BoundFailures(rr.Shards[i].Failures)
	}
	return nil, &rr, nil
}

// minKeptMessage is how much of its message a termination message keeps
// before it drops failures.
const minKeptMessage = 1024

// ParseShardReport decodes a termination message written by
// ShardReport.TerminationMessage. It fails on anything else (with
// terminationMessagePolicy FallbackToLogsOnError, a worker that crashed
// before writing its report leaves the tail of its log there instead).
func ParseShardReport(msg string) (ShardReport, error) {
	var r ShardReport
	// Strict: a field given twice, invalid UTF-8 or a lone surrogate is no
	// report, as is an unknown field or trailing data.
	if err := strictjson.Unmarshal([]byte(msg), &r, true); err != nil {
		return ShardReport{}, fmt.Errorf("decode shard report: %w", err)
	}
	if r.Shard < 0 || r.Attempt < 0 || r.Negative() {
		return ShardReport{}, errors.New("decode shard report: negative field")
	}
	// The status' bounds, whatever the worker sent.
	r.Failures = BoundFailures(r.Failures)
	return r, nil
}

// BoundFailures is failures as a report and the status carry them: the
// first MaxShardFailures, each text cut to its bound (Truncate).
func BoundFailures(failures []FailureSample) []FailureSample {
	if len(failures) == 0 {
		return nil
	}
	out := make([]FailureSample, 0, min(len(failures), MaxShardFailures))
	for _, f := range failures[:min(len(failures), MaxShardFailures)] {
		out = append(out, FailureSample{
			Entity: Truncate(f.Entity, MaxFailureSampleBytes), Occurrence: Truncate(f.Occurrence, MaxFailureSampleBytes),
			Class: Truncate(f.Class, MaxFailureClassBytes), Error: Truncate(f.Error, MaxFailureSampleBytes),
		})
	}
	return out
}

// Truncate cuts s to at most n bytes (and never less than the mark), on a
// rune boundary, and marks the cut with "…": for the API's length limits on
// messages and notes.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len("…"), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

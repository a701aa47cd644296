package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// ProgressBoard is where a run's workers publish their shards' progress and
// its reporter reads it (the ledger database: *ledger.Store).
type ProgressBoard interface {
	PublishProgress(ctx context.Context, uid string, p ledger.ShardProgress, liveFor time.Duration) (written bool, lowestOther int, err error)
	RunProgress(ctx context.Context, uid string) ([]ledger.ShardProgress, error)
}

// StatusReporter reports the worker's shard as the contract
// (api/v1alpha1/contract.go, "Reports") says: it publishes the shard's
// progress to the board every interval and, while it is the run's reporter,
// writes every shard's progress onto its own pod at most every
// RunReportInterval; without a board (or while publishing fails) it reports
// its own shard on its pod at most every FallbackReportInterval. Reports are
// cumulative and exact, so a lost write loses nothing: the next one (or the
// termination message) carries the numbers.
type StatusReporter struct {
	c   *PodClient
	env PodEnv
	// interval is the publishing period; runInterval the least time between
	// two RunReports, fallback between two reports of the own shard.
	interval, runInterval, fallback time.Duration
	log                             logr.Logger
	now                             func() time.Time

	mu    sync.Mutex
	board ProgressBoard
	// replication is what the ledger's server promises of a commit
	// (SetReplication), in every report from then on.
	replication *v1alpha1.LedgerReplication
	latest      v1alpha1.ShardReport
	has         bool // latest holds a report
	pending     bool // latest not yet written on the pod
	final       bool // Final was called: no more turns
	wake        chan struct{}

	// Owned by Run's goroutine.
	lastOwn, lastRun, lastPublish, firstPublish time.Time
	lastRunReport                               []v1alpha1.ShardReport
	boardFailing                                bool
}

// NewStatusReporter reports for env's shard, publishing every interval
// (v1alpha1.ReportIntervalSeconds when 0; the run's reports and the
// fallback's scale with it).
func NewStatusReporter(c *PodClient, env PodEnv, interval time.Duration, log logr.Logger) *StatusReporter {
	if interval <= 0 {
		interval = v1alpha1.ReportIntervalSeconds * time.Second
	}
	scale := float64(interval) / float64(v1alpha1.ReportIntervalSeconds*time.Second)
	return &StatusReporter{c: c, env: env, interval: interval, log: log, now: time.Now, wake: make(chan struct{}, 1),
		runInterval: time.Duration(scale * float64(v1alpha1.RunReportIntervalSeconds*time.Second)),
		fallback:    time.Duration(scale * float64(v1alpha1.FallbackReportInterval(env.Shards)))}
}

// SetBoard makes the reporter publish to b from now on (once the worker has
// its database).
func (s *StatusReporter) SetBoard(b ProgressBoard) {
	s.mu.Lock()
	s.board = b
	s.mu.Unlock()
}

// SetReplication puts rep, what the ledger's server promises of a commit,
// in the reports from now on: the controller shows it on the run.
func (s *StatusReporter) SetReplication(rep *v1alpha1.LedgerReplication) {
	s.mu.Lock()
	s.replication = rep
	s.mu.Unlock()
}

// Update records the shard's latest counts; Run publishes and writes them.
func (s *StatusReporter) Update(r Report, maxFailed int) {
	rep := s.report(r, ShardMessage(r, maxFailed))
	s.mu.Lock()
	s.latest, s.has, s.pending = rep, true, true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *StatusReporter) report(r Report, message string) v1alpha1.ShardReport {
	s.mu.Lock()
	replication := s.replication
	s.mu.Unlock()
	return v1alpha1.ShardReport{
		Shard: int32(s.env.Shard), Attempt: int32(s.env.Attempt),
		ItemCounts:  r.ItemCounts,
		Message:     v1alpha1.Truncate(message, v1alpha1.MaxShardMessageLength),
		Failures:    failureSample(r),
		ReportTime:  &metav1.Time{Time: s.now()},
		Replication: cmp.Or(r.Replication, replication),
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

// reportAction is what one turn of the reporter writes on the pod.
type reportAction int

const (
	writeNothing  reportAction = iota
	writeOwnShard              // the fallback: this shard's ShardReport
	writeRun                   // the run's reporter: a RunReport
)

// reportTurn is what one turn of the reporter knows.
type reportTurn struct {
	shard int
	// published: this shard's progress is on the board (this turn or an
	// earlier one, the board answering); lowestOther is the lowest other
	// live shard on it, -1 for none.
	published   bool
	lowestOther int
	// pending: this shard's latest report is not on the pod yet.
	pending bool
	// sincePublishing: since this shard's first publication (never: none
	// yet); a shard other than 0 reports the run only after runInterval of
	// it, so that the shards below it, starting about when it does, are on
	// the board first.
	sincePublishing time.Duration
	// sinceOwn, sinceRun: since the last ShardReport, RunReport on the pod
	// (math.MaxInt64 for never).
	sinceOwn, sinceRun time.Duration
}

// decideReport is what a turn writes on the pod: the run's reporter (the
// lowest live shard on the board, once it has published for runInterval)
// a RunReport every runInterval; a worker off the board its own ShardReport
// every fallback; any other nothing.
func decideReport(t reportTurn, runInterval, fallback time.Duration) reportAction {
	switch {
	case !t.published && t.pending && t.sinceOwn >= fallback:
		return writeOwnShard
	case !t.published:
		return writeNothing
	case t.shard > 0 && (t.sincePublishing == never || t.sincePublishing < runInterval):
		return writeNothing
	case (t.lowestOther < 0 || t.shard < t.lowestOther) && t.sinceRun >= runInterval:
		return writeRun
	}
	return writeNothing
}

// runReport is the RunReport of reporter from the board's rows at now:
// each row's report time is when it was written, its message cut to
// MaxRunReportMessageBytes.
func runReport(reporter int, rows []ledger.ShardProgress, now time.Time) v1alpha1.RunReport {
	out := v1alpha1.RunReport{Reporter: int32(reporter), Shards: make([]v1alpha1.ShardReport, 0, len(rows)),
		ReportTime: &metav1.Time{Time: now.Truncate(time.Second)}}
	for _, r := range rows {
		out.Shards = append(out.Shards, v1alpha1.ShardReport{
			Shard: int32(r.Shard), Attempt: int32(r.Attempt), ItemCounts: r.ItemCounts,
			Message:    v1alpha1.Truncate(r.Message, v1alpha1.MaxRunReportMessageBytes),
			ReportTime: &metav1.Time{Time: now.Add(-r.Age).Truncate(time.Second)},
		})
	}
	return out
}

// sameProgress: two RunReports' shards say the same, report times aside.
func sameProgress(a, b []v1alpha1.ShardReport) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		x.ReportTime, y.ReportTime = nil, nil
		if !equality.Semantic.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// never is the time since an event that did not happen.
const never = time.Duration(math.MaxInt64)

func since(now, t time.Time) time.Duration {
	if t.IsZero() {
		return never
	}
	return now.Sub(t)
}

// Run publishes and writes reports until ctx is done: a turn every
// interval, and at once when the first report comes.
func (s *StatusReporter) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-t.C:
		}
		if err := s.turn(ctx); err != nil && ctx.Err() == nil {
			if IsInputError(err) {
				s.log.Error(err, "status reports stopped")
				return
			}
			s.log.Info("status report not written; the next one carries the same counts", "error", err.Error())
		}
	}
}

// turn publishes the shard's progress when due, and writes on the pod what
// decideReport says.
func (s *StatusReporter) turn(ctx context.Context) error {
	s.mu.Lock()
	board, rep, has, pending, final := s.board, s.latest, s.has, s.pending, s.final
	s.mu.Unlock()
	if !has || final {
		return nil
	}
	now := s.now()
	tr := reportTurn{shard: s.env.Shard, lowestOther: -1, pending: pending, sinceOwn: since(now, s.lastOwn), sinceRun: since(now, s.lastRun)}
	if board != nil && since(now, s.lastPublish) >= s.interval {
		s.lastPublish = now
		_, lowest, err := board.PublishProgress(ctx, s.env.UID, progressRow(rep, false), v1alpha1.ReporterStaleSeconds*time.Second)
		if err != nil && !s.boardFailing {
			s.log.Info("progress not published to the database; reporting this shard on its pod meanwhile", "error", err.Error())
		}
		s.boardFailing = err != nil
		if err == nil && s.firstPublish.IsZero() {
			s.firstPublish = now
		}
		tr.lowestOther = lowest
	} else if board != nil && !s.boardFailing {
		return nil // published within the interval: nothing new to decide
	}
	tr.published = board != nil && !s.boardFailing
	tr.sincePublishing = since(now, s.firstPublish)
	switch decideReport(tr, s.runInterval, s.fallback) {
	case writeOwnShard:
		return s.writeOwn(ctx, rep)
	case writeRun:
		return s.writeRun(ctx, board, now)
	}
	return nil
}

func (s *StatusReporter) writeOwn(ctx context.Context, rep v1alpha1.ShardReport) error {
	s.lastOwn = s.now()
	if err := s.patch(ctx, rep); err != nil {
		return err
	}
	s.mu.Lock()
	if s.latest.ReportTime.Equal(rep.ReportTime) {
		s.pending = false
	}
	s.mu.Unlock()
	return nil
}

func (s *StatusReporter) writeRun(ctx context.Context, board ProgressBoard, now time.Time) error {
	rows, err := board.RunProgress(ctx, s.env.UID)
	if err != nil {
		return err
	}
	rr := runReport(s.env.Shard, rows, now)
	s.mu.Lock()
	rr.Replication = s.replication
	s.mu.Unlock()
	if sameProgress(rr.Shards, s.lastRunReport) {
		return nil // nothing moved: no write, no reconcile
	}
	s.lastRun = now
	if err := s.patchValue(ctx, rr); err != nil {
		return err
	}
	s.lastRunReport = rr.Shards
	return nil
}

// progressRow is rep as the board keeps it.
func progressRow(rep v1alpha1.ShardReport, done bool) ledger.ShardProgress {
	return ledger.ShardProgress{Shard: int(rep.Shard), Attempt: int(rep.Attempt), ItemCounts: rep.ItemCounts, Message: rep.Message, Done: done}
}

// Final publishes the final report to the board (done: the shard is no
// reporter any more) and writes it on the pod now, retrying for up to
// timeout.
func (s *StatusReporter) Final(ctx context.Context, r Report, message string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	rep := s.report(r, message)
	s.mu.Lock()
	board := s.board
	s.final = true // a later turn would publish the shard live again
	s.mu.Unlock()
	if board != nil {
		if _, _, err := board.PublishProgress(ctx, s.env.UID, progressRow(rep, true), v1alpha1.ReporterStaleSeconds*time.Second); err != nil {
			s.log.Info("final progress not published to the database; the pod's report carries it", "error", err.Error())
		}
	}
	policy := Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, MaxAttempts: math.MaxInt, MaxElapsed: timeout}
	return policy.DoWhile(ctx, "writing the final status report",
		func(err error) bool { return !IsInputError(err) }, // the pod is another one: retrying cannot help
		nil, func(int) error { return s.patch(ctx, rep) })
}

// patch writes rep onto the worker's pod.
func (s *StatusReporter) patch(ctx context.Context, rep v1alpha1.ShardReport) error {
	return s.patchValue(ctx, rep)
}

// patchValue writes report (a ShardReport or a RunReport) onto the worker's
// pod. A pod that is gone, or is another pod of the same name (a
// force-deleted pod's successor: the UID precondition fails), is an
// *InputError: retrying cannot help.
func (s *StatusReporter) patchValue(ctx context.Context, report any) error {
	body, err := progressPatch(s.env.PodUID, report)
	if err != nil {
		return err
	}
	return podPatchError(s.c.PatchPod(ctx, s.env.Namespace, s.env.PodName, body), s.env)
}

// ProgressPatch is the JSON merge patch of a worker's report onto its pod:
// the annotation v1alpha1.AnnotationProgress and, when known, the pod's UID,
// which the API server checks as a precondition.
func ProgressPatch(podUID string, rep v1alpha1.ShardReport) ([]byte, error) {
	return progressPatch(podUID, rep)
}

func progressPatch(podUID string, report any) ([]byte, error) {
	val, err := json.Marshal(report)
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

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/cli/workercmd"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/logging"
	"github.com/runledger/runledger/internal/redact"
	"github.com/runledger/runledger/internal/worker"
)

const runLong = `Process a ProcessingRun manifest on this machine, without Kubernetes: the
same engine as the worker pods, writing to the same ledger.

The manifest is checked as a cluster checks it (the CRD's schema, validation
rules and defaults), so a manifest runledger run accepts is one kubectl apply
accepts. Its spec.database.secretRef is ignored: the ledger is the database of
$RUNLEDGER_DATABASE_URL, --dsn-file (a file holding the connection string) or
--dsn (visible to other users in ps: for a connection string without a
password, the password then coming from ~/.pgpass or $PGPASSFILE). For a batch.configMapRef, the JSON Lines come
from --from-file, or else from a ConfigMap of that name in the same
(multi-document) YAML file. Without --shard, every shard (spec.workers) runs
in this process, at most --parallel at once; with --shard I/N only shard I of
N does, so N processes (or machines) can share a run. The process holds at
most 2 connections to the ledger per shard running at once, and
spec.database.maxConnections, when set, lowers --parallel to
maxConnections / 2, as it bounds a run's worker pods in a cluster.

The run's identity is its metadata.uid, or when it has none (a manifest that
was never applied) a UUID derived from its namespace and name: running the
same manifest again, after an interruption or a kill, counts what the earlier
invocation committed as completed, and the totals come out as one
uninterrupted run's would. A uid the ledger records for another namespace or
name (a manifest copied with kubectl get -o yaml keeps metadata.uid) is bad
input: remove metadata.uid from the copy.

One process at a time runs a given shard of a given run (a lease in the
database, given back at the end, also on SIGINT/SIGTERM; one a killed process
held expires within 10s): a second invocation of the same manifest waits
--lock-wait, then exits 1, since both would count each other's commits as
their own.

Progress goes to stderr (a live line on a terminal, a line every
--progress-interval otherwise). The result goes to stdout: a summary, or with
--output json exactly one JSON object:

  {"total":N,"completed":N,"alreadyHandled":N,"failed":N,
   "failures":[{"entity":"...","occurrence":"...","error":"...","class":"..."}],
   "proven":true,
   "replication":{"synchronous":false,"synchronousCommit":"on"}}

(failures lists the first 100, class being the error's SQLSTATE or
runledger's class of it; proven: every shard finished and the ledger
proved its counts before it reported them, so they are what the database
holds, after a database failover too; "interrupted", "reproven" (shard
passes made again because the ledger had lost items they had counted),
"reprocessed" (those items), "onStandby" (whether a standby of the ledger's
server had flushed every shard's proof when it reported: confirmed,
notConfirmed within 10s, or unknown when the login may not read the
standbys' positions; absent without standbys) and "error" are added when
they apply; replication is what the ledger's server
promises of a commit, read at start: synchronous when it acknowledges a
commit only once a synchronous standby has it (standby: written, flushed or
applied), and the server's synchronousCommit and synchronousStandbyNames;
absent when it could not be read). Every failed item is also recorded in the ledger database:
runledger items NAME -n NAMESPACE --failed lists them all. Exit status: 0 when failed <= spec.maxFailedItems, 1 otherwise (or when
the run could not finish: interrupted, database unreachable after retries),
2 for bad input or configuration (nothing is committed then).`

type runOptions struct {
	batchInput
	shard            string
	output           string
	parallel         int
	progressInterval time.Duration
	workercmd.EngineFlags
	processorURL string
}

func newRunCommand() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run -f RUN.yaml [--dsn-file FILE] [--shard I/N] [--output json]",
		Short: "Process a ProcessingRun manifest locally, without Kubernetes",
		Long:  runLong,
		Example: `  runledger run -f invoices.yaml --dsn postgres://app@localhost/billing   # password from ~/.pgpass
  runledger run -f invoices.yaml --dsn-file /run/secrets/ledger-dsn
  runledger run -f invoices.yaml --shard 0/4 --output json
  runledger run -f mail-invoices.yaml --processor-url http://127.0.0.1:8080/process
  kubectl get prun june-invoices -o yaml | runledger run -f - --skip-migrate`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVarP(&o.file, "filename", "f", "", "the ProcessingRun manifest (YAML or JSON; - for stdin)")
	addDatabaseFlags(cmd, "PostgreSQL connection string of the ledger")
	f.StringVar(&o.shard, "shard", "", "process only shard I of N (N must equal spec.workers), e.g. 0/4")
	f.StringVarP(&o.output, "output", "o", "text", "result format on stdout: text or json")
	f.StringVar(&o.fromFile, "from-file", "", "JSON Lines file with the items of a batch.configMapRef (default: the ConfigMap in the manifest)")
	f.IntVar(&o.parallel, "parallel", 16, "at most this many shards at once in this process (2 connections each; spec.database.maxConnections / 2 at most)")
	f.DurationVar(&o.progressInterval, "progress-interval", 10*time.Second, "time between progress lines when stderr is not a terminal")
	o.Add(f, "SIGINT/SIGTERM", ledger.LeaseTTL+5*time.Second, "how long to wait while another process runs the same shard of the same run (or held it when it was killed)")
	f.StringVar(&o.processorURL, "processor-url", "", "call the spec.effect.processor you started at this URL, e.g. http://127.0.0.1:8080/process (default: the spec's port and path on 127.0.0.1; its image is not run)")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}

// runSummary is the result of `runledger run`, and its JSON output.
type runSummary struct {
	worker.RunResult
	Error string `json:"error,omitempty"`
}

func (o *runOptions) run(cmd *cobra.Command) error {
	if o.output != "text" && o.output != "json" {
		return exitcode.BadInput(fmt.Errorf("--output %q: want text or json", o.output))
	}
	o.stdin = cmd.InOrStdin()
	dsn, _ := databaseURL(cmd) // checked in execute, with the JSON output
	secrets := redact.New(dsn)
	stderr := secrets.Writer(cmd.ErrOrStderr())
	stdout := secrets.Writer(cmd.OutOrStdout())

	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, err := o.Logging.New(stderr, logging.IsTerminal(cmd.ErrOrStderr()))
	if err != nil {
		return exitcode.BadInput(err)
	}
	finished := make(chan struct{})
	defer close(finished) // before stop(): deferred calls run last first
	go func() {
		select {
		case <-finished:
			return
		case <-ctx.Done():
		}
		select {
		case <-finished: // the run ended, stop() cancelled ctx
		default:
			log.Info("stopping: no new chunk is taken; the chunk in flight commits or rolls back (send the signal again to abort)", "drainTimeout", o.DrainTimeout)
		}
		stop() // a second signal kills the process
	}()

	sum, err := o.execute(ctx, cmd, dsn, stderr, log)
	err = exitcode.Redact(err, secrets) // keeps the exit code execute chose
	if err != nil {
		sum.Error = err.Error()
	}
	if sum.Failures == nil {
		sum.Failures = []worker.Failure{}
	}
	if o.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false) // a DSN's & stays &, as the redactor reads a URL's query
		if werr := enc.Encode(sum); werr != nil {
			return errors.Join(err, fmt.Errorf("writing the result: %w", werr))
		}
	} else if sum.Shards != nil {
		printSummary(stdout, sum)
	}
	return err
}

// execute does the run and returns its summary; the error carries the exit
// code (exitcode.Error).
func (o *runOptions) execute(ctx context.Context, cmd *cobra.Command, dsn string, stderr io.Writer, log logr.Logger) (*runSummary, error) {
	sum := &runSummary{}
	if dsn == "" {
		_, err := databaseURL(cmd)
		return sum, err
	}
	m, plan, err := o.plan(ctx)
	if err != nil {
		return sum, err
	}
	log = log.WithValues("run", plan.Run.Namespace+"/"+plan.Run.Name, "attempt", 0)
	if o.processorURL != "" {
		if err := plan.UseProcessorURL(o.processorURL); err != nil {
			return sum, exitcode.For(err)
		}
	}
	if m.run.Spec.Suspend {
		log.Info("spec.suspend is true; runledger run ignores it and processes the run")
	}
	shards, err := selectShards(o.shard, plan.Shards)
	if err != nil {
		return sum, exitcode.BadInput(err)
	}
	if o.parallel < 1 {
		return sum, exitcode.BadInput(fmt.Errorf("--parallel %d: want 1 or more", o.parallel))
	}
	parallel := min(o.parallel, len(shards))
	// spec.database.maxConnections holds here too, by the rule the
	// controller applies to a run's pods (no manager: no default, no
	// maximum).
	budget := v1alpha1.ConnectionBudgetOf(&m.run.Spec, v1alpha1.ConnectionBudgetSettings{})
	if p := int(budget.Parallelism(int32(len(shards)))); p < parallel {
		log.Info("spec.database.maxConnections lowers --parallel", "maxConnections", budget.Limit, "parallel", p,
			"connectionsPerShard", v1alpha1.ConnectionsPerWorker)
		parallel = p
	}
	retry := o.Retry()

	var replication *v1alpha1.LedgerReplication
	store, closeStore, err := worker.Prepare(ctx, plan, worker.PrepareConfig{
		DSN: dsn, Parallel: parallel, SkipMigrate: o.SkipMigrate, Retry: retry, Log: log,
		ApplicationName: "runledger run/" + m.run.Namespace + "/" + m.run.Name,
		OnDurability:    func(d ledger.Durability) { replication = worker.Replication(d) },
	})
	if err != nil {
		return sum, exitcode.For(err)
	}
	defer closeStore()

	uidNote := "metadata.uid"
	if m.run.UID == "" {
		uidNote = "derived from namespace/name"
	}
	log.Info("processing run", "uid", plan.Run.UID, "uidFrom", uidNote,
		"source", describeSource(m.run), "shards", shardList(shards, plan.Shards))

	progress := worker.NewProgressPrinter(stderr, logging.IsTerminal(cmd.ErrOrStderr()), len(shards), o.progressInterval)
	progress.Start(ctx)
	res := worker.RunShards(ctx, store, plan, shards, worker.ShardsConfig{
		Parallel: parallel, Retry: retry, DrainTimeout: o.DrainTimeout, LockWait: o.LockWait,
		Log: log, Progress: progress.Update,
	})
	progress.Stop()

	res.Replication = replication
	sum.RunResult = res
	var errs []error
	badInputs := false
	for _, r := range res.Shards {
		if r.Err != nil {
			err, _ := exitcode.ExplainRejection(r.Err) // e.g. --skip-migrate: the shard connects first
			errs = append(errs, fmt.Errorf("shard %d: %w", r.Shard, err))
			badInputs = badInputs || exitcode.Of(r.Err) == v1alpha1.ExitBadInput
		}
		log.Info("shard finished", "shard", r.Shard, "state", shardState(r), "total", r.Total, "completed", r.Completed,
			"alreadyHandled", r.AlreadyHandled, "failed", r.Failed, "payloadChanged", r.PayloadChanged, "proven", r.Proven, "elapsed", r.Elapsed.Round(time.Millisecond).String())
	}
	switch {
	case badInputs: // e.g. the query failed when it ran, before any commit
		return sum, exitcode.BadInput(errors.Join(errs...))
	case len(errs) > 0:
		return sum, &exitcode.Error{Code: v1alpha1.ExitFailed, Err: errors.Join(errs...)}
	case sum.Interrupted:
		return sum, &exitcode.Error{Code: v1alpha1.ExitFailed, Err: fmt.Errorf("interrupted: %d of %s processed; run the same command again to finish (what was committed counts as completed)", sum.Processed(), worker.Items(sum.Total))}
	case sum.Failed > int64(plan.MaxFailedItems):
		return sum, &exitcode.Error{Code: v1alpha1.ExitFailed, Err: fmt.Errorf("%s failed, more than spec.maxFailedItems (%d)", worker.Items(sum.Failed), plan.MaxFailedItems)}
	}
	return sum, nil
}

func shardState(r worker.Report) string {
	switch {
	case r.Err != nil:
		return "failed"
	case r.Interrupted:
		return "interrupted"
	case r.TooManyFailures:
		return "stopped: too many failed items"
	case r.Done:
		return "done"
	}
	return "not started"
}

func printSummary(w io.Writer, s *runSummary) {
	fmt.Fprintf(w, "total %d, completed %d, already handled %d, failed %d (%s)\n",
		s.Total, s.Completed, s.AlreadyHandled, s.Failed, s.Elapsed.Round(time.Millisecond))
	if s.PayloadChanged > 0 {
		fmt.Fprintf(w, "payload changed %d (already handled by another run, whose committed row has a different payload)\n", s.PayloadChanged)
	}
	if s.Reproven > 0 {
		fmt.Fprintf(w, "the ledger did not hold %d items counted before (commits lost, as in a database failover): processed again, %d shard passes more; the counts above are the ledger's\n", s.Reprocessed, s.Reproven)
	}
	switch s.OnStandby {
	case worker.OnStandbyNotConfirmed:
		fmt.Fprintf(w, "no standby of the ledger's server had the proof after %s: a failover now could lose its latest commits (runledger verify proves the run again after one)\n", worker.DefaultStandbyWait)
	case worker.OnStandbyUnknown:
		fmt.Fprintln(w, "whether a standby of the ledger's server has the proof is unknown (the login may not read pg_stat_replication's positions: grant it pg_monitor)")
	}
	if len(s.Failures) > 0 {
		fmt.Fprintf(w, "failures (first %d of %d):\n", len(s.Failures), s.Failed)
		for _, f := range s.Failures {
			fmt.Fprintf(w, "  %s / %s: %s\n", f.Entity, f.Occurrence, f.Error)
		}
	}
	if r := s.Replication; r != nil {
		verdict := "asynchronous"
		if r.Synchronous {
			verdict = "synchronous"
		}
		fmt.Fprintf(w, "replication %s: %s\n", verdict, r.Message())
	}
}

// selectShards parses --shard ("I/N" or "I"; N must be the manifest's
// workers) and returns the shards to run.
func selectShards(flag string, shards int) ([]int, error) {
	if flag == "" {
		out := make([]int, shards)
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	is, ns, hasN := strings.Cut(flag, "/")
	i, err := strconv.Atoi(is)
	if err != nil || i < 0 {
		return nil, fmt.Errorf("--shard %q: want I/N, e.g. 0/%d", flag, shards)
	}
	if hasN {
		n, err := strconv.Atoi(ns)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--shard %q: want I/N, e.g. 0/%d", flag, shards)
		}
		if n != shards {
			return nil, fmt.Errorf("--shard %q: the manifest declares spec.workers: %d, so N must be %d (the number of shards decides which shard owns each item)", flag, shards, shards)
		}
	}
	if i >= shards {
		return nil, fmt.Errorf("--shard %q: shard indexes go from 0 to %d", flag, shards-1)
	}
	return []int{i}, nil
}

func shardList(s []int, n int) string {
	if len(s) == 1 && n > 1 {
		return fmt.Sprintf("%d/%d", s[0], n)
	}
	return fmt.Sprintf("all %d", n)
}

func describeSource(run *v1alpha1.ProcessingRun) string {
	switch b := run.Spec.Batch; {
	case len(b.Items) > 0:
		return fmt.Sprintf("%d inline items", len(b.Items))
	case b.ConfigMapRef != nil:
		return "configMap " + b.ConfigMapRef.Name + "/" + b.ConfigMapRef.Key
	case b.FromRun != nil:
		return "the failed items of run " + b.FromRun.Name
	case b.Object != nil:
		return b.Object.Location()
	}
	return "query"
}

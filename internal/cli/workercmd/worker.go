// Package workercmd is the worker: the process that runs one shard of a
// ProcessingRun in the pod the controller created for it, and the flags and
// helpers it shares with runledger run. The worker binary
// cmd/runledger-worker (what the pods of the manager's image run, without
// the manager's libraries: docs/scale.md) and `runledger worker` (what the
// pods of a run that names its own image run) are the same command; it
// imports no Kubernetes client library (TestWorkerBinaryDeps).
package workercmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/logging"
	"github.com/runledger/runledger/internal/redact"
	"github.com/runledger/runledger/internal/version"
	"github.com/runledger/runledger/internal/worker"
)

const workerLong = `Process one shard of a ProcessingRun, inside the worker pod the controller
created for it. Everything comes from the pod's environment (` + v1alpha1.EnvRunNamespace + `,
` + v1alpha1.EnvRunName + `, ` + v1alpha1.EnvRunUID + `, ` + v1alpha1.EnvShard + `, ` + v1alpha1.EnvShards + `, ` + v1alpha1.EnvAttempt + `,
` + v1alpha1.EnvDatabaseURL + ` from the run's Secret, ` + v1alpha1.EnvPodName + `, ` + v1alpha1.EnvPodUID + `) and from the files
the kubelet mounts: the run itself ($` + v1alpha1.EnvRunFile + `, from the ConfigMap
runledger-<run>-<digest> the controller writes; a file whose digest is not $` + v1alpha1.EnvRunDigest + ` is refused)
and a configMapRef batch ($` + v1alpha1.EnvBatchFile + `).
The worker reads nothing through the API.

The worker applies the ledger's migrations (unless --skip-migrate), commits
its shard's items, publishes its counts to the ledger database every 2
seconds, where the run's lowest live shard reads every shard's and writes them
on its own pod (the annotation ` + v1alpha1.AnnotationProgress + `, which the
controller folds into the run's status) at most every 4 seconds, reports
its final counts on its own pod at the end, and writes them as JSON to the
termination message. On SIGTERM it takes no new chunk,
lets the chunk in flight commit (within --drain-timeout), reports and exits.

Exit status: 0 shard done (failed items within maxFailedItems), 1 failed
(retried by the controller up to spec.backoffLimit), 2 bad input or
configuration (not retried).`

type workerOptions struct {
	dsnFile        string
	terminationLog string
	reportInterval time.Duration
	tokenDir       string
	EngineFlags
}

// New is the `worker` subcommand of runledger.
func New() *cobra.Command {
	return newCommand(v1alpha1.WorkerSubcommand)
}

// NewBinary is the command line of the worker binary, cmd/runledger-worker
// (v1alpha1.WorkerBinary in the image): the worker subcommand's, with
// --version.
func NewBinary() *cobra.Command {
	cmd := newCommand(path.Base(v1alpha1.WorkerBinary))
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.Version = version.Get().Version
	cmd.SetVersionTemplate(version.Get().String())
	return cmd
}

func newCommand(use string) *cobra.Command {
	var o workerOptions
	cmd := &cobra.Command{
		Use:   use,
		Short: "Process one shard of a ProcessingRun inside its pod (started by the controller)",
		Long:  workerLong,
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.dsnFile, FlagDSNFile, "", "read the connection string from this file (a Secret mounted as a file) instead of $"+v1alpha1.EnvDatabaseURL)
	f.StringVar(&o.terminationLog, "termination-log", v1alpha1.TerminationMessagePath, "where to write the final report (the pod's terminationMessagePath)")
	f.DurationVar(&o.reportInterval, "report-interval", v1alpha1.ReportIntervalSeconds*time.Second, "least time between two status reports")
	f.StringVar(&o.tokenDir, "token-dir", v1alpha1.WorkerTokenPath, "the directory of the pod's ServiceAccount token and the API server's CA (token, ca.crt)")
	o.Add(f, "SIGTERM", time.Minute, "how long to wait while another process holds this shard's lock (an earlier pod still finishing)")
	_ = f.MarkHidden("report-interval")
	_ = f.MarkHidden("token-dir")
	return cmd
}

func (o *workerOptions) run(cmd *cobra.Command) error {
	env, envErr := o.podEnv()
	secrets := redact.New(env.DSN)
	// JSON lines on stderr (kubectl logs, log collectors) unless it is a
	// terminal, every one of them with the DSN's secrets masked.
	log, err := o.Logging.New(secrets.Writer(cmd.ErrOrStderr()), logging.IsTerminal(cmd.ErrOrStderr()))
	if err != nil {
		return exitcode.BadInput(err)
	}
	log = log.WithValues("run", env.Namespace+"/"+env.Name, "attempt", env.Attempt)
	engineLog := log // the engine adds "shard" itself
	log = log.WithValues("shard", env.Shard)

	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Said on a signal only: unregistered before stop() ends a shard that
	// finished by itself.
	quiet := context.AfterFunc(ctx, func() {
		if cmd.Context().Err() == nil {
			log.Info("stop requested: taking no new chunk; the chunk in flight commits or rolls back", "drainTimeout", o.DrainTimeout.String())
		}
	})
	defer quiet()

	s := &workerRun{opts: o, env: env, log: log, engineLog: engineLog}
	defer s.closeStore() // after finish: the final report marks the shard's row done through it
	rep, maxFailed, err := s.work(ctx, envErr)
	rep.Err, _ = exitcode.ExplainRejection(rep.Err) // e.g. --skip-migrate: the shard connects first
	code := exitcode.Worker(rep, err, maxFailed)    // before redaction, which may drop the errors' wrapping
	err = exitcode.Redact(err, secrets)
	rep.Err = secrets.Error(rep.Err)
	if err != nil && rep.Err == nil {
		rep.Err = err
	}
	message := worker.ShardMessage(rep, maxFailed)
	s.finish(ctx, rep, message)
	log.Info("shard finished", "exitCode", code, "total", rep.Total, "completed", rep.Completed,
		"alreadyHandled", rep.AlreadyHandled, "failed", rep.Failed, "message", message)
	if code == v1alpha1.ExitSucceeded {
		return nil
	}
	if err == nil {
		err = errors.New(message)
	}
	return &exitcode.Error{Code: code, Err: err}
}

// podEnv reads the pod's environment, the DSN from --dsn-file when set.
func (o *workerOptions) podEnv() (worker.PodEnv, error) {
	if o.dsnFile == "" {
		return worker.PodEnvFrom(os.Getenv)
	}
	dsn, err := ReadDSNFile(o.dsnFile)
	if err != nil {
		env, _ := worker.PodEnvFrom(os.Getenv) // for the logs and the report
		env.DSN = ""
		return env, err
	}
	return worker.PodEnvFrom(func(name string) string {
		if name == v1alpha1.EnvDatabaseURL {
			return dsn
		}
		return os.Getenv(name)
	})
}

type workerRun struct {
	opts *workerOptions
	env  worker.PodEnv
	log  logr.Logger
	// engineLog is log without "shard", which the engine adds itself.
	engineLog logr.Logger
	reporter  *worker.StatusReporter
	stopRep   func() // stops the periodic reports and waits for the last one
	// closeDB closes the shard's database pool (nil before it is open).
	closeDB func()
}

// closeStore closes the shard's database pool, once finish has used it.
func (s *workerRun) closeStore() {
	if s.closeDB != nil {
		s.closeDB()
	}
}

// finish writes the final status report and the termination message.
func (s *workerRun) finish(ctx context.Context, rep worker.Report, message string) {
	if s.reporter != nil {
		s.stopRep()
		if err := s.reporter.Final(ctx, rep, message, 5*time.Second); err != nil {
			s.log.Error(err, "final status report not written; the termination message carries the counts")
		}
	}
	if err := worker.WriteTerminationMessage(s.opts.terminationLog, s.env, rep, message); err != nil {
		s.log.Error(err, "termination message not written")
	}
}

// work prepares and runs the shard. It returns the shard's report, the run's
// maxFailedItems, and the error that kept the shard from running, if any.
func (s *workerRun) work(ctx context.Context, envErr error) (worker.Report, int, error) {
	if envErr != nil {
		return worker.Report{Shard: s.env.Shard}, 0, envErr
	}
	c, err := worker.InClusterPodClient(s.opts.tokenDir)
	if err != nil {
		return worker.Report{}, 0, fmt.Errorf("configuring the Kubernetes client: %w", err)
	}
	run, err := worker.ReadRun(s.env)
	if err != nil {
		return worker.Report{}, 0, exitcode.BadInput(err)
	}
	maxFailed := int(run.Spec.MaxFailedItems)

	s.reporter = worker.NewStatusReporter(c, s.env, s.opts.reportInterval, s.log)
	repCtx, cancelRep := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { s.reporter.Run(repCtx) })
	s.stopRep = func() { cancelRep(); wg.Wait() }

	if shards := cmp.Or(int(run.Spec.Workers), v1alpha1.DefaultWorkers); shards != s.env.Shards {
		return worker.Report{}, maxFailed, exitcode.BadInput(fmt.Errorf("%s is %d but the run has spec.workers %d", v1alpha1.EnvShards, s.env.Shards, shards))
	}
	data := worker.MountedBatchData(os.Getenv(v1alpha1.EnvBatchFile), run.Namespace)
	if run.Spec.Batch.Object != nil {
		data = worker.MountedObjectCA(os.Getenv(v1alpha1.EnvObjectCAFile), run.Namespace)
	}
	plan, err := worker.NewPlan(ctx, run, data, worker.Limits{})
	if err != nil {
		return worker.Report{}, maxFailed, err
	}
	retry := s.opts.Retry()
	var replication *v1alpha1.LedgerReplication
	store, closeStore, err := worker.Prepare(ctx, plan, worker.PrepareConfig{
		DSN: s.env.DSN, Parallel: 1, SkipMigrate: s.opts.SkipMigrate, Retry: retry, Log: s.log,
		ApplicationName: ledger.WorkerApplicationName(s.env.Namespace, s.env.Name, s.env.Shard),
		OnRetry: func(err error) {
			if ledger.IsTooManyConnections(err) {
				s.reporter.Update(worker.Report{Shard: s.env.Shard, WaitingForConnection: true}, maxFailed)
			}
		},
		OnDurability: func(d ledger.Durability) {
			replication = worker.Replication(d)
			s.reporter.SetReplication(replication)
		},
	})
	if err != nil {
		return worker.Report{}, maxFailed, exitcode.For(err)
	}
	s.closeDB = closeStore
	// From now on the shard's progress goes through the database, one
	// reporter per run writing it on its pod (the contract's "Reports").
	s.reporter.SetBoard(store)

	sc := plan.ShardConfig(s.env.Shard, s.env.Attempt)
	sc.Retry = retry
	sc.DrainTimeout = s.opts.DrainTimeout
	// A pod the controller replaced may still be finishing its chunk.
	sc.LockWait = s.opts.LockWait
	sc.Log = s.engineLog
	sc.Progress = func(r worker.Report) { s.reporter.Update(r, maxFailed) }
	s.log.Info("processing shard", "uid", plan.Run.UID, "shards", plan.Shards, "chunkSize", plan.ChunkSize)
	rep := worker.RunShard(ctx, store, sc)
	rep.Replication = replication // for the termination message
	return rep, maxFailed, nil
}

package worker

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// PrepareConfig says how to ready the ledger for a plan.
type PrepareConfig struct {
	// DSN is the ledger database's connection string.
	DSN string
	// Parallel is how many shards will run at once on the pool.
	Parallel int
	// SkipMigrate: the schema is migrated already (by the owner).
	SkipMigrate bool
	// ApplicationName names the pool's connections in pg_stat_activity
	// (ledger.ApplicationName).
	ApplicationName string
	// Retry is the back-off while the database is unreachable.
	Retry Backoff
	// Log is told about each retry.
	Log logr.Logger
	// OnRetry, if set, is told about each retryable error (the worker pod
	// reports a refused connection in its shard's status).
	OnRetry func(error)
	// OnDurability, if set, is told what the ledger's server promises of a
	// commit, read once at start (Prepare logs it): the worker pod reports
	// it, runledger run's summary shows it.
	OnDurability func(ledger.Durability)
}

// Prepare connects to the ledger's database, applies its migrations (unless
// SkipMigrate) and checks the plan on it (Plan.Check), retrying while the
// database is unreachable; what both `runledger worker` and `runledger run`
// do before their shards run. A connection string that cannot be parsed is an
// *InputError. The caller closes the store's pool with the returned func.
func Prepare(ctx context.Context, plan *Plan, cfg PrepareConfig) (*ledger.Store, func(), error) {
	pool, err := ledger.Open(ctx, cfg.DSN, v1alpha1.MaxConnectionsOf(int32(cfg.Parallel)), ledger.NetworkTimeout(plan.Timeouts.Network), ledger.ApplicationName(cfg.ApplicationName))
	if err != nil {
		return nil, nil, &InputError{Msg: err.Error()}
	}
	onRetry := func(step string) func(int, time.Duration, error) {
		return func(retry int, wait time.Duration, err error) {
			cfg.Log.Info("database not reachable, retrying", "step", step, "retry", retry, "wait", wait.Round(time.Millisecond).String(), "error", err.Error())
			if cfg.OnRetry != nil {
				cfg.OnRetry(err)
			}
		}
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	if !cfg.SkipMigrate {
		if err := cfg.Retry.Do(ctx, "migrating the ledger", onRetry("migrate"), func(int) error {
			_, err := ledger.Migrate(ctx, pool, func(holders []ledger.MigrationBlocker) {
				names := make([]string, len(holders))
				for i, h := range holders {
					names[i] = h.String()
				}
				cfg.Log.Info("waiting for the ledger's migration lock", "heldBy", strings.Join(names, "; "))
			})
			return err
		}); err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	store := ledger.NewStore(pool).WithBounds(plan.Timeouts.Query, plan.Timeouts.Lock)
	readDurability(ctx, store, cfg, onRetry("durability"))
	if err := plan.Check(ctx, store, cfg.Retry, onRetry("check")); err != nil {
		pool.Close()
		return nil, nil, err
	}
	return store, pool.Close, nil
}

// readDurability reads what the ledger's server promises of a commit, logs
// it and tells cfg.OnDurability. A read that fails for good is logged and
// the run goes on: the promise is shown, not required (the next step, the
// plan's check, meets an unreachable database itself).
func readDurability(ctx context.Context, store *ledger.Store, cfg PrepareConfig, onRetry func(int, time.Duration, error)) {
	var d ledger.Durability
	err := cfg.Retry.Do(ctx, "reading what the ledger's server promises of a commit", onRetry, func(int) error {
		var err error
		d, err = store.Durability(ctx)
		return err
	})
	if err != nil {
		cfg.Log.Info("could not read what the ledger's server promises of a commit", "error", err.Error())
		return
	}
	kv := []any{"replication", d.Verdict(), "synchronousCommit", d.SynchronousCommit,
		"synchronousStandbyNames", d.SynchronousStandbyNames, "inRecovery", d.InRecovery}
	switch {
	case d.Synchronous():
		cfg.Log.Info("the ledger's server acknowledges a commit once a synchronous standby has "+string(d.Standby())+" it", kv...)
	case !d.LocalFlush():
		cfg.Log.Info("the ledger's server acknowledges a commit before it is flushed to disk, even its own: a crash or a failover can lose the latest commits; the counts are proven from the ledger", kv...)
	default:
		cfg.Log.Info("the ledger's server acknowledges a commit before any standby has it: a failover can lose the latest commits; the counts are proven from the ledger", kv...)
	}
	if cfg.OnDurability != nil {
		cfg.OnDurability(d)
	}
}

// Replication is d as a worker reports it (v1alpha1.LedgerReplication),
// the standby names cut to v1alpha1.MaxStandbyNamesBytes.
func Replication(d ledger.Durability) *v1alpha1.LedgerReplication {
	return &v1alpha1.LedgerReplication{
		Synchronous: d.Synchronous(), Standby: string(d.Standby()),
		SynchronousCommit:       d.SynchronousCommit,
		SynchronousStandbyNames: v1alpha1.Truncate(d.SynchronousStandbyNames, v1alpha1.MaxStandbyNamesBytes),
		InRecovery:              d.InRecovery,
	}
}

// ShardsConfig is how RunShards runs a set of shards of one plan.
type ShardsConfig struct {
	// Parallel bounds the shards running at once (at least 1).
	Parallel int
	// Attempt is the attempt of every shard (0 outside Kubernetes).
	Attempt      int
	Retry        Backoff
	DrainTimeout time.Duration
	LockWait     time.Duration
	Log          logr.Logger
	// Progress, if set, is called from every shard's goroutine (see
	// ShardConfig.Progress).
	Progress func(Report)
}

// RunResult is what a set of shards did, added up; its JSON is the summary
// `runledger run --output json` prints.
type RunResult struct {
	v1alpha1.ItemCounts
	// Failures lists the first MaxFailures failed items of all shards.
	Failures []Failure `json:"failures"`
	// Interrupted: some shard was stopped before it was done.
	Interrupted bool `json:"interrupted,omitempty"`
	// Proven: every shard was done and the ledger proved its counts
	// (ShardConfig's proof): they are what the database holds, not what
	// the worker remembers. Reproven counts the passes shards made again
	// because the ledger did not hold items they had counted (commits a
	// database failover lost), Reprocessed those items.
	Proven      bool  `json:"proven"`
	Reproven    int   `json:"reproven,omitempty"`
	Reprocessed int64 `json:"reprocessed,omitempty"`
	// OnStandby is the weakest of the shards' Report.OnStandby: whether a
	// standby of the ledger's server has every shard's proof.
	OnStandby string `json:"onStandby,omitempty"`
	// Shards has each shard's report, in the order asked.
	Shards  []Report      `json:"-"`
	Elapsed time.Duration `json:"-"`
	// Replication is what the ledger's server promises of a commit, read
	// at start (nil when it could not be read); set by the caller.
	Replication *v1alpha1.LedgerReplication `json:"replication,omitempty"`
}

// RunShards runs the given shards of plan, at most cfg.Parallel at once, with
// one failure budget (plan.MaxFailedItems) for all of them: once the run as a
// whole has too many failed items, every shard stops taking chunks. A shard
// not started when ctx is cancelled is reported Interrupted.
func RunShards(ctx context.Context, store *ledger.Store, plan *Plan, shards []int, cfg ShardsConfig) RunResult {
	budget := NewFailureBudget(plan.MaxFailedItems)
	start := time.Now()
	reports := make([]Report, len(shards))
	sem := make(chan struct{}, max(cfg.Parallel, 1))
	var wg sync.WaitGroup
	for i, shard := range shards {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if ctx.Err() != nil { // stopped before this shard started
				reports[i] = Report{Shard: shard, Interrupted: true}
				return
			}
			sc := plan.ShardConfig(shard, cfg.Attempt)
			sc.Budget = budget
			sc.Retry = cfg.Retry
			sc.DrainTimeout = cfg.DrainTimeout
			sc.LockWait = cfg.LockWait
			sc.Log = cfg.Log
			sc.Progress = cfg.Progress
			reports[i] = RunShard(ctx, store, sc)
		})
	}
	wg.Wait()
	return summarize(reports, time.Since(start))
}

// summarize adds up the reports of a run's shards.
func summarize(reports []Report, elapsed time.Duration) RunResult {
	res := RunResult{Shards: reports, Elapsed: elapsed, Proven: len(reports) > 0}
	for _, r := range reports {
		res.Proven = res.Proven && r.Proven
		res.Reproven += r.Reproven
		res.Reprocessed += r.Reprocessed
		res.OnStandby = weakerOnStandby(res.OnStandby, r.OnStandby)
		res.Add(r.ItemCounts)
		for _, f := range r.Failures {
			if len(res.Failures) < MaxFailures {
				res.Failures = append(res.Failures, f)
			}
		}
		res.Interrupted = res.Interrupted || r.Interrupted
	}
	return res
}

// weakerOnStandby is the weaker of two Report.OnStandby values: not
// confirmed, then unknown, then confirmed, then "" (no standby).
func weakerOnStandby(a, b string) string {
	rank := map[string]int{"": 0, OnStandbyConfirmed: 1, OnStandbyUnknown: 2, OnStandbyNotConfirmed: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

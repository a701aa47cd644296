package cli

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/runledger/runledger/internal/logging"
	"github.com/runledger/runledger/internal/worker"
)

// engineFlags are the flags of the commands that run shards (worker, run).
type engineFlags struct {
	skipMigrate  bool
	retryTimeout time.Duration
	drainTimeout time.Duration
	lockWait     time.Duration
	logging      logging.Options
}

// add adds the flags to f: signals names what stops the shards, lockWait and
// lockHelp are the lock wait's default and meaning for this command.
func (e *engineFlags) add(f *pflag.FlagSet, signals string, lockWait time.Duration, lockHelp string) {
	f.BoolVar(&e.skipMigrate, "skip-migrate", false, "do not apply the ledger's migrations at start")
	f.DurationVar(&e.retryTimeout, "retry-timeout", worker.DefaultBackoff.MaxElapsed, "how long to retry while the database is unreachable, per operation")
	f.DurationVar(&e.drainTimeout, "drain-timeout", worker.DefaultDrainTimeout, "on "+signals+", how long the chunk in flight may still take to commit")
	f.DurationVar(&e.lockWait, "lock-wait", lockWait, lockHelp)
	e.logging.AddFlags(f)
}

// retry is the database back-off the flags ask for.
func (e *engineFlags) retry() worker.Backoff {
	b := worker.DefaultBackoff
	b.MaxElapsed = e.retryTimeout
	return b
}

package workercmd

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/logging"
	"github.com/runledger/runledger/internal/worker"
)

// EngineFlags are the flags of the commands that run shards (runledger
// worker and runledger-worker, runledger run).
type EngineFlags struct {
	SkipMigrate  bool
	RetryTimeout time.Duration
	DrainTimeout time.Duration
	LockWait     time.Duration
	Logging      logging.Options
}

// Add adds the flags to f: signals names what stops the shards, lockWait and
// lockHelp are the lock wait's default and meaning for this command.
func (e *EngineFlags) Add(f *pflag.FlagSet, signals string, lockWait time.Duration, lockHelp string) {
	f.BoolVar(&e.SkipMigrate, "skip-migrate", false, "do not apply the ledger's migrations at start")
	f.DurationVar(&e.RetryTimeout, "retry-timeout", worker.DefaultBackoff.MaxElapsed, "how long to retry while the database is unreachable, per operation")
	f.DurationVar(&e.DrainTimeout, "drain-timeout", worker.DefaultDrainTimeout, "on "+signals+", how long the chunk in flight may still take to commit")
	f.DurationVar(&e.LockWait, "lock-wait", lockWait, lockHelp)
	e.Logging.AddFlags(f)
}

// Retry is the database back-off the flags ask for.
func (e *EngineFlags) Retry() worker.Backoff {
	b := worker.DefaultBackoff
	b.MaxElapsed = e.RetryTimeout
	return b
}

// FlagDSNFile names the flag of a file holding the connection string.
const FlagDSNFile = "dsn-file"

// ReadDSNFile reads a DSN file (--dsn-file). Its errors never hold its
// content.
func ReadDSNFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", exitcode.BadInput(fmt.Errorf("reading --%s: %w", FlagDSNFile, err))
	}
	// A file written by echo or an editor ends with a newline; a Secret's
	// value usually does not.
	dsn := strings.TrimRight(string(b), "\r\n")
	if strings.TrimSpace(dsn) == "" {
		return "", exitcode.BadInput(fmt.Errorf("--%s %s is empty: want a connection string", FlagDSNFile, path))
	}
	return dsn, nil
}

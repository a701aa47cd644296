// Package cli wires runledger's subcommands (manager, worker, run, migrate).
package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes shared by the subcommands.
const (
	ExitOK          = 0
	ExitFailed      = 1 // the work ran and failed (e.g. more failed items than allowed)
	ExitBadInput    = 2 // bad input or configuration: nothing was attempted
	envDatabaseURL  = "RUNLEDGER_DATABASE_URL"
	flagDatabaseURL = "dsn"
)

// ExitError carries a process exit code through cobra.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// badInput marks err as bad input or configuration (exit 2).
func badInput(err error) error { return &ExitError{Code: ExitBadInput, Err: err} }

// NewRootCommand builds the runledger command tree.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "runledger",
		Short:         "Exactly-once batch processing on Kubernetes, guaranteed by a PostgreSQL unique rule",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newMigrateCommand(),
		newManagerCommand(),
		newWorkerCommand(),
		newRunCommand(),
	)
	return root
}

// Execute runs the command line and returns the process exit code.
func Execute() int {
	err := NewRootCommand().Execute()
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(os.Stderr, "runledger:", err)
	var exit *ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}
	return ExitBadInput
}

// databaseURL returns the DSN from the flag or the environment.
func databaseURL(cmd *cobra.Command) (string, error) {
	if dsn, _ := cmd.Flags().GetString(flagDatabaseURL); dsn != "" {
		return dsn, nil
	}
	if dsn := os.Getenv(envDatabaseURL); dsn != "" {
		return dsn, nil
	}
	return "", badInput(fmt.Errorf("no database: pass --%s or set %s", flagDatabaseURL, envDatabaseURL))
}

// Package exitcode is the one mapping from what happened to the contract's
// exit codes (v1alpha1.Exit*), shared by the runledger commands and the
// worker binary (cmd/runledger-worker): Of for an error, Worker for a
// shard's end; every command returns an *Error built from them.
package exitcode

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/redact"
	"github.com/runledger/runledger/internal/worker"
)

// Error carries a process exit code through cobra.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// BadInput marks err as bad input or configuration (exit 2).
func BadInput(err error) error { return &Error{Code: v1alpha1.ExitBadInput, Err: err} }

// Of is the exit code for err: the one an *Error in its chain carries;
// ExitBadInput for what retrying cannot fix (bad items or query, a server
// that refused the credentials or the database for good, a statement
// refused for what it says: a missing table or privilege); ExitShardBusy
// for a shard whose lock stayed taken; ExitFailed for the rest (e.g. the
// database stayed unreachable). nil is ExitSucceeded.
func Of(err error) int {
	var exit *Error
	switch {
	case err == nil:
		return v1alpha1.ExitSucceeded
	case errors.As(err, &exit):
		return exit.Code
	case worker.IsInputError(err), ledger.IsConfigurationError(err):
		return v1alpha1.ExitBadInput
	case errors.Is(err, ledger.ErrShardBusy):
		// Not a failure of the shard: the controller retries without
		// counting it against backoffLimit.
		return v1alpha1.ExitShardBusy
	}
	if _, rejected := ledger.ConnectionRejected(err); rejected {
		return v1alpha1.ExitBadInput
	}
	return v1alpha1.ExitFailed
}

// OrElse is the exit code err carries (an *Error anywhere in its chain),
// or otherwise; nil is ExitSucceeded.
func OrElse(err error, otherwise int) int {
	var exit *Error
	if err != nil && !errors.As(err, &exit) {
		return otherwise
	}
	return Of(err)
}

// For is err with its exit code (Of), kept when it has one.
func For(err error) error {
	var exit *Error
	if err == nil || errors.As(err, &exit) {
		return err
	}
	if explained, rejected := ExplainRejection(err); rejected {
		err = explained
	}
	return &Error{Code: Of(err), Err: err}
}

// Worker is the worker's exit code for how its shard ended: err kept the
// shard from running, rep is what it did. Beyond the errors' codes, a shard
// that stopped before its end or failed more items than maxFailed failed.
func Worker(rep worker.Report, err error, maxFailed int) int {
	for _, e := range []error{err, rep.Err} {
		if code := Of(e); code == v1alpha1.ExitBadInput {
			return code
		}
	}
	switch {
	case err != nil:
		return Of(err)
	case rep.Err != nil:
		return Of(rep.Err)
	case rep.Interrupted, !rep.Done, rep.TooManyFailures, rep.Failed > int64(maxFailed):
		return v1alpha1.ExitFailed
	}
	return v1alpha1.ExitSucceeded
}

// ExplainRejection prefixes err with why the server refused the connection
// for good (credentials, missing database), and reports whether it did.
func ExplainRejection(err error) (error, bool) {
	why, rejected := ledger.ConnectionRejected(err)
	if !rejected {
		return err, false
	}
	return fmt.Errorf("%s: %w", why, err), true
}

// Redact returns err with the DSN's secrets masked in its message, keeping
// its exit code.
func Redact(err error, secrets *redact.Redactor) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	masked := secrets.String(msg)
	if masked == msg {
		return err
	}
	var exit *Error
	if errors.As(err, &exit) {
		return &Error{Code: exit.Code, Err: errors.New(masked)}
	}
	return errors.New(masked)
}

// Execute runs the command line of root and returns the process exit code,
// printing the error, if any, after the command's name (as its help shows
// it: kubectl runledger for kubectl's plugin).
func Execute(root *cobra.Command) int {
	err := root.Execute()
	if err == nil {
		return v1alpha1.ExitSucceeded
	}
	fmt.Fprintln(os.Stderr, root.DisplayName()+":", err)
	return OrElse(err, v1alpha1.ExitBadInput) // without a code: a command line cobra refused
}

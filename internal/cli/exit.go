package cli

import (
	"errors"
	"fmt"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

// This file is the one mapping from what happened to the contract's exit
// codes (v1alpha1.Exit*): exitCode for an error, workerExitCode for a shard's
// end; every command returns an *ExitError built from them.

// ExitError carries a process exit code through cobra.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// badInput marks err as bad input or configuration (exit 2).
func badInput(err error) error { return &ExitError{Code: v1alpha1.ExitBadInput, Err: err} }

// exitCode is the exit code for err: the one an *ExitError in its chain
// carries; ExitBadInput for what retrying cannot fix (bad items or query,
// a server that refused the credentials or the database for good, a
// statement refused for what it says: a missing table or privilege);
// ExitShardBusy for a shard whose lock stayed taken; ExitFailed for the rest
// (e.g. the database stayed unreachable). nil is ExitSucceeded.
func exitCode(err error) int {
	var exit *ExitError
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

// codeOf is the exit code err carries (an *ExitError anywhere in its chain),
// or otherwise; nil is ExitSucceeded.
func codeOf(err error, otherwise int) int {
	var exit *ExitError
	if err != nil && !errors.As(err, &exit) {
		return otherwise
	}
	return exitCode(err)
}

// exitFor is err with its exit code (exitCode), kept when it has one.
func exitFor(err error) error {
	var exit *ExitError
	if err == nil || errors.As(err, &exit) {
		return err
	}
	if explained, rejected := explainRejection(err); rejected {
		err = explained
	}
	return &ExitError{Code: exitCode(err), Err: err}
}

// workerExitCode is the worker's exit code for how its shard ended: err
// kept the shard from running, rep is what it did. Beyond the errors'
// codes, a shard that stopped before its end or failed more items than
// maxFailed failed.
func workerExitCode(rep worker.Report, err error, maxFailed int) int {
	for _, e := range []error{err, rep.Err} {
		if code := exitCode(e); code == v1alpha1.ExitBadInput {
			return code
		}
	}
	switch {
	case err != nil:
		return exitCode(err)
	case rep.Err != nil:
		return exitCode(rep.Err)
	case rep.Interrupted, !rep.Done, rep.TooManyFailures, rep.Failed > int64(maxFailed):
		return v1alpha1.ExitFailed
	}
	return v1alpha1.ExitSucceeded
}

// explainRejection prefixes err with why the server refused the connection
// for good (credentials, missing database), and reports whether it did.
func explainRejection(err error) (error, bool) {
	why, rejected := ledger.ConnectionRejected(err)
	if !rejected {
		return err, false
	}
	return fmt.Errorf("%s: %w", why, err), true
}

// Package cli wires runledger's subcommands (manager, worker, run, migrate, prune).
package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/redact"
	"github.com/runledger/runledger/internal/version"
)

// Every subcommand exits with a code of the contract's one table
// (v1alpha1.Exit*): 0 done, 1 the work ran and failed, 2 bad input or
// configuration with nothing attempted; the worker adds ExitShardBusy.
const (
	envDatabaseURL  = "RUNLEDGER_DATABASE_URL"
	flagDatabaseURL = "dsn"
	flagDSNFile     = "dsn-file"
)

// NewRootCommand builds the runledger command tree.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "runledger",
		Short:         "Exactly-once batch processing on Kubernetes, guaranteed by a PostgreSQL unique rule",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Get().Version,
	}
	// --version prints what `runledger version` prints.
	root.SetVersionTemplate(version.Get().String())
	root.AddCommand(
		newVersionCommand(),
		newMigrateCommand(),
		newManagerCommand(),
		newWorkerCommand(),
		newRunCommand(),
		newPruneCommand(),
		newItemsCommand(),
		newKeyCommand(),
		newScheduleCommand(),
	)
	return root
}

// Execute runs the command line and returns the process exit code.
func Execute() int {
	err := NewRootCommand().Execute()
	if err == nil {
		return v1alpha1.ExitSucceeded
	}
	fmt.Fprintln(os.Stderr, "runledger:", err)
	return codeOf(err, v1alpha1.ExitBadInput) // without a code: a command line cobra refused
}

// addDatabaseFlags adds --dsn and --dsn-file.
func addDatabaseFlags(cmd *cobra.Command, what string) {
	cmd.Flags().String(flagDatabaseURL, "", what+" (default $"+envDatabaseURL+"); a password here is visible to every user of the machine (ps): prefer --"+flagDSNFile+", $"+envDatabaseURL+" or a .pgpass file")
	cmd.Flags().String(flagDSNFile, "", "read the connection string from this file (e.g. a Kubernetes Secret mounted as a file); a trailing newline is ignored")
}

// openOwnerPool opens a small pool on the database the flags name, for the
// one-shot commands (the owner's migrate and prune; items and key, which
// only read), with the masker of its DSN.
func openOwnerPool(cmd *cobra.Command) (*pgxpool.Pool, *redact.Redactor, error) {
	dsn, err := databaseURL(cmd)
	if err != nil {
		return nil, nil, err
	}
	secrets := redact.New(dsn)
	// No run to read timeouts from: the runs' default.
	pool, err := ledger.Open(cmd.Context(), dsn, 2, ledger.NetworkTimeout(v1alpha1.DefaultNetworkSeconds*time.Second),
		ledger.ApplicationName(ownerApplicationName(cmd)))
	if err != nil {
		return nil, nil, badInput(err)
	}
	return pool, secrets, nil
}

// ownerApplicationName names an owner command's sessions in
// pg_stat_activity ("runledger migrate").
func ownerApplicationName(cmd *cobra.Command) string { return "runledger " + cmd.Name() }

// databaseURL returns the DSN from --dsn, --dsn-file or the environment, in
// that order. A --dsn that holds a password gets a notice on stderr.
func databaseURL(cmd *cobra.Command) (string, error) {
	dsn, _ := cmd.Flags().GetString(flagDatabaseURL)
	file, _ := cmd.Flags().GetString(flagDSNFile)
	switch {
	case dsn != "" && file != "":
		return "", badInput(fmt.Errorf("both --%s and --%s are set: pass one", flagDatabaseURL, flagDSNFile))
	case file != "":
		return readDSNFile(file)
	case dsn != "":
		warnDSNFlag(cmd.ErrOrStderr(), dsn)
		return dsn, nil
	}
	if dsn := os.Getenv(envDatabaseURL); dsn != "" {
		return dsn, nil
	}
	return "", badInput(fmt.Errorf("no database: pass --%s or set %s (or pass --%s FILE)", flagDatabaseURL, envDatabaseURL, flagDSNFile))
}

// readDSNFile reads a DSN file. Its errors never hold its content.
func readDSNFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", badInput(fmt.Errorf("reading --%s: %w", flagDSNFile, err))
	}
	// A file written by echo or an editor ends with a newline; a Secret's
	// value usually does not.
	dsn := strings.TrimRight(string(b), "\r\n")
	if strings.TrimSpace(dsn) == "" {
		return "", badInput(fmt.Errorf("--%s %s is empty: want a connection string", flagDSNFile, path))
	}
	return dsn, nil
}

// warnDSNFlag tells that a --dsn with a password shows it to ps.
func warnDSNFlag(w io.Writer, dsn string) {
	if redact.DSN(dsn) != dsn {
		fmt.Fprintf(w, "runledger: note: --%s holds a password, which other users of this machine can read (ps); prefer --%s, $%s or a .pgpass file\n",
			flagDatabaseURL, flagDSNFile, envDatabaseURL)
	}
}

// Package cli wires runledger's subcommands (manager, worker, run, migrate, prune).
package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/cli/workercmd"
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
		workercmd.New(),
		newRunCommand(),
		newPruneCommand(),
		newItemsCommand(),
		newKeyCommand(),
		newVerifyCommand(),
		newScheduleCommand(),
		newConsoleCommand(),
	)
	return root
}

// Execute runs the command line and returns the process exit code.
func Execute() int {
	root, args := rootFor(os.Args[0], os.Args[1:])
	root.SetArgs(args)
	return exitcode.Execute(root)
}

// The names kubectl runs the binary under (its plugin mechanism): the
// plugin for kubectl runledger ..., and the completion helper kubectl ≥ 1.26
// runs with the words typed after kubectl runledger when completing them.
const (
	pluginName           = "kubectl-runledger"
	pluginCompletionName = "kubectl_complete-runledger"
	pluginDisplayName    = "kubectl runledger"
)

// rootFor is the command tree for the binary invoked as argv0 with args, and
// the arguments to run it with: as kubectl's plugin, its help, examples and
// completion say kubectl runledger; as its completion helper, it answers
// cobra's __complete, whose output format is the one kubectl reads.
func rootFor(argv0 string, args []string) (*cobra.Command, []string) {
	// A Windows build's name ends in .exe; the plugin's name is the same.
	switch strings.TrimSuffix(filepath.Base(argv0), ".exe") {
	case pluginName:
		return asPlugin(NewRootCommand()), args
	case pluginCompletionName:
		return asPlugin(NewRootCommand()), append([]string{cobra.ShellCompRequestCmd}, args...)
	}
	return NewRootCommand(), args
}

// asPlugin renames root as kubectl's plugin: kubectl-runledger for the
// completion script cobra generates (the executable it completes), kubectl
// runledger in usage lines, and in the examples and descriptions that
// show a command line.
func asPlugin(root *cobra.Command) *cobra.Command {
	root.Use = pluginName
	if root.Annotations == nil {
		root.Annotations = map[string]string{}
	}
	root.Annotations[cobra.CommandDisplayNameAnnotation] = pluginDisplayName
	var rename func(*cobra.Command)
	rename = func(c *cobra.Command) {
		c.Example = commandLine.ReplaceAllString(c.Example, "${1}"+pluginDisplayName+" ${2}")
		c.Long = commandLine.ReplaceAllString(c.Long, "${1}"+pluginDisplayName+" ${2}")
		for _, sub := range c.Commands() {
			rename(sub)
		}
	}
	rename(root)
	return root
}

// commandLine is "runledger CMD" where a text names a command a user types
// (not "schema runledger", runledger_worker, nor the manager and worker,
// which pods run as /runledger).
var commandLine = regexp.MustCompile(`(^|[^A-Za-z0-9_./-])runledger ((?:version|migrate|run|prune|items|key|verify|schedule|console|completion|help)\b)`)

// addDatabaseFlags adds --dsn and --dsn-file.
func addDatabaseFlags(cmd *cobra.Command, what string) {
	cmd.Flags().String(flagDatabaseURL, "", what+" (default $"+envDatabaseURL+"); a password here is visible to every user of the machine (ps): prefer --"+workercmd.FlagDSNFile+", $"+envDatabaseURL+" or a .pgpass file")
	cmd.Flags().String(workercmd.FlagDSNFile, "", "read the connection string from this file (e.g. a Kubernetes Secret mounted as a file); a trailing newline is ignored")
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
		return nil, nil, exitcode.BadInput(err)
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
	file, _ := cmd.Flags().GetString(workercmd.FlagDSNFile)
	switch {
	case dsn != "" && file != "":
		return "", exitcode.BadInput(fmt.Errorf("both --%s and --%s are set: pass one", flagDatabaseURL, workercmd.FlagDSNFile))
	case file != "":
		return workercmd.ReadDSNFile(file)
	case dsn != "":
		warnDSNFlag(cmd.ErrOrStderr(), dsn)
		return dsn, nil
	}
	if dsn := os.Getenv(envDatabaseURL); dsn != "" {
		return dsn, nil
	}
	return "", exitcode.BadInput(fmt.Errorf("no database: pass --%s or set %s (or pass --%s FILE)", flagDatabaseURL, envDatabaseURL, workercmd.FlagDSNFile))
}

// warnDSNFlag tells that a --dsn with a password shows it to ps.
func warnDSNFlag(w io.Writer, dsn string) {
	if redact.DSN(dsn) != dsn {
		fmt.Fprintf(w, "runledger: note: --%s holds a password, which other users of this machine can read (ps); prefer --%s, $%s or a .pgpass file\n",
			flagDatabaseURL, workercmd.FlagDSNFile, envDatabaseURL)
	}
}

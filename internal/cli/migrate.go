package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/redact"
)

func newMigrateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the ledger's schema migrations (idempotent, safe to run concurrently)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := databaseURL(cmd)
			if err != nil {
				return err
			}
			secrets := redact.New(dsn)
			pool, err := ledger.Open(cmd.Context(), dsn, 2)
			if err != nil {
				return badInput(err)
			}
			defer pool.Close()
			n, err := ledger.Migrate(cmd.Context(), pool)
			if err != nil {
				return &ExitError{Code: ExitFailed, Err: secrets.Error(err)}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "migrations applied: %d\n", n)
			return nil
		},
	}
	addDatabaseFlags(cmd, "PostgreSQL connection string")
	return cmd
}

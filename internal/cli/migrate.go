package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/internal/ledger"
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
			pool, err := ledger.Open(cmd.Context(), dsn, 2)
			if err != nil {
				return badInput(err)
			}
			defer pool.Close()
			n, err := ledger.Migrate(cmd.Context(), pool)
			if err != nil {
				return &ExitError{Code: ExitFailed, Err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "migrations applied: %d\n", n)
			return nil
		},
	}
	cmd.Flags().String(flagDatabaseURL, "", "PostgreSQL connection string (default $"+envDatabaseURL+")")
	return cmd
}

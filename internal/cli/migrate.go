package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/internal/ledger"
)

const migrateLong = `Apply the ledger's schema migrations (idempotent, safe to run concurrently).

Run it as the role that owns the schema. With --grant-to ROLE it then gives
the worker login ROLE exactly what the protocol needs, and takes back any
other privilege ROLE had on runledger's tables: USAGE on schema runledger;
SELECT on runledger.goose_db_version (a worker's start-up migration check
then finds nothing to apply, read-only); SELECT, INSERT and UPDATE (state,
superseded_at) on runledger.ledger; SELECT, INSERT and UPDATE (items) on
runledger.batch_run; SELECT, INSERT on runledger.batch; TEMPORARY on the
database (the effect's table "claimed"). Never DELETE or TRUNCATE: the
ledger is append-only for every role (a trigger), and pruning is the
owner's (runledger prune). Put ROLE's connection string in the runs' Secret.`

func newMigrateCommand() *cobra.Command {
	var grantTo string
	cmd := &cobra.Command{
		Use:     "migrate",
		Short:   "Apply the ledger's schema migrations (idempotent, safe to run concurrently)",
		Long:    migrateLong,
		Example: `  runledger migrate --dsn-file owner.dsn --grant-to runledger_worker`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("grant-to") && grantTo == "" {
				return badInput(fmt.Errorf("--grant-to is empty: name the worker's login role"))
			}
			pool, secrets, err := openOwnerPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			n, err := ledger.Migrate(cmd.Context(), pool)
			if err != nil {
				return redactExit(exitFor(err), secrets)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "migrations applied: %d\n", n)
			if grantTo == "" {
				return nil
			}
			if err := ledger.GrantWorker(cmd.Context(), pool, grantTo); err != nil {
				return redactExit(exitFor(err), secrets)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "worker privileges granted to %s\n", grantTo)
			return nil
		},
	}
	addDatabaseFlags(cmd, "PostgreSQL connection string")
	cmd.Flags().StringVar(&grantTo, "grant-to", "", "after migrating, give this login role only the privileges a worker needs (and take back its others on runledger's tables)")
	return cmd
}

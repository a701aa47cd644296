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
database (the effect's table "claimed"); EXECUTE on ledger_take_back and on
the effect's sandbox run_effect. Never DELETE or TRUNCATE: the ledger is
append-only for every role (a trigger), and pruning is the owner's
(runledger prune). Put ROLE's connection string in the runs' Secret.

With --effect-role EFFECT, SQL effects run as EFFECT (an existing role,
NOLOGIN is enough): the sandbox runledger.run_effect becomes EFFECT's, a
SECURITY DEFINER function inside which PostgreSQL refuses SET ROLE and RESET
ROLE, so an effect has EFFECT's privileges and never the worker's. EFFECT must
be unprivileged (no superuser, no member of the worker or of the schema's
owner) and loses any privilege on schema runledger: an effect never reads or
writes the ledger. Grant it what the effects need on your own tables
(GRANT INSERT ON invoices TO EFFECT). The migrating login must be a member of
EFFECT (GRANT EFFECT TO the migrator) or a superuser. A worker refuses to run
an SQL effect (exit 2) until this is done once.`

func newMigrateCommand() *cobra.Command {
	var grantTo, effectRole string
	cmd := &cobra.Command{
		Use:     "migrate",
		Short:   "Apply the ledger's schema migrations (idempotent, safe to run concurrently)",
		Long:    migrateLong,
		Example: `  runledger migrate --dsn-file owner.dsn --grant-to runledger_worker --effect-role runledger_effect`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("grant-to") && grantTo == "" {
				return badInput(fmt.Errorf("--grant-to is empty: name the worker's login role"))
			}
			if cmd.Flags().Changed("effect-role") && effectRole == "" {
				return badInput(fmt.Errorf("--effect-role is empty: name the role SQL effects run as"))
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
			if effectRole != "" {
				if err := ledger.SetEffectRole(cmd.Context(), pool, effectRole); err != nil {
					return redactExit(exitFor(err), secrets)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "SQL effects run as %s\n", effectRole)
			}
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
	cmd.Flags().StringVar(&effectRole, "effect-role", "", "after migrating, run SQL effects as this unprivileged role (the migrator must be a member of it); workers run no SQL effect until it is set")
	return cmd
}

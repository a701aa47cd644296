package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/runledger/runledger/internal/cli/exitcode"
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
				return exitcode.BadInput(fmt.Errorf("--grant-to is empty: name the worker's login role"))
			}
			if cmd.Flags().Changed("effect-role") && effectRole == "" {
				return exitcode.BadInput(fmt.Errorf("--effect-role is empty: name the role SQL effects run as"))
			}
			pool, secrets, err := openOwnerPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			stopWatch := watchMigration(cmd.Context(), pool, ownerApplicationName(cmd), cmd.ErrOrStderr())
			n, err := ledger.Migrate(cmd.Context(), pool, func(holders []ledger.MigrationBlocker) {
				fmt.Fprintln(cmd.ErrOrStderr(), "runledger migrate: "+migrationLockLine(holders))
			})
			stopWatch()
			if err != nil {
				return exitcode.Redact(exitcode.For(err), secrets)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "migrations applied: %d\n", n)
			if effectRole != "" {
				if err := ledger.SetEffectRole(cmd.Context(), pool, effectRole); err != nil {
					return exitcode.Redact(exitcode.For(err), secrets)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "SQL effects run as %s\n", effectRole)
			}
			if grantTo == "" {
				return nil
			}
			if err := ledger.GrantWorker(cmd.Context(), pool, grantTo); err != nil {
				return exitcode.Redact(exitcode.For(err), secrets)
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

// migrationWaitReport is how often `runledger migrate` says what it waits
// for, while it waits (an index built CONCURRENTLY waits for every
// transaction older than the build: a shard of v0.1.0 holds
// one for as long as the shard runs).
var migrationWaitReport = 10 * time.Second

// watchMigration says on w, every migrationWaitReport while the migration
// waits for a lock, which sessions it waits for; the returned func stops it.
// Quiet when it cannot look (behind a pooler the migration holds the pool's
// two connections): it is advice, not the migration.
func watchMigration(ctx context.Context, pool *pgxpool.Pool, name string, w io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(migrationWaitReport)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			look, done := context.WithTimeout(ctx, migrationWaitReport/2)
			blockers, err := ledger.MigrationBlockers(look, pool, name)
			done()
			if err == nil && len(blockers) > 0 && ctx.Err() == nil {
				fmt.Fprintln(w, migrationWaitLine(blockers))
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// migrationLockLine says who holds the migration lock a migrator waits for.
func migrationLockLine(holders []ledger.MigrationBlocker) string {
	parts := make([]string, len(holders))
	for i, h := range holders {
		parts[i] = h.String()
	}
	return "waiting for the ledger's migration lock, held by " + strings.Join(parts, "; ") +
		" (another migrator applying migrations, or a session that took its key)"
}

// migrationWaitLine is what a waiting migration says: the sessions it
// waits for (five at most), their transactions' age where it may see it.
func migrationWaitLine(blockers []ledger.MigrationBlocker) string {
	const shown = 5
	var parts []string
	for i, b := range blockers {
		if i == shown {
			parts = append(parts, fmt.Sprintf("and %d more", len(blockers)-shown))
			break
		}
		parts = append(parts, b.String())
	}
	return fmt.Sprintf("runledger migrate: waiting for %d session(s) to end their transactions (%s): "+
		"a migration builds an index CONCURRENTLY, which waits for every transaction older than the build; "+
		"runs go on meanwhile (a shard of v0.1.0 holds its transaction until the shard ends)",
		len(blockers), strings.Join(parts, "; "))
}

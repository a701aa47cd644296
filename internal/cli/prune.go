package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/ledger"
)

const pruneLong = `Delete what finished runs leave behind, as the role that owns the schema.

--older-than deletes the materialised batches (runledger.batch) of runs
whose batch was fixed more than DURATION ago, and those runs' failure
records (runledger.item_failure: which items failed and why). A query source's rows are
copied into the ledger database once per run, when its first shard starts;
they are what every shard, retry and resumption of the run reads, so prune
only runs that are over: a run a shard of which is being processed (its
worker holds the shard's lock) is left alone, and prune exits 4 naming it
after pruning everything else. Each pruned run keeps its header
(runledger.batch_run, with pruned_at set) as a tombstone: a worker of a
pruned run fails with a clear error instead of running the query again and
processing a different batch under the same run.

--superseded-older-than deletes the ledger's superseded rows (history:
rows that onExisting: Supersede retired) retired more than DURATION ago.
Committed rows are never deleted: the ledger is append-only for every role
(a trigger), and only a member of the ledger's owner role may delete a
superseded row; a worker login may not.

Exit status: 0 when everything asked was pruned; 4 when some batches were
left because their run is in flight (the rest was pruned; prune again
later); 2 for bad input (flags, the connection string, a login that may
not prune); 1 for any other failure.`

func newPruneCommand() *cobra.Command {
	var olderThan, supersededOlderThan time.Duration
	cmd := &cobra.Command{
		Use:   "prune (--older-than DURATION | --superseded-older-than DURATION)",
		Short: "Delete old runs' materialised batches (keeps a tombstone) or the ledger's old superseded rows",
		Long:  pruneLong,
		Example: `  runledger prune --older-than 720h --dsn-file owner.dsn
  runledger prune --superseded-older-than 2160h --dsn-file owner.dsn`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			batches, history := cmd.Flags().Changed("older-than"), cmd.Flags().Changed("superseded-older-than")
			switch {
			case !batches && !history:
				return exitcode.BadInput(errors.New("nothing to prune: pass --older-than (batches) or --superseded-older-than (superseded ledger rows)"))
			case batches && olderThan <= 0:
				return exitcode.BadInput(fmt.Errorf("--older-than must be a positive duration (e.g. 720h), not %s", olderThan))
			case history && supersededOlderThan <= 0:
				return exitcode.BadInput(fmt.Errorf("--superseded-older-than must be a positive duration (e.g. 2160h), not %s", supersededOlderThan))
			}
			pool, secrets, err := openOwnerPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			store := ledger.NewStore(pool)
			// Runs in flight are left alone and reported at the end, once
			// everything else was done.
			var inFlight *ledger.RunsInFlightError
			if batches {
				cutoff := time.Now().Add(-olderThan)
				p, err := store.PruneBatches(cmd.Context(), cutoff)
				if err != nil && !errors.As(err, &inFlight) {
					return exitcode.Redact(pruneExit(err), secrets)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "batches pruned: %d (%d rows deleted, %d failure records), fixed before %s\n",
					p.Batches, p.Items, p.FailureRecords, cutoff.UTC().Format(time.RFC3339))
			}
			if history {
				cutoff := time.Now().Add(-supersededOlderThan)
				n, err := store.PruneSuperseded(cmd.Context(), cutoff)
				if err != nil {
					return exitcode.Redact(pruneExit(err), secrets)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "superseded ledger rows pruned: %d, superseded before %s\n", n, cutoff.UTC().Format(time.RFC3339))
			}
			if inFlight != nil {
				return exitcode.Redact(&exitcode.Error{Code: v1alpha1.ExitRunsInFlight, Err: inFlight}, secrets)
			}
			return nil
		},
	}
	addDatabaseFlags(cmd, "PostgreSQL connection string of the schema's owner")
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "prune the batches of runs that started more than this long ago (e.g. 720h)")
	cmd.Flags().DurationVar(&supersededOlderThan, "superseded-older-than", 0, "prune the ledger rows superseded more than this long ago (e.g. 2160h)")
	return cmd
}

// pruneExit: a login that may not prune (a worker's) is bad input, exit 2.
func pruneExit(err error) error {
	if ledger.IsAppendOnlyViolation(err) {
		return exitcode.BadInput(fmt.Errorf("only the schema's owner may prune: %w", err))
	}
	if ledger.IsConfigurationError(err) {
		return exitcode.BadInput(fmt.Errorf("prune as the schema's owner: %w", err))
	}
	return exitcode.For(err)
}

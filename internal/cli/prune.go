package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/internal/ledger"
)

const pruneLong = `Delete the materialised batches (runledger.batch) of runs whose batch was
fixed more than --older-than ago. A query source's rows are copied into the
ledger database once per run, when its first shard starts; they are what every
shard, retry and resumption of the run reads, so prune only runs that are over.

Each pruned run keeps its header (runledger.batch_run, with pruned_at set) as a
tombstone: a worker of a pruned run fails with a clear error instead of running
the query again and processing a different batch under the same run. The
ledger's own rows are never touched.`

func newPruneCommand() *cobra.Command {
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:     "prune --older-than DURATION",
		Short:   "Delete the materialised batches of runs older than a duration (keeps a tombstone)",
		Long:    pruneLong,
		Example: `  runledger prune --older-than 720h --dsn postgres://admin@localhost/billing`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan <= 0 {
				return badInput(fmt.Errorf("--older-than must be a positive duration (e.g. 720h), not %s", olderThan))
			}
			dsn, err := databaseURL(cmd)
			if err != nil {
				return err
			}
			pool, err := ledger.Open(cmd.Context(), dsn, 2)
			if err != nil {
				return badInput(err)
			}
			defer pool.Close()
			cutoff := time.Now().Add(-olderThan)
			batches, rows, err := ledger.NewStore(pool).PruneBatches(cmd.Context(), cutoff)
			if err != nil {
				return &ExitError{Code: ExitFailed, Err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "batches pruned: %d (%d rows deleted), fixed before %s\n", batches, rows, cutoff.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().String(flagDatabaseURL, "", "PostgreSQL connection string (default $"+envDatabaseURL+")")
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "prune the batches of runs that started more than this long ago (e.g. 720h)")
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}

package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// Placeholders until the manager, worker and run commands land; each is
// replaced by its own file.

func newWorkerCommand() *cobra.Command {
	return &cobra.Command{Use: "worker", Short: "Process one shard of a ProcessingRun (not yet built)",
		RunE: func(*cobra.Command, []string) error { return errors.New("worker: not yet built") }}
}

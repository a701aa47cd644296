// Command runledger-worker is the worker of runledger's pods: one shard of a
// ProcessingRun, as `runledger worker` runs it, in a binary that links only
// what a shard needs (the ledger, the engine, the run's file and a pod
// reporter over net/http), not the manager's libraries, whose package
// initialisation alone made a shard's memory (docs/scale.md). The image
// ships it beside the runledger binary, at v1alpha1.WorkerBinary.
package main

import (
	"os"

	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/cli/workercmd"
)

func main() {
	os.Exit(exitcode.Execute(workercmd.NewBinary()))
}

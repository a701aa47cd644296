// Command runledger is the one binary of runledger: the operator (manager),
// the in-pod worker, the local runner and the schema migrator.
package main

import (
	"os"

	"github.com/runledger/runledger/internal/cli"
)

func main() {
	os.Exit(cli.Execute())
}

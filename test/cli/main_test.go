// Package clitest runs the runledger binary end to end against a real
// PostgreSQL: `runledger run` as a user would, several processes at once,
// killed, interrupted, with the database down or restarted.
//
// The binary under test is this test binary itself: TestMain runs
// cli.Execute instead of the tests when RUNLEDGER_CLITEST_MAIN=1, so every
// test spawns `os.Args[0] run ...` as a separate process (killable with
// SIGKILL), built from the same code, with no build step or temporary binary.
package clitest

import (
	"os"
	"testing"

	"github.com/runledger/runledger/internal/cli"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/s3test"
)

const envMain = "RUNLEDGER_CLITEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envMain) == "1" {
		os.Exit(cli.Execute())
	}
	os.Exit(pgtest.MainWith(m, nil, []func() error{s3test.Stop}))
}

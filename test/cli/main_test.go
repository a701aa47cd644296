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
	"fmt"
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
	code := m.Run()
	for _, stop := range []func() error{pgtest.Stop, s3test.Stop} {
		if err := stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

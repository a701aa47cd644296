package worker_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/s3test"
)

// TestMain stops what the tests started: the PostgreSQL cluster and, if a
// test asked for one, the S3 server.
func TestMain(m *testing.M) {
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

package worker_test

import (
	"os"
	"testing"

	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/s3test"
)

// TestMain stops what the tests started: the PostgreSQL cluster and, if a
// test asked for one, the S3 server.
func TestMain(m *testing.M) { os.Exit(pgtest.MainWith(m, nil, []func() error{s3test.Stop})) }

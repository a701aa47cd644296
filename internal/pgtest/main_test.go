package pgtest_test

import (
	"testing"

	"github.com/runledger/runledger/internal/pgtest"
)

// TestMain stops the package's shared cluster and removes its files: without
// it the server died with the test binary (Pdeathsig) and its 44 MB stayed
// in the temporary directory after every run.
func TestMain(m *testing.M) { pgtest.Main(m) }

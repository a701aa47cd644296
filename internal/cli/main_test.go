package cli

import (
	"testing"

	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestMain starts one kube-apiserver, on first use, for the test that
// compares runledger run's validation with the apiserver's, and stops the
// PostgreSQL cluster the migrate tests start on first use.
func TestMain(m *testing.M) { envtestutil.Main(m, pgtest.Stop) }

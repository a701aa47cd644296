package cli

import (
	"testing"

	"github.com/runledger/runledger/internal/envtestutil"
)

// TestMain starts one kube-apiserver, on first use, for the test that
// compares runledger run's validation with the apiserver's.
func TestMain(m *testing.M) { envtestutil.Main(m) }

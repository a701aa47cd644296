package controllers

import (
	"testing"

	"github.com/runledger/runledger/internal/envtestutil"
)

// TestMain starts one kube-apiserver for the envtest suites of this package,
// on first use (the builder tests need none).
func TestMain(m *testing.M) { envtestutil.Main(m) }

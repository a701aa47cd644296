package worker_test

import (
	"testing"

	"github.com/runledger/runledger/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

package bench

import (
	"testing"

	"github.com/runledger/runledger/internal/pgtest"
)

// Benchmarks run on a cluster with PostgreSQL's default durability.
func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Durable) }

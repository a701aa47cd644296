package bench

import (
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/runledger/runledger/internal/pgtest"
)

// Benchmarks run on a cluster with PostgreSQL's default durability. Every
// timed run starts on a database vacuumed and analysed by the benchmark itself,
// right after a checkpoint; autovacuum is off so that it does not clean up one
// measurement's rows during the next one's timed run (on 2 shared cores that
// decided ratios by more than the code under test did).
func TestMain(m *testing.M) {
	// The simulated workers' clients log nothing worth reading.
	ctrllog.SetLogger(logr.Discard())
	pgtest.Main(m, pgtest.Durable, pgtest.Setting("autovacuum", "off"))
}

package bench

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/s3test"
)

// Benchmarks run on a cluster with PostgreSQL's default durability. Every
// timed run starts on a database vacuumed and analysed by the benchmark itself,
// right after a checkpoint; autovacuum is off so that it does not clean up one
// measurement's rows during the next one's timed run (on 2 shared cores that
// decided ratios by more than the code under test did).
//
// RUNLEDGER_BENCH_SHARED_BUFFERS sets shared_buffers (e.g. 4GB, a production
// server's) for the figures of make bench-growth that the docs give beside
// the default's (128MB).
func TestMain(m *testing.M) {
	// The simulated workers' clients log nothing worth reading.
	ctrllog.SetLogger(logr.Discard())
	opts := []func(*pgtest.Options){pgtest.Durable, pgtest.Setting("autovacuum", "off")}
	if v := os.Getenv(envSharedBuffers); v != "" {
		opts = append(opts, pgtest.Setting("shared_buffers", v))
	}
	os.Exit(pgtest.MainWith(m, opts, []func() error{s3test.Stop}))
}

const envSharedBuffers = "RUNLEDGER_BENCH_SHARED_BUFFERS"

package clitest

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestConnectionBudget: a 256-shard run (a query batch, spec.workers 256)
// by `runledger run --parallel 8` opens at most v1alpha1.MaxConnectionsOf(8) =
// 16 connections, sampled all along in pg_stat_activity by the
// application_name every connection of the run carries ("runledger
// run/<namespace>/<run>"); one shard of it alone, as a worker pod runs it,
// at most 2; with spec.database.maxConnections 11, --parallel 16 runs 5
// shards at once and at most 10 connections. The formula is the README's
// ("Running on a shared PostgreSQL"). It used to be 3P+1. Behind a pooler
// the connections sampled are the server connections in a transaction
// (sampleConnections).
func TestConnectionBudget(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, `CREATE TABLE usage AS SELECT 'acct-' || i AS account FROM generate_series(1, 5120) i`)
	for _, tc := range []struct {
		parallel int
		shard    string
		// maxConnections, when set, is the run's budget; parallel is then
		// what it leaves of --parallel 16.
		maxConnections int
	}{{parallel: 1, shard: "17/256"}, {parallel: 8}, {parallel: 5, maxConnections: 11}} {
		parallel := tc.parallel
		t.Run(strconv.Itoa(parallel), func(t *testing.T) {
			name := fmt.Sprintf("budget-%d", parallel)
			// The query holds the batch's fixing 0.2 s: behind a pooler the
			// sampler sees a connection only while it is in a transaction, and
			// a shard of 20 items, all of its transactions, took 0.07 s.
			spec := []string{fmt.Sprintf(`batch: {query: "WITH hold AS MATERIALIZED (SELECT pg_sleep(0.2)) SELECT account AS entity, 'p%d' AS occurrence FROM usage, hold"}`, parallel), "workers: 256", "chunkSize: 7"}
			flagParallel := parallel
			if tc.maxConnections > 0 {
				// Under spec.database (the line after its secretRef).
				spec = append([]string{fmt.Sprintf("  maxConnections: %d", tc.maxConnections)}, spec...)
				flagParallel = 16
			}
			file := writeFile(t, "run.yaml", manifest(name, spec...))
			app := "runledger run/billing/" + name
			sampleCtx, stopSampling := context.WithCancel(context.Background())
			t.Cleanup(stopSampling)
			peak := sampleConnections(sampleCtx, d, app)
			args := []string{"run", "-f", file, "--dsn", d.dsn, "--parallel", strconv.Itoa(flagParallel), "--output", "json"}
			if tc.shard != "" {
				args = append(args, "--shard", tc.shard)
			}
			r := runCLI(t, "", args...)
			stopSampling()
			most := <-peak
			require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
			c := r.summary(t).counts()
			require.Equal(t, counts{Total: c.Total, Completed: c.Total}, c)
			if tc.shard == "" {
				require.EqualValues(t, 5120, c.Total)
			}
			t.Logf("%d shards at once (--parallel %d, maxConnections %d): at most %d connections named %q", parallel, flagParallel, tc.maxConnections, most, app)
			require.LessOrEqual(t, most, int64(v1alpha1.MaxConnectionsOf(int32(parallel))), "the documented budget")
			if tc.maxConnections > 0 {
				require.LessOrEqual(t, most, int64(tc.maxConnections), "within spec.database.maxConnections")
				require.Contains(t, r.stderr, "spec.database.maxConnections lowers --parallel")
			}
			require.GreaterOrEqual(t, most, sampledAtLeast(parallel), "the run's connections are the ones sampled")
		})
	}
}

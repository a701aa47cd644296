package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/internal/pgtest"
)

// growthSizes are the ledger sizes of the growth benchmark, in committed rows
// (RUNLEDGER_BENCH_GROWTH_ROWS="1000000,5000000" for a quick look); an empty
// ledger is always measured beside each of them.
func growthSizes(b *testing.B) []int64 {
	v := os.Getenv("RUNLEDGER_BENCH_GROWTH_ROWS")
	if v == "" {
		return []int64{10_000_000, 50_000_000}
	}
	var sizes []int64
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n <= 0 {
			b.Fatalf("RUNLEDGER_BENCH_GROWTH_ROWS: %q is not a positive row count", f)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// growthItems is the measured batch (RUNLEDGER_BENCH_GROWTH_ITEMS overrides).
func growthItems() int {
	if n, err := strconv.Atoi(os.Getenv("RUNLEDGER_BENCH_GROWTH_ITEMS")); err == nil && n > 0 {
		return n
	}
	return 200_000
}

// growthEntities is how many accounts the grown ledger holds; a size of R rows
// is R/growthEntities months of every account, as a year of billing leaves it.
const growthEntities = 1_000_000

// growthRow is one measured row: the worker's rates on the grown ledger and,
// right before, on an empty one (the baseline, measured side by side).
type growthRow struct {
	rows                        int64
	tableMB, ruleMB, otherIdxMB float64
	emptyFresh, emptyHandled    float64
	grownFresh, grownHandled    float64
	loadTime, vacuumTime        time.Duration
}

// BenchmarkGrowth measures the worker (`runledger run`, 4 shards, a query
// batch of growthItems() items, fsync on, default settings) on a ledger grown
// to each of growthSizes() committed rows, fresh and then the same keys under
// another run (all already handled), each beside the same two runs on an empty
// ledger measured right before it. The batch is realistic: a new occurrence
// (a new billing month) for every 5th existing account, so its keys land all
// over the rule's index, not at its end. The grown ledger is written by the
// schema's owner with INSERT ... SELECT generate_series (months in order, the
// the migrated indexes built again after each load), vacuumed and checkpointed before any
// timing. Target: at every size both rates >= 0.5x the empty ledger's.
func BenchmarkGrowth(b *testing.B) {
	ctx := context.Background()
	bin := buildRunledger(b)
	n := growthItems()
	sizes := growthSizes(b)
	var out []growthRow
	for range b.N {
		out = out[:0]
		grownDSN := pgtest.NewDatabase(b)
		grown := pgtest.Pool(b, grownDSN)
		var loaded int64
		for level, size := range sizes {
			row := growthRow{rows: size}
			start := time.Now()
			growLedger(ctx, b, grown, loaded, size)
			loaded = size
			row.loadTime = time.Since(start)

			occurrence := fmt.Sprintf("2099-%02d", level+1)
			emptyDSN := pgtest.NewDatabase(b)
			empty := pgtest.Pool(b, emptyDSN)
			growthBatch(ctx, b, empty, n, occurrence)
			f := runWorkers(b, bin, emptyDSN, fmt.Sprintf("empty-fresh-%d", level))
			h := runWorkers(b, bin, emptyDSN, fmt.Sprintf("empty-again-%d", level))
			checkGrowthCounts(b, "empty ledger", f, h, n)
			row.emptyFresh, row.emptyHandled = f.rate, h.rate
			empty.Close()

			start = time.Now()
			growthBatch(ctx, b, grown, n, occurrence)
			row.vacuumTime = time.Since(start)
			f = runWorkers(b, bin, grownDSN, fmt.Sprintf("grown-fresh-%d", level))
			h = runWorkers(b, bin, grownDSN, fmt.Sprintf("grown-again-%d", level))
			checkGrowthCounts(b, fmt.Sprintf("ledger of %d rows", size), f, h, n)
			row.grownFresh, row.grownHandled = f.rate, h.rate
			row.tableMB, row.ruleMB, row.otherIdxMB = ledgerSizes(ctx, b, grown)
			out = append(out, row)
		}
	}
	last := out[len(out)-1]
	b.ReportMetric(last.grownFresh/last.emptyFresh, "fresh-x-empty")
	b.ReportMetric(last.grownHandled/last.emptyHandled, "handled-x-empty")

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\ngrowth benchmark: runledger run, %d items (a new occurrence for every 5th of %d accounts), 4 shards, fsync on, default settings\n",
		n, growthEntities)
	fmt.Fprintln(w, "ledger rows\ttable\trule index\tother indexes\tempty fresh\tgrown fresh\tratio\tempty handled\tgrown handled\tratio\tload\tsettle\t")
	for _, r := range out {
		fmt.Fprintf(w, "%s\t%.0f MiB\t%.0f MiB\t%.0f MiB\t%.0f/s\t%.0f/s\t%.2fx\t%.0f/s\t%.0f/s\t%.2fx\t%s\t%s\t\n",
			thousandsOf(r.rows), r.tableMB, r.ruleMB, r.otherIdxMB,
			r.emptyFresh, r.grownFresh, r.grownFresh/r.emptyFresh,
			r.emptyHandled, r.grownHandled, r.grownHandled/r.emptyHandled,
			r.loadTime.Round(time.Second), r.vacuumTime.Round(time.Second))
	}
	fmt.Fprintln(w, "targets: at every size, grown fresh >= 0.50x empty fresh and grown handled >= 0.50x empty handled (each pair measured back to back)")
	_ = w.Flush()
	for _, r := range out {
		if r.grownFresh < 0.5*r.emptyFresh || r.grownHandled < 0.5*r.emptyHandled {
			fmt.Printf("TARGET MISSED at %s rows\n", thousandsOf(r.rows))
		}
	}
}

// growLedger adds committed rows to the ledger until it holds size rows from
// earlier months: month m of account a, written by run "month-m" in month
// order. The rule's index and the run index are dropped during the load and
// built again after it (the same definitions as the migration), which is how
// one loads tens of millions of rows in minutes; the primary key stays.
func growLedger(ctx context.Context, b *testing.B, pool *pgxpool.Pool, from, size int64) {
	b.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	exec := func(sql string, args ...any) {
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("growing the ledger: %s: %v", strings.SplitN(sql, "\n", 2)[0], err)
		}
	}
	exec(`SET maintenance_work_mem = '1GB'`)
	// The migrated definitions, to build the same indexes again.
	var defs []string
	rows, err := conn.Query(ctx, `SELECT indexdef FROM pg_indexes WHERE schemaname = 'runledger' AND tablename = 'ledger'
AND indexname IN ('ledger_business_key_uq', 'ledger_run_uid_idx') ORDER BY indexname`)
	if err == nil {
		defs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(defs) != 2 {
		b.Fatalf("reading the ledger's index definitions: %v (%d found)", err, len(defs))
	}
	exec(`DROP INDEX runledger.ledger_business_key_uq`)
	exec(`DROP INDEX runledger.ledger_run_uid_idx`)
	// Row k is account k % growthEntities in month k / growthEntities.
	exec(`
INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt, payload, created_at)
SELECT 'acct-' || lpad((k % $3)::text, 7, '0'),
       to_char(date '2020-01-01' + make_interval(months => (k / $3)::int), 'YYYY-MM'),
       'billing', 'month-' || (k / $3)::text, lpad((k / $3)::text, 8, '0') || '-0000-4000-8000-000000000000',
       k % 4, 0, jsonb_build_object('amount', k % 1000, 'currency', 'EUR'),
       now() - make_interval(days => (30 * (600 - k / $3))::int)
FROM generate_series($1::bigint, $2::bigint - 1) k`, from, size, int64(growthEntities))
	for _, def := range defs {
		exec(def)
	}
}

// growthBatch (re)creates the source table of the measured runs: occurrence
// for every 5th account, spread over the whole key space, in account order
// shuffled by a hash (as a real source returns them), then vacuums and
// checkpoints the database.
func growthBatch(ctx context.Context, b *testing.B, pool *pgxpool.Pool, n int, occurrence string) {
	b.Helper()
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS usage`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
CREATE TABLE usage AS
SELECT 'acct-' || lpad(((i * 5) % $2::bigint)::text, 7, '0') AS account,
       $3::text AS period,
       jsonb_build_object('amount', i % 1000, 'currency', 'EUR') AS payload
FROM generate_series(0, $1::bigint - 1) i
ORDER BY md5(i::text)`, n, growthEntities, occurrence); err != nil {
		b.Fatalf("creating the source table: %v", err)
	}
	settle(ctx, b, pool)
}

func checkGrowthCounts(b *testing.B, what string, fresh, handled workerRun, n int) {
	b.Helper()
	if fresh.counts != [4]int64{int64(n), int64(n), 0, 0} {
		b.Fatalf("%s, fresh run: counts %v, want all %d completed", what, fresh.counts, n)
	}
	if handled.counts != [4]int64{int64(n), 0, int64(n), 0} {
		b.Fatalf("%s, second run: counts %v, want all %d already handled", what, handled.counts, n)
	}
}

// ledgerSizes is the ledger's heap (with TOAST), its rule index and its other
// indexes, in MiB.
func ledgerSizes(ctx context.Context, b *testing.B, pool *pgxpool.Pool) (table, rule, other float64) {
	b.Helper()
	var t, r, all int64
	if err := pool.QueryRow(ctx, `
SELECT pg_table_size('runledger.ledger'), pg_relation_size('runledger.ledger_business_key_uq'),
       pg_indexes_size('runledger.ledger')`).Scan(&t, &r, &all); err != nil {
		b.Fatal(err)
	}
	const mib = 1 << 20
	return float64(t) / mib, float64(r) / mib, float64(all-r) / mib
}

// thousandsOf formats n as 50,000,000.
func thousandsOf(n int64) string {
	s := strconv.FormatInt(n, 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

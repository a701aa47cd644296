package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// benchItems is the batch size of every measurement (RUNLEDGER_BENCH_ITEMS
// overrides it for a quick look).
func benchItems() int {
	if n, err := strconv.Atoi(os.Getenv("RUNLEDGER_BENCH_ITEMS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

const chunkSize = 10_000

var benchRun = ledger.Run{Namespace: "bench", Name: "bench", UID: "bench-run"}

func makeItems(n int) []ledger.Item {
	out := make([]ledger.Item, n)
	for i := range out {
		out[i] = ledger.Item{
			Key:     ledger.Key{Entity: fmt.Sprintf("acct-%04d", i%1000), Occurrence: fmt.Sprintf("2026-11-%07d", i)},
			Payload: json.RawMessage(`{"amount": ` + strconv.Itoa(i) + `}`),
		}
	}
	return out
}

// variant is one way of writing a batch: prepare (untimed) readies a fresh
// database, write (timed) writes the given items on one connection's share.
type variant struct {
	name    string
	prepare func(ctx context.Context, pool *pgxpool.Pool) error
	write   func(ctx context.Context, pool *pgxpool.Pool, items []ledger.Item) error
	// table is where write puts the rows; after a timed run it must hold
	// exactly one row per item, or (noRule) one per write of an item.
	table  string
	noRule bool
}

// The baselines write into look-alike tables of runledger.ledger.
const (
	sqlBenchTables = `
CREATE SCHEMA bench;
CREATE TABLE bench.with_rule (LIKE runledger.ledger INCLUDING ALL);
CREATE TABLE bench.without_rule (LIKE runledger.ledger INCLUDING ALL);
DO $$ BEGIN
  EXECUTE (SELECT 'DROP INDEX bench.' || quote_ident(indexname) FROM pg_indexes
           WHERE schemaname = 'bench' AND tablename = 'without_rule' AND indexdef LIKE 'CREATE UNIQUE INDEX % WHERE %');
END $$;`
	sqlBareInsert = `
INSERT INTO %s (entity, occurrence, state, run_namespace, run_name, run_uid, shard, attempt, payload)
SELECT k.entity, k.occurrence, 'committed', 'bench', 'bench', 'bench-run', 0, 0, k.payload::jsonb
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(entity, occurrence, payload) %s`
)

func bareInsert(table, conflict string) func(context.Context, *pgxpool.Pool, []ledger.Item) error {
	sql := fmt.Sprintf(sqlBareInsert, table, conflict)
	return func(ctx context.Context, pool *pgxpool.Pool, items []ledger.Item) error {
		for from := 0; from < len(items); from += chunkSize {
			part := items[from:min(from+chunkSize, len(items))]
			e, o, p := make([]string, len(part)), make([]string, len(part)), make([]string, len(part))
			for i, it := range part {
				e[i], o[i], p[i] = it.Entity, it.Occurrence, string(it.Payload)
			}
			if _, err := pool.Exec(ctx, sql, e, o, p); err != nil {
				return fmt.Errorf("bare insert into %s: %w", table, err)
			}
		}
		return nil
	}
}

func createBenchTables(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, sqlBenchTables)
	return err
}

var (
	insertPath = variant{
		name:  "insert path",
		table: "runledger.ledger",
		write: func(ctx context.Context, pool *pgxpool.Pool, items []ledger.Item) error {
			s := ledger.NewStore(pool)
			for from := 0; from < len(items); from += chunkSize {
				// A worker sends the keys its lookups did not find held
				// with ExpectFresh. Here every chunk is sent so: a chunk
				// with held keys (half handled; overlapping, for the
				// writers another one beat) pays the wrong guess.
				res, err := s.CommitChunk(ctx, benchRun, items[from:min(from+chunkSize, len(items))], ledger.ChunkOptions{ExpectFresh: true})
				if err != nil {
					return err
				}
				for _, r := range res {
					if r.Outcome == ledger.Failed {
						return fmt.Errorf("item %s failed: %w", r.Key, r.Err)
					}
				}
			}
			return nil
		},
	}
	ceiling = variant{
		name:    "(a) bare INSERT ON CONFLICT",
		table:   "bench.with_rule",
		prepare: createBenchTables,
		write:   bareInsert("bench.with_rule", `ON CONFLICT (entity, occurrence) WHERE state = 'committed' DO NOTHING`),
	}
	noRule = variant{
		name:    "(b) bare INSERT, no unique index",
		table:   "bench.without_rule",
		noRule:  true,
		prepare: createBenchTables,
		write:   bareInsert("bench.without_rule", ""),
	}
	naive = variant{
		name:  "(c) naive check-then-insert",
		table: "runledger.ledger",
		write: func(ctx context.Context, pool *pgxpool.Pool, items []ledger.Item) error {
			for _, it := range items {
				var exists bool
				if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM runledger.ledger
					WHERE entity = $1 AND occurrence = $2 AND state = 'committed')`, it.Entity, it.Occurrence).Scan(&exists); err != nil {
					return err
				}
				if exists {
					continue
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt, payload)
					VALUES ($1, $2, 'bench', 'bench', 'bench-run', 0, 0, $3)`, it.Entity, it.Occurrence, string(it.Payload))
				if err == nil {
					err = tx.Commit(ctx)
				}
				_ = tx.Rollback(ctx)
				if err != nil && !ledger.IsExpectedBusinessKeyConflict(err) {
					return err
				}
			}
			return nil
		},
	}
)

// workload is the state of the keys when a timed run starts, and who writes
// them.
type workload int

const (
	// fresh: no key is handled; each connection writes its own share.
	fresh workload = iota
	// halfHandled: every other key was written before the timed run (the
	// same way); each connection writes its own share.
	halfHandled
	// overlapping: no key is handled, and every connection writes all the
	// keys at once: the race the rule exists for. Rates count attempts.
	overlapping
)

func (w workload) String() string {
	return [...]string{"fresh", "half handled", "overlapping"}[w]
}

// measure runs v over n items on conns connections, as workload w says, on a
// fresh durable database. It returns items (attempts) per second.
func measure(b *testing.B, v variant, n, conns int, w workload) float64 {
	b.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if v.prepare != nil {
		if err := v.prepare(ctx, pool); err != nil {
			b.Fatalf("preparing %s: %v", v.name, err)
		}
	}
	all := makeItems(n)
	wantRows, attempts := n, n
	shares := make([][]ledger.Item, conns)
	for c := range conns {
		shares[c] = all[c*n/conns : (c+1)*n/conns]
		if w == overlapping {
			shares[c] = all
		}
	}
	switch w {
	case halfHandled:
		half := make([]ledger.Item, 0, n/2)
		for i := 0; i < n; i += 2 {
			half = append(half, all[i])
		}
		if err := v.write(ctx, pool, half); err != nil {
			b.Fatalf("pre-handling half for %s: %v", v.name, err)
		}
		if v.noRule {
			wantRows += len(half)
		}
	case overlapping:
		attempts = n * conns
		if v.noRule {
			wantRows = attempts
		}
	}
	settle(ctx, b, pool)

	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for c, share := range shares {
		wg.Go(func() { errs[c] = v.write(ctx, pool, share) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			b.Fatalf("%s: %v", v.name, err)
		}
	}
	// A variant that skipped work would look fast: every item must have
	// exactly one row (the keys are distinct, and a pre-handled key must not
	// have got a second one), except without the rule, which is (b)'s point.
	var rows, keys int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (entity, occurrence)) FROM `+v.table).Scan(&rows, &keys); err != nil {
		b.Fatalf("counting the rows of %s: %v", v.name, err)
	}
	if rows != wantRows || keys != n {
		b.Fatalf("%s left %d rows for %d distinct keys in %s, want %d rows for the %d items", v.name, rows, keys, v.table, wantRows, n)
	}
	return float64(attempts) / elapsed.Seconds()
}

// settle readies a database for a timed run: vacuumed and analysed (so the
// planner knows the pre-handled rows), and no dirty buffers left by earlier
// measurements for the checkpointer to write during this one. CHECKPOINT needs
// a superuser (or pg_checkpoint); on a TEST_DATABASE_URL server without that
// right the benchmark runs without it and says so.
func settle(ctx context.Context, b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		b.Fatalf("vacuuming before the timed run: %v", err)
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		checkpointWarning.Do(func() { b.Logf("no checkpoint before timed runs (%v): expect noisier ratios", err) })
	}
}

var checkpointWarning sync.Once

// naiveItems caps the naive variant's batch: at one durable commit per item it
// would take minutes for 100,000 items, and its rate does not depend on n.
func naiveItems(n int) int { return min(n, 5_000) }

// repetitions: each variant is measured this many times, the variants
// interleaved (path, (a), (b), (c), path, (a), ...).
const repetitions = 5

// rates holds every measurement of one configuration, per variant, in the
// order taken: rates[v][i] is variant v's items/s in round i.
type rates map[string][]float64

// best is the variant's best rate: what it does on a quiet machine.
func (r rates) best(v variant) float64 { return slices.Max(r[v.name]) }

// ratio is the median over the rounds of x's rate over y's rate in the same
// round. The two ran back to back, under the same load from neighbours on
// this shared machine; the median drops the rounds a burst of load split. (A
// ratio of best rates is not stable here: on 2 shared cores (a) alone varies
// from 56k to 91k items/s between identical runs, and whichever variant had
// the quiet window decided the ratio.)
func (r rates) ratio(x, y variant) float64 {
	q := make([]float64, len(r[x.name]))
	for i := range q {
		q[i] = r[x.name][i] / r[y.name][i]
	}
	slices.Sort(q)
	if len(q)%2 == 1 {
		return q[len(q)/2]
	}
	return (q[len(q)/2-1] + q[len(q)/2]) / 2
}

// LedgerRates measures the insert path and the baselines on one configuration.
func LedgerRates(b *testing.B, n, conns int, w workload) rates {
	r := rates{}
	for range repetitions {
		for _, v := range []variant{insertPath, ceiling, noRule, naive} {
			items := n
			if v.name == naive.name {
				items = naiveItems(n)
			}
			r[v.name] = append(r[v.name], measure(b, v, items, conns, w))
		}
	}
	return r
}

// BenchmarkLedger writes benchItems() items with the insert path and each
// baseline, fresh and half already handled, on 1 and 4 connections, and prints
// the ratios the project's targets are stated in: insert path >= 0.8x (a) and
// >= 20x (c). A fifth configuration, 4 connections writing the same keys at
// once, shows what a race costs each of them (no target).
func BenchmarkLedger(b *testing.B) {
	n := benchItems()
	type row struct {
		conns int
		state workload
		rates rates
	}
	var rows []row
	for _, cfg := range []row{{1, fresh, nil}, {1, halfHandled, nil}, {4, fresh, nil}, {4, halfHandled, nil}, {4, overlapping, nil}} {
		r := cfg
		b.Run(fmt.Sprintf("conns=%d/%s", r.conns, strings.ReplaceAll(r.state.String(), " ", "_")), func(b *testing.B) {
			for range b.N {
				r.rates = LedgerRates(b, n, r.conns, r.state)
			}
			b.ReportMetric(r.rates.best(insertPath), "items/s")
			b.ReportMetric(r.rates.ratio(insertPath, ceiling), "x(a)")
			b.ReportMetric(r.rates.ratio(insertPath, naive), "x(c)")
		})
		rows = append(rows, r)
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\nledger benchmark: %d items (naive: %d), chunks of %d, fsync on, %d interleaved rounds\n",
		n, naiveItems(n), chunkSize, repetitions)
	fmt.Fprintln(w, "rates: the best round of each; ratios: the median over the rounds of the ratio within a round")
	fmt.Fprintln(w, "conns\tstate\tinsert path\t(a) ceiling\t(b) no index\t(c) naive\tpath/(a)\tpath/(c)\t(a)/(b)\t(a)/(c)\t")
	for _, r := range rows {
		if r.rates == nil { // filtered out by -bench
			continue
		}
		fmt.Fprintf(w, "%d\t%s\t%.0f/s\t%.0f/s\t%.0f/s\t%.0f/s\t%.2fx\t%.1fx\t%.2fx\t%.1fx\t\n", r.conns, r.state,
			r.rates.best(insertPath), r.rates.best(ceiling), r.rates.best(noRule), r.rates.best(naive),
			r.rates.ratio(insertPath, ceiling), r.rates.ratio(insertPath, naive),
			r.rates.ratio(ceiling, noRule), r.rates.ratio(ceiling, naive))
	}
	fmt.Fprintln(w, "targets (fresh, half handled): path/(a) >= 0.80x, path/(c) >= 20x; (a)/(c): the bare statement against the naive pattern, for scale")
	fmt.Fprintln(w, "overlapping: every connection writes all the keys at once; rates count attempts, one row per key must remain; target path/(a) >= 1.0x (#27)")
	_ = w.Flush()
}

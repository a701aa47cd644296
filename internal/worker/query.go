package worker

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/internal/ledger"
)

// QuerySource is an SQL SELECT returning the columns entity, occurrence and,
// optionally, payload. It runs in a READ ONLY, REPEATABLE READ transaction
// (one consistent snapshot; the query cannot write) through a server-side
// cursor, so a shard holds one fetch of rows at a time, whatever the size of
// the batch. The shard counts its rows when it opens the cursor, so its
// total is known from the start.
//
// The query also joins the ledger: each row arrives with the run that holds
// its key, if any, so a chunk needs no separate preload round trip, and a
// batch that is already handled costs one set-based join and no write.
//
// Each shard reads only its rows: the shard filter (ShardOf, as SQL) runs in
// PostgreSQL. Rows come sorted by key (byte order), which gives two things
// with O(1) memory: repeats of a key are adjacent, so in-batch duplicates are
// recognised across chunks; and the order is deterministic, so when the
// connection is lost mid-stream the shard reopens the cursor at the row where
// it stopped (OFFSET) instead of starting over.
//
// A row that cannot become an item (NULL or empty key part, payload that is
// not JSON or too large) is a failed item naming its row number in the
// query's output and the field; it counts against maxFailedItems.
type QuerySource struct {
	sql        string
	hasPayload bool
}

// NewQuerySource returns a source over the query text (trailing semicolons
// are ignored). Call Check before using it.
func NewQuerySource(sql string) *QuerySource {
	return &QuerySource{sql: trimQuery(sql)}
}

func trimQuery(q string) string {
	q = strings.TrimSpace(q)
	for strings.HasSuffix(q, ";") {
		q = strings.TrimSpace(strings.TrimSuffix(q, ";"))
	}
	return q
}

func (q *QuerySource) describe() string { return "query" }

// Check describes the query on the database (without running it): it must
// parse, be allowed in a READ ONLY transaction, and return entity and
// occurrence (and optionally payload). It returns an *InputError for a query
// that can never work, or a retryable error if the database could not be
// reached.
func (q *QuerySource) Check(ctx context.Context, pool *pgxpool.Pool) error {
	if q.sql == "" {
		return &InputError{Where: "batch.query", Msg: "is empty"}
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("beginning read-only transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	desc, err := tx.Prepare(ctx, "", "SELECT * FROM (\n"+q.sql+"\n) AS q")
	if err != nil {
		return queryError("batch.query", err)
	}
	var names []string
	cols := map[string]bool{}
	for _, f := range desc.Fields {
		names = append(names, f.Name)
		cols[f.Name] = true
	}
	for _, want := range []string{"entity", "occurrence"} {
		if !cols[want] {
			return &InputError{Where: "batch.query", Msg: fmt.Sprintf("returns no column %q: it must return entity, occurrence and optionally payload (it returns %s)", want, strings.Join(names, ", "))}
		}
	}
	q.hasPayload = cols["payload"]
	// The shard query itself, as it will run.
	if _, err := tx.Prepare(ctx, "", q.shardQuery(0, 2, 0)); err != nil {
		return queryError("batch.query", err)
	}
	return nil
}

// queryError makes err an InputError when PostgreSQL refused the statement for
// good; a retryable or context error passes through (the query may well be fine).
func queryError(where string, err error) error {
	if pgErr, refused := ledger.RefusedStatement(err); refused {
		msg := pgErr.Message
		if pgErr.Detail != "" {
			msg += " (" + pgErr.Detail + ")"
		}
		if pgErr.Hint != "" {
			msg += "; hint: " + pgErr.Hint
		}
		return &InputError{Where: where, Msg: fmt.Sprintf("is rejected by PostgreSQL: %s (SQLSTATE %s)", msg, pgErr.Code)}
	}
	return err
}

// shardQuery is the user's query restricted to one shard, sorted by key,
// starting after the first offset rows. Column names are prefixed rl_ so as
// not to collide with the user's.
func (q *QuerySource) shardQuery(shard, shards int, offset int64) string {
	payload := "NULL::text"
	if q.hasPayload {
		payload = "s.rl_p::text" // cast after the shard filter: only this shard's rows pay
	}
	var b strings.Builder
	// The LEFT JOIN is the preload, set-based inside the query: the run_uid of
	// the committed row holding each key (at most one: the unique rule), as of
	// the query's snapshot. Like any preload it may be stale by the time the
	// chunk commits; it only decides what need not be sent to the insert path.
	fmt.Fprintf(&b, "SELECT s.rl_e, s.rl_o, %s, s.rl_n, l.run_uid FROM (\n", payload)
	b.WriteString("  SELECT q.entity::text AS rl_e, q.occurrence::text AS rl_o, ")
	if q.hasPayload {
		b.WriteString("q.payload AS rl_p, ")
	}
	b.WriteString("row_number() OVER () AS rl_n\n  FROM (\n")
	b.WriteString(q.sql)
	b.WriteString("\n  ) AS q\n) AS s\n")
	b.WriteString("LEFT JOIN runledger.ledger AS l ON l.entity = s.rl_e AND l.occurrence = s.rl_o AND l.state = 'committed'\n")
	if shards > 1 {
		// Rows with a NULL key part have no shard; shard 0 reports them.
		fmt.Fprintf(&b, "WHERE coalesce(%s, 0) = %d\n", shardSQL("s.rl_e", "s.rl_o", shards), shard)
	}
	b.WriteString(`ORDER BY s.rl_e COLLATE "C" NULLS FIRST, s.rl_o COLLATE "C" NULLS FIRST, s.rl_n` + "\n")
	if offset > 0 {
		b.WriteString("OFFSET " + strconv.FormatInt(offset, 10) + "\n")
	}
	return b.String()
}

func (q *QuerySource) open(ctx context.Context, pool *pgxpool.Pool, shard, shards int, opt streamOptions) (stream, error) {
	s := &queryStream{q: q, pool: pool, shard: shard, shards: shards, opt: opt}
	if opt.fetchSize <= 0 {
		s.opt.fetchSize = 1000
	}
	// The first fetch runs the query (sort included): errors in the query
	// itself show up here, before anything is committed.
	if err := s.fill(ctx); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// cursorName is the server-side cursor of a query stream.
const cursorName = "runledger_source"

// sourceWorkMem is the work_mem of a query stream's transaction.
const sourceWorkMem = "64MB"

type queryStream struct {
	q             *QuerySource
	pool          *pgxpool.Pool
	shard, shards int
	opt           streamOptions

	tx       pgx.Tx  // nil when not open
	buf      []entry // fetched, not yet yielded
	consumed int64   // rows yielded (and rows of the sorted stream to skip on reopen)
	eof      bool
	rows     int64 // rows of the shard, once counted
	counted  bool
	prev     ledger.Key // key of the last row yielded, for repeats
	hasPrev  bool
}

func (s *queryStream) total() (int64, bool) {
	if s.counted {
		return s.rows, true
	}
	return s.consumed + int64(len(s.buf)), s.eof
}

func (s *queryStream) close() {
	if s.tx != nil {
		// Rolling back a read-only transaction: nothing is lost either way.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.tx.Rollback(ctx)
		cancel()
		s.tx = nil
	}
}

func (s *queryStream) next(ctx context.Context) (entry, error) {
	if len(s.buf) == 0 && !s.eof {
		if err := s.fill(ctx); err != nil {
			return entry{}, err
		}
	}
	if len(s.buf) == 0 {
		return entry{}, io.EOF
	}
	e := s.buf[0]
	s.buf = s.buf[1:]
	s.consumed++
	if e.bad == nil {
		e.repeat = s.hasPrev && e.item.Key == s.prev
		s.prev, s.hasPrev = e.item.Key, true
	}
	return e, nil
}

// fill fetches the next rows, reopening the cursor after a lost connection.
func (s *queryStream) fill(ctx context.Context) error {
	onRetry := func(attempt int, wait time.Duration, err error) {
		s.close()
		s.opt.log.Info("reading the query failed, reopening it where it stopped", "retry", attempt, "atRow", s.consumed,
			"wait", wait.Round(time.Millisecond), "error", err.Error())
	}
	err := s.opt.retry.Do(ctx, "reading the query", onRetry, func(int) error {
		if s.tx == nil {
			if err := s.openCursor(ctx); err != nil {
				return err
			}
		}
		return s.fetch(ctx)
	})
	if err != nil {
		s.close()
		if s.consumed == 0 {
			return queryError("batch.query", err)
		}
		return err
	}
	return nil
}

func (s *queryStream) openCursor(ctx context.Context) error {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("beginning read-only transaction: %w", err)
	}
	// The shard's rows are sorted (and joined) in the server: give the sort
	// room to stay in memory, for this transaction only.
	if _, err := tx.Exec(ctx, "SET LOCAL work_mem = '"+sourceWorkMem+"'"); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("setting work_mem: %w", err)
	}
	// Rows to skip: those already yielded (the buffer was dropped on error).
	// SCROLL, to count the rows (MOVE to the end, then back): the sort has
	// materialised them anyway, and the count makes the shard's total exact
	// from the start (and gives progress an ETA).
	if _, err := tx.Exec(ctx, "DECLARE "+cursorName+" SCROLL CURSOR FOR "+s.q.shardQuery(s.shard, s.shards, s.consumed)); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("opening cursor: %w", err)
	}
	tag, err := tx.Exec(ctx, "MOVE FORWARD ALL IN "+cursorName)
	if err == nil {
		_, err = tx.Exec(ctx, "MOVE ABSOLUTE 0 IN "+cursorName)
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("counting rows: %w", err)
	}
	s.rows, s.counted = s.consumed+tag.RowsAffected(), true
	s.tx = tx
	return nil
}

func (s *queryStream) fetch(ctx context.Context) error {
	rows, err := s.tx.Query(ctx, "FETCH FORWARD "+strconv.Itoa(s.opt.fetchSize)+" FROM "+cursorName)
	if err != nil {
		s.close()
		return fmt.Errorf("fetching rows: %w", err)
	}
	var e, o, p, holder *string
	var n int64
	buf := make([]entry, 0, s.opt.fetchSize)
	_, err = pgx.ForEachRow(rows, []any{&e, &o, &p, &n, &holder}, func() error {
		en := s.rowEntry(e, o, p, n)
		en.checked = true
		switch {
		case holder == nil:
		case *holder == s.opt.runUID:
			en.holder = ledger.HolderSameRun
		default:
			en.holder = ledger.HolderOtherRun
		}
		buf = append(buf, en)
		return nil
	})
	if err != nil {
		s.close()
		return fmt.Errorf("fetching rows: %w", err)
	}
	s.buf = buf
	if len(buf) < s.opt.fetchSize {
		s.eof = true
		s.close()
	}
	return nil
}

func (s *queryStream) rowEntry(e, o, p *string, n int64) entry {
	where := "query row " + strconv.FormatInt(n, 10)
	var it ledger.Item
	var bad []*InputError
	for _, f := range []struct {
		name string
		v    *string
		dst  *string
	}{{"entity", e, &it.Entity}, {"occurrence", o, &it.Occurrence}} {
		if f.v == nil {
			bad = append(bad, &InputError{Where: where, Field: f.name, Msg: "is NULL"})
			continue
		}
		*f.dst = *f.v
		if msg := checkKeyPart(*f.v); msg != "" {
			bad = append(bad, &InputError{Where: where, Field: f.name, Msg: msg})
		}
	}
	if p != nil {
		if msg := checkPayload([]byte(*p), s.opt.limits); msg != "" {
			bad = append(bad, &InputError{Where: where, Field: "payload", Msg: msg})
		}
		it.Payload = []byte(*p)
	}
	if len(bad) == 0 {
		return entry{item: it}
	}
	first := bad[0]
	for _, b := range bad[1:] {
		first.Msg += fmt.Sprintf("; field %q %s", b.Field, b.Msg)
	}
	return entry{item: it, bad: first}
}

package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Batch sources, as batch_run.source records them.
const (
	BatchSourceQuery  = "query"
	BatchSourceStatic = "static"
	BatchSourceObject = "object"
)

// ErrBatchQuery marks an error of the user's query itself while the batch
// was materialised (as opposed to an error writing the batch).
var ErrBatchQuery = errors.New("the batch's query failed")

// BatchHeader is what the ledger database records about a run's batch the
// first time a shard of the run starts (runledger.batch_run).
type BatchHeader struct {
	ID      int64  // the key of its rows in runledger.batch
	Source  string // BatchSourceQuery, BatchSourceStatic or BatchSourceObject
	Shards  int    // the shard count the batch was fixed for
	Items   int64  // items of the whole batch
	Digest  string // sha256 of a static source's items, of a query source's text ("": fixed before it was recorded), of an object source's location
	Created time.Time
	Pruned  *time.Time // set once `runledger prune` deleted the rows
	// Namespace and Name: the run whose first shard fixed the batch, the
	// one run the ledger knows by its uid (CheckRun).
	Namespace, Name string
}

// RunIdentityError: a run's uid is another run's in the ledger database
// (the namespace/name its batch header recorded when its first shard
// started), as for a copy of a run's manifest that kept its metadata.uid.
// Bad input: retrying cannot change it.
type RunIdentityError struct {
	UID      string
	Recorded RunRef // the run the ledger knows by UID
	Given    RunRef // the run that claimed UID
}

func (e *RunIdentityError) Error() string {
	return fmt.Sprintf("run %s/%s has uid %s, which the ledger database records as run %s/%s (its batch was fixed under that namespace and name): "+
		"processing it would count that run's work as this one's and never run this one's effect. A manifest copied with its metadata.uid? "+
		"Remove metadata.uid from the copy (runledger run then derives a uid from its namespace and name), or give it a uid of its own",
		e.Given.Namespace, e.Given.Name, e.UID, e.Recorded.Namespace, e.Recorded.Name)
}

// CheckRun says whether h, the batch header of run's uid, is run's own: nil
// if so (or if there is no header), else a *RunIdentityError naming both.
func (h *BatchHeader) CheckRun(run Run) error {
	if h == nil || (h.Namespace == run.Namespace && h.Name == run.Name) {
		return nil
	}
	return &RunIdentityError{UID: run.UID, Recorded: RunRef{Namespace: h.Namespace, Name: h.Name, UID: run.UID},
		Given: RunRef{Namespace: run.Namespace, Name: run.Name, UID: run.UID}}
}

// BatchQuery is a query source to materialise: the user's query (with the
// columns entity, occurrence and, if HasPayload, payload), and the shard
// function as SQL over two text expressions (nil: ShardOf's).
type BatchQuery struct {
	SQL string
	// Digest identifies the query text; it is recorded with the batch
	// (batch_run.digest), so that a later attempt tells an edited query.
	Digest     string
	HasPayload bool
	Shards     int
	ShardOf    func(entity, occurrence string) string
	// Occurrence, when not empty, is what the query reads as
	// current_setting('runledger.occurrence') (a run's spec.occurrence): a
	// setting of the query's transaction, never text in the SQL.
	Occurrence string
	// Timeout and LockTimeout bound the statement that runs the query and
	// every statement after it in its transaction (statement_timeout,
	// lock_timeout); 0 keeps the session's own, or DefaultQueryTimeout and
	// DefaultLockTimeout where the session has none. Either one expiring is
	// retryable, with nothing written.
	Timeout, LockTimeout time.Duration
	// NetworkTimeout, with Timeout, bounds the wait for the query's answer
	// on the client, as ChunkOptions.NetworkTimeout does the effect's.
	NetworkTimeout time.Duration
	// Copy lets a second connection of the Store's pool copy the query's
	// rows into the batch while the query runs on the first: the fix on two
	// server processes, not one (docs/insert-path.md). The caller holds no
	// connection of the pool meanwhile and needs none until the fix returns
	// (a worker fixes its batch before it takes its shard's lease, whose
	// renewals need one). Where the pool has no second connection free, or
	// behind a pooler, one statement fixes the batch as without it.
	Copy bool
}

func (q BatchQuery) shardOf() func(entity, occurrence string) string {
	if q.ShardOf != nil {
		return q.ShardOf
	}
	return func(e, o string) string { return sqlShardOf(e, o, q.Shards) }
}

// DescribeBatchQuery describes the user's query without running it, in a
// READ ONLY transaction (so a query that writes is refused): it returns the
// names of its columns and, when they include entity and occurrence,
// prepares the statement that would materialise it for shards shards
// (payload is taken when there is such a column). An error of the query
// itself is PostgreSQL's (see RefusedStatement).
func (s *Store) DescribeBatchQuery(ctx context.Context, query string, shards int, occurrence string) ([]QueryColumn, error) {
	if occurrence == "" && ReadsOccurrence(query) {
		return nil, ErrNoOccurrence
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquiring a connection to describe the batch query: %w", err)
	}
	defer releaseAfterOccurrence(ctx, conn, occurrence)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("beginning read-only transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := setOccurrence(ctx, tx, occurrence, BehindPooler(s.pool)); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, sqlUserPath(userSearchPath(s.pool))); err != nil {
		return nil, fmt.Errorf("describing the batch query: %w", err)
	}
	desc, err := tx.Prepare(ctx, "", sqlDescribeQuery(query))
	if err != nil {
		return nil, err
	}
	names := make([]QueryColumn, 0, len(desc.Fields))
	cols := map[string]bool{}
	for _, f := range desc.Fields {
		names = append(names, QueryColumn{Name: f.Name, TypeOID: f.DataTypeOID})
		cols[f.Name] = true
	}
	if !cols["entity"] || !cols["occurrence"] {
		return names, nil
	}
	// The rows as they will be materialised (a query that hides its writes
	// in a function is rolled back when the batch is fixed).
	q := BatchQuery{SQL: query, HasPayload: cols["payload"], Shards: shards}
	if _, err := tx.Prepare(ctx, "", sqlBatchRows(q.SQL, q.HasPayload, q.Shards, q.shardOf())); err != nil {
		return nil, err
	}
	return names, nil
}

// QueryColumn is a column of a batch query, as PostgreSQL describes it.
type QueryColumn struct {
	Name    string
	TypeOID uint32
}

// The types whose text is the session's TimeZone's (timestamptz, timetz,
// and their arrays): a key part of one of them would be another key in a
// session with another TimeZone, which the batch cannot fix without
// changing what the query means (sqlKeyFormats fixes the others).
var zonedTypes = map[uint32]string{1184: "timestamp with time zone", 1185: "timestamp with time zone[]", 1266: "time with time zone", 1270: "time with time zone[]"}

// PrintsInTimeZone names the column's type when its text depends on the
// session's TimeZone ("" otherwise).
func (c QueryColumn) PrintsInTimeZone() string { return zonedTypes[c.TypeOID] }

// BatchRow is one row of a materialised batch. Seq is its row number in the
// query's output. A key part is nil when the query returned NULL for it;
// When LookedUp, Holder says who held the key's committed row as of the
// fetch (relative to the reading run).
type BatchRow struct {
	Seq        int64
	Entity     *string
	Occurrence *string
	Payload    []byte // nil: no payload
	LookedUp   bool
	Holder     Holder // HolderNone, HolderSameRun or HolderOtherRun
	// PayloadMatch: for HolderOtherRun, what the payload's text says of the
	// committed row's.
	PayloadMatch PayloadMatch
	// PayloadOmitted: the lookup settled the row (the run's own key, or
	// another run's with the same payload) and the fetch left its payload
	// out (OpenBatch's heldPayloads): Payload is nil whatever it was.
	PayloadOmitted bool
}

// BatchHeader returns the header of run's batch, or nil if there is none.
func (s *Store) BatchHeader(ctx context.Context, runUID string) (h *BatchHeader, err error) {
	err = s.pinned(ctx, func(tx pgx.Tx) (err error) {
		h, err = batchHeader(ctx, tx, runUID)
		return err
	})
	return h, err
}

func batchHeader(ctx context.Context, db dbtx, runUID string) (*BatchHeader, error) {
	return scanBatchHeader(db.QueryRow(ctx, sqlBatchHeader, runUID), runUID)
}

// scanBatchHeader reads sqlBatchHeader's answer: nil if there is no header.
func scanBatchHeader(row pgx.Row, runUID string) (*BatchHeader, error) {
	var h BatchHeader
	err := row.Scan(&h.ID, &h.Source, &h.Shards, &h.Items, &h.Digest, &h.Created, &h.Pruned, &h.Namespace, &h.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the batch header of run %s: %w", runUID, err)
	}
	return &h, nil
}

// ForeignWriteError: the batch's query wrote to a table (a function it
// called did); the materialising transaction was rolled back.
type ForeignWriteError struct {
	Table                      string
	Inserted, Updated, Deleted int64
}

func (e *ForeignWriteError) Error() string {
	return fmt.Sprintf("the batch's query wrote to %s (%d rows inserted, %d updated, %d deleted)", e.Table, e.Inserted, e.Updated, e.Deleted)
}

// FixQueryBatch returns the header of run's batch, materialising the batch
// from q first if the run has none: one statement runs the query once and
// writes the header and the rows. Concurrent callers for one run wait for
// each other (an advisory lock of the materialising transaction, so that
// nothing outlives it on a pooler's server connection) and find the header
// there; the header's primary key keeps the batch from being written twice
// even without the lock. The query runs in a read-write transaction (it
// feeds the insert), so a transaction in which it wrote anything else is
// rolled back (*ForeignWriteError). An existing header is returned as it
// is, even one of another source or shard count, or a pruned one: the
// caller decides; one of another run (namespace/name) is a
// *RunIdentityError, whoever wrote it first. An error of the user's query
// is marked ErrBatchQuery.
func (s *Store) FixQueryBatch(ctx context.Context, run Run, q BatchQuery) (*BatchHeader, error) {
	h, err := s.fixQueryBatch(ctx, run, q)
	if err == nil {
		err = h.CheckRun(run)
	}
	if err != nil {
		return nil, err
	}
	return h, nil
}

func (s *Store) fixQueryBatch(ctx context.Context, run Run, q BatchQuery) (*BatchHeader, error) {
	if h, err := s.BatchHeader(ctx, run.UID); err != nil || h != nil {
		return h, err
	}
	if q.Occurrence == "" && ReadsOccurrence(q.SQL) {
		return nil, fmt.Errorf("%w: %w", ErrBatchQuery, ErrNoOccurrence)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquiring a connection to materialise the batch: %w", err)
	}
	// A session that fails mid-way is closed, not reused: the user's query
	// may have run on it.
	ok := false
	defer func() {
		if !ok {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Conn().Close(ctx)
			cancel()
		}
		conn.Release()
	}()
	h, err := materialise(ctx, conn.Conn(), run, q, BehindPooler(s.pool), userSearchPath(s.pool), s.batchWriter)
	if err == nil && h == nil {
		err = pinnedTx(ctx, conn, sqlBeginPinned, func(tx pgx.Tx) (err error) {
			h, err = batchHeader(ctx, tx, run.UID)
			return err
		})
	}
	if err != nil {
		return nil, err
	}
	// A session that set the occurrence keeps the setting's (empty)
	// placeholder for good: closed, so that no later run on it reads ''.
	ok = q.Occurrence == ""
	return h, nil
}

// materialise writes run's batch from q, under the batch's lock, unless
// another materialiser wrote it first: it then returns that header (nil
// when it wrote the batch itself). pooled: conn reaches PostgreSQL through
// a transaction pooler, whose server connection outlives this session.
//
// The query runs on conn. Where writer gives a second session
// (Store.batchWriter), that session copies the query's rows into the batch
// while the query runs, in a transaction of its own (copyQueryBatch), the
// shards by Go's shard function; otherwise one statement on conn runs the
// query and writes the batch (sqlFixQueryBatch), on one server process.
func materialise(ctx context.Context, conn *pgx.Conn, run Run, q BatchQuery, pooled bool, userPath string, writer func(context.Context, BatchQuery) *pgxpool.Conn) (*BatchHeader, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: sqlBeginPinned})
	if err != nil {
		return nil, fmt.Errorf("beginning the batch's transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, sqlBatchLockWait(q.Timeout, q.LockTimeout)); err != nil {
		return nil, fmt.Errorf("bounding the wait for the batch lock of run %s: %w", run.UID, err)
	}
	if _, err := tx.Exec(ctx, sqlLockBatch, run.UID); err != nil {
		return nil, fmt.Errorf("taking the batch lock of run %s: %w", run.UID, err)
	}
	// A statement after the lock sees what the lock's last holder committed.
	if h, err := batchHeader(ctx, tx, run.UID); err != nil || h != nil {
		return h, err
	}
	bounds := sqlBounds(q.Timeout, q.LockTimeout, DefaultQueryTimeout, DefaultLockTimeout)
	if _, err := tx.Exec(ctx, sqlBeforeBatchQuery(bounds)); err != nil {
		return nil, fmt.Errorf("preparing the batch's query: %w", err)
	}
	if err := setOccurrence(ctx, tx, q.Occurrence, pooled); err != nil {
		return nil, err
	}
	before, err := tableWrites(ctx, tx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, sqlUserPath(userPath)); err != nil {
		return nil, fmt.Errorf("preparing the batch's query: %w", err)
	}
	if w := writer(ctx, q); w != nil {
		defer w.Release()
		_, err := copyQueryBatch(ctx, tx, w.Conn(), run, q, func() error { return afterBatchQuery(ctx, tx, bounds, before, pooled) })
		if err != nil {
			_ = w.Conn().Close(context.WithoutCancel(ctx)) // the copy may have ended mid-way: not back to the pool
		}
		return nil, err // tx commits nothing: rolled back, the lock released after w's commit
	}
	var items int64
	bounded, cancel := answerBy(ctx, q.Timeout, q.NetworkTimeout)
	err = tx.QueryRow(bounded, sqlFixQueryBatch(q.SQL, q.HasPayload, q.Shards, q.shardOf()), run.UID, run.Namespace, run.Name, q.Shards, nilIfEmpty(q.Digest)).Scan(&items)
	err = noAnswer(ctx, bounded, err)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBatchQuery, err)
	}
	if err := afterBatchQuery(ctx, tx, bounds, before, pooled); err != nil {
		return nil, err
	}
	if items > 0 {
		if _, err := tx.Exec(ctx, sqlSetBatchItems, run.UID, items); err != nil {
			return nil, fmt.Errorf("counting the batch of run %s: %w", run.UID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if IsAppendOnlyViolation(err) { // user code that ran at COMMIT wrote runledger's tables (00013)
			return nil, fmt.Errorf("%w: writing the batch of run %s: %w", ErrBatchQuery, run.UID, err)
		}
		return nil, fmt.Errorf("writing the batch of run %s: %w", run.UID, err)
	}
	return nil, nil
}

// afterBatchQuery resets the query's session after the query and checks
// what the query left: its writes (before: tableWrites before it), cursors
// WITH HOLD, prepared statements.
func afterBatchQuery(ctx context.Context, tx pgx.Tx, bounds string, before map[int64]ForeignWriteError, pooled bool) error {
	if _, err := tx.Exec(ctx, sqlAfterBatchQuery(bounds)); err != nil {
		return fmt.Errorf("resetting the session after the batch's query: %w", err)
	}
	after, err := tableWrites(ctx, tx)
	if err != nil {
		return err
	}
	if w := foreignWrite(before, after); w != nil {
		return fmt.Errorf("%w: %w", ErrBatchQuery, w)
	}
	var held, prepared string
	if err := tx.QueryRow(ctx, sqlHoldCursors).Scan(&held, &prepared); err != nil {
		return fmt.Errorf("reading the session's cursors and prepared statements: %w", err)
	}
	if held != "" {
		return fmt.Errorf("%w: it declared the cursor(s) %s WITH HOLD, which PostgreSQL would run to the end at COMMIT, after the write check", ErrBatchQuery, held)
	}
	if prepared != "" { // FixQueryBatch closes the session: PREPARE is not undone by a rollback
		if pooled { // closing it leaves the server connection: they go by name
			if err := deallocateFromSQL(ctx, tx.Conn().PgConn()); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: it PREPAREd the statement(s) %s, which would outlive its transaction on the session", ErrBatchQuery, prepared)
	}
	return nil
}

// tableWrites reads sqlBatchWrites: rows written per table, by relid.
func tableWrites(ctx context.Context, tx pgx.Tx) (map[int64]ForeignWriteError, error) {
	rows, err := tx.Query(ctx, sqlBatchWrites)
	if err != nil {
		return nil, fmt.Errorf("reading what the session wrote: %w", err)
	}
	out := map[int64]ForeignWriteError{}
	var relid int64
	var w ForeignWriteError
	_, err = pgx.ForEachRow(rows, []any{&relid, &w.Table, &w.Inserted, &w.Updated, &w.Deleted}, func() error {
		out[relid] = w
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading what the session wrote: %w", err)
	}
	return out, nil
}

// foreignWrite returns the first table (by name) written between two
// readings of tableWrites, with what was written in between, or nil.
func foreignWrite(before, after map[int64]ForeignWriteError) *ForeignWriteError {
	var first *ForeignWriteError
	for relid, a := range after {
		b := before[relid]
		d := ForeignWriteError{Table: a.Table, Inserted: a.Inserted - b.Inserted, Updated: a.Updated - b.Updated, Deleted: a.Deleted - b.Deleted}
		if d.Inserted+d.Updated+d.Deleted > 0 && (first == nil || d.Table < first.Table) {
			first = &d
		}
	}
	return first
}

// FixStaticBatch records the size and digest of run's static batch if the
// run has no header yet, and returns the header the run has: a
// *RunIdentityError if it is another run's (namespace/name).
func (s *Store) FixStaticBatch(ctx context.Context, run Run, shards int, items int64, digest string) (*BatchHeader, error) {
	// Two statements: after waiting on a concurrent insert of the header, the
	// insert's own snapshot would not see it; the SELECT's does. That wait is
	// bounded (the Store's bounds).
	err := pinnedTx(ctx, s.pool, sqlBeginPinned+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sqlFixStaticBatch, run.UID, run.Namespace, run.Name, shards, items, digest)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("recording the batch of run %s: %w", run.UID, err)
	}
	return s.writtenHeader(ctx, run)
}

// writtenHeader reads the header of run's batch, just written (by this
// caller or another): one of another run is a *RunIdentityError.
func (s *Store) writtenHeader(ctx context.Context, run Run) (*BatchHeader, error) {
	h, err := s.BatchHeader(ctx, run.UID)
	if err == nil && h == nil {
		err = fmt.Errorf("the batch header of run %s vanished after it was written", run.UID)
	}
	if err == nil {
		err = h.CheckRun(run)
	}
	if err != nil {
		return nil, err
	}
	return h, nil
}

// BatchShardSize is the number of items of shard in the materialised batch h.
func (s *Store) BatchShardSize(ctx context.Context, h *BatchHeader, shard int) (int64, error) {
	var n int64
	if err := s.pinned(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sqlBatchShardSize, h.ID, shard).Scan(&n) }); err != nil {
		return 0, fmt.Errorf("counting the rows of shard %d: %w", shard, err)
	}
	return n, nil
}

// BatchReader reads one shard of a materialised batch in key order: byte
// order of (occurrence, entity), the rule's, NULL key parts first, repeats
// of a key adjacent in query order. The shard's items are sorted once, by
// one statement, into a copy of their own (batch_sorted, unlogged), each
// with its position in that order; every Fetch then reads a range of
// positions in one short transaction of its own, on whichever connection
// the pool (or a transaction pooler) lends: no snapshot, cursor or session
// outlives a fetch. Every sort gives the same positions, so a copy lost with
// the unlogged tables (a crash) is sorted again and read on at the position
// reached.
//
// A shard whose items already lie in key order in the batch (a query that
// returned its rows in the rule's order) is not sorted: it is read where it
// lies, by the same positions (the order is the same), and loses no copy.
type BatchReader struct {
	store  *Store
	batch  *BatchHeader
	runUID string
	shard  int
	// heldPayloads: rows a lookup found held come with their payloads too
	// (for a Supersede run, which claims them again, and a Fail run, whose
	// failure record of a key a later copy fails keeps its first copy's);
	// otherwise a row the lookup settles comes without.
	heldPayloads bool
	// inPlace: the shard's blocks of the batch with each one's first
	// position, in block order, when the shard is read where it lies; nil
	// when it is read from its sorted copy.
	inPlace []placedBlock
}

// placedBlock is a block of a shard read in place, and its first position.
type placedBlock struct{ block, start int64 }

// ErrSortedCopyLost: the shard's sorted copy vanished between two fetches (a
// crash of the server empties unlogged tables, or another process of the
// shard deleted it); it is sorted again. Retryable.
var ErrSortedCopyLost = errors.New("the shard's sorted copy of its batch is gone (the server restarted, or another process finished the shard)")

// OpenBatch returns a reader of shard of the materialised batch h, for
// runUID (the run whose batch h is), sorting the shard's items first unless
// a whole copy of them exists already. A row a fetch's lookup settles (held
// by the run itself, or by another run with the same payload) comes without
// its payload (BatchRow.PayloadOmitted) unless heldPayloads.
func (s *Store) OpenBatch(ctx context.Context, h *BatchHeader, runUID string, shard int, heldPayloads bool) (*BatchReader, error) {
	r := &BatchReader{store: s, batch: h, runUID: runUID, shard: shard, heldPayloads: heldPayloads}
	if err := r.open(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// InPlace says whether the reader reads its shard where it lies in the
// batch (it was in key order already), not from a sorted copy.
func (r *BatchReader) InPlace() bool { return r.inPlace != nil }

// open reads the shard in place if it lies in key order, else from its
// sorted copy (sorting it unless a copy exists).
func (r *BatchReader) open(ctx context.Context) error {
	placed, err := r.inOrder(ctx)
	if err != nil {
		return fmt.Errorf("reading the order of shard %d of the batch: %w", r.shard, err)
	}
	if placed != nil {
		r.inPlace = placed
		return nil
	}
	return r.sort(ctx)
}

// inOrder returns the shard's blocks with their first positions if its
// items lie in key order in the batch (sqlBatchOrder), else nil.
func (r *BatchReader) inOrder(ctx context.Context) ([]placedBlock, error) {
	type edge struct {
		key Key
		seq int64
	}
	var placed []placedBlock
	inOrder := true
	var last *edge
	var pos int64
	b := r.store.begin(sqlBeginReadOnly)
	b.Queue(sqlNoSeqScan)
	b.Queue(sqlNoBitmapScan)
	b.Queue(sqlNoJIT)
	b.Queue(sqlPinnedSearchPath)
	b.Queue(sqlBatchOrder, r.batch.ID, r.shard).Query(func(rows pgx.Rows) error {
		var block, n, firstSeq, lastSeq int64
		var firstO, firstE, lastO, lastE *string
		var within bool
		_, err := pgx.ForEachRow(rows, []any{&block, &n, &firstO, &firstE, &firstSeq, &lastO, &lastE, &lastSeq, &within}, func() error {
			if !inOrder {
				return nil
			}
			if !within || firstO == nil || firstE == nil || lastO == nil || lastE == nil {
				inOrder = false
				return nil
			}
			first := edge{Key{Entity: *firstE, Occurrence: *firstO}, firstSeq}
			if last != nil && cmp.Or(compareKeys(last.key, first.key), cmp.Compare(last.seq, first.seq)) >= 0 {
				inOrder = false
				return nil
			}
			last = &edge{Key{Entity: *lastE, Occurrence: *lastO}, lastSeq}
			placed = append(placed, placedBlock{block: block, start: pos})
			pos += n
			return nil
		})
		return err
	})
	b.Queue(sqlCommit)
	if err := r.store.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	if !inOrder || placed == nil {
		return nil, nil
	}
	return placed, nil
}

// span returns the blocks of a shard read in place that positions pos to
// pos + n - 1 lie in, and each one's first position.
func (r *BatchReader) span(pos int64, n int) (blocks, starts []int64) {
	i := max(sort.Search(len(r.inPlace), func(i int) bool { return r.inPlace[i].start > pos })-1, 0)
	for ; i < len(r.inPlace) && r.inPlace[i].start < pos+int64(n); i++ {
		blocks, starts = append(blocks, r.inPlace[i].block), append(starts, r.inPlace[i].start)
	}
	return blocks, starts
}

// sort writes the shard's sorted copy if it has none (sqlSortShard); a copy
// another process wrote meanwhile is kept.
func (r *BatchReader) sort(ctx context.Context) error {
	var items int64
	err := r.store.pinned(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sqlSortedShard, r.batch.ID, r.shard).Scan(&items) })
	if err == nil {
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("looking for the sorted copy of shard %d: %w", r.shard, err)
	}
	b := r.store.begin(sqlBeginWrite)
	b.Queue(sqlSortWorkMem)
	b.Queue(sqlNoJIT)
	b.Queue(sqlPinnedSearchPath)
	b.Queue(sqlSortShard, r.batch.ID, r.shard)
	b.Queue(sqlCommit)
	if err := r.store.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("sorting shard %d of the batch: %w", r.shard, err)
	}
	return nil
}

// Fetch returns up to n rows of the shard from position pos of its key
// order (fewer only at the shard's end), and the run's batch header as it
// is now (nil if it was deleted): the header shows a `runledger prune`
// since, whose deleted rows the fetch no longer finds. With lookup, each
// row comes with the holder of its key relative to the reading run, as of
// the fetch (one probe of the rule's index per row); without, no row is
// looked up (LookedUp false) and the claim finds the holders. All in
// one round trip; a copy found gone is sorted again and the fetch repeated.
func (r *BatchReader) Fetch(ctx context.Context, pos int64, n int, lookup bool) ([]BatchRow, *BatchHeader, error) {
	rows, h, whole, err := r.fetch(ctx, pos, n, lookup)
	if err == nil && !whole && h != nil && h.Pruned == nil {
		if err = r.sort(ctx); err == nil {
			rows, h, whole, err = r.fetch(ctx, pos, n, lookup)
			if err == nil && !whole {
				err = ErrSortedCopyLost
			}
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading shard %d of the batch at position %d: %w", r.shard, pos, err)
	}
	return rows, h, nil
}

// fetch is one try of Fetch; whole says the copy's header was there (the
// rows are the copy's, not a remnant's).
func (r *BatchReader) fetch(ctx context.Context, pos int64, n int, lookup bool) ([]BatchRow, *BatchHeader, bool, error) {
	out := make([]BatchRow, 0, n)
	var h *BatchHeader
	whole := false
	b := r.store.begin(sqlBeginReadOnly)
	b.Queue(sqlNoSeqScan)
	b.Queue(sqlNoBitmapScan)
	b.Queue(sqlNoJIT)
	b.Queue(sqlPinnedSearchPath)
	fetch, args := sqlFetchSortedPlain, []any{r.batch.ID, r.shard, pos, n}
	if r.inPlace != nil {
		blocks, starts := r.span(pos, n)
		fetch, args = sqlFetchInPlacePlain, append(args, blocks, starts)
	}
	if lookup {
		fetch, args = sqlFetchSortedProbe, append(args, r.runUID, r.heldPayloads)
		if r.inPlace != nil {
			fetch = sqlFetchInPlaceProbe
		}
	}
	b.Queue(fetch, args...).Query(func(rows pgx.Rows) error {
		var row BatchRow
		var same, changed pgtype.Bool // not *bool: no allocation per row
		_, err := pgx.ForEachRow(rows, []any{&row.Seq, &row.Entity, &row.Occurrence, &row.Payload, &same, &changed}, func() error {
			row.LookedUp = lookup
			switch {
			case !same.Valid:
			case same.Bool:
				row.Holder = HolderSameRun
			default:
				row.Holder = HolderOtherRun
				row.PayloadMatch = PayloadUnknown
				if changed.Valid {
					row.PayloadMatch = payloadMatch(&changed.Bool)
				}
			}
			// As sqlFetchProbe leaves it out.
			row.PayloadOmitted = lookup && !r.heldPayloads && (row.Holder == HolderSameRun || row.PayloadMatch == PayloadSame)
			out = append(out, row)
			row = BatchRow{}
			return nil
		})
		return err
	})
	if r.inPlace != nil {
		whole = true // the batch's own blocks: no copy to lose
	} else {
		b.Queue(sqlSortedShard, r.batch.ID, r.shard).Query(func(rows pgx.Rows) error {
			whole = rows.Next()
			rows.Close()
			return rows.Err()
		})
	}
	b.Queue(sqlBatchHeader, r.runUID).QueryRow(func(row pgx.Row) error {
		var err error
		h, err = scanBatchHeader(row, r.runUID)
		return err
	})
	b.Queue(sqlCommit)
	if err := r.store.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, false, err
	}
	return out, h, whole, nil
}

// FreshRange is what ClaimFresh did with a range of positions.
type FreshRange struct {
	// Claimed: every item of the range is committed by the run, Completed
	// (the chunk committed). Otherwise nothing of the range is, and the
	// caller claims its positions item by item, as if ClaimFresh had not run.
	Claimed bool
	// Held: the rule rejected the insert (a key of the range is committed
	// already, or repeated in it); the caller should look keys up again.
	Held bool
	// Refused: an item is not one ClaimFresh may claim on the server (it
	// fails the server's check, stricter than the worker's, or its payload
	// is not JSON), or the range is not whole (the batch was pruned, the
	// sorted copy lost): the caller should not ask again for this batch.
	Refused bool
	// Last is the key at the range's last position, when Claimed.
	Last Key
}

// ClaimFresh claims positions pos to pos + n - 1 of the shard in one chunk
// transaction on the server (sqlClaimFresh): the items never travel to the
// caller and back, which is most of what a fresh chunk costs a worker
// (docs/insert-path.md). It claims them only if each item passes a check
// stricter than the one a worker makes of a fetched row (maxKey and
// maxPayload are the limits in bytes of a key part and a payload) and no key
// is held; then opts.Effect, if any, runs over them in the same transaction,
// as CommitChunk runs it. Otherwise it commits nothing and says why. It
// guesses like ChunkOptions.ExpectFresh: the rule decides, and a wrong guess
// costs a statement, never a verdict. An effect that fails commits nothing
// of the range either (the error says why): the caller claims the range
// itself, which isolates the effect's failing items. Not for a run with a
// processor or OnExisting Supersede (each needs the items). A non-nil error
// is CommitChunk's: the range's fate is unknown or nothing of it committed.
func (r *BatchReader) ClaimFresh(ctx context.Context, run Run, pos int64, n, maxKey, maxPayload int, opts ChunkOptions) (FreshRange, error) {
	if opts.Processor != nil || opts.OnExisting == Supersede {
		return FreshRange{}, errors.New("claiming a fresh range on the server: only for a run with no processor and OnExisting Skip")
	}
	if err := r.store.prepareEffect(ctx, &opts); err != nil {
		return FreshRange{}, fmt.Errorf("claiming positions of shard %d of the batch on the server: %w", r.shard, err)
	}
	effect := opts.Effect != ""
	q, args := choose(effect, sqlClaimFreshSortedEffect, sqlClaimFreshSorted), []any{r.batch.ID, r.shard, pos, n}
	if r.inPlace != nil {
		blocks, starts := r.span(pos, n)
		q, args = choose(effect, sqlClaimFreshInPlaceEffect, sqlClaimFreshInPlace), append(args, blocks, starts)
	}
	args = append(args, run.Namespace, run.Name, run.UID, run.Shard, run.Attempt, maxKey, maxPayload)
	var out FreshRange
	_, err := r.store.inTx(ctx, opts, func(tx pgx.Tx) ([]Result, error) {
		var inserted, found int64
		var entity, occurrence pgtype.Text
		if err := tx.QueryRow(ctx, q, args...).Scan(&inserted, &found, &entity, &occurrence); err != nil {
			return nil, err
		}
		out.Claimed = inserted == int64(n) && found == int64(n)
		out.Refused = !out.Claimed
		if !out.Claimed {
			return nil, nil
		}
		out.Last = Key{Entity: entity.String, Occurrence: occurrence.String}
		if effect {
			return nil, runEffect(ctx, tx, opts)
		}
		return nil, nil
	})
	switch {
	case err == nil:
		return out, nil
	case IsExpectedBusinessKeyConflict(err): // never what the effect raised: it does not look inside user code
		return FreshRange{Held: true}, nil
	case IsFreshRangeRefusal(err):
		return FreshRange{Refused: true}, nil
	}
	return FreshRange{}, fmt.Errorf("claiming positions %d to %d of shard %d of the batch on the server: %w", pos, pos+int64(n)-1, r.shard, err)
}

// Discard deletes the shard's sorted copy (its reader is done with it; a
// later reader sorts again).
func (r *BatchReader) Discard(ctx context.Context) error {
	if err := r.store.pinned(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sqlDiscardSorted, r.batch.ID, r.shard)
		return err
	}); err != nil {
		return fmt.Errorf("deleting the sorted copy of shard %d: %w", r.shard, err)
	}
	return nil
}

// errRunInFlight rolls back the prune of a run a shard of which is held.
var errRunInFlight = errors.New("a shard of the run is held")

// RunsInFlightError: PruneBatches left the batches of these runs alone,
// because a shard of each is held (its ShardLease, or an earlier release's
// shard lock): a worker is processing it. Every other batch before the
// cutoff was pruned.
type RunsInFlightError struct {
	Runs []string // namespace/name (uid)
}

func (e *RunsInFlightError) Error() string {
	return fmt.Sprintf("%d runs in flight left unpruned (a shard of each is being processed; prune again once they are over): %s",
		len(e.Runs), strings.Join(e.Runs, ", "))
}

// Pruned is what PruneBatches deleted: batches, their items (a query's
// rows) and the failure records of their runs.
type Pruned struct {
	Batches, Items, FailureRecords int64
}

// PruneBatches deletes the items of every batch created before cutoff, and
// the failure records of its run, and marks its header pruned (the header
// stays, a tombstone).
//
// A run in flight is never pruned: each run's batch is pruned in a
// transaction of its own that first takes the leases of the run's shards
// (and the shard locks of earlier releases' workers), and a run any of
// whose shards another process holds is left alone and named in a
// *RunsInFlightError, returned with the counts of what was pruned. While a
// run's batch is being pruned, its workers wait for their shard's lease,
// then find the tombstone.
func (s *Store) PruneBatches(ctx context.Context, cutoff time.Time) (Pruned, error) {
	var out Pruned
	type candidate struct {
		uid, namespace, name string
		shards               int
	}
	var candidates []candidate
	err := s.pinned(ctx, func(tx pgx.Tx) error {
		list, err := tx.Query(ctx, sqlPruneCandidates, cutoff)
		if err != nil {
			return err
		}
		var c candidate
		candidates, err = pgx.CollectRows(list, func(row pgx.CollectableRow) (candidate, error) {
			err := row.Scan(&c.uid, &c.namespace, &c.name, &c.shards)
			return c, err
		})
		return err
	})
	if err != nil {
		return out, fmt.Errorf("listing batches created before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	inFlight := &RunsInFlightError{}
	for _, c := range candidates {
		shards := max(c.shards, 1)
		keys := make([]int64, shards)
		for i := range keys {
			keys[i] = shardLockKey(c.uid, i)
		}
		var n, r, f int64
		err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: sqlBeginPrune()}, func(tx pgx.Tx) error {
			var free bool
			var busy int
			if err := tx.QueryRow(ctx, sqlTryShardLocks, keys).Scan(&free); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, sqlTakeRunLeases, c.uid, shards).Scan(&busy); err != nil {
				return err
			}
			if !free || busy > 0 {
				return errRunInFlight
			}
			return tx.QueryRow(ctx, sqlPruneBatch, c.uid).Scan(&n, &r, &f)
		})
		if errors.Is(err, errRunInFlight) {
			inFlight.Runs = append(inFlight.Runs, fmt.Sprintf("%s/%s (%s)", c.namespace, c.name, c.uid))
			continue
		}
		if err != nil {
			return out, fmt.Errorf("pruning the batch of run %s/%s (%s): %w", c.namespace, c.name, c.uid, err)
		}
		out.Batches, out.Items, out.FailureRecords = out.Batches+n, out.Items+r, out.FailureRecords+f
	}
	if len(inFlight.Runs) > 0 {
		return out, inFlight
	}
	return out, nil
}

// ErrNoOccurrence: the batch's query reads runledger.occurrence, and the
// run has no occurrence (spec.occurrence) to give it.
var ErrNoOccurrence = errors.New("it reads " + sqlOccurrenceSetting + ", and the run has no occurrence (spec.occurrence) to give it")

// ReadsOccurrence reports whether query names runledger.occurrence (setting
// names are case-insensitive): a run without an occurrence refuses it
// (ErrNoOccurrence) whatever the session, a pooler's shared one included.
func ReadsOccurrence(query string) bool {
	return strings.Contains(strings.ToLower(query), sqlOccurrenceSetting)
}

// setOccurrence makes occurrence the transaction's runledger.occurrence
// (nothing when it is empty), a bound parameter of set_config.
// Without one, the session must not define the setting at all (PostgreSQL
// keeps a custom setting's placeholder, reading ”, in a session that ever
// set it, even transaction-locally): the query would read ” instead of
// being refused. Behind a pooler (pooled) a server connection keeps the
// placeholder of whichever run set it there last, so only the query's text
// can be refused (ReadsOccurrence, by the callers); a function the query
// calls that reads the setting reads ” there.
func setOccurrence(ctx context.Context, tx pgx.Tx, occurrence string, pooled bool) error {
	if occurrence == "" {
		if pooled {
			return nil
		}
		var defined bool
		if err := tx.QueryRow(ctx, sqlOccurrenceDefined).Scan(&defined); err != nil {
			return fmt.Errorf("checking the session for %s: %w", sqlOccurrenceSetting, err)
		}
		if defined {
			return fmt.Errorf("the session already defines %s (set by an earlier transaction on it): a run without an occurrence would read it as ''", sqlOccurrenceSetting)
		}
		return nil
	}
	if _, err := tx.Exec(ctx, sqlSetOccurrence, occurrence); err != nil {
		return fmt.Errorf("setting %s: %w", sqlOccurrenceSetting, err)
	}
	return nil
}

// releaseAfterOccurrence returns conn to the pool, or closes it if its
// session set the occurrence (its placeholder stays for the session's life).
func releaseAfterOccurrence(ctx context.Context, conn *pgxpool.Conn, occurrence string) {
	if occurrence != "" {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Conn().Close(ctx)
		cancel()
	}
	conn.Release()
}

// choose is a if cond, else b.
func choose[T any](cond bool, a, b T) T {
	if cond {
		return a
	}
	return b
}

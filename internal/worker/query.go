package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
)

// QuerySource is an SQL SELECT returning the columns entity, occurrence and,
// optionally, payload. A run's batch is what the query returned once: the
// first shard of the run to start materialises every row of the query, with
// its shard and position, in the ledger database (runledger.batch, see
// ledger.Store.FixQueryBatch); every shard, attempt and resumption of the run
// then reads its own rows from there. The query runs in the statement that
// writes the batch, so no longer in a READ ONLY transaction; a transaction in
// which it wrote anything else is rolled back, and the run fails as bad input.
// (Check still describes it in a READ ONLY transaction.)
//
// A shard reads its rows through a ledger.BatchReader, which sorts them by
// key once, in the shard's own statement (unless they lie in key order in
// the batch already: then it reads them where they lie), and reads them by
// position, a fetch at a time (so it holds one fetch whatever the size of the batch),
// in short transactions on any connection. While keys are found held, every
// row comes with the run holding its key: a chunk needs no separate preload
// round trip, and a batch that is already handled costs index probes and no
// write; while none is, fetches look nothing up and the claim alone probes
// (queryStream.sawHeld). After a lost connection the shard reads on at the
// position it reached (the order is the same on every sort). Every attempt reads
// the shard from its first row, so its total is the same on every attempt,
// and the rows an earlier attempt committed count as completed again: a
// finished shard's completed equals the ledger's committed rows of its run
// and shard.
//
// Rows are in key order (the rule's: occurrence, then entity, byte order)
// within a shard, which gives two things
// with O(1) memory: repeats of a key are adjacent, so in-batch duplicates are
// recognised across chunks; and chunks are sorted for the insert path.
//
// A row that cannot become an item (NULL or empty key part, payload that is
// not JSON or too large) is a failed item naming its row number in the
// query's output and the field; it counts against maxFailedItems.
type QuerySource struct {
	sql        string
	hasPayload bool
	// occurrence is the run's spec.occurrence, the query's
	// current_setting('runledger.occurrence'); empty: not set.
	occurrence string
	// fromRun: the query is a fromRun batch's (ledger.FromRunQuery), over
	// the failure records of the run it names in namespace.
	fromRun *fromRun
}

type fromRun struct{ namespace, name string }

// field names the source in errors.
func (q *QuerySource) field() string {
	if q.fromRun != nil {
		return "batch.fromRun"
	}
	return "batch.query"
}

// NewFromRunSource returns the source of a fromRun batch: the items that
// failed in the latest run called name in namespace, fixed like a query's
// rows. Call Check before using it.
func NewFromRunSource(namespace, name string) *QuerySource {
	return &QuerySource{sql: ledger.FromRunQuery(namespace, name), fromRun: &fromRun{namespace: namespace, name: name}}
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

func (q *QuerySource) describe() string {
	if q.fromRun != nil {
		return "the failed items of run " + q.fromRun.name
	}
	return "query"
}

// checkEarlierRun makes sure a fromRun batch not fixed yet has a run to read
// (ledger.Store.EarlierRun): a name that matches no run is bad input, not an
// empty batch. Once the batch is fixed, the earlier run no longer matters.
func (q *QuerySource) checkEarlierRun(ctx context.Context, store *ledger.Store, runUID string) error {
	if q.fromRun == nil {
		return nil
	}
	h, err := store.BatchHeader(ctx, runUID)
	if err != nil || h != nil {
		return err
	}
	if _, err := store.EarlierRun(ctx, q.fromRun.namespace, q.fromRun.name); errors.Is(err, ledger.ErrNoEarlierRun) {
		return &InputError{Where: "batch.fromRun", Msg: "names no run to retry: " + err.Error()}
	} else if err != nil {
		return err
	}
	return nil
}

// Check describes the query on the database (without running it): it must
// parse, be allowed in a READ ONLY transaction, and return entity and
// occurrence (and optionally payload). It returns an *InputError for a query
// that can never work, or a retryable error if the database could not be
// reached.
func (q *QuerySource) Check(ctx context.Context, store *ledger.Store) error {
	if q.sql == "" {
		return &InputError{Where: q.field(), Msg: "is empty"}
	}
	columns, err := store.DescribeBatchQuery(ctx, q.sql, 2, q.occurrence)
	if errors.Is(err, ledger.ErrNoOccurrence) {
		return &InputError{Where: q.field(), Msg: err.Error()}
	}
	if err != nil {
		return queryError(q.field(), err)
	}
	cols := map[string]ledger.QueryColumn{}
	names := make([]string, len(columns))
	for i, c := range columns {
		cols[c.Name], names[i] = c, c.Name
	}
	for _, want := range []string{"entity", "occurrence"} {
		c, ok := cols[want]
		if !ok {
			return &InputError{Where: q.field(), Msg: fmt.Sprintf("returns no column %q: it must return entity, occurrence and optionally payload (it returns %s)", want, strings.Join(names, ", "))}
		}
		if zoned := c.PrintsInTimeZone(); zoned != "" {
			return &InputError{Where: q.field(), Msg: fmt.Sprintf("returns %s as a %s, whose text follows the session's TimeZone: one instant would be another key in a session with another TimeZone; return it as text in the query (say to_char(x AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'))", want, zoned)}
		}
	}
	_, q.hasPayload = cols["payload"]
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

// batchQuery is the query as the ledger materialises it for shards shards.
func (q *QuerySource) batchQuery(shards int, t v1alpha1.RunTimeouts) ledger.BatchQuery {
	return ledger.BatchQuery{SQL: q.sql, Digest: queryDigest(q.sql), HasPayload: q.hasPayload, Shards: shards, Occurrence: q.occurrence,
		Timeout: t.Query, LockTimeout: t.Lock, NetworkTimeout: t.Network}
}

func (q *QuerySource) open(ctx context.Context, store *ledger.Store, shard, shards int, opt streamOptions) (stream, error) {
	s := &queryStream{store: store, shard: shard, opt: opt, fromRun: q.fromRun}
	if opt.fetchSize <= 0 {
		s.opt.fetchSize = v1alpha1.DefaultChunkSize
	}
	onRetry := func(attempt int, wait time.Duration, err error) {
		opt.log.Info("fixing the batch failed, trying again", "retry", attempt, "wait", wait.Round(time.Millisecond), "error", err.Error())
		if opt.retried != nil {
			opt.retried(err)
		}
	}
	start := time.Now()
	var h *ledger.BatchHeader
	err := s.opt.retry.Do(ctx, "fixing the batch", onRetry, func(int) error {
		var err error
		bq := q.batchQuery(shards, opt.timeouts)
		bq.Copy = opt.copyBatch
		if h, err = store.FixQueryBatch(ctx, opt.run, bq); err != nil {
			return err
		}
		if bad := batchMismatch(opt.run, h, ledger.BatchSourceQuery, shards, queryDigest(q.sql)); bad != nil {
			return bad
		}
		s.batch = h
		s.rows, err = store.BatchShardSize(ctx, h, shard)
		return err
	})
	err = identityError(err)
	if w := (*ledger.ForeignWriteError)(nil); errors.As(err, &w) {
		return nil, &InputError{Where: q.field(), Msg: "writes: " + w.Error() + "; a batch query must only read, and nothing it did was kept"}
	}
	if errors.Is(err, ledger.ErrNoOccurrence) {
		return nil, &InputError{Where: q.field(), Msg: ledger.ErrNoOccurrence.Error()}
	}
	if errors.Is(err, ledger.ErrBatchQuery) {
		// The query's own errors surface here, before anything is committed.
		return nil, queryError(q.field(), err)
	}
	if err != nil {
		return nil, err
	}
	opt.log.Info("batch fixed", "items", h.Items, "shardItems", s.rows, "fixedAt", h.Created.UTC().Format(time.RFC3339), "elapsed", time.Since(start).Round(time.Millisecond).String())
	return s, nil
}

// queryStream reads one shard of a materialised batch.
type queryStream struct {
	store   *ledger.Store
	batch   *ledger.BatchHeader
	shard   int
	opt     streamOptions
	fromRun *fromRun // a fromRun batch's
	// source is the header's (ledger.BatchSource*): "" for a query's.
	source string

	rows     int64               // rows of the shard
	reader   *ledger.BatchReader // nil until the shard is sorted
	buf      []entry             // fetched, not yet yielded
	consumed int64               // rows yielded: the position of the next fetch
	eof      bool
	prev     ledger.Key // key of the last row yielded, for repeats
	hasPrev  bool
	lookups  lookupPolicy
}

func (s *queryStream) total() (int64, bool) { return s.rows, true }

// headerSource is the source the batch's header must record.
func (s *queryStream) headerSource() string {
	if s.source != "" {
		return s.source
	}
	return ledger.BatchSourceQuery
}

func (s *queryStream) close() {}

func (s *queryStream) sawHeld(held bool) { s.lookups.claimed(held) }

func (s *queryStream) proofKeys() (bool, []ledger.Key) { return true, nil }

// freshRange is where the shard's next chunk of size would be read, when
// the server may claim it instead (shardRun.claimFresh): the stream is
// between fetches, expects fresh keys (its lookups are off), and is a
// query's or an object's batch (a fromRun batch's rows may be marked not
// items, which only the worker reads).
func (s *queryStream) freshRange(size int) (r *ledger.BatchReader, pos int64, n int, ok bool) {
	if len(s.buf) > 0 || s.eof || s.reader == nil || !s.lookups.skip || s.fromRun != nil {
		return nil, 0, 0, false
	}
	n = int(min(int64(size), s.rows-s.consumed))
	return s.reader, s.consumed, n, n > 0
}

// claimedFresh moves the stream past the n positions the server claimed,
// the last of which holds last, as if it had yielded them.
func (s *queryStream) claimedFresh(ctx context.Context, n int, last ledger.Key) {
	s.consumed += int64(n)
	s.prev, s.hasPrev = last, true
	if s.consumed >= s.rows {
		s.eof = true
		s.discard(ctx)
	}
}

// lookupPolicy decides whether a shard's next fetch looks its keys up. A
// fetch looks its keys up (which settles the held ones with no claim) until
// one finds none held; then fetches look nothing up (the claim probes each
// key anyway: a fresh batch is not probed twice) until a chunk's claim finds
// a held key again. Either way the claim decides; the lookup only saves work.
type lookupPolicy struct{ skip bool }

func (p *lookupPolicy) lookup() bool { return !p.skip }

// fetched is told what a fetch found: whether it looked up, and any held.
func (p *lookupPolicy) fetched(lookedUp, held bool) {
	if lookedUp && !held {
		p.skip = true
	}
}

// claimed is told whether a chunk's claim found any of its keys held.
func (p *lookupPolicy) claimed(held bool) {
	if held {
		p.skip = false
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

// fill fetches the shard's next rows from the position reached (sorting the
// shard first, once). It runs once the buffer is empty, so every row
// fetched has been yielded; a retried fetch reads the same positions.
func (s *queryStream) fill(ctx context.Context) error {
	onRetry := func(attempt int, wait time.Duration, err error) {
		s.opt.log.Info("reading the batch failed, reading again where it stopped", "retry", attempt, "atRow", s.consumed,
			"wait", wait.Round(time.Millisecond), "error", err.Error())
		if s.opt.retried != nil {
			s.opt.retried(err)
		}
	}
	lookup := s.lookups.lookup()
	var page []ledger.BatchRow
	err := s.opt.retry.Do(ctx, "reading the batch", onRetry, func(int) error {
		if s.reader == nil {
			r, err := s.store.OpenBatch(ctx, s.batch, s.opt.run.UID, s.shard, s.opt.heldPayloads)
			if err != nil {
				return err
			}
			s.reader = r
		}
		rows, h, err := s.reader.Fetch(ctx, s.consumed, s.opt.fetchSize, lookup)
		if err != nil {
			return err
		}
		// A prune since the batch was fixed shows in the header.
		if h == nil {
			return s.lostBatch()
		}
		if bad := batchMismatch(s.opt.run, h, s.headerSource(), 0, ""); bad != nil {
			return bad
		}
		page = rows
		return nil
	})
	if err != nil {
		return err
	}
	buf := make([]entry, 0, len(page))
	held := false
	for _, r := range page {
		en := s.rowEntry(r.Entity, r.Occurrence, r.Payload, r.Seq)
		en.checked, en.holder, en.payload, en.omitted = r.LookedUp, r.Holder, r.PayloadMatch, r.PayloadOmitted
		en.direct = !r.LookedUp
		held = held || r.Holder != ledger.HolderNone
		buf = append(buf, en)
	}
	s.lookups.fetched(lookup, held)
	s.buf = buf
	// The shard ends at its count (the engine reads no further then) or
	// with a short fetch, which must be at its count too.
	if got := s.consumed + int64(len(page)); len(page) < s.opt.fetchSize || got >= s.rows {
		s.eof = true
		if got != s.rows {
			return s.shortBatch(ctx, got)
		}
		s.discard(ctx)
	}
	return nil
}

// discard deletes the shard's sorted copy once it is read to the end (a
// later attempt sorts again; prune deletes what a failed one left).
func (s *queryStream) discard(ctx context.Context) {
	if err := s.reader.Discard(ctx); err != nil {
		s.opt.log.Info("the shard's sorted copy of its batch stays until the run is pruned", "error", err.Error())
	}
}

// errBatchLost: the run's batch header went while a shard read the batch,
// as the ledger's server lost it in a failover (or it was deleted by hand):
// the shard fixes the batch again, whole, and processes it again.
var errBatchLost = errors.New("the batch's header is gone from runledger.batch_run while the shard read it (lost with a database failover, or deleted by hand)")

func (s *queryStream) lostBatch() error {
	return fmt.Errorf("shard %d of the batch of run %s/%s (uid %s): %w", s.shard, s.opt.run.Namespace, s.opt.run.Name, s.opt.run.UID, errBatchLost)
}

// shortBatch explains a shard that ended before its count: its rows were
// pruned meanwhile, or lost (errBatchLost).
func (s *queryStream) shortBatch(ctx context.Context, got int64) error {
	h, err := s.store.BatchHeader(ctx, s.opt.run.UID)
	if err != nil {
		return err
	}
	if h == nil {
		return s.lostBatch()
	}
	if bad := batchMismatch(s.opt.run, h, s.headerSource(), 0, ""); bad != nil {
		return bad
	}
	return fmt.Errorf("shard %d of the batch of run %s has %d rows, %d were read: rows were deleted from runledger.batch while it ran", s.shard, s.opt.run.UID, s.rows, got)
}

// rowEntry makes a fetched row an entry: its item, or why the row cannot
// be one. (Per row: nothing is formatted or copied unless the row is bad.)
func (s *queryStream) rowEntry(e, o *string, p []byte, n int64) entry {
	where := func() string {
		if s.fromRun != nil {
			return "batch.fromRun row " + strconv.FormatInt(n, 10)
		}
		if s.source == ledger.BatchSourceObject {
			return "batch.object item " + strconv.FormatInt(n, 10)
		}
		return "query row " + strconv.FormatInt(n, 10)
	}
	if s.fromRun != nil && string(p) == ledger.FromRunNotAnItem {
		return entry{item: ledger.Item{Key: ledger.Key{Entity: deref(e), Occurrence: deref(o)}}, bad: &InputError{Where: where(),
			Msg: "failed in run " + s.fromRun.name + " as bad input (its row could not become an item, or its payload could not be kept): not retried; fix the source and process it in a new run"}}
	}
	it := ledger.Item{Key: ledger.Key{Entity: deref(e), Occurrence: deref(o)}, Payload: p}
	var bad []*InputError
	for _, f := range [2]struct {
		name string
		v    *string
	}{{"entity", e}, {"occurrence", o}} {
		msg := "is NULL"
		if f.v != nil {
			msg = v1alpha1.KeyPartProblem(*f.v)
		}
		if msg != "" {
			bad = append(bad, &InputError{Where: where(), Field: f.name, Msg: msg})
		}
	}
	if p != nil {
		if msg := batchitem.CheckPayload(p, s.opt.limits); msg != "" {
			bad = append(bad, &InputError{Where: where(), Field: "payload", Msg: msg})
		}
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

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

package ledger

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// copyQueryBatch writes run's batch from q on two sessions: the query's,
// tx (the batch's lock held, the query's settings and the user's
// search_path set, as materialise sets them), reads the query's rows; a
// session of the ledger's own, w, writes the header and copies the rows
// packed in blocks as they arrive (copyPacker), so that the query and the
// writing run on two server processes, where one statement ran both on
// one (docs/insert-path.md, "The fix on both cores"). w commits only once
// every row has been read and check, run on tx after the query, has
// passed; tx commits nothing (the caller rolls it back, after w's commit:
// its lock keeps a second materialiser waiting until then). It returns the
// items copied; errors of the query are ErrBatchQuery's.
func copyQueryBatch(ctx context.Context, tx pgx.Tx, w *pgx.Conn, run Run, q BatchQuery, check func() error) (int64, error) {
	var items int64
	err := pinnedTx(ctx, w, sqlBeginPinned, func(wtx pgx.Tx) error {
		// The copy lasts as long as the query's rows come: bounded like it.
		if _, err := wtx.Exec(ctx, sqlBounds(q.Timeout, q.LockTimeout, DefaultQueryTimeout, DefaultLockTimeout)); err != nil {
			return fmt.Errorf("bounding the copy of the batch of run %s: %w", run.UID, err)
		}
		var id int64
		if err := wtx.QueryRow(ctx, sqlInsertQueryBatch, run.UID, run.Namespace, run.Name, q.Shards, nilIfEmpty(q.Digest)).Scan(&id); err != nil {
			return fmt.Errorf("writing the batch header of run %s: %w", run.UID, err)
		}
		var err error
		if items, err = copyQueryRows(ctx, tx, wtx, id, q); err != nil {
			return err
		}
		if err := check(); err != nil {
			return err
		}
		if items > 0 {
			if _, err := wtx.Exec(ctx, sqlSetBatchItems, run.UID, items); err != nil {
				return fmt.Errorf("counting the batch of run %s: %w", run.UID, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return items, nil
}

// copyQueryRows streams the query's rows from tx into one COPY on wtx,
// bounded like the query: a copy whose server stops answering ends no
// later than the query would.
func copyQueryRows(ctx context.Context, tx, wtx pgx.Tx, batchID int64, q BatchQuery) (int64, error) {
	bounded, cancel := answerBy(ctx, q.Timeout, q.NetworkTimeout)
	defer cancel()
	items, err := copyPacked(bounded, wtx, batchID, q.Shards, func(ctx context.Context, p *copyPacker) error { return p.read(ctx, tx, q) })
	return items, noAnswer(ctx, bounded, err)
}

// copyPacked runs fill, which packs a batch's items, beside one COPY on
// wtx that takes the blocks as they fill (memory: one window of blocks,
// whatever the batch's size), and returns the items copied. fill's own
// error comes first, as it is, unless it only saw the copy end.
func copyPacked(ctx context.Context, wtx pgx.Tx, batchID int64, shards int, fill func(context.Context, *copyPacker) error) (int64, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	p := &copyPacker{batchID: batchID, shards: max(shards, 1), w: pw}
	fillErr := make(chan error, 1)
	go func() {
		p.start()
		err := fill(rctx, p)
		if err == nil {
			err = p.end()
		}
		_ = pw.CloseWithError(err) // nil: the copy's end
		fillErr <- err
	}()
	_, err := wtx.Conn().PgConn().CopyFrom(ctx, pr, sqlCopyBatch)
	_ = pr.CloseWithError(errCopyEnded) // fill stops at its next write
	cancel()
	ferr := <-fillErr
	if ferr != nil && !errors.Is(ferr, errCopyEnded) && (err == nil || !errors.Is(ferr, context.Canceled)) {
		return 0, ferr
	}
	if err != nil {
		return 0, fmt.Errorf("copying the batch into %s.batch: %w", Schema, err)
	}
	return p.items, nil
}

// errCopyEnded tells the filler of a copy that the copy has ended.
var errCopyEnded = errors.New("the batch's copy ended")

// read runs the query on tx and packs its rows; ctx is bounded like the
// query (copyQueryRows), which marks an answer that never came.
func (p *copyPacker) read(ctx context.Context, tx pgx.Tx, q BatchQuery) error {
	rows, err := tx.Query(ctx, sqlBatchQueryRows(q.SQL, q.HasPayload))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBatchQuery, err)
	}
	defer rows.Close()
	for rows.Next() {
		raw := rows.RawValues()
		if err := p.add(raw[0], raw[1], raw[2]); err != nil {
			return err
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrBatchQuery, err)
	}
	return nil
}

// addItem packs an item of a batch read outside the database (an object
// source's): its key parts are never NULL, an empty one included.
func (p *copyPacker) addItem(it Item) error {
	return p.add(append([]byte{}, it.Entity...), append([]byte{}, it.Occurrence...), it.Payload)
}

// copyPacker packs a batch's items into its blocks, as sqlBatchRows does
// on the server (each shard's items among a window of batchBlockSeqs
// consecutive items, or batchWindowBytes of text, make one block numbered
// 2*window; an item of more than batchItemBytes is a block of its own,
// 2*seq+1; a NULL key part goes to shard 0), written in COPY's binary
// format straight from the items' bytes: nothing per item on the heap,
// which made a copy through pgx's encoding of the arrays as slow as the
// one statement it replaces.
type copyPacker struct {
	batchID int64
	shards  int
	w       io.Writer
	out     []byte

	items    int64 // seq of the last item
	window   int64
	inWindow int
	bytes    int
	open     []copyBlock // by shard
	one      copyBlock   // a large item's own
}

// copyBlock is one block's arrays, their elements only (len, bytes).
type copyBlock struct {
	n                                     int
	nullE, nullO, nullP                   bool
	seqs, entities, occurrences, payloads []byte
}

// COPY's binary format: the signature, the flags and the header
// extension's length; a tuple's field count; the end.
const copySignature = "PGCOPY\n\xff\r\n\x00"

// Element types of the block's arrays (pg_type OIDs).
const (
	oidInt8 = 20
	oidText = 25
)

func (p *copyPacker) start() {
	p.open = make([]copyBlock, p.shards)
	p.out = append(p.out[:0], copySignature...)
	p.out = binary.BigEndian.AppendUint32(p.out, 0)
	p.out = binary.BigEndian.AppendUint32(p.out, 0)
}

func (p *copyPacker) add(entity, occurrence, payload []byte) error {
	p.items++
	shard := 0
	if entity != nil && occurrence != nil {
		shard = shardOfBytes(entity, occurrence, p.shards)
	}
	size := len(entity) + len(occurrence) + len(payload)
	if size > batchItemBytes {
		p.one.append(p.items, entity, occurrence, payload)
		p.tuple(shard, 2*p.items+1, &p.one)
		return p.write()
	}
	p.open[shard].append(p.items, entity, occurrence, payload)
	p.inWindow++
	p.bytes += size
	if p.bytes >= batchWindowBytes || p.inWindow >= batchBlockSeqs {
		return p.flush()
	}
	return nil
}

// flush writes the window's blocks, in shard order, and opens the next.
func (p *copyPacker) flush() error {
	for shard := range p.open {
		if p.open[shard].n > 0 {
			p.tuple(shard, 2*p.window, &p.open[shard])
		}
	}
	p.window++
	p.inWindow, p.bytes = 0, 0
	return p.write()
}

// end writes the last window and the format's end.
func (p *copyPacker) end() error {
	if err := p.flush(); err != nil {
		return err
	}
	p.out = binary.BigEndian.AppendUint16(p.out, math.MaxUint16) // -1
	return p.write()
}

func (p *copyPacker) write() error {
	_, err := p.w.Write(p.out)
	p.out = p.out[:0]
	return err
}

// tuple appends block b of shard as one row of the copy and empties b.
func (p *copyPacker) tuple(shard int, block int64, b *copyBlock) {
	out := binary.BigEndian.AppendUint16(p.out, 7)
	out = binary.BigEndian.AppendUint32(out, 8)
	out = binary.BigEndian.AppendUint64(out, uint64(p.batchID))
	out = binary.BigEndian.AppendUint32(out, 4)
	out = binary.BigEndian.AppendUint32(out, uint32(shard))
	out = binary.BigEndian.AppendUint32(out, 8)
	out = binary.BigEndian.AppendUint64(out, uint64(block))
	out = appendCopyArray(out, oidInt8, b.n, false, b.seqs)
	out = appendCopyArray(out, oidText, b.n, b.nullE, b.entities)
	out = appendCopyArray(out, oidText, b.n, b.nullO, b.occurrences)
	p.out = appendCopyArray(out, oidText, b.n, b.nullP, b.payloads)
	*b = copyBlock{seqs: b.seqs[:0], entities: b.entities[:0], occurrences: b.occurrences[:0], payloads: b.payloads[:0]}
}

func (b *copyBlock) append(seq int64, entity, occurrence, payload []byte) {
	b.n++
	b.seqs = binary.BigEndian.AppendUint32(b.seqs, 8)
	b.seqs = binary.BigEndian.AppendUint64(b.seqs, uint64(seq))
	b.entities, b.nullE = appendCopyElem(b.entities, entity, b.nullE)
	b.occurrences, b.nullO = appendCopyElem(b.occurrences, occurrence, b.nullO)
	b.payloads, b.nullP = appendCopyElem(b.payloads, payload, b.nullP)
}

// appendCopyElem appends one array element (its length, -1 for NULL, and
// its bytes) and says whether the array now holds a NULL.
func appendCopyElem(out, v []byte, hasNull bool) ([]byte, bool) {
	if v == nil {
		return binary.BigEndian.AppendUint32(out, math.MaxUint32), true // -1
	}
	out = binary.BigEndian.AppendUint32(out, uint32(len(v)))
	return append(out, v...), hasNull
}

// appendCopyArray appends a one-dimensional array field: its length, then
// the array's binary form (dimensions, the NULL flag, the element type,
// the length and lower bound 1, then the elements).
func appendCopyArray(out []byte, elemType uint32, n int, hasNull bool, elems []byte) []byte {
	out = binary.BigEndian.AppendUint32(out, uint32(20+len(elems)))
	out = binary.BigEndian.AppendUint32(out, 1)
	flag := uint32(0)
	if hasNull {
		flag = 1
	}
	out = binary.BigEndian.AppendUint32(out, flag)
	out = binary.BigEndian.AppendUint32(out, elemType)
	out = binary.BigEndian.AppendUint32(out, uint32(n))
	out = binary.BigEndian.AppendUint32(out, 1)
	return append(out, elems...)
}

// copySessionWait bounds the wait for the pool's connection that copies
// a query's batch (BatchQuery.Copy): none free by then, one statement
// fixes the batch on the query's session.
const copySessionWait = 2 * time.Second

// batchWriter is the session that copies a query's batch (copyQueryBatch),
// or nil where one statement fixes it: q did not ask for the copy
// (BatchQuery.Copy), a shard function of the caller's (the server's SQL
// only), a pooler (the shards waiting for the batch's lock may hold all of
// its server connections in their transactions), a pool of one, or no
// connection free within copySessionWait.
func (s *Store) batchWriter(ctx context.Context, q BatchQuery) *pgxpool.Conn {
	if !q.Copy || q.ShardOf != nil || BehindPooler(s.pool) || s.pool.Config().MaxConns < 2 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, copySessionWait)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil
	}
	return conn
}

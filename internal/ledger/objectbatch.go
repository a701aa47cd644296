package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// BatchObject is one object a batch was read from, as its header records
// it (batch_run.objects).
type BatchObject struct {
	Key       string `json:"key"`
	Size      int64  `json:"size"`
	ETag      string `json:"etag"`
	VersionID string `json:"versionId,omitempty"`
	// SHA256 is the digest of the bytes read, as stored ("sha256:" and hex).
	SHA256 string `json:"sha256"`
}

// ObjectBatch is a batch streamed from outside the database (objects of a
// bucket) to fix in runledger.batch.
type ObjectBatch struct {
	Shards int
	// Digest identifies the source (where and how it is read); the header
	// records it, so that a worker of the same run reading another source
	// is refused.
	Digest string
	// Read streams the batch's items in order, calling add for each, and
	// returns the objects it read. It runs once, only when the run has no
	// header yet, while the batch's transaction is open: an error rolls
	// everything back. add's error (the database failed, ctx ended) is
	// returned as is.
	Read func(ctx context.Context, add func(Item) error) ([]BatchObject, error)
	// Timeout and LockTimeout bound the wait for another shard fixing the
	// batch, as a query batch's (DefaultQueryTimeout, DefaultLockTimeout
	// where 0).
	Timeout, LockTimeout time.Duration
}

// FixObjectBatch returns the header of run's batch, fixing the batch from b
// first if the run has none: in one transaction, under the batch's lock
// (shards starting together read the objects once), it writes the header,
// copies the items b.Read streams into runledger.batch, packed in blocks per
// shard like a query's rows (COPY: memory is one block window, whatever the
// batch's size), and records the item count and the objects read. An
// existing header is returned as it is, whatever its source (the caller
// decides); one of another run is a *RunIdentityError. b.Read's error is
// returned as is, wrapped.
func (s *Store) FixObjectBatch(ctx context.Context, run Run, b ObjectBatch) (*BatchHeader, error) {
	h, err := s.BatchHeader(ctx, run.UID)
	if err != nil {
		return nil, err
	}
	if h == nil {
		if err := s.copyObjectBatch(ctx, run, b); err != nil {
			return nil, err
		}
	}
	return s.writtenHeader(ctx, run)
}

func (s *Store) copyObjectBatch(ctx context.Context, run Run, b ObjectBatch) error {
	return pinnedTx(ctx, s.pool, sqlBeginPinned, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlBatchLockWait(b.Timeout, b.LockTimeout)); err != nil {
			return fmt.Errorf("bounding the wait for the batch lock of run %s: %w", run.UID, err)
		}
		if _, err := tx.Exec(ctx, sqlLockBatch, run.UID); err != nil {
			return fmt.Errorf("taking the batch lock of run %s: %w", run.UID, err)
		}
		// A statement after the lock sees what the lock's last holder committed.
		if h, err := batchHeader(ctx, tx, run.UID); err != nil || h != nil {
			return err
		}
		var id int64
		if err := tx.QueryRow(ctx, sqlInsertObjectBatch, run.UID, run.Namespace, run.Name, b.Shards, b.Digest).Scan(&id); err != nil {
			return fmt.Errorf("writing the batch header of run %s: %w", run.UID, err)
		}
		if _, err := tx.Exec(ctx, sqlObjectCopyBounds); err != nil {
			return fmt.Errorf("preparing the copy of the batch of run %s: %w", run.UID, err)
		}
		items, objects, err := copyBlocks(ctx, tx, id, b)
		if err != nil {
			return err
		}
		list, err := json.Marshal(objects)
		if err != nil {
			return fmt.Errorf("encoding the objects of the batch of run %s: %w", run.UID, err)
		}
		if _, err := tx.Exec(ctx, sqlSetObjectBatch, run.UID, items, string(list)); err != nil {
			return fmt.Errorf("counting the batch of run %s: %w", run.UID, err)
		}
		return nil
	})
}

// copyBlocks runs b.Read beside one COPY into runledger.batch that takes
// the blocks it packs as they fill; it returns the items copied and the
// objects read.
func copyBlocks(ctx context.Context, tx pgx.Tx, batchID int64, b ObjectBatch) (int64, []BatchObject, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	src := &blockSource{rows: make(chan []any, 4)}
	p := &blockPacker{batchID: batchID, shards: max(b.Shards, 1), out: src.rows, ctx: rctx}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(src.rows)
		src.objects, src.readErr = b.Read(rctx, p.add)
		if src.readErr == nil {
			src.readErr = p.flush()
		}
	}()
	_, err := tx.CopyFrom(ctx, pgx.Identifier{Schema, "batch"},
		[]string{"batch_id", "shard", "block", "seqs", "entities", "occurrences", "payloads"}, src)
	cancel()
	for range src.rows { // the reader stops at rctx's end; drain what it sent meanwhile
	}
	wg.Wait()
	// The reader's own error first, unless it only saw the copy end.
	if src.readErr != nil && (err == nil || !errors.Is(src.readErr, context.Canceled)) {
		return 0, nil, fmt.Errorf("reading the batch: %w", src.readErr)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("copying the batch into %s.batch: %w", Schema, err)
	}
	return p.items, src.objects, nil
}

// blockSource is the COPY's pgx.CopyFromSource: the rows the packer sends.
type blockSource struct {
	rows    chan []any
	cur     []any
	objects []BatchObject
	readErr error // set before rows is closed
}

func (s *blockSource) Next() bool {
	row, ok := <-s.rows
	s.cur = row
	return ok
}

func (s *blockSource) Values() ([]any, error) { return s.cur, nil }

// Err is read once rows is closed (Next returned false).
func (s *blockSource) Err() error { return s.readErr }

// blockPacker packs items as sqlBatchRows does: each shard's items among a
// window of consecutive seqs make one block, numbered 2*window; an item of
// more than batchItemBytes is a block of its own, numbered 2*seq+1. A
// window closes at batchBlockSeqs items or batchWindowBytes of text,
// whichever comes first, so that memory is bounded by bytes too.
type blockPacker struct {
	batchID int64
	shards  int
	out     chan<- []any
	ctx     context.Context

	items    int64 // seq of the last item
	window   int64
	inWindow int // items of the window
	bytes    int // and their text
	open     map[int]*packedBlock
}

type packedBlock struct {
	seqs                  []int64
	entities, occurrences []string
	payloads              []*string
}

// batchWindowBytes bounds the text of one window of blocks in memory.
const batchWindowBytes = 4 << 20

func (p *blockPacker) add(it Item) error {
	p.items++
	shard := ShardOf(it.Key, p.shards)
	size := len(it.Entity) + len(it.Occurrence) + len(it.Payload)
	one := &packedBlock{}
	if size > batchItemBytes {
		one.append(p.items, it)
		return p.send(shard, 2*p.items+1, one)
	}
	if p.open == nil {
		p.open = map[int]*packedBlock{}
	}
	blk := p.open[shard]
	if blk == nil {
		blk = &packedBlock{}
		p.open[shard] = blk
	}
	blk.append(p.items, it)
	p.inWindow++
	p.bytes += size
	if p.bytes >= batchWindowBytes || p.inWindow >= batchBlockSeqs {
		return p.flush()
	}
	return nil
}

func (b *packedBlock) append(seq int64, it Item) {
	b.seqs = append(b.seqs, seq)
	b.entities = append(b.entities, it.Entity)
	b.occurrences = append(b.occurrences, it.Occurrence)
	var payload *string
	if it.Payload != nil {
		s := string(it.Payload)
		payload = &s
	}
	b.payloads = append(b.payloads, payload)
}

// flush sends the window's blocks, in shard order, and opens the next.
func (p *blockPacker) flush() error {
	for shard := range p.shards {
		if blk := p.open[shard]; blk != nil {
			if err := p.send(shard, 2*p.window, blk); err != nil {
				return err
			}
		}
	}
	p.window++
	p.inWindow, p.bytes = 0, 0
	clear(p.open)
	return nil
}

func (p *blockPacker) send(shard int, block int64, b *packedBlock) error {
	row := []any{p.batchID, int32(shard), block, b.seqs, b.entities, b.occurrences, b.payloads}
	select {
	case p.out <- row:
		return nil
	case <-p.ctx.Done():
		return fmt.Errorf("copying the batch: %w", context.Cause(p.ctx))
	}
}

// BatchObjects returns the objects run's batch was read from, in the order
// read (none for a batch of another source).
func (s *Store) BatchObjects(ctx context.Context, runUID string) ([]BatchObject, error) {
	var raw []byte
	err := s.pinned(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sqlBatchObjects, runUID).Scan(&raw) })
	if err != nil {
		return nil, fmt.Errorf("reading the objects of the batch of run %s: %w", runUID, err)
	}
	var objects []BatchObject
	if err := json.Unmarshal(raw, &objects); err != nil {
		return nil, fmt.Errorf("decoding the objects of the batch of run %s: %w", runUID, err)
	}
	return objects, nil
}

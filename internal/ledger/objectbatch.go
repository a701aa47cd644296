package ledger

import (
	"context"
	"encoding/json"
	"fmt"
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
// the blocks it packs as they fill (copyPacked); it returns the items
// copied and the objects read.
func copyBlocks(ctx context.Context, tx pgx.Tx, batchID int64, b ObjectBatch) (int64, []BatchObject, error) {
	var objects []BatchObject
	items, err := copyPacked(ctx, tx, batchID, b.Shards, func(ctx context.Context, p *copyPacker) error {
		var err error
		if objects, err = b.Read(ctx, p.addItem); err != nil {
			return fmt.Errorf("reading the batch: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return items, objects, nil
}

// batchWindowBytes bounds the text of one window of blocks in memory.
const batchWindowBytes = 4 << 20

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

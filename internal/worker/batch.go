package worker

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"time"

	"github.com/runledger/runledger/internal/ledger"
)

// batchMismatch says why a run's batch header (what the ledger database
// recorded when the run's first shard started) does not fit the shard at
// hand, or nil if it fits. shards 0 skips the shard count, digest "" the
// digest. Every answer is final: retrying cannot change it.
func batchMismatch(run ledger.Run, h *ledger.BatchHeader, source string, shards int, digest string) *InputError {
	where := fmt.Sprintf("the batch of run %s/%s (uid %s)", run.Namespace, run.Name, run.UID)
	switch {
	case h == nil:
		return &InputError{Where: where, Msg: "has no header in runledger.batch_run: it was deleted by hand, or lost with a database failover, while the run was running"}
	case h.Pruned != nil:
		return &InputError{Where: where, Msg: fmt.Sprintf("was pruned at %s (`runledger prune`): its items are gone and are not read again; give the run a new name (or uid) to process the batch anew",
			h.Pruned.UTC().Format(time.RFC3339))}
	case h.Source != source:
		return &InputError{Where: where, Msg: fmt.Sprintf("was fixed from a %s source when the run started; this worker reads a %s source: keep the run's batch as it was, or give the run a new name", h.Source, source)}
	case shards > 0 && h.Shards != shards:
		return &InputError{Where: where, Msg: fmt.Sprintf("was fixed for %d shards when the run started; this worker runs %d: keep spec.workers as it was, or give the run a new name", h.Shards, shards)}
	case source == ledger.BatchSourceQuery && digest != "" && h.Digest != "" && h.Digest != digest:
		// A batch fixed before the query's digest was recorded (NULL) is read as it was fixed.
		return &InputError{Where: where, Msg: "is what another query returned: batch.query has changed since the run started (the batch is fixed once, from the query text its first shard ran); restore the query, or give the run a new name to process the new query's rows"}
	case source == ledger.BatchSourceObject && digest != "" && h.Digest != digest:
		return &InputError{Where: where, Msg: "was read from another place: batch.object (endpoint, bucket, key or prefix, format, compression or delimiter) has changed since the run started; restore it, or give the run a new name to process the new objects"}
	case source == ledger.BatchSourceStatic && digest != "" && h.Digest != digest:
		return &InputError{Where: where, Msg: "has changed since the run started: its items (the ConfigMap or file) differ from those its first shard read; restore them, or give the run a new name to process the new items"}
	}
	return nil
}

// identityError is err as bad input when it says that the run's uid is
// another run's in the ledger (*ledger.RunIdentityError), else err.
func identityError(err error) error {
	if idErr := (*ledger.RunIdentityError)(nil); errors.As(err, &idErr) {
		return &InputError{Msg: idErr.Error()}
	}
	return err
}

// checkRunIdentity fails at once when the ledger knows run's uid as another
// run's: a shard of the copy would otherwise first wait for the lease that
// run's shard may hold. The batch's fix checks again (a header written
// meanwhile).
func checkRunIdentity(ctx context.Context, store *ledger.Store, run ledger.Run) error {
	h, err := store.BatchHeader(ctx, run.UID)
	if err != nil {
		return err
	}
	return identityError(h.CheckRun(run))
}

// queryDigest is the sha256 of a query source's text (as NewQuerySource
// trimmed it), recorded with the batch: any edit, white space included,
// makes another batch.
func queryDigest(sql string) string {
	sum := sha256.Sum256([]byte(sql))
	return hex.EncodeToString(sum[:])
}

// ItemsDigest is the sha256 of a static batch's items in their declared
// order: each key part and payload length-prefixed, so no two batches share
// a digest by shifting bytes from one field to the next. A payload counts as
// the bytes given (a ConfigMap that only reformats its JSON changes it).
func ItemsDigest(items []ledger.Item) string {
	h := sha256.New()
	for _, it := range items {
		field(h, []byte(it.Entity))
		field(h, []byte(it.Occurrence))
		field(h, it.Payload)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func field(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// fixStaticBatch records (the first time) or checks (every later time) the
// size and digest of a static batch in the run's header.
func fixStaticBatch(ctx context.Context, store *ledger.Store, opt streamOptions, shards int, items []ledger.Item) error {
	digest := ItemsDigest(items)
	return identityError(opt.retry.Do(ctx, "recording the batch", nil, func(int) error {
		h, err := store.FixStaticBatch(ctx, opt.run, shards, int64(len(items)), digest)
		if err != nil {
			return err
		}
		if bad := batchMismatch(opt.run, h, ledger.BatchSourceStatic, shards, digest); bad != nil {
			return bad
		}
		return nil
	}))
}

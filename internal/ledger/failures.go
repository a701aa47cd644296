package ledger

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/runledger/runledger/api/v1alpha1"
)

// MaxFailureErrorBytes bounds the error text kept per failed item
// (runledger.item_failure.error): the first 1024 bytes of the error, cut
// at a character boundary, "…" ending a cut one.
const MaxFailureErrorBytes = 1024

// FailedItem is an item a pass of a run counted failed, as the ledger
// records it (RecordVerdicts).
type FailedItem struct {
	Key
	// Payload is the item's payload as the source gave it (its digest is
	// kept, not the payload).
	Payload []byte
	// Class is FailureClass of the item's error, or ClassInput.
	Class string
	// Error is the item's error (cut to MaxFailureErrorBytes when kept).
	Error string
}

// Pass is one shard's processing of a run, from its start to its end (an
// attempt of a pod, an invocation of runledger run): the writer of its
// failure records. A pass's chunks are numbered from 1.
type Pass struct {
	Run
	// ID tells this pass's records from an earlier pass's (a random id).
	ID string
	// Lease, if set, is the shard's: the records are written only while it
	// is this process's (ErrShardBusy otherwise).
	Lease *ShardLease
}

// RunHasFailures reports whether run uid has any failure record, of any
// pass: a pass that finds none has nothing to forget.
func (s *Store) RunHasFailures(ctx context.Context, uid string) (bool, error) {
	var has bool
	if err := s.pinned(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sqlRunHasFailures, uid).Scan(&has) }); err != nil {
		if IsConfigurationError(err) { // a login granted before 00010
			return false, fmt.Errorf("looking up failure records of run %s (the login needs the privileges runledger migrate --grant-to gives, on runledger.item_failure too): %w", uid, err)
		}
		return false, fmt.Errorf("looking up failure records of run %s: %w", uid, err)
	}
	return has, nil
}

// RecordVerdicts records chunk number chunk of pass p: its failed items (one
// record per key, counting the key's copies among failed, its first copy's
// error kept) and, of settled (the chunk's keys that did not fail), the
// records an earlier pass left. It is one round trip (its transaction, the
// search path pinned, and the statement as one pipeline) and idempotent: the
// same chunk recorded again changes nothing.
func (s *Store) RecordVerdicts(ctx context.Context, p Pass, chunk int, failed []FailedItem, settled []Key) error {
	if len(failed) == 0 && len(settled) == 0 {
		return nil
	}
	rows, recorded := failureRows(failed)
	// A bad row's key made storable may equal a settled key: it stays failed.
	settled = slices.DeleteFunc(slices.Clone(settled), func(k Key) bool { _, ok := recorded[k]; return ok })
	var gone, put int64
	b := s.begin(sqlBeginWrite)
	b.Queue(sqlPinnedSearchPath)
	if p.Lease != nil {
		b.Queue(p.Lease.sqlHold())
	}
	entities, occurrences := keyColumns(settled)
	b.Queue(sqlRecordVerdicts, p.UID, p.Namespace, p.Name, p.Shard, p.Attempt, p.ID, chunk,
		rows.entities, rows.occurrences, rows.items, rows.digests, rows.classes, rows.errors,
		entities, occurrences, rows.payloads).QueryRow(func(r pgx.Row) error { return r.Scan(&gone, &put) })
	b.Queue(sqlCommit)
	bounded, cancel := s.answered(ctx)
	defer cancel()
	if err := noAnswer(ctx, bounded, s.pool.SendBatch(bounded, b).Close()); err != nil {
		if isShardLeaseLost(err) && p.Lease != nil { // its own statement: no user code runs in this transaction
			err = p.Lease.refused(ctx)
		}
		return fmt.Errorf("recording %d failed items of shard %d of run %s/%s: %w", len(failed), p.Shard, p.Namespace, p.Name, err)
	}
	return nil
}

// failureColumns are a chunk's failure records as the statement's arrays.
type failureColumns struct {
	entities, occurrences, classes, errors []string
	items                                  []int32
	digests, payloads                      []*string
}

// failureRows merges failed into one record per (storable) key, in order of
// first appearance: the key's copies counted, its first copy's payload
// digest, class and error kept. It returns each key's record.
func failureRows(failed []FailedItem) (failureColumns, map[Key]int) {
	var c failureColumns
	at := make(map[Key]int, len(failed))
	for _, f := range failed {
		k := Key{Entity: storableKeyPart(f.Entity), Occurrence: storableKeyPart(f.Occurrence)}
		if i, ok := at[k]; ok {
			c.items[i]++
			continue
		}
		at[k] = len(c.entities)
		c.entities = append(c.entities, k.Entity)
		c.occurrences = append(c.occurrences, k.Occurrence)
		c.items = append(c.items, 1)
		c.digests = append(c.digests, PayloadDigest(f.Payload))
		c.payloads = append(c.payloads, keptPayload(f.Payload))
		c.classes = append(c.classes, cmpOr(f.Class, ClassError))
		c.errors = append(c.errors, CutError(f.Error))
	}
	return c, at
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// PayloadDigest is the SHA-256 of a payload as the source gave it, in hex;
// nil without a payload.
func PayloadDigest(payload []byte) *string {
	if payload == nil {
		return nil
	}
	sum := sha256.Sum256(payload)
	d := hex.EncodeToString(sum[:])
	return &d
}

// MaxFailurePayloadBytes bounds the payload a failure record keeps (for a
// fromRun retry): the worker's own limit, over which an item fails as bad
// input anyway.
const MaxFailurePayloadBytes = 1 << 20

// keptPayload is the payload a failure record keeps: nil without one, or
// for one text cannot hold (not valid UTF-8, a NUL) or over
// MaxFailurePayloadBytes, whose digest alone is kept.
func keptPayload(payload []byte) *string {
	if payload == nil || len(payload) > MaxFailurePayloadBytes || !utf8.Valid(payload) || bytes.IndexByte(payload, 0) >= 0 {
		return nil
	}
	s := string(payload)
	return &s
}

// CutError cuts an error text to MaxFailureErrorBytes bytes of valid UTF-8
// without NUL (which PostgreSQL text cannot hold), ending a cut one with "…".
func CutError(s string) string {
	return cutText(s, MaxFailureErrorBytes)
}

// storableKeyPart is a key part as text PostgreSQL can hold and index: valid
// UTF-8, no NUL, at most v1alpha1.MaxKeyPartBytes bytes. Only a key of a
// source's bad row needs it; every valid key part already is.
func storableKeyPart(s string) string {
	return cutText(s, v1alpha1.MaxKeyPartBytes)
}

// cutText makes s valid UTF-8 without NUL (each invalid byte or NUL U+FFFD)
// of at most n bytes, cut at a character boundary with "…" at its end.
func cutText(s string, n int) string {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	return v1alpha1.Truncate(s, n)
}

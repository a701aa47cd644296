package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// objectItems is n items, every 500th with a payload over 16 KiB (a block
// of its own).
func objectItems(n int) []ledger.Item {
	out := make([]ledger.Item, n)
	for i := range out {
		payload := fmt.Sprintf(`{"i":%d}`, i)
		if i%500 == 0 {
			payload = fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 20<<10))
		}
		out[i] = ledger.Item{Key: ledger.Key{Entity: fmt.Sprintf("e%d", i), Occurrence: "o"}, Payload: []byte(payload)}
	}
	return out
}

// TestFixObjectBatch_OnceWhenShardsStartTogether: four shards fix an object
// batch at once; the objects are read once, every item is in the batch
// once, in its shard (the Go shard function, which ShardOf shares with the
// SQL one), a large item in a block of its own, and the header records the
// objects.
func TestFixObjectBatch_OnceWhenShardsStartTogether(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	run := runNamed("object-once")
	its := objectItems(10_000)
	var reads atomic.Int32
	objects := []ledger.BatchObject{{Key: "a.jsonl", Size: 1, ETag: `"e"`, SHA256: "sha256:00"}}
	b := ledger.ObjectBatch{Shards: 3, Digest: "d", Read: func(ctx context.Context, add func(ledger.Item) error) ([]ledger.BatchObject, error) {
		reads.Add(1)
		for _, it := range its {
			if err := add(it); err != nil {
				return nil, err
			}
		}
		return objects, nil
	}}
	headers := make([]*ledger.BatchHeader, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range headers {
		wg.Go(func() { headers[i], errs[i] = s.FixObjectBatch(context.Background(), run, b) })
	}
	wg.Wait()
	for i := range headers {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, headers[0], headers[i], "caller %d sees the same header", i)
	}
	require.EqualValues(t, 1, reads.Load(), "the objects are read once")
	h := headers[0]
	require.Equal(t, ledger.BatchSourceObject, h.Source)
	require.Equal(t, "d", h.Digest)
	require.EqualValues(t, len(its), h.Items)
	got, err := s.BatchObjects(context.Background(), run.UID)
	require.NoError(t, err)
	require.Equal(t, objects, got)

	const q = `SELECT count(*) FROM runledger.batch AS b, unnest(b.seqs, b.entities) AS u(seq, entity)
WHERE b.batch_id = $1 AND b.shard = $2 AND u.entity = $3`
	for i, it := range its {
		if i%97 != 0 && i%500 != 0 {
			continue
		}
		require.EqualValues(t, 1, scalar[int64](t, pool, q, h.ID, ledger.ShardOf(it.Key, 3), it.Entity), "item %d once, in its shard", i)
	}
	require.EqualValues(t, len(its)/500, scalar[int64](t, pool, `SELECT count(*) FROM runledger.batch WHERE batch_id = $1 AND block % 2 = 1 AND cardinality(seqs) = 1`, h.ID),
		"each item over 16 KiB is a block of its own")
	var total int64
	for shard := range 3 {
		n, err := s.BatchShardSize(context.Background(), h, shard)
		require.NoError(t, err)
		total += n
	}
	require.EqualValues(t, len(its), total)
}

// TestFixObjectBatch_ReadFailsWritesNothing: a read that fails after
// handing on items (a bad line further on) leaves no header and no item.
func TestFixObjectBatch_ReadFailsWritesNothing(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	run := runNamed("object-bad")
	bad := errors.New("line 9001 is not valid JSON")
	_, err := s.FixObjectBatch(context.Background(), run, ledger.ObjectBatch{Shards: 2, Read: func(ctx context.Context, add func(ledger.Item) error) ([]ledger.BatchObject, error) {
		for _, it := range objectItems(9000) {
			if err := add(it); err != nil {
				return nil, err
			}
		}
		return nil, bad
	}})
	require.ErrorIs(t, err, bad)
	h, err := s.BatchHeader(context.Background(), run.UID)
	require.NoError(t, err)
	require.Nil(t, h, "no header")
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.batch`), "no item")
}

// TestFixObjectBatch_AsWorkerLogin: a worker login granted as `runledger
// migrate --grant-to` does (not the schema's owner) fixes an object batch,
// header, items and objects, and a later shard of that login reads them.
// Its grant once let it set the header's item count and not the objects
// read: the first shard failed with "permission denied for table
// batch_run" (SQLSTATE 42501) after reading every object.
func TestFixObjectBatch_AsWorkerLogin(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	s := ledger.NewStore(worker)
	run := runNamed("object-worker-login")
	its := objectItems(1200)
	objects := []ledger.BatchObject{{Key: "credits/2026-06-30.csv", Size: 42, ETag: `"e"`, SHA256: "sha256:00"}}
	h, err := s.FixObjectBatch(context.Background(), run, ledger.ObjectBatch{Shards: 2, Digest: "d", Read: func(ctx context.Context, add func(ledger.Item) error) ([]ledger.BatchObject, error) {
		for _, it := range its {
			if err := add(it); err != nil {
				return nil, err
			}
		}
		return objects, nil
	}})
	require.NoError(t, err, "the worker login fixes the batch")
	require.EqualValues(t, len(its), h.Items)
	got, err := s.BatchObjects(context.Background(), run.UID)
	require.NoError(t, err)
	require.Equal(t, objects, got, "the objects read, recorded by the worker login")
	again, err := s.FixObjectBatch(context.Background(), run, ledger.ObjectBatch{Shards: 2, Digest: "d", Read: func(context.Context, func(ledger.Item) error) ([]ledger.BatchObject, error) {
		t.Error("a fixed batch is not read again")
		return nil, nil
	}})
	require.NoError(t, err)
	require.Equal(t, h, again, "a later shard finds the batch fixed")
}

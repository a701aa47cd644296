package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

func TestBatchMismatch(t *testing.T) {
	t.Parallel()
	run := ledger.Run{Namespace: "billing", Name: "june", UID: "u1"}
	pruned := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	query := &ledger.BatchHeader{Source: ledger.BatchSourceQuery, Shards: 4, Items: 10}
	static := &ledger.BatchHeader{Source: ledger.BatchSourceStatic, Shards: 2, Items: 3, Digest: "d1"}
	for _, tt := range []struct {
		name   string
		h      *ledger.BatchHeader
		source string
		shards int
		digest string
		want   string // "" : fits
	}{
		{"query fits", query, ledger.BatchSourceQuery, 4, "", ""},
		{"shard count not checked", query, ledger.BatchSourceQuery, 0, "", ""},
		{"static fits", static, ledger.BatchSourceStatic, 2, "d1", ""},
		{"no header", nil, ledger.BatchSourceQuery, 4, "", "the batch of run billing/june (uid u1) has no header"},
		{"pruned", &ledger.BatchHeader{Source: ledger.BatchSourceQuery, Shards: 4, Pruned: &pruned}, ledger.BatchSourceQuery, 4, "",
			"the batch of run billing/june (uid u1) was pruned at 2026-01-02T03:04:05Z (`runledger prune`)"},
		{"pruned wins over a mismatch", &ledger.BatchHeader{Source: ledger.BatchSourceStatic, Shards: 1, Pruned: &pruned}, ledger.BatchSourceQuery, 4, "", "was pruned at"},
		{"other source", static, ledger.BatchSourceQuery, 2, "", "was fixed from a static source when the run started; this worker reads a query source"},
		{"other shard count", query, ledger.BatchSourceQuery, 3, "", "was fixed for 4 shards when the run started; this worker runs 3"},
		{"other items", static, ledger.BatchSourceStatic, 2, "d2", "has changed since the run started"},
	} {
		got := batchMismatch(run, tt.h, tt.source, tt.shards, tt.digest)
		if tt.want == "" {
			require.Nil(t, got, tt.name)
			continue
		}
		require.NotNil(t, got, tt.name)
		require.Contains(t, got.Error(), tt.want, tt.name)
	}
}

func TestItemsDigest(t *testing.T) {
	t.Parallel()
	a := []ledger.Item{{Key: ledger.Key{Entity: "ab", Occurrence: "c"}}}
	b := []ledger.Item{{Key: ledger.Key{Entity: "a", Occurrence: "bc"}}}
	require.NotEqual(t, ItemsDigest(a), ItemsDigest(b), "bytes shifted between fields")
	require.Equal(t, ItemsDigest(a), ItemsDigest([]ledger.Item{{Key: ledger.Key{Entity: "ab", Occurrence: "c"}}}), "deterministic")
	withPayload := []ledger.Item{{Key: a[0].Key, Payload: []byte(`{}`)}}
	require.NotEqual(t, ItemsDigest(a), ItemsDigest(withPayload))
	require.Len(t, ItemsDigest(nil), 64)
}

func TestBatchMismatchQueryDigest(t *testing.T) {
	t.Parallel()
	run := ledger.Run{Namespace: "billing", Name: "june", UID: "u1"}
	q1 := queryDigest("SELECT 1")
	fixed := &ledger.BatchHeader{Source: ledger.BatchSourceQuery, Shards: 1, Digest: q1}
	require.Nil(t, batchMismatch(run, fixed, ledger.BatchSourceQuery, 1, q1), "the same query")
	got := batchMismatch(run, fixed, ledger.BatchSourceQuery, 1, queryDigest("SELECT 1 "))
	require.NotNil(t, got, "white space is an edit too")
	require.Contains(t, got.Error(), "batch.query has changed since the run started")
	legacy := &ledger.BatchHeader{Source: ledger.BatchSourceQuery, Shards: 1}
	require.Nil(t, batchMismatch(run, legacy, ledger.BatchSourceQuery, 1, q1), "a batch fixed before digests were recorded is accepted")
}

// TestLookupPolicy: a shard's fetches look their keys up until one finds
// none held, then not until a claim finds a held key: a fresh batch's keys
// are probed once (by the claim), an already handled one's by the fetch
// only (no claim), a batch that turns held midway is looked up again.
func TestLookupPolicy(t *testing.T) {
	type step struct {
		fetchHeld, claimHeld bool
		wantLookup           bool // of this step's fetch
	}
	for _, tt := range []struct {
		name  string
		steps []step
	}{
		{"fresh", []step{{false, false, true}, {false, false, false}, {false, false, false}}},
		{"all held", []step{{true, false, true}, {true, false, true}, {true, false, true}}},
		{"held midway", []step{{false, false, true}, {false, true, false}, {true, false, true}, {false, false, true}, {false, false, false}}},
		{"held again by this run's earlier attempt", []step{{false, false, true}, {false, true, false}, {false, false, true}, {false, false, false}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var p lookupPolicy
			for i, s := range tt.steps {
				lookup := p.lookup()
				require.Equal(t, s.wantLookup, lookup, "fetch %d", i)
				p.fetched(lookup, lookup && s.fetchHeld)
				p.claimed(s.claimHeld)
			}
		})
	}
}

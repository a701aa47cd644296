package worker_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/pkg/processor"
)

// slowService is a processor that does its work (records the item's key)
// first and answers after delay: with a shorter call timeout, the worker
// gives up on a call whose work was done. It keeps, per business key, the
// distinct idempotency keys it was sent, in order.
type slowService struct {
	mu    sync.Mutex
	delay time.Duration
	keys  map[ledger.Key][]string
	busy  sync.WaitGroup
}

func (s *slowService) handler() http.Handler {
	h := processor.Handler(func(_ context.Context, _ *processor.Request, it processor.Item) processor.Result {
		s.mu.Lock()
		defer s.mu.Unlock()
		k := ledger.Key{Entity: it.Entity, Occurrence: it.Occurrence}
		if !slices.Contains(s.keys[k], it.Key) {
			s.keys[k] = append(s.keys[k], it.Key)
		}
		return processor.OK()
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.busy.Add(1)
		defer s.busy.Done()
		h.ServeHTTP(w, r) // the work, done
		s.mu.Lock()
		d := s.delay
		s.mu.Unlock()
		time.Sleep(d) // the answer, late
	})
}

func (s *slowService) setDelay(d time.Duration) {
	s.busy.Wait() // the calls given up on have done their work
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

func (s *slowService) keysOf(k ledger.Key) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.keys[k])
}

// TestProcessor_KeyNamesTheWorkNotTheRun: a processor did the work of an
// item, but its answer came after the call's timeout, so the run failed the
// item; the item retried under a new run name (what a failed run is given)
// is sent with the same idempotency key, so a service that deduplicates by
// it does the work once. A Supersede run is another generation of the work
// and gets a new key; that generation retried under yet another name gets
// that same new key again; the next Supersede, once it committed, a third.
func TestProcessor_KeyNamesTheWorkNotTheRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	svc := &slowService{keys: map[ledger.Key][]string{}}
	srv := httptest.NewServer(svc.handler())
	defer srv.Close()
	items := occItems("1", "2", "3")

	// attempt runs items under uid, with answers late past the timeout
	// (failed) or on time.
	attempt := func(uid string, late bool, onExisting ledger.OnExisting) v1alpha1.ItemCounts {
		t.Helper()
		timeout := 5 * time.Second
		if late {
			svc.setDelay(time.Second)
			timeout = 100 * time.Millisecond
		} else {
			svc.setDelay(0)
		}
		cfg := processorConfig(uid, srv.URL, items, timeout)
		cfg.OnExisting = onExisting
		_, sum := runShards(t, f, cfg)
		return sum
	}
	requireKeys := func(want int, why string) []string {
		t.Helper()
		svc.setDelay(0)
		var first []string
		for i, it := range items {
			got := svc.keysOf(it.Key)
			require.Len(t, got, want, "%s: %s was sent with %d distinct keys: %v", why, it.Key, len(got), got)
			for _, k := range got {
				require.LessOrEqual(t, len(k), processor.MaxKeyLength)
			}
			if i == 0 {
				first = got
			}
		}
		return first
	}

	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Failed: 3}, attempt("uid-first", true, ledger.Skip), "every call timed out")
	requireKeys(1, "one run, its retries")
	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 3}, attempt("uid-renamed", false, ledger.Skip))
	gen1 := requireKeys(1, "the failed run, retried under a new name")

	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Failed: 3}, attempt("uid-super-1", true, ledger.Supersede))
	gen2 := requireKeys(2, "a Supersede run is new work")
	require.Equal(t, gen1[0], gen2[0])
	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 3}, attempt("uid-super-1-renamed", false, ledger.Supersede))
	require.Equal(t, gen2, requireKeys(2, "the same generation retried under a new name"))

	require.Equal(t, v1alpha1.ItemCounts{Total: 3, Completed: 3}, attempt("uid-super-2", false, ledger.Supersede))
	gen3 := requireKeys(3, "the next Supersede, after one committed")
	require.Equal(t, gen2, gen3[:2])
	require.EqualValues(t, 3, f.committed(t))
}

// TestProcessor_KeySurvivesAFailoverThatLostGenerations: a failover to an
// asynchronous standby lost two Supersede runs' commits of a key (the
// standby never received them), after the processor had done both
// generations' work. Processed again on the surviving database, each
// generation is sent under the key it was sent under before, so a service
// that deduplicates by it does each once. On the old code the key named the
// id of the row a claim replaced: the first generation processed again got
// a new row id, and the second generation, replacing that row, a new key.
func TestProcessor_KeySurvivesAFailoverThatLostGenerations(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	svc := &slowService{keys: map[ledger.Key][]string{}}
	srv := httptest.NewServer(svc.handler())
	defer srv.Close()
	items := occItems("1", "2")
	attempt := func(uid string, onExisting ledger.OnExisting) {
		t.Helper()
		cfg := processorConfig(uid, srv.URL, items, 5*time.Second)
		cfg.OnExisting = onExisting
		_, sum := runShards(t, f, cfg)
		require.Equal(t, v1alpha1.ItemCounts{Total: 2, Completed: 2}, sum, uid)
	}
	attempt("uid-gen-first", ledger.Skip)
	attempt("uid-gen-s1", ledger.Supersede)
	attempt("uid-gen-s2", ledger.Supersede)
	before := map[ledger.Key][]string{}
	for _, it := range items {
		before[it.Key] = svc.keysOf(it.Key)
		require.Len(t, before[it.Key], 3, "three generations, three keys")
	}

	// The failover: the surviving ledger is the one before the Supersede
	// runs started (WAL never replayed runs no trigger either).
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{
		`SET LOCAL session_replication_role = replica`,
		`DELETE FROM runledger.ledger WHERE run_uid IN ('uid-gen-s1', 'uid-gen-s2')`,
		`UPDATE runledger.ledger SET state = 'committed', superseded_at = NULL WHERE run_uid = 'uid-gen-first'`,
		`DELETE FROM runledger.ledger_retired WHERE run_uid IN ('uid-gen-first', 'uid-gen-s1')`,
		`DELETE FROM runledger.batch WHERE batch_id IN (SELECT id FROM runledger.batch_run WHERE run_uid IN ('uid-gen-s1', 'uid-gen-s2'))`,
		`DELETE FROM runledger.batch_run WHERE run_uid IN ('uid-gen-s1', 'uid-gen-s2')`,
	} {
		_, err := tx.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	require.NoError(t, tx.Commit(ctx))

	attempt("uid-gen-s1", ledger.Supersede) // the runs' shards, processing what the ledger lost
	attempt("uid-gen-s2", ledger.Supersede)
	for _, it := range items {
		require.Equal(t, before[it.Key], svc.keysOf(it.Key), "%s: each generation under its key again, no new one", it.Key)
	}
	require.EqualValues(t, 2, f.committed(t))
}

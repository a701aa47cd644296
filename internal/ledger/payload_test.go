package ledger_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// payloadCases: a committed row's payload, an item's for the same key, and
// whether they differ as jsonb values (key order, white space and a number's
// spelling do not count; no payload is a JSON null).
var payloadCases = []struct {
	name              string
	committed, given  string // "" is no payload
	changed, sameText bool   // sameText: given is the committed value as jsonb prints it
}{
	{name: "identical", committed: `{"a": 1, "b": [1, 2]}`, given: `{"a": 1, "b": [1, 2]}`, sameText: true},
	{name: "key order and white space", committed: `{"a": 1, "b": [1, 2]}`, given: `{"b":[1,2],"a":1}`},
	{name: "a number spelled otherwise", committed: `{"amount": 100}`, given: `{"amount": 1e2}`},
	{name: "trailing zeros", committed: `{"amount": 1}`, given: `{"amount": 1.00}`},
	{name: "an escape", committed: `{"s": "é"}`, given: `{"s": "\u00e9"}`},
	{name: "another value", committed: `{"a": 1}`, given: `{"a": 2}`, changed: true},
	{name: "a member more", committed: `{"a": 1}`, given: `{"a": 1, "b": null}`, changed: true},
	{name: "array order", committed: `[1, 2]`, given: `[2, 1]`, changed: true},
	{name: "a string for a number", committed: `{"a": 1}`, given: `{"a": "1"}`, changed: true},
	{name: "none, none", sameText: true},
	{name: "none, null", given: `null`, sameText: true},
	{name: "null, none", committed: `null`, sameText: true},
	{name: "none, a value", given: `{}`, changed: true},
	{name: "a value, none", committed: `{}`, changed: true, sameText: true},
}

func payloadItem(i int, payload string) ledger.Item {
	it := ledger.Item{Key: ledger.Key{Entity: "acct", Occurrence: fmt.Sprintf("occ-%02d", i)}}
	if payload != "" {
		it.Payload = json.RawMessage(payload)
	}
	return it
}

// TestCommitChunk_PayloadChanged: an item already handled by another run is
// marked PayloadChanged exactly when its payload differs from the committed
// row's as a jsonb value, on the fast path and on the arbiter's (a bad item
// in the chunk makes it isolate); nothing is written for it either way, and
// a key the run itself committed is never compared.
func TestCommitChunk_PayloadChanged(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"fast path", "arbiter (isolating a bad item)"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			pool := newPool(t)
			s := ledger.NewStore(pool)
			var committed, given []ledger.Item
			for i, c := range payloadCases {
				committed = append(committed, payloadItem(i, c.committed))
				given = append(given, payloadItem(i, c.given))
			}
			require.Equal(t, tally{completed: len(committed)}, count(commit(t, s, runNamed("holder"), committed, ledger.ChunkOptions{})))
			// A key of the run's own with another payload: completed, not compared.
			own := payloadItem(90, `{"v": 1}`)
			commit(t, s, runNamed("other"), []ledger.Item{own}, ledger.ChunkOptions{})
			own.Payload = json.RawMessage(`{"v": 2}`)
			given = append(given, own)
			if path != "fast path" {
				// jsonb cannot hold \u0000: the statement fails, and the
				// chunk is claimed again part by part by the arbiter.
				given = append(given, payloadItem(99, `{"s": "\u0000"}`))
			}
			res := commit(t, s, runNamed("other"), given, ledger.ChunkOptions{})
			for i, c := range payloadCases {
				require.Equal(t, ledger.AlreadyHandled, res[i].Outcome, c.name)
				require.Equal(t, "holder", res[i].HolderUID, c.name)
				require.Equal(t, c.changed, res[i].PayloadChanged, "%s: %s against %s", c.name, c.given, c.committed)
			}
			n := len(payloadCases)
			require.Equal(t, ledger.Completed, res[n].Outcome)
			require.Equal(t, ledger.HolderSameRun, res[n].Holder)
			require.False(t, res[n].PayloadChanged, "the run's own row is not compared")
			if path != "fast path" {
				require.Equal(t, ledger.Failed, res[n+1].Outcome, "the bad item fails, alone")
				require.False(t, res[n+1].PayloadChanged)
			}
			requireOneCommittedPerKey(t, pool, n+1)
			for i, c := range payloadCases {
				var same bool
				require.NoError(t, pool.QueryRow(context.Background(), `SELECT payload IS NOT DISTINCT FROM $2::jsonb
					FROM runledger.ledger WHERE occurrence = $1 AND state = 'committed' AND run_uid = 'holder'`,
					committed[i].Occurrence, nullable(c.committed)).Scan(&same))
				require.True(t, same, "%s: the committed row is untouched", c.name)
			}
		})
	}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// TestPreloadItems_PayloadMatch: the preload tells a payload apart from the
// committed row's only where its text can (it casts nothing): the same text
// as jsonb prints the row's is PayloadSame, no payload against a value is
// PayloadDiffers, anything else PayloadUnknown, never a wrong answer; a key
// of the run itself or of nobody carries no comparison.
func TestPreloadItems_PayloadMatch(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	var committed, given []ledger.Item
	for i, c := range payloadCases {
		committed = append(committed, payloadItem(i, c.committed))
		given = append(given, payloadItem(i, c.given))
	}
	commit(t, s, runNamed("holder"), committed, ledger.ChunkOptions{})
	commit(t, s, runNamed("self"), []ledger.Item{payloadItem(90, `{"v": 1}`)}, ledger.ChunkOptions{})
	given = append(given, payloadItem(90, `{"v": 2}`), payloadItem(91, `{"fresh": true}`),
		payloadItem(92, `{"s": "\u0000"}`)) // not castable: still no error
	commit(t, s, runNamed("holder"), []ledger.Item{payloadItem(92, `{"s": "x"}`)}, ledger.ChunkOptions{})

	held, err := s.PreloadItems(context.Background(), "self", given)
	require.NoError(t, err)
	for i, c := range payloadCases {
		h := held[given[i].Key]
		require.Equal(t, ledger.HolderOtherRun, h.Holder, c.name)
		switch {
		case c.sameText && !c.changed:
			require.Equal(t, ledger.PayloadSame, h.Payload, c.name)
		case c.given == "" && c.changed:
			require.Equal(t, ledger.PayloadDiffers, h.Payload, c.name)
		default:
			require.Equal(t, ledger.PayloadUnknown, h.Payload, c.name)
		}
	}
	n := len(payloadCases)
	require.Equal(t, ledger.Held{Holder: ledger.HolderSameRun}, held[given[n].Key], "the run's own key is not compared")
	require.NotContains(t, held, given[n+1].Key, "nobody holds a fresh key")
	require.Equal(t, ledger.Held{Holder: ledger.HolderOtherRun, Payload: ledger.PayloadUnknown}, held[given[n+2].Key],
		"a payload jsonb cannot hold is left to the claim")
}

// copyCases: the copies of one key in a chunk, in order, against a
// committed row {"v": 1} of another run, and whether the key's payload
// changed: some copy's differs as a jsonb value, whichever it is.
var copyCases = []struct {
	name      string
	committed string   // {"v": 1} unless given
	copies    []string // "" is no payload
	changed   bool
}{
	{name: "the same, then another value", copies: []string{`{"v": 1}`, `{"v": 2}`}, changed: true},
	{name: "another value, then the same", copies: []string{`{"v": 2}`, `{"v": 1}`}, changed: true},
	{name: "spelled otherwise, then another value", copies: []string{`{"v":1}`, `{ "v" : 1.0 }`, `{"v":2}`}, changed: true},
	{name: "the same, then none", copies: []string{`{"v": 1}`, ``}, changed: true},
	{name: "none, then the same", copies: []string{``, `{"v":1}`}, changed: true},
	{name: "the same, spelled three ways", copies: []string{`{"v":1}`, `{"v": 1}`, `{ "v" : 1e0 }`}},
	{name: "the same twice", copies: []string{`{"v": 1}`, `{"v": 1}`}},
	{name: "quotes and backslashes, the same", committed: `{"s": "a\"b\\c{,}"}`, copies: []string{`{"s": "a\"b\\c{,}"}`, `{"s":"a\"b\\c{,}"}`, `{ "s" : "a\u0022b\\c{,}" }`}},
	{name: "quotes and backslashes, then another", committed: `{"s": "a\"b\\c"}`, copies: []string{`{"s": "a\"b\\c"}`, `{"s":"a\"b\\c", "t": "\""}`}, changed: true},
}

// TestCommitChunk_PayloadChangedLaterCopy: a key given several times in a
// chunk, which another run holds, is marked PayloadChanged (on its first
// copy, which carries the key's verdict) when any copy's payload differs
// from the committed row's, not only the first copy's; its repeats are
// already handled by the chunk. On the fast path (with an effect too) and
// on the arbiter's; nothing is written. A Supersede run compares nothing.
func TestCommitChunk_PayloadChangedLaterCopy(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"fast path", "fast path with an effect", "arbiter (isolating a bad item)"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			pool := newPool(t)
			s := ledger.NewStore(pool)
			var committed, given []ledger.Item
			first := map[int]int{} // case -> position of its first copy in given
			for i, c := range copyCases {
				committed = append(committed, payloadItem(i, cmp.Or(c.committed, `{"v": 1}`)))
				first[i] = len(given)
				for _, p := range c.copies {
					given = append(given, payloadItem(i, p))
				}
			}
			// A fresh key with two payloads: the first copy is committed, the other not compared.
			fresh := len(given)
			given = append(given, payloadItem(80, `{"v": 1}`), payloadItem(80, `{"v": 2}`))
			var opts ledger.ChunkOptions
			switch path {
			case "fast path with an effect":
				opts.Effect = `SELECT 1`
			case "arbiter (isolating a bad item)":
				given = append(given, payloadItem(99, `{"s": "\u0000"}`))
			}
			commit(t, s, runNamed("holder"), committed, ledger.ChunkOptions{})
			writes := scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`)
			res := commit(t, s, runNamed("other"), given, opts)
			for i, c := range copyCases {
				r := res[first[i]]
				require.Equal(t, ledger.AlreadyHandled, r.Outcome, c.name)
				require.Equal(t, "holder", r.HolderUID, c.name)
				require.Equal(t, c.changed, r.PayloadChanged, "%s: %q", c.name, c.copies)
				for j := 1; j < len(c.copies); j++ {
					require.Equal(t, ledger.AlreadyHandled, res[first[i]+j].Outcome, c.name)
					require.Equal(t, ledger.HolderSameChunk, res[first[i]+j].Holder, c.name)
				}
			}
			require.Equal(t, ledger.Completed, res[fresh].Outcome)
			require.False(t, res[fresh].PayloadChanged)
			require.Equal(t, ledger.HolderSameChunk, res[fresh+1].Holder)
			require.EqualValues(t, writes+1, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`), "only the fresh key is written")
			require.EqualValues(t, 1, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE occurrence = 'occ-80' AND payload = '{"v": 1}'`),
				"the fresh key's first copy is committed")

			res = commit(t, s, runNamed("superseder"), given, ledger.ChunkOptions{OnExisting: ledger.Supersede})
			for i, c := range copyCases {
				require.Equal(t, ledger.Completed, res[first[i]].Outcome, c.name)
				require.False(t, res[first[i]].PayloadChanged, "%s: a Supersede run compares nothing", c.name)
			}
		})
	}
}

// TestPreloadItems_PayloadMatchCopies: the preload of a key given several
// times answers for all its copies: PayloadDiffers when one copy's text
// tells it differs, PayloadSame only when every copy's tells it is the same,
// PayloadUnknown otherwise.
func TestPreloadItems_PayloadMatchCopies(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	var committed []ledger.Item
	for i := range 5 {
		committed = append(committed, payloadItem(i, `{"v": 1}`))
	}
	commit(t, s, runNamed("holder"), committed, ledger.ChunkOptions{})
	held, err := s.PreloadItems(context.Background(), "self", []ledger.Item{
		payloadItem(0, `{"v": 1}`), payloadItem(0, ``), // the same text, then none
		payloadItem(1, ``), payloadItem(1, `{"v": 1}`), // none, then the same text
		payloadItem(2, `{"v": 1}`), payloadItem(2, `{"v":2}`), // the same text, then text that cannot tell
		payloadItem(3, `{"v":2}`), payloadItem(3, `{"v": 1}`), // text that cannot tell, then the same
		payloadItem(4, `{"v": 1}`), payloadItem(4, `{"v": 1}`), // the same text twice
	})
	require.NoError(t, err)
	for i, want := range []ledger.PayloadMatch{ledger.PayloadDiffers, ledger.PayloadDiffers, ledger.PayloadUnknown, ledger.PayloadUnknown, ledger.PayloadSame} {
		require.Equal(t, ledger.Held{Holder: ledger.HolderOtherRun, Payload: want}, held[payloadItem(i, "").Key], "key %d", i)
	}
}

// TestCommitChunk_LaterCopiesOnTheFastPath: a chunk whose held keys come
// with later copies to compare is claimed by the fast path's one statement,
// with or without an effect, as a chunk without copies is: as many round
// trips, no isolating (the arbiter's path would answer the same verdicts,
// in many more).
func TestCommitChunk_LaterCopiesOnTheFastPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, writes := onePool(t)
	s := ledger.NewStore(pool)
	held := items("acct", 0, 100)
	_, err := s.CommitChunk(ctx, runNamed("holder"), held, ledger.ChunkOptions{})
	require.NoError(t, err)
	for _, effect := range []string{"", `SELECT 1`} {
		chunk := func(i int, copies bool) []ledger.Item {
			out := slices.Clone(held)
			out = append(out, items("fresh-"+strconv.Itoa(i), 0, 3)...) // the effect runs: a claim of some keys
			if copies {
				for _, it := range held[:50] {
					it.Payload = json.RawMessage(`{"amount": -1}`)
					out = append(out, it)
				}
			}
			return out
		}
		trips := func(i int, copies bool) (int64, []ledger.Result) {
			before := writes.Load()
			res, err := s.CommitChunk(ctx, runNamed(fmt.Sprintf("run-%d-%v", i, effect != "")), chunk(i, copies), ledger.ChunkOptions{Effect: effect})
			require.NoError(t, err)
			return writes.Load() - before, res
		}
		trips(0, false) // the statements prepared
		trips(1, true)
		plain, _ := trips(2, false)
		withCopies, res := trips(3, true)
		require.Equal(t, plain, withCopies, "effect %q: the same round trips", effect)
		for i := range held {
			require.Equal(t, ledger.AlreadyHandled, res[i].Outcome)
			require.Equal(t, i < 50, res[i].PayloadChanged, "key %d", i)
		}
	}
}

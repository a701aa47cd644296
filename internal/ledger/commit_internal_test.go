package ledger

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDedupe(t *testing.T) {
	t.Parallel()
	item := func(e, o, payload string) Item {
		return Item{Key: Key{Entity: e, Occurrence: o}, Payload: []byte(payload)}
	}
	for _, tc := range []struct {
		name        string
		items       []Item
		wantUnique  []Item
		wantIndexOf []int
	}{
		{
			name:       "sorted and distinct: the items themselves",
			items:      []Item{item("a", "1", ""), item("b", "1", ""), item("a", "2", "")},
			wantUnique: []Item{item("a", "1", ""), item("b", "1", ""), item("a", "2", "")},
		},
		{
			name:        "unsorted: sorted as the rule's columns, occurrence then entity",
			items:       []Item{item("a", "2", ""), item("b", "1", ""), item("a", "1", "")},
			wantUnique:  []Item{item("a", "1", ""), item("b", "1", ""), item("a", "2", "")},
			wantIndexOf: []int{2, 1, 0},
		},
		{
			name:        "repeats: the first copy wins",
			items:       []Item{item("a", "2", "first"), item("a", "1", ""), item("a", "2", "second"), item("a", "2", "third")},
			wantUnique:  []Item{item("a", "1", ""), item("a", "2", "first")},
			wantIndexOf: []int{1, 0, 1, 1},
		},
		{
			name:        "sorted with a repeat is not distinct",
			items:       []Item{item("a", "1", "first"), item("a", "1", "second")},
			wantUnique:  []Item{item("a", "1", "first")},
			wantIndexOf: []int{0, 0},
		},
		{
			name:        "bytewise order, not a collation",
			items:       []Item{item("b", "a", ""), item("B", "a", ""), item("ä", "a", ""), item("1", "Z", "")},
			wantUnique:  []Item{item("1", "Z", ""), item("B", "a", ""), item("b", "a", ""), item("ä", "a", "")},
			wantIndexOf: []int{2, 1, 3, 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			unique, indexOf := dedupe(tc.items)
			require.Equal(t, tc.wantUnique, unique, "distinct items in key order")
			require.Equal(t, tc.wantIndexOf, indexOf, "position of every input's key (nil: identity)")
		})
	}
}

func TestSpread(t *testing.T) {
	t.Parallel()
	k := func(o string) Key { return Key{Entity: "a", Occurrence: o} }
	items := []Item{{Key: k("2")}, {Key: k("1")}, {Key: k("2")}, {Key: k("3")}, {Key: k("3")}}
	indexOf := []int{1, 0, 1, 2, 2}
	bad := errHolderVanished
	res := []Result{
		{Key: k("1"), Outcome: Completed},
		{Key: k("2"), Outcome: AlreadyHandled, Holder: HolderOtherRun},
		{Key: k("3"), Outcome: Failed, Err: bad},
	}
	require.Equal(t, []Result{
		{Key: k("2"), Outcome: AlreadyHandled, Holder: HolderOtherRun},
		{Key: k("1"), Outcome: Completed},
		{Key: k("2"), Outcome: AlreadyHandled, Holder: HolderSameChunk},
		{Key: k("3"), Outcome: Failed, Err: bad},
		{Key: k("3"), Outcome: Failed, Err: bad},
	}, spread(items, indexOf, res), "the first copy carries the outcome; repeats are same-chunk, or failed alike")
	require.Equal(t, res, spread(res2items(res), nil, res), "nil indexOf: the results as they are")
}

func res2items(res []Result) []Item {
	out := make([]Item, len(res))
	for i, r := range res {
		out[i] = Item{Key: r.Key}
	}
	return out
}

package ledger

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecide: every way a key's verdict is reached, in the one place that
// decides it.
func TestDecide(t *testing.T) {
	t.Parallel()
	refused := errors.New("processor: card declined")
	for _, tc := range []struct {
		name       string
		held       Held
		r          Result
		sent, fail bool
		want       Decision
	}{
		{name: "claimed now", r: Result{Outcome: Completed}, sent: true, want: Decision{Outcome: Completed}},
		{name: "this run's, found by the claim", r: Result{Outcome: Completed, Holder: HolderSameRun}, sent: true, want: Decision{Outcome: Completed}},
		{name: "this run's, found by a lookup", held: Held{Holder: HolderSameRun}, want: Decision{Outcome: Completed}},
		{name: "another run's, found by a lookup", held: Held{Holder: HolderOtherRun, Payload: PayloadSame}, want: Decision{Outcome: AlreadyHandled}},
		{name: "another run's, changed, found by a lookup", held: Held{Holder: HolderOtherRun, Payload: PayloadDiffers},
			want: Decision{Outcome: AlreadyHandled, PayloadChanged: true}},
		{name: "another run's, changed, found by a lookup, onPayloadChange Fail", held: Held{Holder: HolderOtherRun, Payload: PayloadDiffers}, fail: true,
			want: Decision{Outcome: Failed, PayloadChanged: true, Err: ErrPayloadChanged, Class: ClassPayloadChanged}},
		{name: "another run's, found by the claim", r: Result{Outcome: AlreadyHandled, Holder: HolderOtherRun}, sent: true, want: Decision{Outcome: AlreadyHandled}},
		{name: "another run's, changed, found by the claim, onPayloadChange Fail", r: Result{Outcome: AlreadyHandled, Holder: HolderOtherRun, PayloadChanged: true}, sent: true, fail: true,
			want: Decision{Outcome: Failed, PayloadChanged: true, Err: ErrPayloadChanged, Class: ClassPayloadChanged}},
		{name: "refused", r: Result{Outcome: Failed, Err: &refusedError{err: refused}}, sent: true, fail: true,
			want: Decision{Outcome: Failed, Err: &refusedError{err: refused}, Class: ClassProcessorRefused}},
		{name: "a completed item's payload is never compared", r: Result{Outcome: Completed, PayloadChanged: true}, sent: true, fail: true,
			want: Decision{Outcome: Completed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, decide(tc.held, tc.r, tc.sent, tc.fail))
		})
	}
}

// TestToClaim: a Skip run claims the keys no lookup settled, with their
// copies to compare; a Supersede run claims every key but its own, without
// copies.
func TestToClaim(t *testing.T) {
	t.Parallel()
	it := func(o string) Item { return Item{Key: Key{Entity: "e", Occurrence: o}} }
	groups := []Group{
		{Item: it("new"), Copies: []Item{it("new")}},
		{Item: it("mine"), Held: Held{Holder: HolderSameRun}},
		{Item: it("theirs"), Held: Held{Holder: HolderOtherRun, Payload: PayloadSame}},
	}
	require.Equal(t, []Item{it("new"), it("new")}, toClaim(groups, Skip))
	require.Equal(t, []Item{it("new"), it("theirs")}, toClaim(groups, Supersede))
}

package ledger

import (
	"context"
	"fmt"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/phrase"
)

// Disagreements says, one phrase each, why p does not prove the counts a
// run reported: keys missing or mismatched, failure records that are not
// its bad rows', and each count that differs from the ledger's (total and
// payloadChanged only when compareTotal and comparePayloadChanged: the
// counts hold them). None: the ledger proves them (runledger verify, the
// console's proof of a run).
func (p RunProof) Disagreements(reported v1alpha1.ItemCounts, compareTotal, comparePayloadChanged bool) []string {
	var why []string
	if p.Missing > 0 {
		why = append(why, phrase.Count(p.Missing, "item", "items")+" missing (no committed row, no row of the run, no failure record)")
	}
	if p.Mismatched > 0 {
		why = append(why, phrase.Count(p.Mismatched, "key", "keys")+" mismatched")
	}
	if p.Unmatched != p.BadRows {
		why = append(why, fmt.Sprintf("its failure records under no key of the batch count %d failed, for %d rows of the batch that could not become items", p.Unmatched, p.BadRows))
	}
	for _, c := range []struct {
		what           string
		reported, have int64
		compare        bool
	}{
		{"total", reported.Total, p.Total, compareTotal},
		{"completed", reported.Completed, p.Completed, true},
		{"alreadyHandled", reported.AlreadyHandled, p.AlreadyHandled, true},
		{"failed", reported.Failed, p.Failed, true},
		{"payloadChanged", reported.PayloadChanged, p.PayloadChanged, comparePayloadChanged},
	} {
		if c.compare && c.reported != c.have {
			why = append(why, fmt.Sprintf("%s %d reported, %d in the ledger", c.what, c.reported, c.have))
		}
	}
	return why
}

// PayloadChangedKeys counts run's keys that another run's committed row
// holds and a copy of which in the batch has another payload (already
// handled, or failed with class payload-changed under onPayloadChange:
// Fail), each once: what runledger items --payload-changed lists and the
// run's payloadChanged counts. batch: a static run's items, as RunItemsOf
// takes them (nil for a query's). A read of its own, after ProveRun's
// snapshot.
func (s *Store) PayloadChangedKeys(ctx context.Context, run RunRecord, batch []Item) (int64, error) {
	var n int64
	err := s.RunItemsOf(ctx, run, batch, []Outcome{AlreadyHandled, Failed}, func(v ItemVerdict) error {
		if v.PayloadChanged || v.Outcome == Failed && v.Class == ClassPayloadChanged {
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("counting the keys whose payload changed: %w", err)
	}
	return n, nil
}

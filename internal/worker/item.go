package worker

import (
	"github.com/runledger/runledger/internal/batchitem"
	"github.com/runledger/runledger/internal/ledger"
)

// The rules of an item and the bad-input errors live in internal/batchitem,
// which internal/batchfile's streaming reader shares (one copy of each
// check); these names keep the worker's API as it was.

// DefaultMaxPayloadBytes bounds one item's payload. (Key parts are bounded by
// v1alpha1.MaxKeyPartBytes, the API's rule.)
const DefaultMaxPayloadBytes = batchitem.DefaultMaxPayloadBytes

// InputError is bad input: an item, a line or a row that cannot be processed,
// or a batch or query that cannot be read (batchitem.InputError).
type InputError = batchitem.InputError

// InputErrors is every problem found in a batch (batchitem.InputErrors).
type InputErrors = batchitem.InputErrors

// Limits configures validation (batchitem.Limits).
type Limits = batchitem.Limits

// IsInputError reports whether err is bad input (exit code 2 in the CLI).
func IsInputError(err error) bool { return batchitem.IsInputError(err) }

// ValidateItems checks every item of an inline batch; where(i) names item i in
// errors (e.g. "batch.items[3]"). It returns an *InputErrors listing every
// problem, or nil.
func ValidateItems(items []ledger.Item, where func(i int) string, l Limits) error {
	errs := &InputErrors{Source: "spec.batch.items"}
	for i, it := range items {
		for _, e := range batchitem.CheckItem(it, where(i), l) {
			errs.Add(e)
		}
	}
	if len(items) == 0 {
		errs.Add(&InputError{Msg: "the batch has no items"})
	}
	return errs.OrNil()
}

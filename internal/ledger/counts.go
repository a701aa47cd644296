package ledger

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// RunCounts are what the ledger database counts of a run by itself: its
// ledger rows (Completed: committed, or superseded since by a later run)
// and the items its failure records hold (Failed: a key's copies each).
// Already handled items need the batch (RunItems), so are not counted.
type RunCounts struct {
	Completed, Failed int64
}

// RunCounts counts run uid's rows and failed items: one probe of an index
// each, for runs without a status to read (those of runledger run).
func (s *Store) RunCounts(ctx context.Context, uid string) (RunCounts, error) {
	var c RunCounts
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqlRunCounts, uid).Scan(&c.Completed, &c.Failed)
	})
	if err != nil {
		return c, fmt.Errorf("counting the items of run %s: %w", uid, err)
	}
	return c, nil
}

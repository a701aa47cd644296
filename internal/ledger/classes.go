package ledger

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ClassCount is how many of a run's failure records have a class, and the
// items they count failed (a key's copies each).
type ClassCount struct {
	Class          string
	Records, Items int64
}

// FailureClasses counts run uid's failure records by class, the class of
// the most failed items first: one read of its records (failures by class
// on the console's run page).
func (s *Store) FailureClasses(ctx context.Context, uid string) ([]ClassCount, error) {
	out := []ClassCount{}
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlRunFailureClasses, uid)
		if err != nil {
			return err
		}
		c := ClassCount{}
		_, err = pgx.ForEachRow(rows, []any{&c.Class, &c.Records, &c.Items}, func() error {
			out = append(out, c)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("counting the failures of run %s by class: %w", uid, err)
	}
	return out, nil
}

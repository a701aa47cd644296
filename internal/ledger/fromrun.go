package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNoEarlierRun: a fromRun batch names a run the ledger has no batch of
// (never started, or another namespace), or one whose batch, and with it its
// failure records, was pruned.
var ErrNoEarlierRun = errors.New("the ledger holds no such run")

// FromRunNotAnItem is the payload a fromRun batch gives an earlier failure
// that is no item to retry (sqlFromRunFailed): not JSON (it starts with a
// control character), it cannot be a payload anyone kept.
const FromRunNotAnItem = "\x01runledger: not an item to retry"

// FromRunQuery is the batch query of a fromRun batch: the items that failed
// in the latest run called name in namespace, with their payloads.
func FromRunQuery(namespace, name string) string { return sqlFromRunFailed(namespace, name) }

// EarlierRun returns the uid of the latest run called name in namespace
// whose batch the ledger holds: the run a fromRun batch reads. It is
// ErrNoEarlierRun when there is none, or when that run's batch was pruned.
func (s *Store) EarlierRun(ctx context.Context, namespace, name string) (string, error) {
	var uid string
	var pruned bool
	err := s.pinned(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, sqlEarlierRun, namespace, name).Scan(&uid, &pruned) })
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("run %s/%s: %w (it never started, or it is in another namespace)", namespace, name, ErrNoEarlierRun)
	case err != nil:
		return "", fmt.Errorf("looking up run %s/%s: %w", namespace, name, err)
	case pruned:
		return "", fmt.Errorf("run %s/%s (uid %s): %w: its batch was pruned, and its failure records with it", namespace, name, uid, ErrNoEarlierRun)
	}
	return uid, nil
}

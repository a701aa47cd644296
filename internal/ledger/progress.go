package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runledger/runledger/api/v1alpha1"
)

// MaxProgressMessageBytes bounds a progress row's message
// (runledger.shard_progress.message, migrations/00015).
const MaxProgressMessageBytes = 1024

// ShardProgress is one shard's latest progress as its worker published it
// (runledger.shard_progress): what the run's reporter writes onto its pod.
type ShardProgress struct {
	Shard, Attempt int
	v1alpha1.ItemCounts
	Message string
	// Done: the shard's worker has its final counts (and is exiting).
	Done bool
	// Age is how long ago the row was written, by the database's clock
	// (RunProgress only).
	Age time.Duration
}

// PublishProgress writes p as run uid's row for p.Shard (unless a later
// attempt of the shard wrote it: then written is false) and returns the
// lowest other shard of the run whose row is not done and at most liveFor
// old, or -1: the run's reporter is the lower of it and p.Shard. One round
// trip, one statement.
func (s *Store) PublishProgress(ctx context.Context, uid string, p ShardProgress, liveFor time.Duration) (written bool, lowestOther int, err error) {
	var n int64
	var other *int32
	bounded, cancel := s.answered(ctx)
	defer cancel()
	err = s.pinned(bounded, func(tx pgx.Tx) error {
		return tx.QueryRow(bounded, sqlPublishProgress, uid, p.Shard, p.Attempt, p.Total, p.Completed, p.AlreadyHandled, p.Failed,
			p.PayloadChanged, v1alpha1.Truncate(p.Message, MaxProgressMessageBytes), p.Done, liveFor.Seconds()).Scan(&n, &other)
	})
	if err = noAnswer(ctx, bounded, err); err != nil {
		if IsConfigurationError(err) { // a schema before 00015, or a login granted before it
			return false, -1, fmt.Errorf("publishing the progress of shard %d of run %s (the login needs the privileges runledger migrate --grant-to gives, on runledger.shard_progress too): %w", p.Shard, uid, err)
		}
		return false, -1, fmt.Errorf("publishing the progress of shard %d of run %s: %w", p.Shard, uid, err)
	}
	if other == nil {
		return n == 1, -1, nil
	}
	return n == 1, int(*other), nil
}

// RunProgress is every shard row of run uid, by shard.
func (s *Store) RunProgress(ctx context.Context, uid string) ([]ShardProgress, error) {
	var out []ShardProgress
	err := s.pinned(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlRunProgress, uid)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ShardProgress, error) {
			var p ShardProgress
			var age float64
			err := r.Scan(&p.Shard, &p.Attempt, &p.Total, &p.Completed, &p.AlreadyHandled, &p.Failed, &p.PayloadChanged, &p.Message, &p.Done, &age)
			p.Age = time.Duration(age * float64(time.Second))
			return p, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the progress of run %s: %w", uid, err)
	}
	return out, nil
}

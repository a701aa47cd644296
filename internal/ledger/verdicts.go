package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// RunRecord is a run as the ledger database knows it: its batch's header
// (runledger.batch_run), which the first shard of every run writes.
type RunRecord struct {
	UID, Namespace, Name string
	// Source is BatchSourceQuery (its rows are kept in runledger.batch
	// until pruned) or BatchSourceStatic (inline items or a ConfigMap: only
	// a digest is kept).
	Source string
	Shards int
	Items  int64
	// Digest of a static batch's items (empty for a query's, or a batch
	// fixed before digests were recorded).
	Digest  string
	Created time.Time
	Pruned  *time.Time
}

// FindRuns returns the runs named namespace/name, the latest first (a run
// deleted and created again under its name is another run, of another uid).
func (s *Store) FindRuns(ctx context.Context, namespace, name string) ([]RunRecord, error) {
	out, err := s.runRecords(ctx, sqlFindRuns, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("looking up run %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// RecentRuns returns the runs of namespace ("" for all) whose batch was
// fixed at since or later (their first shard started then), the latest
// first: the runs an incident at since or later may have touched.
func (s *Store) RecentRuns(ctx context.Context, namespace string, since time.Time) ([]RunRecord, error) {
	out, err := s.runRecords(ctx, sqlRecentRuns, since, namespace)
	if err != nil {
		return nil, fmt.Errorf("looking up the runs since %s: %w", since.UTC().Format(time.RFC3339), err)
	}
	return out, nil
}

func (s *Store) runRecords(ctx context.Context, q string, args ...any) ([]RunRecord, error) {
	var out []RunRecord
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunRecord, error) {
			var r RunRecord
			err := row.Scan(&r.UID, &r.Namespace, &r.Name, &r.Source, &r.Shards, &r.Items, &r.Digest, &r.Created, &r.Pruned)
			return r, err
		})
		return err
	})
	return out, err
}

// RunRef names the run that wrote a ledger row.
type RunRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// ItemVerdict is one item of a run and its current verdict there.
type ItemVerdict struct {
	Key
	Outcome Outcome
	// Completed: the run's row (Holder is the run itself); AlreadyHandled:
	// the committed row of the run that holds the key.
	Holder  RunRef
	Shard   int
	Attempt int
	// At: when the row was committed, or the item failed.
	At time.Time
	// State of a completed item's row: committed, or superseded since (by
	// a later run that reprocessed the key).
	State string
	// A failed item's record: the copies of the key counted failed, the
	// class and error, the payload's digest.
	Copies        int
	Class, Error  string
	PayloadDigest *string
	// PayloadChanged (AlreadyHandled): a copy of the key in the run's batch
	// has a payload other than the holding row's (as the claim compares).
	PayloadChanged bool
}

// ErrBatchNotKept: the run's batch was inline items or a ConfigMap, whose
// items the ledger database does not keep (only their digest): which of them
// another run held cannot be read from it, only from the items given
// (RunItemsOf).
var ErrBatchNotKept = errors.New("the run's batch (inline items or a ConfigMap) is not kept in the ledger database, only its digest")

// ErrBatchPruned: runledger prune deleted the run's batch.
var ErrBatchPruned = errors.New("the run's batch was pruned (runledger prune)")

// RunItems calls fn with run's items of the outcomes asked, in key order,
// each outcome in turn (Completed, Failed, AlreadyHandled): a completed item
// is a ledger row of the run, a failed one its failure record, an already
// handled one a key of its batch whose committed row another run wrote
// (listed once however often the batch repeats it, and not when the run
// failed it: its verdict there is Failed). AlreadyHandled needs the
// batch kept in the database (a query source's, until pruned): otherwise
// ErrBatchNotKept or ErrBatchPruned, after the other outcomes.
func (s *Store) RunItems(ctx context.Context, run RunRecord, outcomes []Outcome, fn func(ItemVerdict) error) error {
	return s.RunItemsOf(ctx, run, nil, outcomes, fn)
}

// RunItemsOf is RunItems for a run of inline items or a ConfigMap (source
// BatchSourceStatic) whose items are given as batch, which the caller
// checked against run.Digest: its already handled items are read from them.
// A nil batch is RunItems.
func (s *Store) RunItemsOf(ctx context.Context, run RunRecord, batch []Item, outcomes []Outcome, fn func(ItemVerdict) error) error {
	for _, o := range outcomes {
		var err error
		switch o {
		case Completed:
			err = s.eachItem(ctx, sqlRunCompleted, run.UID, func(row pgx.Rows, v *ItemVerdict) error {
				v.Outcome, v.Holder = Completed, RunRef{Namespace: run.Namespace, Name: run.Name, UID: run.UID}
				return row.Scan(&v.Entity, &v.Occurrence, &v.Shard, &v.Attempt, &v.At, &v.State)
			}, fn)
		case Failed:
			err = s.eachItem(ctx, sqlRunFailed, run.UID, func(row pgx.Rows, v *ItemVerdict) error {
				v.Outcome = Failed
				return row.Scan(&v.Entity, &v.Occurrence, &v.Shard, &v.Attempt, &v.At, &v.Copies, &v.Class, &v.Error, &v.PayloadDigest)
			}, fn)
		case AlreadyHandled:
			err = s.alreadyHandled(ctx, run, batch, fn)
		default:
			return fmt.Errorf("listing items: no such outcome %s", o)
		}
		if err != nil {
			return fmt.Errorf("listing the %s items of run %s/%s (%s): %w", o, run.Namespace, run.Name, run.UID, err)
		}
	}
	return nil
}

// alreadyHandled lists run's already handled items: from its batch kept in
// the database (a query's), or from batch (a static run's).
func (s *Store) alreadyHandled(ctx context.Context, run RunRecord, batch []Item, fn func(ItemVerdict) error) error {
	q, args := sqlRunAlreadyHandled, []any(nil)
	switch {
	case run.Source == BatchSourceStatic && batch != nil:
		entities, occurrences, payloads := make([]string, len(batch)), make([]string, len(batch)), make([]*string, len(batch))
		for i, it := range batch {
			entities[i], occurrences[i] = it.Entity, it.Occurrence
			if it.Payload != nil {
				p := string(it.Payload)
				payloads[i] = &p
			}
		}
		q, args = sqlStaticAlreadyHandled, []any{entities, occurrences, payloads}
	case run.Source != BatchSourceQuery:
		return ErrBatchNotKept
	case batch != nil:
		return fmt.Errorf("the run's batch is a query's, kept in the ledger database: no items may be given for it")
	case run.Pruned != nil:
		return ErrBatchPruned
	}
	return s.eachItem(ctx, q, run.UID, func(row pgx.Rows, v *ItemVerdict) error {
		v.Outcome = AlreadyHandled
		return row.Scan(&v.Entity, &v.Occurrence, &v.Holder.Namespace, &v.Holder.Name, &v.Holder.UID, &v.Shard, &v.Attempt, &v.At, &v.PayloadChanged)
	}, fn, args...)
}

// eachItem runs q for uid (then args) in a read-only transaction under the Store's
// bounds and calls fn with each row scanned by scan.
func (s *Store) eachItem(ctx context.Context, q, uid string, scan func(pgx.Rows, *ItemVerdict) error, fn func(ItemVerdict) error, args ...any) error {
	return pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q, append([]any{uid}, args...)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var v ItemVerdict
			if err := scan(rows, &v); err != nil {
				return err
			}
			if err := fn(v); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// KeyRow is a ledger row of a key: the committed one, or a superseded one
// (history).
type KeyRow struct {
	Run        RunRef     `json:"run"`
	Shard      int        `json:"shard"`
	Attempt    int        `json:"attempt"`
	State      string     `json:"state"`
	Committed  time.Time  `json:"committedAt"`
	Superseded *time.Time `json:"supersededAt,omitempty"`
}

// KeyFailure is a run's failure record of a key.
type KeyFailure struct {
	Run     RunRef    `json:"run"`
	Shard   int       `json:"shard"`
	Attempt int       `json:"attempt"`
	Copies  int       `json:"copies"`
	Class   string    `json:"class"`
	Error   string    `json:"error"`
	At      time.Time `json:"failedAt"`
}

// KeyHistory is what the ledger database knows of a key.
type KeyHistory struct {
	// Rows: its committed row (at most one: the rule) and its superseded
	// rows (not yet pruned), newest first.
	Rows []KeyRow
	// Retired: the runs that committed the key and had their row
	// superseded (runledger.ledger_retired; kept when the row is pruned).
	Retired []string
	// Failures: the runs in which the key's item is failed now.
	Failures []KeyFailure
}

// Key returns the history of key: a probe of an index each (the rule's for
// its committed row, migration 00016's for its superseded rows and retired
// runs), under the Store's bounds.
func (s *Store) Key(ctx context.Context, key Key) (KeyHistory, error) {
	var h KeyHistory
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlKeyRows, key.Entity, key.Occurrence)
		if err != nil {
			return err
		}
		if h.Rows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyRow, error) {
			var r KeyRow
			err := row.Scan(&r.Run.Namespace, &r.Run.Name, &r.Run.UID, &r.Shard, &r.Attempt, &r.State, &r.Committed, &r.Superseded)
			return r, err
		}); err != nil {
			return err
		}
		if rows, err = tx.Query(ctx, sqlKeyRetired, key.Entity, key.Occurrence); err != nil {
			return err
		}
		if h.Retired, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		if rows, err = tx.Query(ctx, sqlKeyFailures, key.Entity, key.Occurrence); err != nil {
			return err
		}
		h.Failures, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyFailure, error) {
			var f KeyFailure
			err := row.Scan(&f.Run.Namespace, &f.Run.Name, &f.Run.UID, &f.Shard, &f.Attempt, &f.Copies, &f.Class, &f.Error, &f.At)
			return f, err
		})
		return err
	})
	if err != nil {
		return h, fmt.Errorf("reading the history of key %s: %w", key, err)
	}
	return h, nil
}

package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runledger/runledger/api/v1alpha1"
)

// KeyProof is one distinct key of a run's batch and what the ledger holds
// for it now (ProveRun).
type KeyProof struct {
	Key
	// NullKey: a key part of the batch's row is NULL (a query row that could
	// not become an item; Key holds "" for it).
	NullKey bool
	// Copies of the key in the batch (its rows, repeats included).
	Copies int64
	// Holder is the run whose committed row holds the key now (nil: no
	// row does), HeldSince when that row was committed.
	Holder    *RunRef
	HeldSince time.Time
	// Own: the run committed the key itself, its row committed still, or
	// superseded since by another run's Supersede (ledger_retired).
	Own bool
	// FailedCopies: the copies the run's failure record of the key counts
	// failed (0: no record); Class that record's class.
	FailedCopies int64
	Class        string
}

// ProofVerdict is what the ledger proves of a key for a run.
type ProofVerdict string

const (
	// ProofCompleted: the run committed the key (its first copy; its
	// repeats are already handled).
	ProofCompleted ProofVerdict = "Completed"
	// ProofAlreadyHandled: another run's committed row holds the key.
	ProofAlreadyHandled ProofVerdict = "AlreadyHandled"
	// ProofFailed: the run's failure record counts every copy failed.
	ProofFailed ProofVerdict = "Failed"
	// ProofBadRow: a row that could not become an item (a key part NULL,
	// empty or too long): failed as bad input, its record under the
	// storable form of its key.
	ProofBadRow ProofVerdict = "BadRow"
	// ProofMissing: nothing proves a verdict: no row of the run, no
	// committed row of another run, no failure record (lost, say, with the
	// commits a database failover did not replicate).
	ProofMissing ProofVerdict = "Missing"
	// ProofMismatched: the ledger's records of the key contradict each
	// other or the batch.
	ProofMismatched ProofVerdict = "Mismatched"
)

// KeyVerdict is a key's verdict from the ledger alone, as the worker
// counts it: the copies each count takes, and what is wrong ("" for none).
type KeyVerdict struct {
	Verdict ProofVerdict
	v1alpha1.ItemCounts
	// Missing copies: no verdict of theirs is proven.
	Missing int64
	// BadRows: copies that could not become items and whose failure record
	// is not under this key (RunProof matches them with the records under
	// no key of the batch).
	BadRows int64
	Problem string
}

// Verdict settles p as the worker counts a key's copies: its first copy
// completed (the run's row) or already handled (another run's), its
// repeats already handled, or every copy failed (its record); a copy
// failed as bad input beside them counts in the record too.
func (p KeyProof) Verdict() KeyVerdict {
	v := KeyVerdict{ItemCounts: v1alpha1.ItemCounts{Total: p.Copies, Failed: p.FailedCopies}}
	rest := p.Copies - p.FailedCopies // copies the failure record does not count
	switch {
	case rest < 0:
		v.Verdict, v.Problem = ProofMismatched, fmt.Sprintf("the run's failure record counts %d copies failed, the batch holds %d", p.FailedCopies, p.Copies)
	case p.Own && rest == 0:
		v.Verdict, v.Problem = ProofMismatched, "the run committed the key and its failure record counts every copy failed"
		v.Completed = 1
	case rest == 0:
		v.Verdict = ProofFailed
	case p.NullKey || v1alpha1.KeyPartProblem(p.Entity) != "" || v1alpha1.KeyPartProblem(p.Occurrence) != "":
		v.Verdict, v.BadRows = ProofBadRow, rest
	case p.Own:
		v.Verdict, v.Completed, v.AlreadyHandled = ProofCompleted, 1, rest-1
	case p.Holder != nil:
		v.Verdict, v.AlreadyHandled = ProofAlreadyHandled, rest
	default:
		v.Verdict, v.Missing = ProofMissing, rest
		v.Problem = "no committed row holds the key, and the run has neither a row of it nor a failure record: nothing proves the verdict the run counted"
	}
	return v
}

// RunProof is what the ledger proves of a run's counts (ProveRun).
type RunProof struct {
	// Keys: the distinct keys of the batch; ItemCounts the copies each
	// verdict takes (Total: the batch's rows), Failed every copy the run's
	// failure records count, under a key of the batch or not.
	Keys int64
	v1alpha1.ItemCounts
	// Missing: the copies of Missing keys; Mismatched: the keys whose
	// records contradict each other or the batch.
	Missing, Mismatched int64
	// Records: the run's failure records; Unmatched the copies counted
	// failed by those under no key of the batch, BadRows the rows of the
	// batch that could not become items and have no record under their
	// key (each should be one of those).
	Records, Unmatched, BadRows int64
	// Counted: ProveShard proved the shard's counts by its server's
	// unchanged life, not key by key (Counted); Keys is then unknown (0).
	Counted bool
	// Server: the server, and its life, ProveShard read the proof on, in
	// its snapshot (AwaitStandby waits for a standby of that one); not
	// Known when the shard's counted Server was not.
	Server ServerIdentity
}

// Proven reports whether every copy of the batch has a proven verdict and
// the records under no key of the batch are its bad rows'.
func (p RunProof) Proven() bool {
	return p.Missing == 0 && p.Mismatched == 0 && p.Unmatched == p.BadRows
}

// ProveRun reads, for every distinct key of run's batch, what the ledger
// holds for it now, and calls fn with it and its verdict, in key order:
// the batch is the one kept in the database (a query's), or batch for a
// run of inline items or a ConfigMap (BatchSourceStatic), which the caller
// checked against run.Digest. One statement over the batch and one over
// the run's failure records, in one read-only snapshot under the Store's
// bounds. A pruned batch is ErrBatchPruned (its failure records went with
// it), a static one not given ErrBatchNotKept.
func (s *Store) ProveRun(ctx context.Context, run RunRecord, batch []Key, fn func(KeyProof, KeyVerdict) error) (RunProof, error) {
	q, args := sqlProveKeptBatch, []any{run.UID}
	switch {
	case run.Pruned != nil:
		return RunProof{}, ErrBatchPruned
	case run.Source == BatchSourceStatic && batch == nil:
		return RunProof{}, ErrBatchNotKept
	case run.Source == BatchSourceStatic:
		entities, occurrences := keyColumns(batch)
		q, args = sqlProveGivenBatch, append(args, entities, occurrences)
	case batch != nil:
		return RunProof{}, fmt.Errorf("proving run %s/%s: its batch is a query's, kept in the ledger database: no items may be given for it", run.Namespace, run.Name)
	}
	var p RunProof
	var matched int64
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedSnapshot+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		p, matched = RunProof{}, 0
		if err := tx.QueryRow(ctx, sqlProveFailures, run.UID).Scan(&p.Records, &p.Failed); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			k, err := scanKeyProof(rows)
			if err != nil {
				return err
			}
			v := k.Verdict()
			p.add(v)
			matched += k.FailedCopies
			if err := fn(k, v); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if err != nil {
		return RunProof{}, fmt.Errorf("proving run %s/%s (%s) from the ledger: %w", run.Namespace, run.Name, run.UID, err)
	}
	p.Unmatched = p.Failed - matched
	return p, nil
}

// Counted is what a shard counted in a pass over its batch, for
// ProveShard: Server, the ledger's server as read before the pass's first
// read of the ledger.
type Counted struct {
	Server ServerIdentity
	v1alpha1.ItemCounts
}

// ProveShard is ProveRun for shard shard of run runUID's batch, in counts
// only, for the worker before it reports the shard done: the shard's part
// of the batch kept in the database (kept), or the shard's keys given
// (static, the copies of a key each given), and the failure records the
// shard wrote. One read-only snapshot, all on the server.
//
// When the server is the same life of the same server as when the pass
// began (counted.Server: not restarted, not recovered from a crash, not
// another server or timeline), nothing the pass committed or read since
// can have been lost: a running server loses no committed row. The shard's
// counts are then proven by that and by counts on the server (its rows as
// many as it counted completed, the batch's items as many as it counted, no
// failure record), with no key read again (Counted).
// Otherwise, or with a failure, each key is proven: one probe of the rule's
// index per key tells its holder and whether it is the run's own (whatever
// the planner's statistics: sqlProveShardSelect); only the keys that are
// not plainly held (a failure record, no holder) come back one by one. A
// nil counted always proves key by key.
func (s *Store) ProveShard(ctx context.Context, runUID string, shard int, kept bool, static []Key, counted *Counted) (RunProof, error) {
	q, args := sqlProveKeptShard, []any{runUID, shard}
	if !kept {
		entities, occurrences := keyColumns(static)
		q, args = sqlProveGivenShard, append(args, entities, occurrences)
	}
	var p RunProof
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedSnapshot+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		p = RunProof{}
		if counted != nil && counted.Server.Known() {
			id, err := scanServerIdentity(tx.QueryRow(ctx, sqlServerIdentity))
			if err != nil {
				return err
			}
			p.Server = id
		}
		if err := tx.QueryRow(ctx, sqlProveShardFailures, runUID, shard).Scan(&p.Records, &p.Failed); err != nil {
			return err
		}
		if ok, err := provenByCounts(ctx, tx, counted, runUID, shard, kept, int64(len(static)), &p); ok || err != nil {
			return err
		}
		return scanShardProof(tx.QueryRow(ctx, q, args...), &p)
	})
	if err != nil {
		return RunProof{}, fmt.Errorf("proving shard %d of run %s from the ledger: %w", shard, runUID, err)
	}
	return p, nil
}

// ShardHeld is what the ledger holds of a shard of a run: its rows
// (committed by any attempt, or committed and superseded since) and the
// items of its part of the batch kept in the database (0 for a static
// batch, whose items the ledger does not keep, or a pruned one).
type ShardHeld struct {
	Rows, BatchItems int64
}

// HeldOfShard reads what the ledger holds of run's shard (run.Shard), the
// rows and batch written under its uid, namespace and name, in one
// read-only statement: for a shard that stops before its proof, whose
// counts would otherwise miss what earlier attempts committed
// (worker.RunShard).
func (s *Store) HeldOfShard(ctx context.Context, run Run) (ShardHeld, error) {
	var h ShardHeld
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqlHeldOfShard, run.UID, run.Shard, run.Namespace, run.Name).Scan(&h.Rows, &h.BatchItems)
	})
	if err != nil {
		return ShardHeld{}, fmt.Errorf("reading what the ledger holds of shard %d of run %s/%s: %w", run.Shard, run.Namespace, run.Name, err)
	}
	return h, nil
}

// provenByCounts makes p the shard's counts c when they are proven without
// reading each key again (ProveShard): the server is c.Server's life, the
// shard has no failure record and counted none, its rows in the ledger are
// as many as it counted completed (one per key: the rule), and its batch
// (kept: read again; otherwise the static items given) has as many items as
// it counted, each with a verdict.
func provenByCounts(ctx context.Context, tx pgx.Tx, c *Counted, runUID string, shard int, kept bool, static int64, p *RunProof) (bool, error) {
	if c == nil || !c.Server.Known() || !p.Server.Same(c.Server) || c.Failed != 0 || p.Records != 0 || c.Completed+c.AlreadyHandled != c.Total {
		return false, nil
	}
	var own int64
	if err := tx.QueryRow(ctx, sqlShardOwnRows, runUID, shard).Scan(&own); err != nil {
		return false, err
	}
	items := static
	if kept {
		if err := tx.QueryRow(ctx, sqlShardBatchItems, runUID, shard).Scan(&items); err != nil {
			return false, err
		}
	}
	if items != c.Total || own != c.Completed {
		return false, nil
	}
	p.ItemCounts = v1alpha1.ItemCounts{Total: c.Total, Completed: c.Completed, AlreadyHandled: c.AlreadyHandled}
	p.Counted = true
	return true, nil
}

// scanShardProof adds sqlProveShardSelect's row to p: its plainly held
// keys as KeyProof.Verdict counts them (the run's own: its first copy
// completed, repeats already handled; another run's: every copy already
// handled), every other key through Verdict itself.
func scanShardProof(row pgx.Row, p *RunProof) error {
	var ownKeys, ownCopies, otherKeys, otherCopies int64
	var entities, occurrences, classes []*string
	var copies, failed []*int64
	var held, own []bool
	if err := row.Scan(&ownKeys, &ownCopies, &otherKeys, &otherCopies, &entities, &occurrences, &copies, &held, &own, &failed, &classes); err != nil {
		return err
	}
	p.Keys += ownKeys + otherKeys
	p.Total += ownCopies + otherCopies
	p.Completed += ownKeys
	p.AlreadyHandled += ownCopies - ownKeys + otherCopies
	var matched int64
	for i := range entities {
		k := KeyProof{NullKey: entities[i] == nil || occurrences[i] == nil, Copies: *copies[i], Own: own[i]}
		k.Entity, k.Occurrence = deref(entities[i]), deref(occurrences[i])
		if held[i] {
			k.Holder = &RunRef{} // another run's, which the count does not name
		}
		if failed[i] != nil {
			k.FailedCopies, k.Class = *failed[i], deref(classes[i])
		}
		p.add(k.Verdict())
		matched += k.FailedCopies
	}
	p.Unmatched = p.Failed - matched
	return nil
}

// add counts a key's verdict in p (Failed is the records', read apart).
func (p *RunProof) add(v KeyVerdict) {
	p.Keys++
	p.Total += v.Total
	p.Completed += v.Completed
	p.AlreadyHandled += v.AlreadyHandled
	p.Missing += v.Missing
	p.BadRows += v.BadRows
	if v.Verdict == ProofMismatched {
		p.Mismatched++
	}
}

func scanKeyProof(rows pgx.Rows) (KeyProof, error) {
	var k KeyProof
	var entity, occurrence, ns, name, uid, class *string
	var since *time.Time
	var failed *int64
	if err := rows.Scan(&entity, &occurrence, &k.Copies, &ns, &name, &uid, &since, &k.Own, &failed, &class); err != nil {
		return k, err
	}
	k.NullKey = entity == nil || occurrence == nil
	k.Entity, k.Occurrence = deref(entity), deref(occurrence)
	if uid != nil {
		k.Holder = &RunRef{Namespace: deref(ns), Name: deref(name), UID: *uid}
		k.HeldSince = *since
	}
	if failed != nil {
		k.FailedCopies, k.Class = *failed, deref(class)
	}
	return k, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

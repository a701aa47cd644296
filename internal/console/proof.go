package console

import (
	"context"
	"errors"
	"strconv"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// maxProblems is how many of the keys a proof does not prove the run's
// page lists (runledger verify lists them all).
const maxProblems = 20

// proofData is the proof of a run on its page: what runledger verify
// computes, from the ledger alone, compared with the run's status.
type proofData struct {
	Asked bool
	Error string
	// Proof is the ledger's counts; Reported the status's (nil when the
	// run has not finished, or the console has no cluster: nothing to
	// compare).
	Proof    ledger.RunProof
	Reported *v1alpha1.ItemCounts
	Rows     []proofRow
	Proven   bool
	Why      []string
	Note     string
	// Problems are the first keys the ledger does not prove, More how
	// many more there are.
	Problems []proofProblem
	More     int
}

// proofRow is one count, reported and proven.
type proofRow struct {
	What     string
	Reported string
	Ledger   int64
	Differs  bool
}

// proofProblem is a key the ledger does not prove.
type proofProblem struct {
	ledger.KeyProof
	Verdict ledger.ProofVerdict
	Problem string
}

// prove proves rec from the ledger as runledger verify does (a kept
// batch: a query's), against run's status when it finished and is the
// ledger's run of that uid.
func (s *Server) prove(ctx context.Context, rec ledger.RunRecord, run *v1alpha1.ProcessingRun) proofData {
	d := proofData{Asked: true}
	p, err := s.o.Store.ProveRun(ctx, rec, nil, func(k ledger.KeyProof, v ledger.KeyVerdict) error {
		if v.Problem == "" {
			return nil
		}
		if len(d.Problems) < maxProblems {
			d.Problems = append(d.Problems, proofProblem{KeyProof: k, Verdict: v.Verdict, Problem: v.Problem})
		} else {
			d.More++
		}
		return nil
	})
	switch {
	case errors.Is(err, ledger.ErrBatchNotKept):
		d.Error = "The run's batch is inline items or a ConfigMap, which the ledger database does not keep (only their digest): prove it with its manifest, kubectl get prun " + rec.Name + " -n " + rec.Namespace + " -o yaml | runledger verify " + rec.Name + " -n " + rec.Namespace + " -f -"
		return d
	case errors.Is(err, ledger.ErrBatchPruned):
		d.Error = "The run's batch was pruned (runledger prune), and its failure records with it: the ledger can no longer prove its status."
		return d
	case err != nil:
		d.Error = s.shown(err)
		return d
	}
	if p.PayloadChanged, err = s.o.Store.PayloadChangedKeys(ctx, rec, nil); err != nil {
		d.Error = s.shown(err)
		return d
	}
	d.Proof = p
	switch {
	case run == nil:
		d.Note = "No status to compare (no cluster, or no such run there): the ledger's counts alone."
	case string(run.UID) != rec.UID:
		d.Note = "The ledger's run of this name has another uid than the ProcessingRun (" + rec.UID + "): its counts alone."
	case !finished(run):
		d.Note = "The run has not finished: its counts are not final, and are not compared."
	default:
		c := run.Status.ItemCounts
		d.Reported = &c
	}
	d.Rows = proofRows(p, d.Reported)
	if d.Reported != nil {
		d.Why = p.Disagreements(*d.Reported, true, true)
	} else if !p.Proven() {
		d.Why = p.Disagreements(p.ItemCounts, false, false)
	}
	d.Proven = len(d.Why) == 0
	return d
}

func proofRows(p ledger.RunProof, rep *v1alpha1.ItemCounts) []proofRow {
	rows := []proofRow{
		{What: "total", Ledger: p.Total}, {What: "completed", Ledger: p.Completed},
		{What: "alreadyHandled", Ledger: p.AlreadyHandled}, {What: "failed", Ledger: p.Failed},
		{What: "payloadChanged", Ledger: p.PayloadChanged},
	}
	if rep != nil {
		for i, n := range []int64{rep.Total, rep.Completed, rep.AlreadyHandled, rep.Failed, rep.PayloadChanged} {
			rows[i].Reported, rows[i].Differs = strconv.FormatInt(n, 10), n != rows[i].Ledger
		}
	}
	return append(rows, proofRow{What: "missing", Ledger: p.Missing, Differs: p.Missing > 0}, proofRow{What: "mismatched", Ledger: p.Mismatched, Differs: p.Mismatched > 0})
}

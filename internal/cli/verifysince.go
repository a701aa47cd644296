package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/phrase"
)

// The state of a run runledger verify --since reports.
const (
	recentProven    = "Proven"
	recentNotProven = "NotProven"
	recentNotKept   = "NotKept" // inline items or a ConfigMap: the ledger keeps only their digest
	recentPruned    = "Pruned"
)

// recentRun is one run of runledger verify --since.
type recentRun struct {
	Run    ledger.RunRef    `json:"run"`
	Source string           `json:"source"`
	Fixed  time.Time        `json:"fixedAt"`
	State  string           `json:"state"`
	Ledger *proofCountsJSON `json:"ledger,omitempty"`
}

// recent proves, from the ledger alone, every run whose batch was fixed
// within --since: after an incident, which runs' items the ledger no longer
// holds. No counts are compared (each run's own: runledger verify RUN).
func (o *verifyOptions) recent(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) > 0:
		return exitcode.BadInput(errors.New("verify --since proves every recent run: give no RUN (runledger verify RUN proves one against its counts)"))
	case o.file != "" || o.summaryFile != "" || cmd.Flags().Changed("expect-completed") || o.uid != "" || o.all:
		return exitcode.BadInput(errors.New("verify --since takes no -f, --summary, --expect-*, --uid or --all: it proves each run from the ledger alone (runledger verify RUN compares one run's counts)"))
	case o.allNamespaces && cmd.Flags().Changed("namespace"):
		return exitcode.BadInput(errors.New("--all-namespaces and --namespace: give one"))
	}
	ns := ""
	if !o.allNamespaces {
		var err error
		if ns, err = namespaceOr(o.namespace); err != nil {
			return err
		}
	}
	pool, secrets, err := openOwnerPool(cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := ledger.NewStore(pool)
	since := time.Now().Add(-o.since)
	runs, err := store.RecentRuns(cmd.Context(), ns, since)
	if err != nil {
		return exitcode.Redact(exitcode.For(err), secrets)
	}
	out := make([]recentRun, 0, len(runs))
	tally := map[string]int{}
	for _, run := range runs {
		r, err := proveRecent(cmd, store, run)
		if err != nil {
			return exitcode.Redact(exitcode.For(err), secrets)
		}
		tally[r.State]++
		out = append(out, r)
	}
	where := "namespace " + ns
	if ns == "" {
		where = "every namespace"
	}
	summary := fmt.Sprintf("%s of %s fixed since %s: %d proven by the ledger, %d not (runledger verify RUN -n NS lists their items), %d not checked (%d inline items or a ConfigMap, whose batch the ledger does not keep: runledger verify RUN -f MANIFEST; %d pruned)",
		phrase.Count(int64(len(out)), "run", "runs"), where, since.UTC().Format(time.RFC3339), tally[recentProven], tally[recentNotProven],
		tally[recentNotKept]+tally[recentPruned], tally[recentNotKept], tally[recentPruned])
	if err := writeRecent(secrets.Writer(cmd.OutOrStdout()), o.output, out, tally[recentNotProven] == 0, summary); err != nil {
		return err
	}
	if tally[recentNotProven] > 0 {
		return &exitcode.Error{Code: v1alpha1.ExitFailed, Err: errors.New(summary)}
	}
	return nil
}

// proveRecent proves one run from the ledger alone, where it keeps the run's batch.
func proveRecent(cmd *cobra.Command, store *ledger.Store, run ledger.RunRecord) (recentRun, error) {
	r := recentRun{Run: ledger.RunRef{Namespace: run.Namespace, Name: run.Name, UID: run.UID}, Source: run.Source, Fixed: run.Created.UTC()}
	switch {
	case run.Pruned != nil:
		r.State = recentPruned
		return r, nil
	case run.Source == ledger.BatchSourceStatic:
		r.State = recentNotKept
		return r, nil
	}
	p, err := store.ProveRun(cmd.Context(), run, nil, func(ledger.KeyProof, ledger.KeyVerdict) error { return nil })
	if err != nil {
		return r, err
	}
	r.Ledger = &proofCountsJSON{ItemCounts: p.ItemCounts, Missing: p.Missing, Mismatched: p.Mismatched, Keys: p.Keys, FailureRecords: p.Records}
	r.State = recentNotProven
	if p.Proven() {
		r.State = recentProven
	}
	return r, nil
}

func writeRecent(w io.Writer, output string, runs []recentRun, proven bool, summary string) error {
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(struct {
			Runs    []recentRun `json:"runs"`
			Proven  bool        `json:"proven"`
			Summary string      `json:"summary"`
		}{runs, proven, summary}); err != nil {
			return fmt.Errorf("writing the proofs: %w", err)
		}
		return nil
	}
	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(t, "NAMESPACE\tRUN\tFIXED\tSTATE\tTOTAL\tCOMPLETED\tALREADY HANDLED\tFAILED\tMISSING\tMISMATCHED")
	for _, r := range runs {
		counts := "-\t-\t-\t-\t-\t-"
		if l := r.Ledger; l != nil {
			counts = fmt.Sprintf("%d\t%d\t%d\t%d\t%d\t%d", l.Total, l.Completed, l.AlreadyHandled, l.Failed, l.Missing, l.Mismatched)
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\n", cell(r.Run.Namespace), cell(r.Run.Name), r.Fixed.Format(time.RFC3339), r.State, counts)
	}
	fmt.Fprintln(t)
	fmt.Fprintln(t, summary)
	if err := t.Flush(); err != nil {
		return fmt.Errorf("writing the proofs: %w", err)
	}
	return nil
}

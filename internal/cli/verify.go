package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

const verifyLong = `Prove a finished run's status from the ledger database alone: run it after
a database failover or any incident that may have lost commits (with
asynchronous replication a failover loses the last ones, and a run may have
reported items completed that the surviving database never held).

For every distinct key of the run's batch it reads the committed row that
holds the key now and the run's failure record, and settles the key as the
worker counts it: Completed (the run's row, or its row another run's
Supersede retired since; its repeats already handled), AlreadyHandled
(another run's row), Failed (the run's failure record counts every copy),
or Missing (no row of the run, no row of another run, no failure record:
nothing proves the verdict the run counted), Mismatched (records that
contradict each other or the batch). It recomputes completed,
alreadyHandled and failed from those, and payloadChanged (the keys another
run holds of which a copy in the batch has another payload, as runledger
items --payload-changed lists them, read after the snapshot), and compares
them with the counts the run reported:

  - the status in the manifest given with -f: what kubectl get prun NAME -o
    yaml prints (the run must be finished: Succeeded or Failed);
  - or --summary FILE: the JSON runledger run --output json printed;
  - or --expect-completed, --expect-already-handled, --expect-failed (and
    --expect-total and --expect-payload-changed, optional).

The ledger database keeps a query's batch (until runledger prune), but only
the digest of inline items or a ConfigMap: for such a run give its manifest
with -f (a ConfigMap's items with --from-file, or the ConfigMap in the
manifest, as runledger run takes them); the items must be the batch the run
fixed (their digest is checked). The same database, connection string and
rules as runledger run; any login that may read schema runledger will do.
Everything is read in one read-only snapshot, one statement over the batch.

Output: the Missing and Mismatched keys (every key with --all), then the
counts reported and proven, and one line saying whether the ledger proves
the run's status; with --output json one JSON object:

  {"run":{...},"reported":{...},"items":[{"verdict":"Missing","entity":"...",
   "occurrence":"...","copies":1,"problem":"..."}],"ledger":{"total":N,
   "completed":N,"alreadyHandled":N,"failed":N,"missing":N,...},
   "proven":false,"summary":"..."}

With --since DURATION instead of RUN it proves every run of the namespace
(or, with --all-namespaces, of every namespace) whose batch was fixed within
that long, from the ledger alone: a table (or JSON object) of the runs, each
Proven (every key has a proven verdict), NotProven (runledger verify RUN lists
its missing and mismatched keys), NotKept (inline items or a ConfigMap: give
its manifest to runledger verify RUN -f) or Pruned; no counts are compared.

Exit status: 0 when the ledger proves the status (every key has a proven
verdict and the counts are the reported ones; with --since, every run it
checked); 1 when it does not (the line on stderr says why), or for any other
failure; 5 when the ledger database has no run of that name; 2 for bad input (flags, the connection string, no
counts to prove, a run not finished, a manifest whose items are not the
run's batch, a static run without its manifest, a pruned batch).`

type verifyOptions struct {
	batchInput
	namespace, uid, output string
	derived                bool // as itemsOptions'
	all                    bool
	summaryFile            string
	expect                 v1alpha1.ItemCounts
	since                  time.Duration
	allNamespaces          bool
}

func newVerifyCommand() *cobra.Command {
	var o verifyOptions
	cmd := &cobra.Command{
		Use:     "verify (RUN [--namespace NS] [-f MANIFEST|-] [--summary FILE | --expect-completed N --expect-already-handled N --expect-failed N] [--all] | --since DURATION [--namespace NS | --all-namespaces]) [--output table|json]",
		Aliases: []string{"prove"},
		Short:   "Prove a finished run's status from the ledger database alone (after a database failover or incident)",
		Long:    verifyLong,
		Example: `  kubectl get prun june-invoices -n billing -o yaml | runledger verify june-invoices -f - --dsn-file ledger.dsn
  runledger verify june-invoices -n billing --expect-completed 3 --expect-already-handled 1 --expect-failed 0
  runledger run -f june.yaml --output json > june.json; runledger verify june-invoices -f june.yaml --summary june.json
  runledger verify may-refunds -n billing -f refunds.yaml --from-file refunds.jsonl --summary refunds.json --output json
  runledger verify --since 6h --all-namespaces --dsn-file ledger.dsn`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.since > 0 {
				return o.recent(cmd, args)
			}
			if len(args) != 1 {
				return exitcode.BadInput(errors.New("verify needs RUN, the run to prove, or --since DURATION to prove every recent run"))
			}
			return o.run(cmd, args[0])
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.namespace, "namespace", "n", "", "the run's namespace (default: the kubeconfig context's, as kubectl's, else default)")
	f.StringVar(&o.uid, "uid", "", "the run's metadata.uid, when several runs had that name")
	f.StringVarP(&o.file, "filename", "f", "", "the run's manifest (YAML or JSON; - for stdin): its status holds the counts to prove (kubectl get prun NAME -o yaml), and for a run of inline items or a ConfigMap its items are the batch")
	f.StringVar(&o.fromFile, "from-file", "", "with -f: JSON Lines file with the items of its batch.configMapRef (default: the ConfigMap in the manifest)")
	f.StringVar(&o.summaryFile, "summary", "", "the counts to prove: the JSON object runledger run --output json printed (- for stdin)")
	f.Int64Var(&o.expect.Completed, "expect-completed", 0, "the counts to prove: completed")
	f.Int64Var(&o.expect.AlreadyHandled, "expect-already-handled", 0, "the counts to prove: alreadyHandled")
	f.Int64Var(&o.expect.Failed, "expect-failed", 0, "the counts to prove: failed")
	f.Int64Var(&o.expect.Total, "expect-total", 0, "the counts to prove: total (optional)")
	f.Int64Var(&o.expect.PayloadChanged, "expect-payload-changed", 0, "the counts to prove: payloadChanged (optional)")
	f.BoolVar(&o.all, "all", false, "list every key of the batch with its verdict and holder, not only the missing and mismatched ones")
	f.StringVarP(&o.output, "output", "o", "table", "table or json")
	f.DurationVar(&o.since, "since", 0, "instead of RUN: prove every run whose batch was fixed within this long (e.g. 6h), from the ledger alone, after an incident: which runs' items the ledger no longer holds (no counts compared; runs of inline items or a ConfigMap are listed, not checked)")
	f.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "with --since: the runs of every namespace")
	cmd.MarkFlagsRequiredTogether("expect-completed", "expect-already-handled", "expect-failed")
	cmd.MarkFlagsMutuallyExclusive("summary", "expect-completed")
	cmd.MarkFlagsMutuallyExclusive("summary", "expect-total")
	cmd.MarkFlagsMutuallyExclusive("summary", "expect-payload-changed")
	addDatabaseFlags(cmd, "PostgreSQL connection string of the ledger")
	return cmd
}

// reported is the counts a run reported and where they were read.
type reported struct {
	counts v1alpha1.ItemCounts
	from   string
	// total, payloadChanged: the counts hold one to compare.
	total, payloadChanged bool
}

func (o *verifyOptions) run(cmd *cobra.Command, name string) error {
	if err := checkOutput(o.output, "table", "json"); err != nil {
		return err
	}
	batch, m, err := o.given(cmd, name)
	if err != nil {
		return err
	}
	rep, err := o.reported(cmd, m)
	if err != nil {
		return err
	}
	if o.namespace, err = namespaceOr(o.namespace); err != nil {
		return err
	}
	store, secrets, run, done, err := openRun(cmd, "proving", o.namespace, name, runPick{uid: o.uid, derived: o.derived}, batch)
	if err != nil {
		return err
	}
	defer done()
	w := newProofWriter(secrets.Writer(cmd.OutOrStdout()), o.output, run, rep)
	proof, err := store.ProveRun(cmd.Context(), run, keysOf(batch), func(k ledger.KeyProof, v ledger.KeyVerdict) error {
		if o.all || v.Problem != "" {
			return w.item(k, v)
		}
		return nil
	})
	switch {
	case errors.Is(err, ledger.ErrBatchNotKept):
		return exitcode.BadInput(fmt.Errorf("proving run %s/%s: %w; give its manifest: kubectl get prun %s -n %s -o yaml | runledger verify %s -n %s -f - (a ConfigMap's items with --from-file)",
			run.Namespace, run.Name, err, run.Name, run.Namespace, run.Name, run.Namespace))
	case errors.Is(err, ledger.ErrBatchPruned):
		return exitcode.BadInput(fmt.Errorf("proving run %s/%s: %w, and its failure records with it: the ledger can no longer prove its status", run.Namespace, run.Name, err))
	case err != nil:
		return exitcode.Redact(exitcode.For(err), secrets)
	}
	if proof.PayloadChanged, err = store.PayloadChangedKeys(cmd.Context(), run, batch); err != nil {
		return exitcode.Redact(exitcode.For(err), secrets)
	}
	verdict := judge(run, rep, proof)
	if err := w.close(proof, verdict); err != nil {
		return exitcode.Redact(exitcode.For(err), secrets)
	}
	if !verdict.proven {
		return &exitcode.Error{Code: v1alpha1.ExitFailed, Err: errors.New(verdict.summary)}
	}
	return nil
}

// given reads the manifest of -f (nil without one): its static batch's
// items (nil for a query's), checked to be run namespace/name's; its uid
// picks the run unless --uid does.
func (o *verifyOptions) given(cmd *cobra.Command, name string) ([]ledger.Item, *manifest, error) {
	switch {
	case o.file == "" && o.fromFile != "":
		return nil, nil, exitcode.BadInput(errors.New("--from-file needs the run's manifest (-f)"))
	case o.file == "":
		return nil, nil, nil
	case o.summaryFile == "-" && (o.file == "-" || o.fromFile == "-"):
		return nil, nil, exitcode.BadInput(errors.New("--summary - and -f - or --from-file - cannot both read stdin"))
	}
	o.stdin = cmd.InOrStdin()
	m, plan, err := o.plan(cmd.Context())
	if err != nil {
		return nil, nil, err
	}
	if !cmd.Flags().Changed("namespace") {
		o.namespace = plan.Run.Namespace
	}
	if plan.Run.Namespace != o.namespace || plan.Run.Name != name {
		return nil, nil, exitcode.BadInput(fmt.Errorf("%s is run %s/%s, not %s/%s", m.source, plan.Run.Namespace, plan.Run.Name, o.namespace, name))
	}
	if o.uid == "" {
		o.uid, o.derived = plan.Run.UID, m.run.UID == "" // its metadata.uid, or the one runledger run derives
	}
	if static, ok := plan.Source.(*worker.StaticSource); ok {
		return static.Items(), m, nil
	}
	return nil, m, nil
}

// reported reads the counts to prove: the manifest's status, --summary or
// --expect-*, exactly one of them.
func (o *verifyOptions) reported(cmd *cobra.Command, m *manifest) (reported, error) {
	var out []reported
	if m != nil && m.status != nil && m.status.Phase != "" {
		st := m.status
		if st.Phase != v1alpha1.RunSucceeded && st.Phase != v1alpha1.RunFailed {
			return reported{}, exitcode.BadInput(fmt.Errorf("%s: the run is not finished (status.phase %s): its counts are not final; verify it once it has Succeeded or Failed", m.source, st.Phase))
		}
		out = append(out, reported{counts: st.ItemCounts, from: "the status in " + m.source, total: true, payloadChanged: true})
	}
	if o.summaryFile != "" {
		c, err := readSummary(o.summaryFile, cmd.InOrStdin())
		if err != nil {
			return reported{}, exitcode.BadInput(err)
		}
		out = append(out, reported{counts: c, from: "--summary " + o.summaryFile, total: true, payloadChanged: true})
	}
	if cmd.Flags().Changed("expect-completed") {
		out = append(out, reported{counts: o.expect, from: "--expect-*", total: cmd.Flags().Changed("expect-total"),
			payloadChanged: cmd.Flags().Changed("expect-payload-changed")})
	} else if cmd.Flags().Changed("expect-total") || cmd.Flags().Changed("expect-payload-changed") {
		return reported{}, exitcode.BadInput(errors.New("--expect-total and --expect-payload-changed need --expect-completed, --expect-already-handled and --expect-failed"))
	}
	switch len(out) {
	case 0:
		return reported{}, exitcode.BadInput(errors.New("no counts to prove: give the run's manifest with its status (kubectl get prun NAME -n NS -o yaml | runledger verify NAME -f -), the JSON runledger run printed (--summary FILE), or --expect-completed, --expect-already-handled and --expect-failed"))
	case 1:
		if c := out[0].counts; c.Negative() {
			return reported{}, exitcode.BadInput(fmt.Errorf("%s: a count is negative", out[0].from))
		}
		return out[0], nil
	}
	return reported{}, exitcode.BadInput(fmt.Errorf("counts to prove from both %s and %s: give one", out[0].from, out[1].from))
}

// readSummary reads the counts of runledger run's JSON output.
func readSummary(path string, stdin io.Reader) (v1alpha1.ItemCounts, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return v1alpha1.ItemCounts{}, fmt.Errorf("reading --summary: %w", err)
	}
	var s struct {
		Total, Completed, AlreadyHandled, Failed *int64
		PayloadChanged                           int64 // omitted when 0
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return v1alpha1.ItemCounts{}, fmt.Errorf("--summary %s: not the JSON object runledger run --output json prints: %w", path, err)
	}
	if s.Total == nil || s.Completed == nil || s.AlreadyHandled == nil || s.Failed == nil {
		return v1alpha1.ItemCounts{}, fmt.Errorf("--summary %s: want the JSON object runledger run --output json prints, with total, completed, alreadyHandled and failed", path)
	}
	return v1alpha1.ItemCounts{Total: *s.Total, Completed: *s.Completed, AlreadyHandled: *s.AlreadyHandled, Failed: *s.Failed, PayloadChanged: s.PayloadChanged}, nil
}

func keysOf(items []ledger.Item) []ledger.Key {
	if items == nil {
		return nil
	}
	keys := make([]ledger.Key, len(items))
	for i, it := range items {
		keys[i] = it.Key
	}
	return keys
}

// judgement is whether the ledger proves the reported counts, in one line.
type judgement struct {
	proven  bool
	summary string
}

// judge compares what the ledger proves of run with what it reported.
func judge(run ledger.RunRecord, rep reported, p ledger.RunProof) judgement {
	why := p.Disagreements(rep.counts, rep.total, rep.payloadChanged)
	id := fmt.Sprintf("run %s/%s (uid %s)", run.Namespace, run.Name, run.UID)
	if len(why) > 0 {
		return judgement{summary: fmt.Sprintf("%s is not proven by the ledger: %s (counts from %s)", id, strings.Join(why, "; "), rep.from)}
	}
	return judgement{proven: true, summary: fmt.Sprintf("%s is proven by the ledger: %d completed, %d already handled, %d failed of %d items, as %s says",
		id, p.Completed, p.AlreadyHandled, p.Failed, p.Total, rep.from)}
}

// proofItemJSON is one key of runledger verify's JSON output.
type proofItemJSON struct {
	Verdict    string         `json:"verdict"`
	Entity     *string        `json:"entity"`
	Occurrence *string        `json:"occurrence"`
	Copies     int64          `json:"copies"`
	HeldBy     *ledger.RunRef `json:"heldBy,omitempty"`
	HeldSince  *time.Time     `json:"heldSince,omitempty"`
	Failed     int64          `json:"failed,omitempty"`
	Class      string         `json:"class,omitempty"`
	Problem    string         `json:"problem,omitempty"`
}

// reportedJSON is the counts to prove in runledger verify's JSON output
// (total absent when none was given).
type reportedJSON struct {
	Total          *int64 `json:"total,omitempty"`
	Completed      int64  `json:"completed"`
	AlreadyHandled int64  `json:"alreadyHandled"`
	Failed         int64  `json:"failed"`
	PayloadChanged *int64 `json:"payloadChanged,omitempty"`
}

// proofCountsJSON is the ledger's side of runledger verify's JSON output.
type proofCountsJSON struct {
	v1alpha1.ItemCounts
	Missing        int64 `json:"missing"`
	Mismatched     int64 `json:"mismatched"`
	Keys           int64 `json:"keys"`
	FailureRecords int64 `json:"failureRecords"`
}

// proofWriter writes the keys as they come, then the counts and verdict.
type proofWriter struct {
	w      io.Writer
	output string
	run    ledger.RunRecord
	rep    reported
	table  *tabwriter.Writer
	enc    *json.Encoder
	n      int
	err    error
}

func newProofWriter(w io.Writer, output string, run ledger.RunRecord, rep reported) *proofWriter {
	pw := &proofWriter{w: w, output: output, run: run, rep: rep}
	if output == "table" {
		pw.table = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		return pw
	}
	pw.enc = json.NewEncoder(w)
	pw.enc.SetEscapeHTML(false)
	counts := reportedJSON{Completed: rep.counts.Completed, AlreadyHandled: rep.counts.AlreadyHandled, Failed: rep.counts.Failed}
	if rep.total {
		counts.Total = &rep.counts.Total
	}
	if rep.payloadChanged {
		counts.PayloadChanged = &rep.counts.PayloadChanged
	}
	head, err := json.Marshal(struct {
		Run      ledger.RunRef `json:"run"`
		Source   string        `json:"source"`
		Reported reportedJSON  `json:"reported"`
		From     string        `json:"reportedIn"`
	}{ledger.RunRef{Namespace: run.Namespace, Name: run.Name, UID: run.UID}, run.Source, counts, rep.from})
	if err == nil {
		_, err = fmt.Fprintf(w, "%s,\"items\":[", strings.TrimSuffix(string(head), "}"))
	}
	pw.fail(err)
	return pw
}

func (pw *proofWriter) fail(err error) {
	if err != nil && pw.err == nil {
		pw.err = fmt.Errorf("writing the proof: %w", err)
	}
}

func (pw *proofWriter) item(k ledger.KeyProof, v ledger.KeyVerdict) error {
	if pw.err != nil {
		return pw.err
	}
	if pw.table != nil {
		if pw.n == 0 {
			fmt.Fprintln(pw.table, "VERDICT\tENTITY\tOCCURRENCE\tCOPIES\tHELD BY\tDETAIL")
		}
		held := "-"
		if k.Holder != nil {
			held = fmt.Sprintf("%s/%s (%s)", k.Holder.Namespace, k.Holder.Name, k.Holder.UID)
		}
		detail := v.Problem
		if detail == "" && k.FailedCopies > 0 {
			detail = fmt.Sprintf("%d failed: %s", k.FailedCopies, k.Class)
		}
		_, err := fmt.Fprintf(pw.table, "%s\t%s\t%s\t%d\t%s\t%s\n", v.Verdict, keyCell(k.Entity, k.NullKey), keyCell(k.Occurrence, k.NullKey), k.Copies, held, cell(detail))
		pw.fail(err)
	} else {
		out := proofItemJSON{Verdict: string(v.Verdict), Copies: k.Copies, HeldBy: k.Holder, Failed: k.FailedCopies, Class: k.Class, Problem: v.Problem}
		if !k.NullKey {
			out.Entity, out.Occurrence = &k.Entity, &k.Occurrence
		}
		if k.Holder != nil {
			since := k.HeldSince.UTC()
			out.HeldSince = &since
		}
		if pw.n > 0 {
			_, err := io.WriteString(pw.w, ",")
			pw.fail(err)
		}
		pw.fail(pw.enc.Encode(out))
	}
	pw.n++
	return pw.err
}

// keyCell is a key part in the table (a NULL one shown as such).
func keyCell(s string, null bool) string {
	if null && s == "" {
		return "(null)"
	}
	return cell(s)
}

// close writes the counts reported and proven and the verdict.
func (pw *proofWriter) close(p ledger.RunProof, j judgement) error {
	if pw.err != nil {
		return pw.err
	}
	if pw.table == nil {
		tail, err := json.Marshal(struct {
			Ledger  proofCountsJSON `json:"ledger"`
			Proven  bool            `json:"proven"`
			Summary string          `json:"summary"`
		}{proofCountsJSON{ItemCounts: p.ItemCounts, Missing: p.Missing, Mismatched: p.Mismatched, Keys: p.Keys, FailureRecords: p.Records}, j.proven, j.summary})
		if err == nil {
			_, err = fmt.Fprintf(pw.w, "],%s\n", strings.TrimPrefix(string(tail), "{"))
		}
		pw.fail(err)
		return pw.err
	}
	t := pw.table
	if pw.n > 0 {
		fmt.Fprintln(t)
	}
	source := map[string]string{ledger.BatchSourceQuery: "a query's, kept in the ledger", ledger.BatchSourceStatic: "inline items or a ConfigMap, given with -f"}[pw.run.Source]
	fmt.Fprintf(t, "run %s/%s (uid %s): batch of %d items, %d distinct keys (%s)\n", pw.run.Namespace, pw.run.Name, pw.run.UID, p.Total, p.Keys, source)
	fmt.Fprintln(t, "\tREPORTED\tLEDGER")
	rep := pw.rep.counts
	total := "-"
	if pw.rep.total {
		total = fmt.Sprint(rep.Total)
	}
	fmt.Fprintf(t, "total\t%s\t%d\n", total, p.Total)
	fmt.Fprintf(t, "completed\t%d\t%d\n", rep.Completed, p.Completed)
	fmt.Fprintf(t, "alreadyHandled\t%d\t%d\n", rep.AlreadyHandled, p.AlreadyHandled)
	fmt.Fprintf(t, "failed\t%d\t%d\n", rep.Failed, p.Failed)
	changed := "-"
	if pw.rep.payloadChanged {
		changed = fmt.Sprint(rep.PayloadChanged)
	}
	fmt.Fprintf(t, "payloadChanged\t%s\t%d\n", changed, p.PayloadChanged)
	fmt.Fprintf(t, "missing\t-\t%d\n", p.Missing)
	fmt.Fprintf(t, "mismatched\t-\t%d\n", p.Mismatched)
	pw.fail(t.Flush())
	if j.proven {
		_, err := fmt.Fprintln(pw.w, j.summary)
		pw.fail(err)
	}
	return pw.err
}

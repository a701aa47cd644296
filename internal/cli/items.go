package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/redact"
	"github.com/runledger/runledger/internal/worker"
)

const itemsLong = `List a run's items and their verdicts, from the ledger database: the same
database, connection string and rules as runledger run ($RUNLEDGER_DATABASE_URL,
--dsn-file or --dsn). Any login that may read schema runledger will do.

  Completed       the run's ledger rows (state superseded: a later run
                  reprocessed the key since)
  Failed          the run's failure records: the current verdict of each
                  failed key (a later attempt or rerun replaces or removes
                  it), with its class (the error's SQLSTATE, or input,
                  processor-refused, processor-retries-exhausted,
                  processor-unavailable, effect-sandbox, unproven), its
                  error (cut to 1024 bytes) and the copies of the key the
                  batch held
  AlreadyHandled  the keys of the run's batch another run had committed,
                  with that run, and whether the payload a copy came with
                  differs from the holding row's ("payloadChanged": true;
                  counted in status.payloadChanged). The ledger database
                  keeps a query's batch (until runledger prune), but only the
                  digest of inline items or a ConfigMap: for such a run give
                  its manifest with -f (and a ConfigMap's items with
                  --from-file, as runledger run takes them), which must be
                  the batch the run fixed (its digest is checked)

--payload-changed lists the repeats whose payload changed: the already
handled items whose payload differs (onPayloadChange: Report) and the failed
ones of class payload-changed (onPayloadChange: Fail). A key the run failed
is listed as Failed only.

A key repeated in the batch is listed once. RUN is the run's name in
--namespace; a run created again under the same name is another run (its
own uid): the latest is listed, --uid picks another.

Output: a table, or with --output json one JSON array, with --output jsonl
one JSON object a line:

  {"verdict":"Failed","entity":"...","occurrence":"...","shard":N,"attempt":N,
   "time":"...","class":"23503","error":"...","copies":1,"payloadDigest":"..."}
  {"verdict":"AlreadyHandled",...,"heldBy":{"namespace":"...","name":"...","uid":"..."},
   "payloadChanged":true}

Exit status: 0 when listed; 5 when the ledger database has no run of that
name; 2 for bad input (flags, the connection string, a manifest whose items
are not the run's batch, --already-handled or --payload-changed for a run
whose batch is neither kept nor given); 1 for any other failure.`

type itemsOptions struct {
	batchInput
	namespace, uid, output string
	// derived: uid is the one runledger run derives from a manifest
	// without metadata.uid (runPick).
	derived           bool
	failed, completed bool
	alreadyHandled    bool
	payloadChanged    bool
}

func newItemsCommand() *cobra.Command {
	var o itemsOptions
	cmd := &cobra.Command{
		Use:   "items RUN [--namespace NS] [--failed|--completed|--already-handled|--payload-changed] [--output table|json|jsonl]",
		Short: "List a run's items and their verdicts from the ledger database (which failed and why, which another run held)",
		Long:  itemsLong,
		Example: `  runledger items june-invoices -n billing --failed --dsn-file ledger.dsn
  runledger items june-invoices -n billing --failed --output jsonl | jq -r .entity
  runledger items june-invoices -n billing --already-handled --output json
  runledger items june-invoices -n billing --payload-changed
  kubectl get prun may-refunds -n billing -o yaml | runledger items may-refunds -n billing -f - --already-handled`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	f := cmd.Flags()
	f.StringVarP(&o.namespace, "namespace", "n", "", "the run's namespace (default: the kubeconfig context's, as kubectl's, else default)")
	f.StringVar(&o.uid, "uid", "", "the run's metadata.uid, when several runs had that name")
	f.BoolVar(&o.failed, "failed", false, "only the failed items")
	f.BoolVar(&o.completed, "completed", false, "only the completed items")
	f.BoolVar(&o.alreadyHandled, "already-handled", false, "only the items another run had committed")
	f.BoolVar(&o.payloadChanged, "payload-changed", false, "only the repeats whose payload differs from the holding row's (already handled, or failed of class payload-changed)")
	f.StringVarP(&o.output, "output", "o", "table", "table, json or jsonl")
	f.StringVarP(&o.file, "filename", "f", "", "the run's manifest (YAML or JSON; - for stdin), for a run of inline items or a ConfigMap: its already handled items are read from it")
	f.StringVar(&o.fromFile, "from-file", "", "with -f: JSON Lines file with the items of its batch.configMapRef (default: the ConfigMap in the manifest)")
	cmd.MarkFlagsMutuallyExclusive("failed", "completed", "already-handled", "payload-changed")
	addDatabaseFlags(cmd, "PostgreSQL connection string of the ledger")
	return cmd
}

// outcomes are the verdicts asked for, and whether the user named one.
func (o *itemsOptions) outcomes() ([]ledger.Outcome, bool) {
	switch {
	case o.failed:
		return []ledger.Outcome{ledger.Failed}, true
	case o.completed:
		return []ledger.Outcome{ledger.Completed}, true
	case o.alreadyHandled:
		return []ledger.Outcome{ledger.AlreadyHandled}, true
	case o.payloadChanged:
		return []ledger.Outcome{ledger.Failed, ledger.AlreadyHandled}, true
	}
	return []ledger.Outcome{ledger.Completed, ledger.Failed, ledger.AlreadyHandled}, false
}

func (o *itemsOptions) run(cmd *cobra.Command, name string) error {
	if err := checkOutput(o.output, "table", "json", "jsonl"); err != nil {
		return err
	}
	batch, err := o.givenBatch(cmd, name)
	if err != nil {
		return err
	}
	if o.namespace, err = namespaceOr(o.namespace); err != nil {
		return err
	}
	store, secrets, run, done, err := openRun(cmd, "listing", o.namespace, name, runPick{uid: o.uid, derived: o.derived}, batch)
	if err != nil {
		return err
	}
	defer done()
	outcomes, named := o.outcomes()
	w := newItemWriter(secrets.Writer(cmd.OutOrStdout()), o.output)
	write := w.write
	if o.payloadChanged {
		write = func(v ledger.ItemVerdict) error {
			if v.PayloadChanged || v.Outcome == ledger.Failed && v.Class == ledger.ClassPayloadChanged {
				return w.write(v)
			}
			return nil
		}
	}
	err = store.RunItemsOf(cmd.Context(), run, batch, outcomes, write)
	if errors.Is(err, ledger.ErrBatchNotKept) || errors.Is(err, ledger.ErrBatchPruned) {
		if named {
			w.close()
			return exitcode.BadInput(fmt.Errorf("listing the already handled items of run %s/%s: %w; its completed and failed items are listed (--completed, --failed)%s", run.Namespace, run.Name, err, giveManifest(err)))
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "runledger: note: the already handled items of run %s/%s are not listed: %v%s\n", run.Namespace, run.Name, err, giveManifest(err))
		err = nil
	}
	if cerr := w.close(); err == nil {
		err = cerr
	}
	return exitcode.Redact(exitcode.For(err), secrets)
}

// openRun opens the ledger and finds the run namespace/name (the one of
// uid, if given) whose batch batch, if given, is (checkGiven): what items
// and verify do first. done closes the ledger's pool.
func openRun(cmd *cobra.Command, verb, namespace, name string, pick runPick, batch []ledger.Item) (
	store *ledger.Store, secrets *redact.Redactor, run ledger.RunRecord, done func(), err error) {
	pool, secrets, err := openOwnerPool(cmd)
	if err != nil {
		return nil, nil, run, nil, err
	}
	store = ledger.NewStore(pool)
	runs, err := store.FindRuns(cmd.Context(), namespace, name)
	if err != nil {
		pool.Close()
		return nil, nil, run, nil, exitcode.Redact(exitcode.For(err), secrets)
	}
	if run, err = pickRun(cmd.ErrOrStderr(), verb, namespace, name, pick, runs); err == nil {
		err = checkGiven(run, batch)
	}
	if err != nil {
		pool.Close()
		return nil, nil, run, nil, err
	}
	return store, secrets, run, pool.Close, nil
}

// giveManifest says how to list a static run's already handled items.
func giveManifest(err error) string {
	if !errors.Is(err, ledger.ErrBatchNotKept) {
		return ""
	}
	return "; give its manifest to read them from: kubectl get prun NAME -n NS -o yaml | runledger items NAME -n NS -f - (a ConfigMap's items with --from-file)"
}

// givenBatch reads the batch of the manifest given with -f (nil without
// one): inline items or a ConfigMap's, of the run named namespace/name (a
// manifest's namespace is the run's unless --namespace says otherwise; its
// uid, or the one runledger run derives, picks the run unless --uid does).
func (o *itemsOptions) givenBatch(cmd *cobra.Command, name string) ([]ledger.Item, error) {
	switch {
	case o.file == "" && o.fromFile != "":
		return nil, exitcode.BadInput(errors.New("--from-file needs the run's manifest (-f)"))
	case o.file == "":
		return nil, nil
	}
	o.stdin = cmd.InOrStdin()
	m, plan, err := o.plan(cmd.Context())
	if err != nil {
		return nil, err
	}
	if !cmd.Flags().Changed("namespace") {
		o.namespace = plan.Run.Namespace
	}
	if plan.Run.Namespace != o.namespace || plan.Run.Name != name {
		return nil, exitcode.BadInput(fmt.Errorf("%s is run %s/%s, not %s/%s", m.source, plan.Run.Namespace, plan.Run.Name, o.namespace, name))
	}
	static, ok := plan.Source.(*worker.StaticSource)
	if !ok {
		return nil, exitcode.BadInput(fmt.Errorf("%s: -f is for a run of inline items or a ConfigMap; the ledger database keeps the batch of any other", m.source))
	}
	if o.uid == "" {
		o.uid, o.derived = plan.Run.UID, m.run.UID == "" // its metadata.uid, or the one runledger run derives
	}
	return static.Items(), nil
}

// runPick is how openRun picks a run of a name: by uid, or the latest.
// derived: uid is the one runledger run derives from a manifest without
// metadata.uid, which a run a cluster made does not have: without a run of
// that uid, the latest is picked.
type runPick struct {
	uid     string
	derived bool
}

// checkGiven refuses a batch given for run that is not the one the run
// fixed: another source, or items whose digest differs from the recorded.
func checkGiven(run ledger.RunRecord, batch []ledger.Item) error {
	switch {
	case batch == nil:
		return nil
	case run.Source != ledger.BatchSourceStatic:
		return exitcode.BadInput(fmt.Errorf("run %s/%s's batch is a query's, kept in the ledger database: list it without -f", run.Namespace, run.Name))
	case run.Digest == "":
		return exitcode.BadInput(fmt.Errorf("run %s/%s's batch was fixed before its digest was recorded: the items given cannot be checked against it", run.Namespace, run.Name))
	case worker.ItemsDigest(batch) != run.Digest:
		return exitcode.BadInput(fmt.Errorf("the items given are not run %s/%s's batch: their digest differs from the one its first shard recorded (an edited manifest or ConfigMap?)", run.Namespace, run.Name))
	}
	return nil
}

// pickRun chooses the run named namespace/name among runs: the one of uid,
// or the latest (saying on stderr, after verb, when there were others).
func pickRun(stderr io.Writer, verb, namespace, name string, pick runPick, runs []ledger.RunRecord) (ledger.RunRecord, error) {
	if pick.uid != "" {
		for _, r := range runs {
			if r.UID == pick.uid {
				return r, nil
			}
		}
		if !pick.derived || len(runs) == 0 {
			return ledger.RunRecord{}, &exitcode.Error{Code: v1alpha1.ExitNotFound, Err: fmt.Errorf("the ledger database has no run %s/%s of uid %s", namespace, name, pick.uid)}
		}
		// A manifest kept without metadata.uid (in git, say) of a run a
		// cluster made: its uid is the API server's. The batch given is
		// checked against the run's digest (checkGiven).
		fmt.Fprintf(stderr, "runledger: note: the manifest has no metadata.uid and no run %s/%s has the uid runledger run derives from it: %s the latest run of that name, whose batch must be the manifest's\n",
			namespace, name, verb)
	}
	if len(runs) == 0 {
		return ledger.RunRecord{}, &exitcode.Error{Code: v1alpha1.ExitNotFound, Err: fmt.Errorf("the ledger database has no run %s/%s (no shard of it ever started; is --namespace right?)", namespace, name)}
	}
	if len(runs) > 1 {
		uids := make([]string, 0, len(runs)-1)
		for _, r := range runs[1:] {
			uids = append(uids, r.UID+" ("+r.Created.UTC().Format(time.RFC3339)+")")
		}
		fmt.Fprintf(stderr, "runledger: note: %d runs were named %s/%s; %s the latest, uid %s (--uid picks another: %s)\n",
			len(runs), namespace, name, verb, runs[0].UID, strings.Join(uids, ", "))
	}
	return runs[0], nil
}

// checkOutput is bad input unless output is one of allowed.
func checkOutput(output string, allowed ...string) error {
	for _, a := range allowed {
		if output == a {
			return nil
		}
	}
	return exitcode.BadInput(fmt.Errorf("--output %q: want %s", output, strings.Join(allowed, ", ")))
}

// itemJSON is one item of runledger items' JSON output.
type itemJSON struct {
	Verdict       string         `json:"verdict"`
	Entity        string         `json:"entity"`
	Occurrence    string         `json:"occurrence"`
	Shard         int            `json:"shard"`
	Attempt       int            `json:"attempt"`
	Time          time.Time      `json:"time"`
	State         string         `json:"state,omitempty"`
	Class         string         `json:"class,omitempty"`
	Error         string         `json:"error,omitempty"`
	Copies        int            `json:"copies,omitempty"`
	PayloadDigest *string        `json:"payloadDigest,omitempty"`
	HeldBy        *ledger.RunRef `json:"heldBy,omitempty"`
	// PayloadChanged: omitted when false, so that the other verdicts' objects stay as they were.
	PayloadChanged bool `json:"payloadChanged,omitempty"`
}

func toItemJSON(v ledger.ItemVerdict) itemJSON {
	out := itemJSON{Verdict: v.Outcome.String(), Entity: v.Entity, Occurrence: v.Occurrence, Shard: v.Shard, Attempt: v.Attempt,
		Time: v.At.UTC(), State: v.State, Class: v.Class, Error: v.Error, Copies: v.Copies, PayloadDigest: v.PayloadDigest,
		PayloadChanged: v.PayloadChanged}
	if v.Outcome == ledger.AlreadyHandled {
		held := v.Holder
		out.HeldBy = &held
	}
	return out
}

// itemWriter writes items as they come, in one of the output formats.
type itemWriter struct {
	w      io.Writer
	output string
	enc    *json.Encoder
	table  *tabwriter.Writer
	n      int
	err    error
}

func newItemWriter(w io.Writer, output string) *itemWriter {
	iw := &itemWriter{w: w, output: output}
	switch output {
	case "table":
		iw.table = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(iw.table, "VERDICT\tENTITY\tOCCURRENCE\tSHARD\tATTEMPT\tTIME\tDETAIL")
	default:
		iw.enc = json.NewEncoder(w)
		iw.enc.SetEscapeHTML(false)
	}
	return iw
}

func (iw *itemWriter) write(v ledger.ItemVerdict) error {
	if iw.err != nil {
		return iw.err
	}
	switch iw.output {
	case "table":
		_, iw.err = fmt.Fprintf(iw.table, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", v.Outcome, cell(v.Entity), cell(v.Occurrence),
			v.Shard, v.Attempt, v.At.UTC().Format(time.RFC3339), cell(detail(v)))
	case "json":
		sep := ","
		if iw.n == 0 {
			sep = "["
		}
		if _, iw.err = io.WriteString(iw.w, sep); iw.err == nil {
			iw.err = iw.enc.Encode(toItemJSON(v))
		}
	default:
		iw.err = iw.enc.Encode(toItemJSON(v))
	}
	iw.n++
	if iw.err != nil {
		iw.err = fmt.Errorf("writing the items: %w", iw.err)
	}
	return iw.err
}

// close ends the output (the JSON array's bracket, the table's flush).
func (iw *itemWriter) close() error {
	if iw.err != nil {
		return iw.err
	}
	var err error
	switch {
	case iw.output == "table":
		err = iw.table.Flush()
	case iw.output == "json" && iw.n == 0:
		_, err = io.WriteString(iw.w, "[]\n")
	case iw.output == "json":
		_, err = io.WriteString(iw.w, "]\n")
	}
	if err != nil {
		return fmt.Errorf("writing the items: %w", err)
	}
	return nil
}

// detail is a table's last column: why an item failed, who held it.
func detail(v ledger.ItemVerdict) string {
	switch v.Outcome {
	case ledger.Failed:
		s := v.Class + ": " + v.Error
		if v.Copies > 1 {
			s += fmt.Sprintf(" (%d copies)", v.Copies)
		}
		return s
	case ledger.AlreadyHandled:
		s := fmt.Sprintf("held by %s/%s (%s)", v.Holder.Namespace, v.Holder.Name, v.Holder.UID)
		if v.PayloadChanged {
			s += ", payload changed"
		}
		return s
	case ledger.Completed:
		if v.State != "committed" {
			return v.State
		}
	}
	return ""
}

// cell keeps a table cell on its line: tabs and line breaks become spaces.
func cell(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

const keyLong = `Show what the ledger database knows of one business key: its committed row
(which run committed it, in which namespace, uid, shard and attempt, when),
its history (the rows superseded by later runs that reprocessed it, until
runledger prune --superseded-older-than deletes them, and the runs whose row
was superseded, kept for good), and the runs in which its item is failed now.
The same database and connection string rules as runledger run. The history
is read by a scan of the ledger's superseded rows, bounded like every read.

Output: a table, or with --output json one JSON object:

  {"entity":"...","occurrence":"...","committed":{"run":{"namespace":"...",
   "name":"...","uid":"..."},"shard":N,"attempt":N,"state":"committed",
   "committedAt":"..."},"history":[...],"retiredBy":["uid"],"failures":[...]}

("committed" is null when no row holds the key.) Exit status: 0 when the key
is known; 5 when the ledger database knows nothing of it; 2 for bad input;
1 for any other failure.`

func newKeyCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "key ENTITY OCCURRENCE [--output table|json]",
		Short: "Show which run committed a key, when, its superseded history and its failures",
		Long:  keyLong,
		Example: `  runledger key acct-42 2026-06 --dsn-file ledger.dsn
  runledger key acct-42 2026-06 --output json | jq .committed.run`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			pool, secrets, err := openOwnerPool(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			key := ledger.Key{Entity: args[0], Occurrence: args[1]}
			h, err := ledger.NewStore(pool).Key(cmd.Context(), key)
			if err != nil {
				return exitcode.Redact(exitcode.For(err), secrets)
			}
			if err := writeKey(secrets.Writer(cmd.OutOrStdout()), output, key, h); err != nil {
				return exitcode.Redact(exitcode.For(err), secrets)
			}
			if len(h.Rows) == 0 && len(h.Retired) == 0 && len(h.Failures) == 0 {
				return &exitcode.Error{Code: v1alpha1.ExitNotFound, Err: fmt.Errorf("the ledger database knows nothing of key %s: no run committed it, none failed it", key)}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	addDatabaseFlags(cmd, "PostgreSQL connection string of the ledger")
	return cmd
}

// keyJSON is runledger key's JSON output.
type keyJSON struct {
	Entity     string              `json:"entity"`
	Occurrence string              `json:"occurrence"`
	Committed  *ledger.KeyRow      `json:"committed"`
	History    []ledger.KeyRow     `json:"history"`
	RetiredBy  []string            `json:"retiredBy"`
	Failures   []ledger.KeyFailure `json:"failures"`
}

func writeKey(w io.Writer, output string, key ledger.Key, h ledger.KeyHistory) error {
	out := keyJSON{Entity: key.Entity, Occurrence: key.Occurrence, History: []ledger.KeyRow{},
		RetiredBy: append([]string{}, h.Retired...), Failures: append([]ledger.KeyFailure{}, h.Failures...)}
	for _, r := range h.Rows {
		if r.State == "committed" {
			r := r
			out.Committed = &r
		} else {
			out.History = append(out.History, r)
		}
	}
	if output == "json" {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(out); err != nil {
			return fmt.Errorf("writing the key: %w", err)
		}
		return nil
	}
	t := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(t, "key\t%s / %s\n", cell(key.Entity), cell(key.Occurrence))
	row := func(what string, r ledger.KeyRow) {
		fmt.Fprintf(t, "%s\t%s/%s (uid %s), shard %d, attempt %d, at %s", what, r.Run.Namespace, r.Run.Name, r.Run.UID, r.Shard, r.Attempt, r.Committed.UTC().Format(time.RFC3339))
		if r.Superseded != nil {
			fmt.Fprintf(t, ", superseded at %s", r.Superseded.UTC().Format(time.RFC3339))
		}
		fmt.Fprintln(t)
	}
	if out.Committed != nil {
		row("committed by", *out.Committed)
	} else {
		fmt.Fprintln(t, "committed by\tno run (no committed row holds the key)")
	}
	for _, r := range out.History {
		row("superseded", r)
	}
	if len(out.RetiredBy) > 0 {
		fmt.Fprintf(t, "retired from\t%s\n", strings.Join(out.RetiredBy, ", "))
	}
	for _, f := range out.Failures {
		fmt.Fprintf(t, "failed in\t%s/%s (uid %s), shard %d, attempt %d, at %s: %s: %s\n", f.Run.Namespace, f.Run.Name, f.Run.UID, f.Shard, f.Attempt,
			f.At.UTC().Format(time.RFC3339), f.Class, cell(f.Error))
	}
	if err := t.Flush(); err != nil {
		return fmt.Errorf("writing the key: %w", err)
	}
	return nil
}

package clitest

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

// proof is runledger verify's JSON output.
type proof struct {
	Run      runRef `json:"run"`
	Source   string `json:"source"`
	Reported struct {
		counts
		PayloadChanged *int64 `json:"payloadChanged"`
	} `json:"reported"`
	ReportedIn string `json:"reportedIn"`
	Items      []struct {
		Verdict    string  `json:"verdict"`
		Entity     *string `json:"entity"`
		Occurrence *string `json:"occurrence"`
		Copies     int64   `json:"copies"`
		HeldBy     *struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
			UID       string `json:"uid"`
		} `json:"heldBy"`
		HeldSince string `json:"heldSince"`
		Failed    int64  `json:"failed"`
		Class     string `json:"class"`
		Problem   string `json:"problem"`
	} `json:"items"`
	Ledger  proofLedger `json:"ledger"`
	Proven  bool        `json:"proven"`
	Summary string      `json:"summary"`
}

// proofLedger is the ledger's side of a proof.
type proofLedger struct {
	Total          int64 `json:"total"`
	Completed      int64 `json:"completed"`
	AlreadyHandled int64 `json:"alreadyHandled"`
	Failed         int64 `json:"failed"`
	PayloadChanged int64 `json:"payloadChanged"`
	Missing        int64 `json:"missing"`
	Mismatched     int64 `json:"mismatched"`
	Keys           int64 `json:"keys"`
	FailureRecords int64 `json:"failureRecords"`
}

func (p proof) counts() counts {
	return counts{p.Ledger.Total, p.Ledger.Completed, p.Ledger.AlreadyHandled, p.Ledger.Failed}
}

// verdicts maps each listed key's entity to its verdict.
func (p proof) verdicts() map[string]string {
	out := map[string]string{}
	for _, it := range p.Items {
		e := "(null)"
		if it.Entity != nil {
			e = *it.Entity
		}
		out[e] = it.Verdict
	}
	return out
}

// verify runs runledger verify RUN ARGS --output json and decodes its proof:
// exit 0 and proven, or exit 1 and not, the one-line summary on stderr.
func verify(t *testing.T, d *db, stdin, run string, args ...string) (proof, result) {
	t.Helper()
	r := runCLI(t, stdin, append([]string{"verify", run, "-n", "billing", "--output", "json", "--dsn", d.dsn}, args...)...)
	require.Contains(t, []int{v1alpha1.ExitSucceeded, v1alpha1.ExitFailed}, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	var p proof
	require.NoError(t, dec.Decode(&p), "stdout is one JSON object:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.False(t, dec.More(), "nothing after the object")
	require.NotNil(t, p.Items, "items is always a list")
	require.Equal(t, r.code == 0, p.Proven, "exit 0 exactly when proven; stderr:\n%s", r.stderr)
	if r.code != 0 {
		require.Contains(t, r.stderr, p.Summary, "the summary on stderr")
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
			if !strings.HasPrefix(l, "runledger: note: --dsn holds a password") {
				lines = append(lines, l)
			}
		}
		require.Len(t, lines, 1, "one line on stderr:\n%s", r.stderr)
	}
	return p, r
}

// lose deletes committed ledger rows as a failover that did not replicate
// their commits would (as the owner, past the append-only trigger).
func (d *db) lose(t *testing.T, where string) int64 {
	t.Helper()
	before := d.int(t, `SELECT count(*) FROM runledger.ledger`)
	d.exec(t, `SET session_replication_role = replica; DELETE FROM runledger.ledger WHERE state = 'committed' AND (`+where+`); RESET session_replication_role`)
	return before - d.int(t, `SELECT count(*) FROM runledger.ledger`)
}

// verifyQuery is a query batch: accounts lo..hi, acct-lo..lo+9 twice, and a
// row with a NULL entity (a failed item of class input).
func verifyQuery(name string, lo, hi int) string {
	return manifest(name,
		"batch:",
		"  query: |",
		fmt.Sprintf("    SELECT 'acct-' || i AS entity, '2024-06' AS occurrence, jsonb_build_object('amount', i) AS payload FROM generate_series(%d, %d) i", lo, hi),
		fmt.Sprintf("    UNION ALL SELECT 'acct-' || i, '2024-06', jsonb_build_object('amount', i) FROM generate_series(%d, %d) i", lo, lo+9),
		"    UNION ALL SELECT NULL, '2024-06', NULL",
		sinkEffect, "workers: 2", "chunkSize: 40", "maxFailedItems: 100")
}

// TestVerifyQueryBatch: two query runs over overlapping accounts (repeats,
// failed items of a foreign key, a row with a NULL key, keys the second
// finds already handled) are proven from the ledger, against runledger
// run's JSON or counts given; counts that differ are not. Then a failover
// loses commits: the second run's completed rows and, for keys it found
// already handled, the first run's rows that held them: every such key is
// listed Missing, no other, the counts differ, exit 1 with the reason in
// one line.
func TestVerifyQueryBatch(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, itemsSchema)
	sums := map[string]summary{}
	for _, r := range []struct {
		name   string
		lo, hi int
	}{{"first", 0, 299}, {"second", 200, 549}} {
		res := runCLI(t, "", "run", "-f", writeFile(t, r.name+".yaml", verifyQuery(r.name, r.lo, r.hi)), "--dsn", d.dsn, "--output", "json")
		require.Equal(t, 0, res.code, res.stderr)
		sums[r.name] = res.summary(t)
	}
	// first: 0..299 (acct-0 and acct-250 fail, acct-0 twice), 0..9 again, NULL.
	require.Equal(t, counts{Total: 311, Completed: 298, AlreadyHandled: 9, Failed: 2 + 1 + 1}, sums["first"].counts())
	// second: 200..549 (200..299 held by first but acct-250, which fails
	// again, as acct-500 does), 200..209 again (already handled), NULL.
	require.Equal(t, counts{Total: 361, Completed: 250 - 1, AlreadyHandled: 99 + 10, Failed: 2 + 1}, sums["second"].counts())

	for name, s := range sums {
		out, _ := json.Marshal(s)
		p, _ := verify(t, d, "", name, "--summary", writeFile(t, name+".json", string(out)))
		require.True(t, p.Proven, p.Summary)
		require.Equal(t, s.counts(), p.counts())
		require.Equal(t, "query", p.Source)
		require.Empty(t, p.Items, "nothing missing or mismatched is listed")
		require.Zero(t, p.Ledger.Missing)
	}
	c := sums["second"].counts()
	p, _ := verify(t, d, "", "second", "--expect-completed", fmt.Sprint(c.Completed), "--expect-already-handled", fmt.Sprint(c.AlreadyHandled),
		"--expect-failed", fmt.Sprint(c.Failed), "--expect-total", fmt.Sprint(c.Total), "--all")
	require.True(t, p.Proven, p.Summary)
	require.Len(t, p.Items, 350+1, "--all lists every distinct key, the NULL one's rows as one")
	v := p.verdicts()
	require.Equal(t, "AlreadyHandled", v["acct-200"])
	require.Equal(t, "Completed", v["acct-300"])
	require.Equal(t, "Failed", v["acct-500"])
	require.Equal(t, "Failed", v["acct-250"], "failed in second though first failed it too")
	require.Equal(t, "BadRow", v["(null)"])

	p, r := verify(t, d, "", "second", "--expect-completed", fmt.Sprint(c.Completed+1), "--expect-already-handled", fmt.Sprint(c.AlreadyHandled-1),
		"--expect-failed", fmt.Sprint(c.Failed))
	require.False(t, p.Proven)
	require.Empty(t, p.Items, "every key has a proven verdict; only the counts differ")
	require.Contains(t, r.stderr, fmt.Sprintf("completed %d reported, %d in the ledger", c.Completed+1, c.Completed))
	require.Contains(t, r.stderr, fmt.Sprintf("alreadyHandled %d reported, %d in the ledger", c.AlreadyHandled-1, c.AlreadyHandled))

	// The failover: second's acct-400..404 and first's acct-230..231
	// (already handled in second) were never replicated.
	require.EqualValues(t, 5, d.lose(t, `run_name = 'second' AND entity IN ('acct-400', 'acct-401', 'acct-402', 'acct-403', 'acct-404')`))
	require.EqualValues(t, 2, d.lose(t, `run_name = 'first' AND entity IN ('acct-230', 'acct-231')`))
	out, _ := json.Marshal(sums["second"])
	summaryFile := writeFile(t, "second.json", string(out))
	p, r = verify(t, d, "", "second", "--summary", summaryFile)
	require.False(t, p.Proven)
	require.Equal(t, map[string]string{"acct-400": "Missing", "acct-401": "Missing", "acct-402": "Missing", "acct-403": "Missing", "acct-404": "Missing",
		"acct-230": "Missing", "acct-231": "Missing"}, p.verdicts(), "exactly the keys whose proof was lost")
	for _, it := range p.Items {
		require.Nil(t, it.HeldBy)
		require.Contains(t, it.Problem, "nothing proves the verdict the run counted")
	}
	require.EqualValues(t, 7, p.Ledger.Missing)
	require.Equal(t, counts{Total: 361, Completed: 249 - 5, AlreadyHandled: 109 - 2, Failed: 3}, p.counts())
	require.Contains(t, r.stderr, "runledger: run billing/second (uid ")
	require.Contains(t, r.stderr, "is not proven by the ledger: 7 items missing")
	require.Contains(t, r.stderr, "completed 249 reported, 244 in the ledger")

	// first lost its own acct-230..231: Missing there too; the table says so.
	r = runCLI(t, "", "verify", "first", "-n", "billing", "--expect-completed", "298", "--expect-already-handled", "9", "--expect-failed", "4", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitFailed, r.code, r.stderr)
	require.Contains(t, r.stdout, "Missing  acct-230")
	require.Contains(t, r.stdout, "Missing  acct-231")
	require.Contains(t, r.stdout, "completed       298       296")
	require.Contains(t, r.stderr, "2 items missing")
	require.Contains(t, r.stderr, "completed 298 reported, 296 in the ledger")
}

// withStatus is manifest m as kubectl get -o yaml prints it: with the
// run's status (phase and counts).
func withStatus(m, phase string, c counts, payloadChanged ...int64) string {
	m += fmt.Sprintf("status:\n  phase: %s\n  total: %d\n  completed: %d\n  alreadyHandled: %d\n  failed: %d\n", phase, c.Total, c.Completed, c.AlreadyHandled, c.Failed)
	for _, n := range payloadChanged {
		m += fmt.Sprintf("  payloadChanged: %d\n", n)
	}
	return m
}

// TestVerifyStaticBatch: runs of inline items and of a ConfigMap, whose
// batch the ledger keeps only as a digest, are proven against the manifest
// kubectl prints (its status holds the counts; on stdin too), a Supersede
// run's rows having retired an earlier run's: that run's keys stay its
// completed ones. Then the Supersede run's row of a key is lost: it is
// Missing for that run only. And bad input: no manifest for a static run,
// edited items, a run not finished, no counts, two sources of counts, an
// unknown run (exit 5).
func TestVerifyStaticBatch(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, fmt.Sprintf(sinkSchema, 0.0))
	keys := func(lo, hi int, repeat ...int) [][2]string {
		var out [][2]string
		for i := lo; i <= hi; i++ {
			out = append(out, [2]string{fmt.Sprintf("acct-%02d", i), "2024-06"})
		}
		for _, i := range repeat {
			out = append(out, [2]string{fmt.Sprintf("acct-%02d", i), "2024-06"})
		}
		return out
	}
	var changed int64 // the last run's payloadChanged
	run := func(name string, m string, args ...string) (string, counts) {
		t.Helper()
		file := writeFile(t, name+".yaml", m)
		r := runCLI(t, "", append([]string{"run", "-f", file, "--dsn", d.dsn, "--output", "json"}, args...)...)
		require.Equal(t, 0, r.code, r.stderr)
		changed = r.summary(t).PayloadChanged
		return m, r.summary(t).counts()
	}
	may, mayCounts := run("may", manifest("may", inlineItems(keys(0, 9, 3)...), sinkEffect))
	require.Equal(t, counts{Total: 11, Completed: 10, AlreadyHandled: 1}, mayCounts)
	// june retires may's acct-05..07 and commits its own.
	june, juneCounts := run("june", manifest("june", inlineItems(keys(5, 12)...), sinkEffect, "onExisting: Supersede"))
	require.Equal(t, counts{Total: 8, Completed: 8}, juneCounts)
	// july, from a ConfigMap: acct-00..14, already handled but 13 and 14.
	var lines []string
	for _, k := range keys(0, 14) {
		lines = append(lines, fmt.Sprintf(`{"entity": %q, "occurrence": %q, "payload": {"amount": 1}}`, k[0], k[1]))
	}
	julyItems := writeFile(t, "july.jsonl", strings.Join(lines, "\n"))
	july, julyCounts := run("july", manifest("july", "batch: {configMapRef: {name: july, key: items.jsonl}}", sinkEffect), "--from-file", julyItems)
	require.Equal(t, counts{Total: 15, Completed: 2, AlreadyHandled: 13}, julyCounts)
	// Held by may (acct-00..04, amounts 1..5) and june (acct-05..12, 1..8):
	// all but acct-00 and acct-05 had another amount than july's 1.
	julyChanged := changed
	require.EqualValues(t, 11, julyChanged)

	check := func(stdin, name string, want counts, args ...string) proof {
		t.Helper()
		p, _ := verify(t, d, stdin, name, args...)
		require.True(t, p.Proven, p.Summary)
		require.Equal(t, want, p.counts())
		require.Equal(t, "static", p.Source)
		if !slices.Contains(args, "--all") {
			require.Empty(t, p.Items, "nothing missing or mismatched is listed")
		}
		return p
	}
	p := check("", "may", mayCounts, "-f", writeFile(t, "may-status.yaml", withStatus(may, "Succeeded", mayCounts)))
	require.Contains(t, p.Summary, "is proven by the ledger: 10 completed, 1 already handled, 0 failed of 11 items")
	check(withStatus(june, "Succeeded", juneCounts), "june", juneCounts, "-f", "-")
	check("", "july", julyCounts, "-f", writeFile(t, "july-status.yaml", withStatus(july, "Succeeded", julyCounts, julyChanged)), "--from-file", julyItems)
	p = check("", "may", mayCounts, "-f", writeFile(t, "may.yaml", may), "--all", "--expect-completed", "10", "--expect-already-handled", "1", "--expect-failed", "0")
	v := p.verdicts()
	require.Equal(t, "Completed", v["acct-05"], "may committed acct-05, june's Supersede retired its row since")
	for _, it := range p.Items {
		if it.Entity != nil && *it.Entity == "acct-05" {
			require.Equal(t, "june", it.HeldBy.Name, "held by june now")
		}
	}

	// june's row of acct-06 is lost; may's superseded one stays.
	require.EqualValues(t, 1, d.lose(t, `entity = 'acct-06'`))
	check("", "may", mayCounts, "-f", writeFile(t, "may-status.yaml", withStatus(may, "Succeeded", mayCounts)))
	p, r := verify(t, d, withStatus(june, "Succeeded", juneCounts), "june", "-f", "-")
	require.False(t, p.Proven)
	require.Equal(t, map[string]string{"acct-06": "Missing"}, p.verdicts())
	require.Contains(t, r.stderr, "is not proven by the ledger: 1 item missing")
	require.Contains(t, r.stderr, "(counts from the status in stdin)")
	p, _ = verify(t, d, "", "july", "-f", writeFile(t, "july-status.yaml", withStatus(july, "Succeeded", julyCounts, julyChanged)), "--from-file", julyItems)
	require.False(t, p.Proven)
	require.Equal(t, map[string]string{"acct-06": "Missing"}, p.verdicts(), "july found acct-06 already handled: its holder vanished")

	mayFile := writeFile(t, "may.yaml", may)
	edited := writeFile(t, "edited.yaml", withStatus(strings.Replace(may, "acct-09", "acct-99", 1), "Succeeded", mayCounts))
	for _, c := range []struct {
		name string
		code int
		args []string
		want string
	}{
		{"no manifest", v1alpha1.ExitBadInput, []string{"may", "--expect-completed", "10", "--expect-already-handled", "1", "--expect-failed", "0"},
			"kubectl get prun may -n billing -o yaml | runledger verify may -n billing -f -"},
		{"edited items", v1alpha1.ExitBadInput, []string{"may", "-f", edited},
			"the items given are not run billing/may's batch: their digest differs"},
		{"not finished", v1alpha1.ExitBadInput, []string{"may", "-f", writeFile(t, "running.yaml", withStatus(may, "Running", mayCounts))},
			"the run is not finished (status.phase Running)"},
		{"no counts", v1alpha1.ExitBadInput, []string{"may", "-f", mayFile}, "no counts to prove"},
		{"two sources", v1alpha1.ExitBadInput, []string{"may", "-f", writeFile(t, "may-status.yaml", withStatus(may, "Succeeded", mayCounts)),
			"--expect-completed", "10", "--expect-already-handled", "1", "--expect-failed", "0"}, "counts to prove from both the status in"},
		{"some expect flags", v1alpha1.ExitBadInput, []string{"may", "-f", mayFile, "--expect-completed", "10"}, "must all be set"},
		{"a bad summary", v1alpha1.ExitBadInput, []string{"may", "-f", mayFile, "--summary", writeFile(t, "s.json", `{"total": 11}`)},
			"want the JSON object runledger run --output json prints"},
		{"unknown run", v1alpha1.ExitNotFound, []string{"april", "--expect-completed", "1", "--expect-already-handled", "0", "--expect-failed", "0"},
			"the ledger database has no run billing/april"},
		{"another run's manifest", v1alpha1.ExitBadInput, []string{"june", "-f", mayFile, "--expect-completed", "10", "--expect-already-handled", "1", "--expect-failed", "0"},
			"is run billing/may, not billing/june"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, "", append([]string{"verify", "-n", "billing", "--dsn", d.dsn}, c.args...)...)
			require.Equal(t, c.code, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, c.want)
			require.Empty(t, strings.TrimSpace(r.stdout), "nothing written")
		})
	}
}

// TestVerify_Randomized: random runs of inline items (repeats, Skip and
// Supersede, overlapping keys) are each proven against runledger run's own
// JSON; then a random set of committed rows is lost: a run is not proven
// exactly when a lost key's verdict rested on that row (the run's own row,
// or the holder of a key it found already handled; not a row of its that
// a Supersede had retired before), and its Missing keys are exactly those.
func TestVerify_Randomized(t *testing.T) {
	t.Parallel()
	for seed := int64(1); seed <= 2; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			rnd := rand.New(rand.NewSource(seed))
			d := newDB(t)
			d.exec(t, fmt.Sprintf(sinkSchema, 0.0))
			type runInfo struct {
				name    string
				keys    map[string]bool
				file    string
				summary string
			}
			var runs []runInfo
			for i := range 4 {
				name := fmt.Sprintf("run-%d", i)
				var items [][2]string
				keys := map[string]bool{}
				for range 5 + rnd.Intn(10) {
					k := fmt.Sprintf("acct-%02d", rnd.Intn(20))
					items = append(items, [2]string{k, "2024-06"})
					keys[k] = true
				}
				spec := []string{inlineItems(items...), sinkEffect, fmt.Sprintf("chunkSize: %d", 1+rnd.Intn(4)), fmt.Sprintf("workers: %d", 1+rnd.Intn(2))}
				if rnd.Intn(2) == 0 {
					spec = append(spec, "onExisting: Supersede")
				}
				file := writeFile(t, name+".yaml", manifest(name, spec...))
				r := runCLI(t, "", "run", "-f", file, "--dsn", d.dsn, "--output", "json")
				require.Equal(t, 0, r.code, r.stderr)
				runs = append(runs, runInfo{name: name, keys: keys, file: file, summary: writeFile(t, name+".json", r.stdout)})
				p, _ := verify(t, d, "", name, "-f", file, "--summary", runs[i].summary)
				require.True(t, p.Proven, p.Summary)
			}
			// Which keys each run's row was retired from (a Supersede took them over).
			retired := map[string]bool{}
			rows, err := d.pool.Query(t.Context(), `SELECT b.run_name || ' ' || r.entity FROM runledger.ledger_retired AS r JOIN runledger.batch_run AS b USING (run_uid)`)
			require.NoError(t, err)
			for rows.Next() {
				var s string
				require.NoError(t, rows.Scan(&s))
				retired[s] = true
			}
			require.NoError(t, rows.Err())
			lost := map[string]bool{}
			var lostList []string
			for i := range 20 {
				if rnd.Intn(8) == 0 {
					k := fmt.Sprintf("acct-%02d", i)
					lost[k] = true
					lostList = append(lostList, "'"+k+"'")
				}
			}
			if len(lostList) > 0 {
				d.lose(t, "entity IN ("+strings.Join(lostList, ", ")+")")
			}
			for _, r := range runs {
				want := map[string]string{}
				for k := range r.keys {
					if lost[k] && !retired[r.name+" "+k] {
						want[k] = "Missing"
					}
				}
				p, _ := verify(t, d, "", r.name, "-f", r.file, "--summary", r.summary)
				require.Equal(t, want, p.verdicts(), "run %s, lost %v", r.name, lostList)
				require.Equal(t, len(want) == 0, p.Proven, p.Summary)
			}
		})
	}
}

// recentProofs is runledger verify --since's JSON output.
type recentProofs struct {
	Runs []struct {
		Run    runRef       `json:"run"`
		Source string       `json:"source"`
		Fixed  string       `json:"fixedAt"`
		State  string       `json:"state"`
		Ledger *proofLedger `json:"ledger"`
	} `json:"runs"`
	Proven  bool   `json:"proven"`
	Summary string `json:"summary"`
}

// TestVerifySince is issue #44.2's re-proof after an incident: runledger
// verify --since proves every run fixed since then from the ledger alone:
// two query runs proven, an inline run listed as not checked; once a
// failover lost commits of one of them, that run is NotProven and the
// command exits 1 saying so, the other still Proven. Bad flag mixes are
// bad input.
func TestVerifySince(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	d.exec(t, itemsSchema)
	for _, r := range []struct {
		name   string
		lo, hi int
	}{{"first", 0, 99}, {"second", 100, 199}} {
		res := runCLI(t, "", "run", "-f", writeFile(t, r.name+".yaml", verifyQuery(r.name, r.lo, r.hi)), "--dsn", d.dsn, "--output", "json")
		require.Equal(t, 0, res.code, res.stderr)
	}
	res := runCLI(t, "", "run", "-f", writeFile(t, "inline.yaml", manifest("inline", inlineItems([2]string{"acct-900", "2024-06"}), sinkEffect)), "--dsn", d.dsn)
	require.Equal(t, 0, res.code, res.stderr)

	since := func(want int, args ...string) recentProofs {
		t.Helper()
		r := runCLI(t, "", append([]string{"verify", "--since", "1h", "--output", "json", "--dsn", d.dsn}, args...)...)
		require.Equal(t, want, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		dec := json.NewDecoder(strings.NewReader(r.stdout))
		dec.DisallowUnknownFields()
		var p recentProofs
		require.NoError(t, dec.Decode(&p), r.stdout)
		require.Equal(t, want == 0, p.Proven)
		if want != 0 {
			require.Contains(t, r.stderr, p.Summary)
		}
		return p
	}
	states := func(p recentProofs) map[string]string {
		out := map[string]string{}
		for _, r := range p.Runs {
			out[r.Run.Name] = r.State
		}
		return out
	}
	p := since(0, "-n", "billing")
	require.Equal(t, map[string]string{"first": "Proven", "second": "Proven", "inline": "NotKept"}, states(p))
	require.Contains(t, p.Summary, "3 runs of namespace billing fixed since ")
	require.Contains(t, p.Summary, "2 proven by the ledger, 0 not")
	require.Empty(t, since(0, "-n", "elsewhere").Runs, "another namespace's runs are not listed")
	require.Len(t, since(0, "-A").Runs, 3)

	require.EqualValues(t, 3, d.lose(t, `run_name = 'second' AND entity IN ('acct-150', 'acct-151', 'acct-152')`))
	p = since(v1alpha1.ExitFailed, "-A")
	require.Equal(t, map[string]string{"first": "Proven", "second": "NotProven", "inline": "NotKept"}, states(p))
	for _, r := range p.Runs {
		if r.Run.Name == "second" {
			require.EqualValues(t, 3, r.Ledger.Missing)
		}
	}
	require.Contains(t, p.Summary, "1 proven by the ledger, 1 not")

	table := runCLI(t, "", "verify", "--since", "1h", "-A", "--dsn", d.dsn)
	require.Equal(t, v1alpha1.ExitFailed, table.code, table.stderr)
	require.Regexp(t, `billing\s+second\s+\S+\s+NotProven\s+\d+\s+\d+\s+\d+\s+\d+\s+3\s+0`, table.stdout)

	for _, bad := range [][]string{
		{"verify", "--since", "1h", "second"},
		{"verify", "--since", "1h", "--expect-completed", "1", "--expect-already-handled", "0", "--expect-failed", "0"},
		{"verify", "--since", "1h", "-A", "-n", "billing"},
		{"verify"},
	} {
		r := runCLI(t, "", append(bad, "--dsn", d.dsn)...)
		require.Equal(t, v1alpha1.ExitBadInput, r.code, "%v: %s", bad, r.stderr)
	}
}

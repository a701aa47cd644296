//go:build e2e

package e2e

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/console"
	"github.com/runledger/runledger/internal/console/consoletest"
)

// TestConsoleInABrowserOnTheCluster drives runledger console, started as
// the user starts it (the cluster's kubeconfig, the ledger's connection
// string), in Debian's Chromium against the real controller and worker
// pods: a run's page, opened as the run is created, follows it without a
// reload through its progress to Succeeded; it and the runs page show the
// numbers of the status, which are the ledger's (its committed rows, its
// failure records, the console's proof); the failed items' page lists the
// three keys the user's CHECK refused; once the cause is fixed, "Retry the
// failed items" creates the fromRun run, whose page follows it to its end,
// and its three items commit once: every key of the batch committed exactly
// once overall.
func TestConsoleInABrowserOnTheCluster(t *testing.T) {
	t.Parallel()
	// 1.5 s a chunk: the run lasts long enough (about half a minute) for
	// its progress to reach the status, and the page, before it ends.
	f := newFixture(t, "console", 1.5)
	_, err := f.sql(f.ctx, f.dsn, `ALTER TABLE sink ADD CONSTRAINT sink_no_17 CHECK (entity !~ '17$')`)
	require.NoError(t, err)
	dsnFile := filepath.Join(t.TempDir(), "ledger.dsn")
	require.NoError(t, os.WriteFile(dsnFile, []byte(f.dsn), 0o600))
	url := consoletest.Start(t, f.dsn, "--kubeconfig", os.Getenv("KUBECONFIG"), "-n", f.ns, "--dsn-file", dsnFile)
	shots := cmp.Or(os.Getenv(consoletest.EnvScreenshots), os.Getenv("RUNLEDGER_CLUSTER_LOGS"), t.TempDir())
	ctx := consoletest.Browser(t, 10*time.Minute)
	text := func(sel string) string { t.Helper(); return consoletest.Text(t, ctx, sel) }
	number := func(sel string) int64 {
		t.Helper()
		n, err := strconv.ParseInt(text(sel), 10, 64)
		require.NoError(t, err, "%s", sel)
		return n
	}
	// pageCounts are the counts a run's page shows, as the status's.
	pageCounts := func() counts {
		t.Helper()
		return counts{Total: number("#counts .total"), Completed: number("#counts .completed"),
			AlreadyHandled: number("#counts .already-handled"), Failed: number("#counts .failed")}
	}
	// follow records, on the open page, each phase and completed count its
	// live part shows (every 100 ms: a status lasts seconds), and waits
	// until the page shows the run Succeeded, without a reload; it returns
	// what the page showed.
	follow := func(name string) []string {
		t.Helper()
		consoletest.Do(t, ctx, consoletest.MarkLoaded(), chromedp.Evaluate[chromedp.Void](`window.seen = [];
setInterval(function () {
  const phase = document.querySelector("#counts .phase"), done = document.querySelector("#counts .completed");
  if (!phase || !done) { return; }
  const v = phase.textContent.trim() + " " + done.textContent.trim();
  if (window.seen[window.seen.length - 1] !== v) { window.seen.push(v); }
}, 100)`))
		consoletest.Live(t, ctx, runTimeout, `document.querySelector("#counts .phase").textContent.trim() === "Succeeded"`,
			"the page follows run "+name+" to Succeeded")
		seen := consoletest.Get(t, ctx, chromedp.Evaluate[[]string](`window.seen`))
		t.Logf("the page of %s showed (phase, completed): %s", name, strings.Join(seen, ", "))
		return seen
	}

	run := f.newRun("june", runSpec{workers: 2, chunk: 10, batch: queryBatch(1, 300, 0)})
	run.Spec.MaxFailedItems = 10
	require.NoError(t, f.c.Create(f.ctx, run))
	consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/june"), chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)))
	require.NotEqual(t, "Succeeded", text("#counts .phase"), "the page opened as the run started")
	seen := follow("june")
	partial := slices.ContainsFunc(seen, func(v string) bool {
		phase, done, _ := strings.Cut(v, " ")
		n, _ := strconv.Atoi(done)
		return phase == string(v1alpha1.RunRunning) && n > 0 && n < 297
	})
	require.True(t, partial, "the page showed the run Running with part of its items completed: %v", seen)
	consoletest.Shot(t, ctx, shots, "e2e-run-live.png")

	// The page's numbers are the status's, and the status's the ledger's.
	run = f.waitComplete("june", runTimeout)
	require.Equal(t, counts{Total: 300, Completed: 297, Failed: 3}, countsOf(run), "acct-17, 117 and 217 fail the CHECK")
	require.Equal(t, countsOf(run), pageCounts(), "the page shows the status's counts")
	uid := string(run.UID)
	require.Equal(t, f.committedRows(uid), run.Status.Completed, "the ledger's committed rows")
	require.Equal(t, f.int(`SELECT count(*) FROM runledger.item_failure WHERE run_uid = $1`, uid), run.Status.Failed, "the ledger's failure records")
	require.Equal(t, 2, consoletest.Count(t, ctx, "#shards tbody tr"), "two shards")
	require.Equal(t, 2, consoletest.Count(t, ctx, `#shards tbody tr td:nth-child(2)`), "each with its phase")
	for _, sh := range []string{"1", "2"} {
		require.Equal(t, string(v1alpha1.ShardSucceeded), text(`#shards tbody tr:nth-child(`+sh+`) td:nth-child(2)`))
	}
	// The controller's Events (events.k8s.io/v1: an eventTime, no
	// lastTimestamp nor count), with when and how often, as kubectl shows them.
	require.Contains(t, text("#events tbody"), "PodCreated")
	require.NotEmpty(t, text("#events tbody tr:first-child td:first-child"), "an Event's time")
	require.Equal(t, "1", text("#events tbody tr:first-child td:nth-child(4)"), "an Event's count")

	// The ledger's part (read when the page loads): the failed items, by
	// class, and the proof.
	consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/june?proof=1#proof"), chromedp.WaitVisible(chromedp.CSS(`#proof-verdict`)))
	var failed []string
	f.rows(func() { failed = nil }, func(r pgx.Rows) error {
		var e string
		if err := r.Scan(&e); err != nil {
			return err
		}
		failed = append(failed, e)
		return nil
	}, `SELECT entity FROM runledger.item_failure WHERE run_uid = $1 ORDER BY entity`, uid)
	require.Equal(t, []string{"acct-117", "acct-17", "acct-217"}, failed)
	var listed []string
	for i := range 3 {
		listed = append(listed, text(fmt.Sprintf("#failed tbody tr:nth-child(%d) td:first-child", i+1)))
		require.Contains(t, text(fmt.Sprintf("#failed tbody tr:nth-child(%d) .err", i+1)), "sink_no_17")
	}
	slices.Sort(listed)
	require.Equal(t, failed, listed, "the page lists the ledger's failed items")
	require.Equal(t, 3, consoletest.Count(t, ctx, "#failed tbody tr"))
	require.Equal(t, "23514", text("#classes tbody tr:first-child .class"))
	require.Equal(t, "3", text("#classes tbody tr:first-child .items"))
	require.Contains(t, text("#proof-verdict"), "Proven", "the console's proof, from the ledger")
	for what, want := range map[string]int64{"completed": 297, "failed": 3} {
		require.Equal(t, fmt.Sprint(want), text(`#proof-counts tr[data-count="`+what+`"] .ledger`), "the ledger's %s", what)
		require.Equal(t, fmt.Sprint(want), text(`#proof-counts tr[data-count="`+what+`"] .reported`), "the status's %s", what)
	}
	require.Equal(t, 0, consoletest.Count(t, ctx, "#proof-counts tr.differs"))
	consoletest.Shot(t, ctx, shots, "e2e-run-proof.png")

	// The cause fixed, the page's retry: a fromRun run of june's failed
	// items, followed to its end.
	_, err = f.sql(f.ctx, f.dsn, `ALTER TABLE sink DROP CONSTRAINT sink_no_17`)
	require.NoError(t, err)
	consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/june"), chromedp.Click(chromedp.CSS(`#action-retry`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)), chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)))
	retryName := console.RetryName("june", run.UID)
	require.True(t, strings.HasSuffix(consoletest.Get(t, ctx, chromedp.Location()), "/runs/"+f.ns+"/"+retryName), "on the retry's page")
	follow(retryName)
	retry := f.waitComplete(retryName, runTimeout)
	require.Equal(t, &v1alpha1.FromRunSource{Name: "june", Verdict: v1alpha1.FromRunFailed}, retry.Spec.Batch.FromRun, "june's failed items")
	require.Equal(t, run.Spec.Effect, retry.Spec.Effect, "june's spec otherwise")
	require.Equal(t, counts{Total: 3, Completed: 3}, countsOf(retry), "the retry's batch is june's failed items, and they complete")
	require.Equal(t, countsOf(retry), pageCounts(), "the page shows the retry's status")
	f.requireShardsAddUp(retry)
	rid := string(retry.UID)
	require.EqualValues(t, 3, f.committedRows(rid))
	require.EqualValues(t, 3, f.int(`SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND entity ~ '17$'`, rid), "the retry committed the failed keys and no other")
	consoletest.Shot(t, ctx, shots, "e2e-retry.png")

	// The runs page: both runs, with the status's numbers.
	consoletest.Do(t, ctx, chromedp.Navigate(url+"/"), chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)))
	for _, r := range []*v1alpha1.ProcessingRun{run, retry} {
		row := fmt.Sprintf(`tr[data-run="%s/%s"]`, f.ns, r.Name)
		require.Equal(t, string(v1alpha1.RunSucceeded), text(row+" .phase"))
		require.Equal(t, countsOf(r), counts{Total: number(row + " .total"), Completed: number(row + " .completed"),
			AlreadyHandled: number(row + " .already-handled"), Failed: number(row + " .failed")}, "run %s's row", r.Name)
	}
	f.requireExactlyOnce(300)
}

package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli"
	"github.com/runledger/runledger/internal/console"
	"github.com/runledger/runledger/internal/console/consoletest"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/schedule"
	"github.com/runledger/runledger/internal/schedule/manualrun"
)

func TestMain(m *testing.M) { envtestutil.Main(m, pgtest.Stop) }

// consoleSchema: invoices whose amount must be positive (the items of
// accounts 1 to 3 carry 0 or less: their effect fails).
const consoleSchema = `CREATE TABLE invoices (account text NOT NULL, period text NOT NULL, amount numeric NOT NULL CHECK (amount > 0))`

// runSpec is a run's spec over accounts lo..hi of 2026-06, the amount of
// account i being i-3, plus bump for accounts 39 and 40 (another payload
// than may's: june's payload-changed items).
func runSpec(lo, hi, bump int) string {
	return fmt.Sprintf(`database: {secretRef: {name: ledger, key: dsn}}
batch:
  query: "SELECT 'acct-' || i AS entity, '2026-06' AS occurrence, jsonb_build_object('amount', i - 3 + CASE WHEN i > 38 THEN %d ELSE 0 END) AS payload FROM generate_series(%d, %d) i"
effect: {sql: "INSERT INTO invoices SELECT entity, occurrence, (payload->>'amount')::numeric FROM claimed"}
maxFailedItems: 10
`, bump, lo, hi)
}

// fixture is a real apiserver and ledger database holding two runs, may
// (accounts 30..40, all committed) and june (accounts 1..40: 3 failed, 11
// already handled by may, 26 completed), made by runledger run under the
// uids of their ProcessingRuns.
type fixture struct {
	env        *envtestutil.Env
	ns         string
	dsnFile    string
	kubeconfig string
	shots      string
	counts     map[string]v1alpha1.ItemCounts
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := envtestutil.Get(t)
	dsn := pgtest.NewDatabase(t)
	f := &fixture{env: env, ns: env.Namespace(t), counts: map[string]v1alpha1.ItemCounts{}}
	dir := t.TempDir()
	f.dsnFile = filepath.Join(dir, "ledger.dsn")
	require.NoError(t, os.WriteFile(f.dsnFile, []byte(dsn), 0o600))
	f.kubeconfig = filepath.Join(dir, "kubeconfig")
	require.NoError(t, os.WriteFile(f.kubeconfig, env.KubeConfig, 0o600))
	f.shots = os.Getenv(consoletest.EnvScreenshots)
	if f.shots == "" {
		f.shots = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(f.shots, 0o755))
	pool := pgtest.Pool(t, pgtest.Direct(t, dsn))
	_, err := pool.Exec(context.Background(), consoleSchema)
	require.NoError(t, err)
	store := ledger.NewStore(pool)
	for _, r := range []struct {
		name         string
		lo, hi, bump int
	}{{"may", 30, 40, 0}, {"june", 1, 40, 100}} {
		run := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: r.name}}
		require.NoError(t, yaml.Unmarshal([]byte(runSpec(r.lo, r.hi, r.bump)), &run.Spec))
		require.NoError(t, env.Client.Create(context.Background(), run))
		manifest := fmt.Sprintf("apiVersion: processing.runledger.dev/v1alpha1\nkind: ProcessingRun\nmetadata: {name: %s, namespace: %s, uid: %s}\nspec:\n  %s",
			r.name, f.ns, run.UID, strings.ReplaceAll(strings.TrimSpace(runSpec(r.lo, r.hi, r.bump)), "\n", "\n  "))
		file := filepath.Join(dir, r.name+".yaml")
		require.NoError(t, os.WriteFile(file, []byte(manifest), 0o600))
		root := cli.NewRootCommand()
		root.SetArgs([]string{"run", "-f", file, "--dsn-file", f.dsnFile})
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		_ = root.ExecuteContext(context.Background()) // june's failed items fail it (exit 1): the ledger's counts below say what it did
		recs, err := store.FindRuns(context.Background(), f.ns, r.name)
		require.NoError(t, err)
		require.Len(t, recs, 1)
		require.Equal(t, string(run.UID), recs[0].UID, "runledger run kept the ProcessingRun's uid")
		var c v1alpha1.ItemCounts
		require.NoError(t, store.RunItems(context.Background(), recs[0], []ledger.Outcome{ledger.Completed, ledger.Failed, ledger.AlreadyHandled}, func(v ledger.ItemVerdict) error {
			switch v.Outcome {
			case ledger.Completed:
				c.Completed++
			case ledger.Failed:
				c.Failed++
			case ledger.AlreadyHandled:
				c.AlreadyHandled++
				if v.PayloadChanged {
					c.PayloadChanged++
				}
			}
			return nil
		}))
		c.Total = int64(r.hi - r.lo + 1)
		f.counts[r.name] = c
	}
	require.Equal(t, v1alpha1.ItemCounts{Total: 40, Completed: 26, AlreadyHandled: 11, Failed: 3, PayloadChanged: 2}, f.counts["june"], "june's verdicts in the ledger")
	return f
}

// setStatus writes run name's status as the controller would.
func (f *fixture) setStatus(t *testing.T, name string, phase v1alpha1.RunPhase, c v1alpha1.ItemCounts) {
	t.Helper()
	run := &v1alpha1.ProcessingRun{}
	require.NoError(t, f.env.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: name}, run))
	now := metav1.Now()
	run.Status.Phase, run.Status.ItemCounts, run.Status.StartTime = phase, c, &now
	run.Status.Shards = []v1alpha1.ShardStatus{{Index: 0, Pod: name + "-0-0", Phase: v1alpha1.ShardRunning, ItemCounts: c}}
	cond := metav1.Condition{Type: v1alpha1.ConditionComplete, Status: metav1.ConditionFalse, Reason: "Running", Message: "the shards run", LastTransitionTime: now}
	if phase == v1alpha1.RunSucceeded {
		run.Status.CompletionTime = &now
		run.Status.Shards[0].Phase = v1alpha1.ShardSucceeded
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "Succeeded", "every shard succeeded"
	}
	run.Status.Conditions = []metav1.Condition{cond}
	require.NoError(t, f.env.Client.Status().Update(context.Background(), run))
}

// event records a Warning Event of run name, as the controller would.
func (f *fixture) event(t *testing.T, name, reason, message string) {
	t.Helper()
	run := &v1alpha1.ProcessingRun{}
	require.NoError(t, f.env.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: name}, run))
	now := metav1.Now()
	require.NoError(t, f.env.Client.Create(context.Background(), &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: f.ns, Name: name + "." + strings.ToLower(reason)},
		InvolvedObject: corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProcessingRun", Namespace: f.ns, Name: name, UID: run.UID},
		Type:           corev1.EventTypeWarning, Reason: reason, Message: message, Count: 1, FirstTimestamp: now, LastTimestamp: now,
	}))
}

// schedule creates schedule invoices (monthly in Europe/Paris, billing
// the month before) with two ticks missed in its status, as the controller
// would write it.
func (f *fixture) schedule(t *testing.T) *v1alpha1.ProcessingSchedule {
	t.Helper()
	sc := &v1alpha1.ProcessingSchedule{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "invoices"},
		Spec: v1alpha1.ProcessingScheduleSpec{Schedule: "@monthly", TimeZone: "Europe/Paris",
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01", Shift: &v1alpha1.OccurrenceShift{Months: -1}}},
	}
	require.NoError(t, yaml.Unmarshal([]byte(runSpec(41, 42, 0)), &sc.Spec.RunTemplate.Spec))
	require.NoError(t, f.env.Client.Create(context.Background(), sc))
	sc.Status.TimeZone, sc.Status.MissedTicks = "Europe/Paris", 2
	for _, m := range []string{"2025-12", "2026-01"} {
		at, err := time.Parse("2006-01", m)
		require.NoError(t, err)
		sc.Status.Missed = append(sc.Status.Missed, v1alpha1.MissedTick{ScheduledTime: metav1.NewTime(at.AddDate(0, 1, 0).Add(-time.Hour)),
			Occurrence: m, Reason: v1alpha1.MissedSuspended})
	}
	require.NoError(t, f.env.Client.Status().Update(context.Background(), sc))
	return sc
}

// startConsole runs runledger console as the user of kubeconfig, on a free
// loopback port, until the test ends, and returns its URL.
// ("" for none: the ledger alone).
func (f *fixture) startConsole(t *testing.T, kubeconfig string) string {
	t.Helper()
	args := []string{"-n", f.ns, "--dsn-file", f.dsnFile}
	if kubeconfig == "" {
		args = append(args, "--no-cluster")
	} else {
		args = append(args, "--kubeconfig", kubeconfig)
	}
	dsn, err := os.ReadFile(f.dsnFile)
	require.NoError(t, err)
	return consoletest.Start(t, strings.TrimSpace(string(dsn)), args...)
}

func (f *fixture) shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	consoletest.Shot(t, ctx, f.shots, name)
}

// colorScheme has the page's prefers-color-scheme be scheme.
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, target *chromedp.Target) error {
		_, err := cdp.Call(ctx, target, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	})
}

// TestConsoleInABrowser drives runledger console in Debian's Chromium,
// against a real apiserver and ledger database: the runs page shows the
// runs' status and follows a change of it without a reload (the watch,
// through Server-Sent Events); a run's page shows its status and the
// ledger's failed and already handled items, searchable; a key's page its
// holder and failures; the retry action creates the fromRun run; a user
// whom RBAC refuses sees the API server's refusal; a cross-site POST, even
// one that knows the token, is refused.
func TestConsoleInABrowser(t *testing.T) {
	f := newFixture(t)
	june := f.counts["june"]
	running := june
	running.Completed = 10
	f.setStatus(t, "may", v1alpha1.RunSucceeded, f.counts["may"])
	f.setStatus(t, "june", v1alpha1.RunRunning, running)
	f.event(t, "june", "ShardFailed", "shard 0 attempt 0 failed: the pod was evicted")
	url := f.startConsole(t, f.kubeconfig)
	ctx := consoletest.Browser(t, 3*time.Minute)
	row := fmt.Sprintf(`tr[data-run="%s/june"]`, f.ns)

	t.Run("the runs page follows the watch", func(t *testing.T) {
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/"), chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)))
		require.Equal(t, "Running", consoletest.Text(t, ctx, row+" .phase"))
		require.Equal(t, fmt.Sprint(running.Completed), consoletest.Text(t, ctx, row+" .completed"))
		require.Equal(t, fmt.Sprint(running.AlreadyHandled), consoletest.Text(t, ctx, row+" .already-handled"))
		require.Equal(t, fmt.Sprint(running.Failed), consoletest.Text(t, ctx, row+" .failed"))
		require.Equal(t, fmt.Sprint(running.Total), consoletest.Text(t, ctx, row+" .total"))
		require.Equal(t, "60%", consoletest.Text(t, ctx, row+" .pct"), "(10+11+3)/40")
		consoletest.Do(t, ctx, consoletest.MarkLoaded())
		f.setStatus(t, "june", v1alpha1.RunSucceeded, june)
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`document.querySelector(%q).textContent.trim() === "Succeeded"`, row+" .phase"), chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "the page follows june to Succeeded")
		kept := consoletest.Get(t, ctx, chromedp.Evaluate[bool](`window.notReloaded === true`))
		require.True(t, kept, "without a reload")
		require.Equal(t, fmt.Sprint(june.Completed), consoletest.Text(t, ctx, row+" .completed"))
		require.Equal(t, "100%", consoletest.Text(t, ctx, row+" .pct"))
		f.shot(t, ctx, "runs.png")
		consoletest.Do(t, ctx, colorScheme("dark"))
		f.shot(t, ctx, "runs-dark.png")
		consoletest.Do(t, ctx, colorScheme("light"))
	})

	t.Run("a run's page: status and the ledger's items", func(t *testing.T) {
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(row+" .name a")), chromedp.WaitVisible(chromedp.CSS(`#failed`)))
		require.Equal(t, fmt.Sprint(june.Completed), consoletest.Text(t, ctx, "#counts .completed"))
		require.Equal(t, fmt.Sprint(june.AlreadyHandled), consoletest.Text(t, ctx, "#counts .already-handled"))
		require.Equal(t, fmt.Sprint(june.Failed), consoletest.Text(t, ctx, "#counts .failed"))
		require.Equal(t, fmt.Sprint(june.Total), consoletest.Text(t, ctx, "#counts .total"))
		require.Equal(t, int(june.Failed), consoletest.Count(t, ctx, "#failed tbody tr"), "a row per failed item of the ledger")
		require.Equal(t, "23514", consoletest.Text(t, ctx, "#failed tbody tr:first-child .class"), "the class: the CHECK's SQLSTATE")
		require.Contains(t, consoletest.Text(t, ctx, "#failed tbody tr:first-child .err"), "invoices_amount_check")
		require.Equal(t, int(june.AlreadyHandled), consoletest.Count(t, ctx, "#handled tbody tr"))
		require.Equal(t, f.ns+"/may", consoletest.Text(t, ctx, "#handled tbody tr:first-child td:nth-child(3)"), "the run that holds the key")
		require.Equal(t, 1, consoletest.Count(t, ctx, "#shards tbody tr"))
		require.Contains(t, consoletest.Text(t, ctx, "#events tbody"), "ShardFailed", "the run's Event")
		require.Equal(t, 1, consoletest.Count(t, ctx, "#classes tbody tr"), "failures by class")
		require.Equal(t, "23514", consoletest.Text(t, ctx, "#classes tbody .class"))
		require.Equal(t, fmt.Sprint(june.Failed), consoletest.Text(t, ctx, "#classes tbody .items"))
		require.Equal(t, 2, consoletest.Count(t, ctx, "#changed tbody tr"), "acct-39 and acct-40 came with another payload than may's")
		require.Equal(t, "acct-39", consoletest.Text(t, ctx, "#changed tbody tr:first-child td:first-child"))
		f.shot(t, ctx, "run.png")
		// The proof, as runledger verify computes it, against the status.
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS("#action-prove")), chromedp.WaitVisible(chromedp.CSS("#proof-verdict")))
		require.Contains(t, consoletest.Text(t, ctx, "#proof-verdict"), "Proven")
		require.Equal(t, fmt.Sprint(june.Completed), consoletest.Text(t, ctx, `#proof-counts tr[data-count="completed"] .ledger`))
		require.Equal(t, fmt.Sprint(june.Completed), consoletest.Text(t, ctx, `#proof-counts tr[data-count="completed"] .reported`))
		require.Equal(t, "2", consoletest.Text(t, ctx, `#proof-counts tr[data-count="payloadChanged"] .ledger`))
		require.Equal(t, 0, consoletest.Count(t, ctx, "#proof-counts tr.differs"))
		f.shot(t, ctx, "proof.png")
		wrong := june
		wrong.Completed++
		f.setStatus(t, "june", v1alpha1.RunSucceeded, wrong)
		consoletest.Do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#proof-verdict")))
		require.Contains(t, consoletest.Text(t, ctx, "#proof-verdict"), fmt.Sprintf("Not proven: completed %d reported, %d in the ledger", wrong.Completed, june.Completed))
		require.Equal(t, 1, consoletest.Count(t, ctx, "#proof-counts tr.differs"))
		f.setStatus(t, "june", v1alpha1.RunSucceeded, june)
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/june"), chromedp.WaitVisible(chromedp.CSS(`#failed`)))
		consoletest.Do(t, ctx, chromedp.SetValue(chromedp.CSS("#q"), "acct-2"), chromedp.Submit(chromedp.CSS("#q")),
			chromedp.WaitVisible(chromedp.CSS(`#failed`)))
		require.Equal(t, 1, consoletest.Count(t, ctx, "#failed tbody tr"), "the search finds acct-2 alone")
		require.Equal(t, "acct-2", consoletest.Text(t, ctx, "#failed tbody tr td:first-child"))
	})

	t.Run("a key's page", func(t *testing.T) {
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(`#failed tbody tr td:first-child a`)), chromedp.WaitVisible(chromedp.CSS(`#failures`)))
		require.Contains(t, consoletest.Text(t, ctx, "#no-holder"), "No committed row")
		require.Contains(t, consoletest.Text(t, ctx, "#failures tbody"), f.ns+"/june")
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/key?entity=acct-35&occurrence=2026-06"), chromedp.WaitVisible(chromedp.CSS(`#rows`)))
		require.Contains(t, consoletest.Text(t, ctx, "#rows .state-committed"), f.ns+"/may", "acct-35 committed by may")
		f.shot(t, ctx, "key.png")
	})

	t.Run("a run's page follows its status", func(t *testing.T) {
		may := f.counts["may"]
		half := may
		half.Completed = 5
		f.setStatus(t, "may", v1alpha1.RunRunning, half)
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/may"), chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)),
			consoletest.MarkLoaded())
		require.Equal(t, "5", consoletest.Text(t, ctx, "#counts .completed"))
		require.Equal(t, "Running", consoletest.Text(t, ctx, "#counts .phase"))
		require.Equal(t, "Running", consoletest.Text(t, ctx, "#shards tbody tr:first-child td:nth-child(2)"))
		require.Equal(t, "Running", consoletest.Text(t, ctx, "#conditions tbody tr:first-child td:nth-child(3)"))
		f.setStatus(t, "may", v1alpha1.RunSucceeded, may)
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector("#counts .phase").textContent.trim() === "Succeeded" && window.notReloaded === true`,
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "the page follows may to Succeeded, without a reload")
		require.Equal(t, fmt.Sprint(may.Completed), consoletest.Text(t, ctx, "#counts .completed"))
		require.Equal(t, "100%", consoletest.Text(t, ctx, "#counts .pct"))
		require.Equal(t, "Succeeded", consoletest.Text(t, ctx, "#shards tbody tr:first-child td:nth-child(2)"), "the shards follow")
		require.Equal(t, "Succeeded", consoletest.Text(t, ctx, "#conditions tbody tr:first-child td:nth-child(3)"), "the conditions follow")
		require.Equal(t, 1, consoletest.Count(t, ctx, "#action-delete"), "the actions follow (a finished run may be deleted)")
		f.event(t, "may", "ShardRetried", "shard 0 attempt 1 started")
		_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector("#events tbody").textContent.indexOf("ShardRetried") >= 0 && window.notReloaded === true`,
			chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "the Events follow (their watch), without a reload")
		require.Contains(t, consoletest.Get(t, ctx, chromedp.AttributeValue(chromedp.CSS("#rate svg"), "aria-label")).Value, "items per second", "the items/s chart of the samples the console kept")
		f.shot(t, ctx, "run-live.png")
	})

	t.Run("suspend and resume a running run", func(t *testing.T) {
		may := f.counts["may"]
		f.setStatus(t, "may", v1alpha1.RunRunning, may)
		defer f.setStatus(t, "may", v1alpha1.RunSucceeded, may)
		suspended := func() bool {
			t.Helper()
			run := &v1alpha1.ProcessingRun{}
			require.NoError(t, f.env.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "may"}, run))
			return run.Spec.Suspend
		}
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/may"), chromedp.Click(chromedp.CSS(`#action-suspend`)),
			chromedp.WaitVisible(chromedp.CSS(`#confirm`)), chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#action-resume`)))
		require.True(t, suspended(), "suspended through the API")
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(`#action-resume`)), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
			chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#action-suspend`)))
		require.False(t, suspended(), "resumed through the API")
	})

	t.Run("keyboard: skip link, then a run's link by Tab and Enter", func(t *testing.T) {
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/"), chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)))
		consoletest.Do(t, ctx, chromedp.KeyEvent("\t"))
		require.Equal(t, "Skip to content", consoletest.Get(t, ctx, chromedp.Evaluate[string](`document.activeElement.textContent`)), "the first Tab stop")
		consoletest.Do(t, ctx, chromedp.KeyEvent("\r"))
		for range 20 {
			if consoletest.Get(t, ctx, chromedp.Evaluate[string](`document.activeElement.textContent`)) == "may" {
				break
			}
			consoletest.Do(t, ctx, chromedp.KeyEvent("\t"))
		}
		require.Equal(t, "may", consoletest.Get(t, ctx, chromedp.Evaluate[string](`document.activeElement.textContent`)), "a run's link is reached by Tab")
		consoletest.Do(t, ctx, chromedp.KeyEvent("\r"), chromedp.WaitVisible(chromedp.CSS(`#counts`)))
		require.Contains(t, consoletest.Get(t, ctx, chromedp.Location()), "/runs/"+f.ns+"/may")
	})

	t.Run("schedules: next ticks, missed ticks, trigger, backfill, suspend", func(t *testing.T) {
		sc := f.schedule(t)
		p, err := schedule.Parse(sc.Name, &sc.Spec)
		require.NoError(t, err)
		srow := fmt.Sprintf(`tr[data-schedule="%s/invoices"]`, f.ns)
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/schedules"), chromedp.WaitVisible(chromedp.CSS(srow)))
		require.Equal(t, "2", consoletest.Text(t, ctx, srow+" .missed"), "the status's missed ticks")
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(srow+" .name a")), chromedp.WaitVisible(chromedp.CSS(`#next`)))
		next, ok := p.NextAfter(p.WallOf(time.Now()))
		require.True(t, ok)
		require.Equal(t, next.LocalTime(), consoletest.Text(t, ctx, "#next tbody tr:first-child .wall"), "the next tick in Europe/Paris")
		require.Equal(t, next.Occurrence, consoletest.Text(t, ctx, "#next tbody tr:first-child .occurrence"))
		require.Equal(t, 5, consoletest.Count(t, ctx, "#next tbody tr"))
		require.Equal(t, 2, consoletest.Count(t, ctx, "#missed tbody tr"))
		require.Equal(t, "Suspended", consoletest.Text(t, ctx, "#missed tbody tr:first-child .reason"))

		// Trigger an occurrence: its run, as runledger schedule trigger makes it.
		consoletest.Do(t, ctx, chromedp.SetValue(chromedp.CSS("#occurrence"), "2026-03"), chromedp.Click(chromedp.CSS("#action-trigger")),
			chromedp.WaitVisible(chromedp.CSS(`#confirm`)))
		require.Equal(t, "2026-03", consoletest.Text(t, ctx, "#planned tbody .occurrence"))
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#counts`)))
		require.True(t, strings.HasSuffix(consoletest.Get(t, ctx, chromedp.Location()), "/runs/"+f.ns+"/invoices-2026-03"), "on the occurrence's run")
		run := &v1alpha1.ProcessingRun{}
		require.NoError(t, f.env.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "invoices-2026-03"}, run))
		require.True(t, schedule.IsRunOf(run, sc, "2026-03"))
		require.Equal(t, schedule.CreatedByTrigger, run.Annotations[v1alpha1.AnnotationCreatedBy])
		// Again: found, not duplicated, and said so.
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/schedules/"+f.ns+"/invoices/confirm/trigger?occurrence=2026-03"),
			chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#note`)))
		require.Contains(t, consoletest.Text(t, ctx, "#note"), "existed already")

		// Backfill the ticks of 1 April to 1 June: occurrences 2026-03 (found), 2026-04 and 2026-05.
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/schedules/"+f.ns+"/invoices"), chromedp.SetValue(chromedp.CSS("#from"), "2026-04"),
			chromedp.SetValue(chromedp.CSS("#to"), "2026-06"), chromedp.Click(chromedp.CSS("#action-backfill")), chromedp.WaitVisible(chromedp.CSS(`#confirm`)))
		require.Equal(t, 3, consoletest.Count(t, ctx, "#planned tbody tr"))
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#note`)))
		require.Contains(t, consoletest.Text(t, ctx, "#note"), "2 runs created, 1 found")
		require.Equal(t, 3, consoletest.Count(t, ctx, "#occurrences tbody tr"), "the run of each occurrence")
		require.Equal(t, "2026-05", consoletest.Text(t, ctx, "#occurrences tbody tr:first-child .occurrence"))
		require.Equal(t, schedule.CreatedByBackfill, consoletest.Text(t, ctx, "#occurrences tbody tr:first-child .created-by"))
		f.shot(t, ctx, "schedule.png")

		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(`#action-suspend`)), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
			chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#action-resume`)))
		require.NoError(t, f.env.Client.Get(context.Background(), client.ObjectKeyFromObject(sc), sc))
		require.True(t, sc.Spec.Suspend, "suspended through the API")
	})

	t.Run("schedules follow the watch", func(t *testing.T) {
		ctxb := context.Background()
		sc := &v1alpha1.ProcessingSchedule{}
		require.NoError(t, f.env.Client.Get(ctxb, types.NamespacedName{Namespace: f.ns, Name: "invoices"}, sc))
		require.True(t, sc.Spec.Suspend, "as the console's suspend left it")
		live := func(cond, why string) { t.Helper(); consoletest.Live(t, ctx, 30*time.Second, cond, why) }
		setSuspend := func(suspend bool) {
			t.Helper()
			require.NoError(t, f.env.Client.Patch(ctxb, sc, client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"suspend":%t}}`, suspend))))
		}
		setMissed := func(n int64) {
			t.Helper()
			require.NoError(t, f.env.Client.Get(ctxb, client.ObjectKeyFromObject(sc), sc))
			sc.Status.MissedTicks = n
			require.NoError(t, f.env.Client.Status().Update(ctxb, sc))
		}

		// A schedule's page: resumed through the API, a new run of an
		// occurrence (another user's trigger), a missed tick of its status.
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/schedules/"+f.ns+"/invoices"), chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)),
			consoletest.MarkLoaded())
		require.Equal(t, "suspended", consoletest.Text(t, ctx, "#schedule-status .state"))
		require.Equal(t, 1, consoletest.Count(t, ctx, "#action-resume"))
		setSuspend(false)
		live(`document.querySelector("#schedule-status .state").textContent.trim() === "active" && document.querySelector("#action-suspend") !== null`,
			"the page follows the schedule's resume")
		_, made, err := manualrun.Create(ctxb, f.env.Client, sc, "2026-07", time.Time{}, schedule.CreatedByTrigger)
		require.NoError(t, err)
		require.True(t, made)
		live(`document.querySelector("#occurrences tbody tr:first-child .occurrence").textContent.trim() === "2026-07"`,
			"the page follows a new run of occurrence 2026-07")
		require.Equal(t, schedule.CreatedByTrigger, consoletest.Text(t, ctx, "#occurrences tbody tr:first-child .created-by"))
		require.Equal(t, 4, consoletest.Count(t, ctx, "#occurrences tbody tr"))
		f.setStatus(t, "invoices-2026-07", v1alpha1.RunSucceeded, v1alpha1.ItemCounts{Total: 2, Completed: 2})
		live(`document.querySelector("#occurrences tbody tr:first-child .badge").textContent.trim() === "Succeeded"`,
			"the page follows the status of an occurrence's run")
		setMissed(3)
		live(`document.querySelector("#schedule-status .missed").textContent.trim() === "3"`, "the page follows the schedule's status")

		// The schedules page: suspended through the API, a missed tick.
		srow := fmt.Sprintf(`tr[data-schedule="%s/invoices"]`, f.ns)
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/schedules"), chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)),
			consoletest.MarkLoaded())
		require.Equal(t, "3", consoletest.Text(t, ctx, srow+" .missed"))
		require.Empty(t, consoletest.Text(t, ctx, srow+" .suspended"))
		setSuspend(true)
		live(fmt.Sprintf(`document.querySelector('%s .suspended').textContent.trim() === "suspended"`, srow), "the schedules page follows a suspend")
		setMissed(4)
		live(fmt.Sprintf(`document.querySelector('%s .missed').textContent.trim() === "4"`, srow), "the schedules page follows the status")
	})

	t.Run("delete a finished run", func(t *testing.T) {
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/may"), chromedp.Click(chromedp.CSS(`#action-delete`)),
			chromedp.WaitVisible(chromedp.CSS(`#confirm`)), chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#runs`)))
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`document.querySelector('tr[data-run="%s/may"]') === null`, f.ns), chromedp.WithPollingTimeout(30*time.Second)))
		require.NoError(t, err, "may leaves the runs page")
		err = f.env.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "may"}, &v1alpha1.ProcessingRun{})
		require.True(t, apierrors.IsNotFound(err), "may is deleted: %v", err)
	})

	t.Run("retry creates the fromRun run", func(t *testing.T) {
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/june"), chromedp.Click(chromedp.CSS(`#action-retry`)),
			chromedp.WaitVisible(chromedp.CSS(`#confirm`)))
		f.shot(t, ctx, "confirm.png")
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#counts`)),
			chromedp.WaitVisible(chromedp.CSS(`body[data-updates]`)))
		loc := consoletest.Get(t, ctx, chromedp.Location())
		require.Contains(t, loc, "/runs/"+f.ns+"/june-retry-", "the new run's page, live at once")
		runs := &v1alpha1.ProcessingRunList{}
		require.NoError(t, f.env.Client.List(context.Background(), runs, client.InNamespace(f.ns)))
		var retries []v1alpha1.ProcessingRun
		for _, r := range runs.Items {
			if r.Spec.Batch.FromRun != nil {
				retries = append(retries, r)
			}
		}
		require.Len(t, retries, 1)
		orig := &v1alpha1.ProcessingRun{}
		require.NoError(t, f.env.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "june"}, orig))
		require.Equal(t, "june", retries[0].Spec.Batch.FromRun.Name)
		require.Equal(t, orig.Spec.Effect, retries[0].Spec.Effect, "the original's spec otherwise")
		require.Equal(t, orig.Spec.Database, retries[0].Spec.Database)
		require.True(t, strings.HasSuffix(loc, "/"+retries[0].Name), "the browser is on the new run's page")
		require.Equal(t, console.RetryName("june", orig.UID), retries[0].Name)
		// A second submit (the form posted again) finds the retry: no second run.
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/june/confirm/retry"), chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#note`)))
		require.Contains(t, consoletest.Get(t, ctx, chromedp.Location()), "/runs/"+f.ns+"/"+retries[0].Name+"?")
		require.Contains(t, consoletest.Text(t, ctx, "#note"), "nothing was created")
		require.NoError(t, f.env.Client.List(context.Background(), runs, client.InNamespace(f.ns)))
		n := 0
		for _, r := range runs.Items {
			if r.Spec.Batch.FromRun != nil {
				n++
			}
		}
		require.Equal(t, 1, n, "one retry run")
	})

	t.Run("a user whom RBAC refuses sees the refusal", func(t *testing.T) {
		viewer := "viewer-" + f.ns
		ctxb := context.Background()
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "viewer"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"processingruns"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}},
		}}
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "viewer"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "viewer"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: viewer}}}
		require.NoError(t, f.env.Client.Create(ctxb, role))
		require.NoError(t, f.env.Client.Create(ctxb, binding))
		kc := filepath.Join(t.TempDir(), "viewer.kubeconfig")
		require.NoError(t, os.WriteFile(kc, f.env.User(t, viewer), 0o600))
		vurl := f.startConsole(t, kc)
		consoletest.Do(t, ctx, chromedp.Navigate(vurl+"/runs/"+f.ns+"/june"), chromedp.WaitVisible(chromedp.CSS(`#failed`)))
		require.Equal(t, fmt.Sprint(june.Failed), consoletest.Text(t, ctx, "#counts .failed"), "the viewer reads the run")
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(`#action-retry`)), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
			chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#message`)))
		msg := consoletest.Text(t, ctx, "#message")
		require.Contains(t, msg, `User "`+viewer+`" cannot create resource "processingruns"`, "the API server's own message")
		require.Contains(t, consoletest.Text(t, ctx, ".refusal"), "Refused by the API server (HTTP 403)")
		f.shot(t, ctx, "refused.png")
	})

	t.Run("without a cluster, the ledger alone", func(t *testing.T) {
		lurl := f.startConsole(t, "")
		consoletest.Do(t, ctx, chromedp.Navigate(lurl+"/"), chromedp.WaitVisible(chromedp.CSS(row)))
		require.Equal(t, fmt.Sprint(june.Completed), consoletest.Text(t, ctx, row+" .completed"), "the ledger's rows of june")
		require.Equal(t, "—", consoletest.Text(t, ctx, row+" .already-handled"), "not counted without the batch")
		require.Equal(t, fmt.Sprint(june.Failed), consoletest.Text(t, ctx, row+" .failed"))
		require.Equal(t, fmt.Sprint(june.Total), consoletest.Text(t, ctx, row+" .total"))
		consoletest.Do(t, ctx, chromedp.Click(chromedp.CSS(row+" .name a")), chromedp.WaitVisible(chromedp.CSS(`#failed`)))
		require.Equal(t, int(june.Failed), consoletest.Count(t, ctx, "#failed tbody tr"))
		require.Equal(t, int(june.AlreadyHandled), consoletest.Count(t, ctx, "#handled tbody tr"))
	})

	t.Run("a cross-site POST is refused", func(t *testing.T) {
		// Another site's page (another origin) that even knows the token posts
		// a suspend of june to the console.
		consoletest.Do(t, ctx, chromedp.Navigate(url+"/runs/"+f.ns+"/june/confirm/suspend"))
		token := consoletest.Get(t, ctx, chromedp.Value(chromedp.CSS(`input[name="token"]`)))
		require.NotEmpty(t, token)
		evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/runs/%s/june/suspend"><input name="token" value="%s"></form>
<script>document.getElementById("f").submit()</script>`, url, f.ns, token)
		}))
		defer evil.Close()
		consoletest.Do(t, ctx, chromedp.Navigate(evil.URL),
			chromedp.Poll[chromedp.Void](`location.href.indexOf("/suspend") > 0 && document.body && document.body.innerText.length > 0`, chromedp.WithPollingTimeout(20*time.Second)))
		body := consoletest.Text(t, ctx, "body")
		require.Regexp(t, `refused: (a (same|cross)-site request|from origin)`, body, "refused for where it came from, though it knew the token")
		run := &v1alpha1.ProcessingRun{}
		require.NoError(t, f.env.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "june"}, run))
		require.False(t, run.Spec.Suspend, "june is not suspended")
	})
}

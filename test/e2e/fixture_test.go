//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// fixture is one test's namespace and database.
type fixture struct {
	*env
	t   *testing.T
	ctx context.Context
	ns  string
	db  string
	dsn string
	mon *podMonitor
	cnt *countMonitor
}

const (
	secretName = "ledger-db"
	secretKey  = "dsn"
	workerSA   = "runledger-worker"
)

// newFixture creates a namespace (restricted Pod Security level, the worker
// ServiceAccount bound to the runledger-worker ClusterRole, the ledger
// Secret) and a database with the sink schema whose trigger sleeps
// sleepPerChunk seconds per chunk; it watches the namespace's worker pods
// (never two live pods for a shard) and runs (counts never go down).
// On success everything is deleted; on failure it is kept (with a dump of
// what a user would look at) for debugging.
func newFixture(t *testing.T, name string, sleepPerChunk float64) *fixture {
	t.Helper()
	return newFixtureOf(t, name, sleepPerChunk, true)
}

// newFixtureOf is newFixture; with migrate false its ledger database is left
// empty (no migration, no effect role), for the workers of a release to
// migrate it as theirs do at start.
func newFixtureOf(t *testing.T, name string, sleepPerChunk float64, migrate bool) *fixture {
	t.Helper()
	return newFixtureOn(t, setup(t), name, sleepPerChunk, migrate)
}

// newFixtureOn is newFixtureOf on e's PostgreSQL (e.adminDSN): the
// cluster's, or another one such as the HA set of TestLedgerFailover.
func newFixtureOn(t *testing.T, e *env, name string, sleepPerChunk float64, migrate bool) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	suffix := randSuffix()
	f := &fixture{env: e, t: t, ctx: ctx, ns: "e2e-" + name + "-" + suffix, db: "e2e_" + strings.ReplaceAll(name, "-", "_") + "_" + suffix}

	f.dsn = e.createDatabase(t, f.db)
	_, err := e.sql(ctx, f.dsn, fmt.Sprintf(sinkSchema, sleepPerChunk))
	require.NoError(t, err, "sink schema")
	if migrate {
		sandboxEffects(t, f.dsn)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "runledger.dev/e2e": "true",
	}}}
	require.NoError(t, e.c.Create(ctx, ns))
	f.mon = startPodMonitor(ctx, t, e.cs, f.ns)
	f.cnt = startCountMonitor(ctx, e.c, f.ns)
	t.Cleanup(func() {
		cancel()
		f.mon.stop()
		f.cnt.stop()
		if v := f.mon.violations(); len(v) > 0 {
			t.Errorf("a shard had two live pods at once:\n  %s", strings.Join(v, "\n  "))
		}
		if v := f.cnt.violations(); len(v) > 0 {
			t.Errorf("a run's counts went down:\n  %s", strings.Join(v, "\n  "))
		}
		if t.Failed() {
			f.dump()
			t.Logf("kept namespace %s and database %s for debugging", f.ns, f.db)
			return
		}
		bg := context.Background()
		if err := e.c.Delete(bg, ns); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete namespace %s: %v", f.ns, err)
		}
		if err := e.dropDatabase(f.db); err != nil {
			t.Logf("drop database %s: %v", f.db, err)
		}
	})

	require.NoError(t, e.c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: workerSA}}))
	require.NoError(t, e.c.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: workerSA},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "runledger-worker"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: f.ns, Name: workerSA}},
	}))
	f.createSecret(secretName)
	return f
}

// with is the fixture for a subtest: the same namespace and database, and
// the subtest's t for its failures.
func (f *fixture) with(t *testing.T) *fixture {
	c := *f
	c.t = t
	return &c
}

func randSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// createSecret creates the Secret a run's spec.database.secretRef names.
func (f *fixture) createSecret(name string) {
	f.t.Helper()
	require.NoError(f.t, f.c.Create(f.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		StringData: map[string]string{secretKey: f.dsn},
	}))
}

// createConfigMap creates a ConfigMap holding a batch as JSON Lines.
func (f *fixture) createConfigMap(name, key, jsonl string) {
	f.t.Helper()
	require.NoError(f.t, f.c.Create(f.ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Data:       map[string]string{key: jsonl},
	}))
}

// runSpec is what the tests vary in a run.
type runSpec struct {
	workers, chunk int32
	batch          v1alpha1.BatchSpec
	noEffect       bool
	secret         string
}

// createRun creates a ProcessingRun with the sink effect.
func (f *fixture) createRun(name string, s runSpec) *v1alpha1.ProcessingRun {
	f.t.Helper()
	run := f.newRun(name, s)
	require.NoError(f.t, f.c.Create(f.ctx, run), "create run %s", name)
	f.t.Logf("created run %s/%s (uid %s): %d workers", f.ns, name, run.UID, run.Spec.Workers)
	return run
}

func (f *fixture) newRun(name string, s runSpec) *v1alpha1.ProcessingRun {
	secret := s.secret
	if secret == "" {
		secret = secretName
	}
	run := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: v1alpha1.ProcessingRunSpec{
			Database:     v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: secret, Key: secretKey}},
			Batch:        s.batch,
			Workers:      max(s.workers, 1),
			BackoffLimit: ptr.To[int32](3),
		},
	}
	if s.chunk > 0 {
		run.Spec.ChunkSize = s.chunk
	}
	if !s.noEffect {
		run.Spec.Effect = &v1alpha1.EffectSpec{SQL: sinkEffect}
	}
	return run
}

// queryBatch is accounts lo..hi (and repeats of the first `repeats` of
// them, duplicates inside the batch), from an SQL query.
func queryBatch(lo, hi, repeats int) v1alpha1.BatchSpec {
	q := queryBatchIn("2026-01", lo, hi).Query
	if repeats > 0 {
		q += fmt.Sprintf(` UNION ALL SELECT 'acct-' || i, '2026-01', jsonb_build_object('amount', i) FROM generate_series(%d, %d) i`, lo, lo+repeats-1)
	}
	return v1alpha1.BatchSpec{Query: q}
}

// queryBatchIn is accounts lo..hi for occurrence, from a query.
func queryBatchIn(occurrence string, lo, hi int) v1alpha1.BatchSpec {
	return v1alpha1.BatchSpec{Query: fmt.Sprintf(`SELECT 'acct-' || i AS entity, '%s' AS occurrence, jsonb_build_object('amount', i) AS payload FROM generate_series(%d, %d) i`, occurrence, lo, hi)}
}

// jsonLines is accounts lo..hi as JSON Lines.
func jsonLines(lo, hi int) string {
	var b strings.Builder
	for i := lo; i <= hi; i++ {
		fmt.Fprintf(&b, `{"entity":"acct-%d","occurrence":"2026-01","payload":{"amount":%d}}`+"\n", i, i)
	}
	return b.String()
}

// get reads a run.
func (f *fixture) get(name string) *v1alpha1.ProcessingRun {
	f.t.Helper()
	run := &v1alpha1.ProcessingRun{}
	require.NoError(f.t, f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: name}, run))
	return run
}

// waitRun polls a run until cond holds.
func (f *fixture) waitRun(name string, timeout time.Duration, what string, cond func(*v1alpha1.ProcessingRun) bool) *v1alpha1.ProcessingRun {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		run := &v1alpha1.ProcessingRun{}
		err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: name}, run)
		if err == nil && cond(run) {
			return run
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out after %s waiting until %s (run %s: phase %q, status %s)", timeout, what, name, run.Status.Phase, statusLine(run))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// waitFinished waits until the run is Complete or Failed.
func (f *fixture) waitFinished(name string, timeout time.Duration) *v1alpha1.ProcessingRun {
	f.t.Helper()
	run := f.waitRun(name, timeout, "the run is Complete or Failed", func(r *v1alpha1.ProcessingRun) bool {
		return isTrue(r, v1alpha1.ConditionComplete) || isTrue(r, v1alpha1.ConditionFailed)
	})
	f.t.Logf("run %s finished: %s", name, statusLine(run))
	return run
}

// waitComplete waits for the Complete condition and checks the phase.
func (f *fixture) waitComplete(name string, timeout time.Duration) *v1alpha1.ProcessingRun {
	f.t.Helper()
	run := f.waitFinished(name, timeout)
	require.True(f.t, isTrue(run, v1alpha1.ConditionComplete), "run %s is Complete; conditions: %s", name, conditionsLine(run))
	require.Equal(f.t, v1alpha1.RunSucceeded, run.Status.Phase)
	return run
}

func isTrue(run *v1alpha1.ProcessingRun, cond string) bool {
	return meta.IsStatusConditionTrue(run.Status.Conditions, cond)
}

func statusLine(run *v1alpha1.ProcessingRun) string {
	s := run.Status
	return fmt.Sprintf("phase=%s total=%d completed=%d alreadyHandled=%d failed=%d conditions=[%s]",
		s.Phase, s.Total, s.Completed, s.AlreadyHandled, s.Failed, conditionsLine(run))
}

func conditionsLine(run *v1alpha1.ProcessingRun) string {
	var parts []string
	for _, c := range run.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, " ")
}

// counts is a run's totals.
type counts struct{ Total, Completed, AlreadyHandled, Failed int64 }

func countsOf(run *v1alpha1.ProcessingRun) counts {
	s := run.Status
	return counts{s.Total, s.Completed, s.AlreadyHandled, s.Failed}
}

// requireShardsAddUp checks that the shards' entries add up to the run's
// counts and each shard is Succeeded.
func (f *fixture) requireShardsAddUp(run *v1alpha1.ProcessingRun) {
	f.t.Helper()
	require.Len(f.t, run.Status.Shards, int(run.Spec.Workers), "one status entry per shard")
	var sum counts
	for _, s := range run.Status.Shards {
		require.Equal(f.t, v1alpha1.ShardSucceeded, s.Phase, "shard %d", s.Index)
		sum.Total += s.Total
		sum.Completed += s.Completed
		sum.AlreadyHandled += s.AlreadyHandled
		sum.Failed += s.Failed
	}
	require.Equal(f.t, countsOf(run), sum, "the shards add up to the run's counts")
}

// runPods are the worker pods of a run (by UID).
func (f *fixture) runPods(run *v1alpha1.ProcessingRun) []corev1.Pod {
	f.t.Helper()
	var pods corev1.PodList
	require.NoError(f.t, f.c.List(f.ctx, &pods, client.InNamespace(f.ns), client.MatchingLabels{v1alpha1.LabelRunUID: string(run.UID)}))
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	return pods.Items
}

// waitPodsFinished waits until every pod of the run has a terminal phase and
// returns them. A shard is finished when its worker container has
// terminated, which the run may report a moment before the kubelet reports
// the pod's phase.
func (f *fixture) waitPodsFinished(run *v1alpha1.ProcessingRun, timeout time.Duration) []corev1.Pod {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pods := f.runPods(run)
		done := true
		for _, p := range pods {
			done = done && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
		}
		if done || time.Now().After(deadline) {
			return pods
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// events are the Events about an object of the test's namespace.
func (f *fixture) events(name string) []corev1.Event {
	f.t.Helper()
	var evs corev1.EventList
	require.NoError(f.t, f.c.List(f.ctx, &evs, client.InNamespace(f.ns)))
	var out []corev1.Event
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// waitEvent waits for an Event about name with the given reason and returns it.
func (f *fixture) waitEvent(name, reason string, timeout time.Duration) corev1.Event {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, e := range f.events(name) {
			if e.Reason == reason {
				return e
			}
		}
		if time.Now().After(deadline) {
			var seen []string
			for _, e := range f.events(name) {
				seen = append(seen, e.Reason+": "+e.Message)
			}
			f.t.Fatalf("no Event %s about %s after %s; events: %v", reason, name, timeout, seen)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// kubectl runs kubectl in the test's namespace.
func (f *fixture) kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return f.kubectlRun(ctx, append([]string{"-n", f.ns}, args...)...)
}

// dump writes what a user would look at to understand a failure (the runs,
// pods, events, schedules, the workers' and the manager's logs) to a file
// among the cluster's logs (RUNLEDGER_CLUSTER_LOGS; the temporary directory
// without it) and logs only where: the test's failure message stays at the
// tail of its output, which is the part a CI summary shows.
func (f *fixture) dump() {
	f.t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"get", "processingruns", "-o", "wide"},
		{"get", "pods", "-o", "wide"},
		{"describe", "processingruns"},
		{"get", "events", "--sort-by=.lastTimestamp"},
		{"get", "processingruns", "-o", "yaml"},
		{"get", "processingschedules", "-o", "yaml"},
	} {
		out, _ := f.kubectl(args...)
		fmt.Fprintf(&b, "$ kubectl -n %s %s\n%s\n", f.ns, strings.Join(args, " "), out)
	}
	var pods corev1.PodList
	if err := f.c.List(context.Background(), &pods, client.InNamespace(f.ns)); err == nil {
		for _, p := range pods.Items {
			out, _ := f.kubectl("logs", p.Name, "--tail=30")
			fmt.Fprintf(&b, "$ kubectl -n %s logs %s --tail=30\n%s\n", f.ns, p.Name, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, _ := f.kubectlRun(ctx, "-n", systemNamespace, "logs", "deployment/"+managerName, "--all-pods", "--prefix", "--tail=200")
	fmt.Fprintf(&b, "$ kubectl -n %s logs deployment/%s --all-pods --prefix --tail=200\n%s\n", systemNamespace, managerName, out)

	dir := cmp.Or(os.Getenv("RUNLEDGER_CLUSTER_LOGS"), os.TempDir())
	path := filepath.Join(dir, "dump-"+strings.ReplaceAll(f.t.Name(), "/", "_")+"-"+f.ns+".txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		f.t.Logf("writing the dump to %s: %v; here it is:\n%s", path, err, b.String())
		return
	}
	f.t.Logf("the runs, pods, events and logs of namespace %s are in %s", f.ns, path)
}

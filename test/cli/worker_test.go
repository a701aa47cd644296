package clitest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/pgtest"
	"github.com/runledger/runledger/internal/testtier"
	"github.com/runledger/runledger/internal/worker"
)

// kubeEnv is a real kube-apiserver (envtest) with the ProcessingRun CRD,
// and config/policy's admission policy runledger-worker-own-pod in
// namespace default, where the runs are: the workers' reports pass it.
type kubeEnv struct {
	env *envtestutil.Env
	c   client.Client
}

func startKube(t *testing.T) *kubeEnv {
	t.Helper()
	testtier.Needs(t, envtestutil.Needs)
	env, err := envtestutil.Start()
	require.NoError(t, err, "starting kube-apiserver and etcd")
	t.Cleanup(func() { require.NoError(t, env.Stop(), "stopping the control plane") })
	env.InstallOwnPodPolicy(t, "default")
	return &kubeEnv{env: env, c: env.Client}
}

// podClient is the worker's client of pod's shard, with the token the
// kubelet would mount into the pod.
func (k *kubeEnv) podClient(t *testing.T, pod *corev1.Pod) *worker.PodClient {
	t.Helper()
	dir, _ := k.env.WorkerTokenDir(t, pod)
	c, err := worker.TokenDirPodClient(k.env.Config.Host, dir)
	require.NoError(t, err)
	return c
}

// createRun creates a ProcessingRun in namespace default.
func (k *kubeEnv) createRun(t *testing.T, name string, workers int32, batch v1alpha1.BatchSpec, effect ...string) *v1alpha1.ProcessingRun {
	t.Helper()
	run := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.ProcessingRunSpec{
			Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}},
			Batch:    batch,
			Workers:  workers,
		},
	}
	if len(effect) > 0 {
		run.Spec.Effect = &v1alpha1.EffectSpec{SQL: effect[0]}
	}
	require.NoError(t, k.c.Create(context.Background(), run), "creating run %s", name)
	return run
}

func (k *kubeEnv) getRun(t *testing.T, name string) *v1alpha1.ProcessingRun {
	t.Helper()
	run := &v1alpha1.ProcessingRun{}
	require.NoError(t, k.c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, run))
	return run
}

// workerPod returns the worker pod of a shard and attempt, creating it as
// the controller would (no kubelet runs it: the test runs the worker).
func (k *kubeEnv) workerPod(t *testing.T, run *v1alpha1.ProcessingRun, shard, attempt int) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	name := v1alpha1.PodName(run.Name, int32(shard), int32(attempt))
	pod := &corev1.Pod{}
	err := k.c.Get(ctx, types.NamespacedName{Namespace: run.Namespace, Name: name}, pod)
	if err == nil {
		return pod
	}
	require.True(t, apierrors.IsNotFound(err), "%v", err)
	pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: run.Namespace, Labels: map[string]string{
			v1alpha1.LabelRun: run.Name, v1alpha1.LabelRunUID: string(run.UID),
			v1alpha1.LabelShard: strconv.Itoa(shard), v1alpha1.LabelAttempt: strconv.Itoa(attempt)}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, ServiceAccountName: envtestutil.WorkerServiceAccount,
			Containers: []corev1.Container{{Name: v1alpha1.WorkerContainerName, Image: "runledger"}}},
	}
	require.NoError(t, k.c.Create(ctx, pod))
	return pod
}

// report is a worker's latest report on its pod (the progress annotation),
// as the controller reads it.
func (k *kubeEnv) report(t *testing.T, run *v1alpha1.ProcessingRun, shard, attempt int) v1alpha1.ShardReport {
	t.Helper()
	pod := k.workerPod(t, run, shard, attempt)
	v, ok := pod.Annotations[v1alpha1.AnnotationProgress]
	require.True(t, ok, "pod %s has no report: %v", pod.Name, pod.Annotations)
	r, err := v1alpha1.ParseShardReport(v)
	require.NoError(t, err)
	require.Equal(t, []int32{int32(shard), int32(attempt)}, []int32{r.Shard, r.Attempt})
	return r
}

func inlineBatch(n int) v1alpha1.BatchSpec {
	var b v1alpha1.BatchSpec
	for i := range n {
		b.Items = append(b.Items, v1alpha1.Item{Entity: fmt.Sprintf("acct-%d", i), Occurrence: "2024-06",
			Payload: &apiextensionsv1.JSON{Raw: []byte(fmt.Sprintf(`{"amount":%d}`, i))}})
	}
	return b
}

// TestWorkerInPod runs the worker's Kubernetes side against a real
// kube-apiserver: its reports on its pod (JSON merge patches through the
// worker's own client, with a token bound to the pod as the kubelet mounts
// it, under the admission policy workers get), and the worker's processes
// as the controller starts them: the worker binary (runledger-worker, what
// the pods of the manager's image run) and `runledger worker` (a run that
// names its own image).
func TestWorkerInPod(t *testing.T) {
	t.Parallel()
	k := startKube(t)
	bin := buildWorkerBinary(t)

	// Two shards report concurrently, many times: each report lands on the
	// shard's own pod, and the run object is never written by a worker (the
	// controller aggregates the pods' reports).
	t.Run("shards report on their own pods", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		run := k.createRun(t, "reports", 2, inlineBatch(4))
		before := k.getRun(t, run.Name).ResourceVersion

		var wg sync.WaitGroup
		for shard := range 2 {
			pod := k.workerPod(t, run, shard, 0)
			pc := k.podClient(t, pod)
			wg.Go(func() {
				env := worker.PodEnv{Namespace: run.Namespace, Name: run.Name, UID: string(run.UID), Shard: shard, Shards: 2,
					PodName: pod.Name, PodUID: string(pod.UID)}
				rep := worker.NewStatusReporter(pc, env, 0, discard())
				for i := 1; i <= 10; i++ {
					r := worker.Report{ItemCounts: v1alpha1.ItemCounts{Total: 1000, Completed: int64(100*i + shard), AlreadyHandled: int64(shard)}}
					require.NoError(t, rep.Final(ctx, r, "report "+strconv.Itoa(i), 10*time.Second))
				}
			})
		}
		wg.Wait()
		for shard := range 2 {
			e := k.report(t, run, shard, 0)
			require.EqualValues(t, 1000+shard, e.Completed, "shard %d's last report", shard)
			require.EqualValues(t, shard, e.AlreadyHandled)
			require.EqualValues(t, 1000, e.Total)
			require.Equal(t, "report 10", e.Message)
			require.NotNil(t, e.ReportTime)
		}
		require.Equal(t, before, k.getRun(t, run.Name).ResourceVersion, "no worker wrote the run")

		// A report onto a pod of the same name but another UID (a
		// force-deleted pod's successor) is refused, and writes nothing.
		pod := k.workerPod(t, run, 0, 0)
		pc := k.podClient(t, pod)
		stale := worker.NewStatusReporter(pc, worker.PodEnv{Namespace: run.Namespace, Name: run.Name, UID: string(run.UID), Shard: 0, Shards: 2,
			PodName: pod.Name, PodUID: "00000000-0000-0000-0000-000000000000"}, 0, discard())
		err := stale.Final(ctx, worker.Report{ItemCounts: v1alpha1.ItemCounts{Completed: 1}}, "stale", 5*time.Second)
		require.ErrorContains(t, err, "another pod took its name")
		require.EqualValues(t, 1000, k.report(t, run, 0, 0).Completed)
		gone := worker.NewStatusReporter(pc, worker.PodEnv{Namespace: run.Namespace, Name: run.Name, UID: string(run.UID), Shard: 0, Shards: 2,
			PodName: "reports-0-9"}, 0, discard())
		require.ErrorContains(t, gone.Final(ctx, worker.Report{}, "gone", 5*time.Second), "pod reports-0-9 is gone")
	})

	// A wrong password that is a common word, the run's name holding the
	// word: the JSON logs, the status entry and the termination message keep
	// the name readable and never hold the password as the DSN's secret.
	t.Run("common-word password", func(t *testing.T) {
		t.Parallel()
		pgtest.DirectOnly(t, testBouncerTrusts)
		d := newDB(t)
		run := k.createRun(t, "runledger-words", 1, inlineBatch(3))
		wrong := &db{dsn: pgtest.PasswordDSN(t, d.dsn, "runledger"), pool: d.pool}
		tl := filepath.Join(t.TempDir(), "t")
		r := runWorker(t, k, bin, wrong, run, 0, 0, "--termination-log", tl, "--retry-timeout", "5s")
		require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
		raw, err := os.ReadFile(tl)
		require.NoError(t, err)
		e := k.report(t, run, 0, 0)
		for _, out := range []string{r.stderr, string(raw), e.Message} {
			require.Contains(t, out, "rejected the connection string's credentials")
			require.NotContains(t, out, "password=runledger")
			require.NotContains(t, out, "xxxxx", "nothing to mask:\n%s", out)
			require.NotContains(t, out, "[redacted]", "nothing to mask:\n%s", out)
		}
		require.Contains(t, r.stderr, `"run":"default/runledger-words"`)
		require.Zero(t, d.committed(t))
	})

	// The DSN from a file (a Secret mounted as a file), with
	// RUNLEDGER_DATABASE_URL unset; a DSN file that cannot be read is bad
	// configuration, said so without retries.
	t.Run("DSN file", func(t *testing.T) {
		t.Parallel()
		d := newDB(t)
		run := k.createRun(t, "dsn-file", 1, inlineBatch(10))
		noEnv := &db{pool: d.pool}
		file := writeFile(t, "dsn", d.dsn+"\n")
		r := runWorker(t, k, subcommand, noEnv, run, 0, 0, "--dsn-file", file, "--termination-log", filepath.Join(t.TempDir(), "t"))
		require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
		require.EqualValues(t, 10, k.report(t, run, 0, 0).Completed)
		require.EqualValues(t, 10, d.committed(t))

		tl := filepath.Join(t.TempDir(), "t")
		missing := filepath.Join(t.TempDir(), "nope")
		r = runWorker(t, k, subcommand, noEnv, run, 0, 1, "--dsn-file", missing, "--termination-log", tl)
		require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
		require.Contains(t, r.stderr, "reading --dsn-file: open "+missing+": no such file or directory")
		require.NotContains(t, r.stderr, "RUNLEDGER_DATABASE_URL is not set", "the file is the DSN's source")
		raw, err := os.ReadFile(tl)
		require.NoError(t, err)
		require.Contains(t, string(raw), "reading --dsn-file")
		require.EqualValues(t, 10, d.committed(t), "nothing committed twice")
	})

	// Issue #43.5 in a pod: the ledger knows the run's uid as another run's
	// (a manifest copied with it, run locally first): the worker's shard is
	// bad input, naming both runs, and commits nothing.
	t.Run("uid of another run", func(t *testing.T) {
		t.Parallel()
		d := newDB(t)
		run := k.createRun(t, "uid-taken", 1, inlineBatch(1))
		// The same batch: nothing but the uid tells the runs apart.
		local := strings.Replace(manifest("elsewhere", "batch:", `  items: [{entity: acct-0, occurrence: "2024-06", payload: {amount: 0}}]`),
			"  namespace: billing\n", "  namespace: billing\n  uid: "+string(run.UID)+"\n", 1)
		r := runCLI(t, "", "run", "-f", writeFile(t, "local.yaml", local), "--dsn", d.dsn, "--output", "json")
		require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
		writes := d.ledgerWrites(t)

		tl := filepath.Join(t.TempDir(), "t")
		r = runWorker(t, k, bin, d, run, 0, 0, "--termination-log", tl)
		require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
		for _, out := range []string{r.stderr, k.report(t, run, 0, 0).Message} {
			require.Contains(t, out, "run default/uid-taken has uid "+string(run.UID)+", which the ledger database records as run billing/elsewhere")
		}
		require.Equal(t, writes, d.ledgerWrites(t), "nothing written to the ledger")
		require.EqualValues(t, 1, d.committed(t))
	})

	// `runledger worker` as the controller starts it: two shard processes of a
	// run, then one of a ConfigMap run, then bad configurations.
	t.Run("worker processes", func(t *testing.T) {
		t.Parallel()
		d := newDB(t)
		run := k.createRun(t, "inline", 2, inlineBatch(300))
		results := make([]result, 2)
		term := make([]string, 2)
		var wg sync.WaitGroup
		for shard := range 2 {
			term[shard] = filepath.Join(t.TempDir(), "termination-log")
			wg.Go(func() {
				results[shard] = runWorker(t, k, bin, d, run, shard, 0, "--termination-log", term[shard])
			})
		}
		wg.Wait()
		var sum v1alpha1.ItemCounts
		for shard := range 2 {
			r := results[shard]
			require.Equal(t, 0, r.code, "shard %d; stderr:\n%s", shard, r.stderr)
			e := k.report(t, run, shard, 0)
			require.Equal(t, "done", e.Message)
			require.Equal(t, e.Total, e.Completed, "shard %d: all completed", shard)
			raw, err := os.ReadFile(term[shard])
			require.NoError(t, err, "the termination message is written")
			rep, err := v1alpha1.ParseShardReport(string(raw))
			require.NoError(t, err, "the controller can parse it: %s", raw)
			// With what the ledger's server promises of a commit, as the
			// server tells its sessions (the controller's
			// SynchronousReplication condition), on the pod's final report too.
			var commit string
			require.NoError(t, d.pool.QueryRow(context.Background(), `SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit'`).Scan(&commit))
			require.NotNil(t, rep.Replication, "the termination message says what the ledger's server promises")
			require.Equal(t, commit, rep.Replication.SynchronousCommit)
			require.Equal(t, rep.Replication, e.Replication, "the pod's final report says the same")
			rep.Replication = nil
			require.Equal(t, v1alpha1.ShardReport{Shard: int32(shard), ItemCounts: v1alpha1.ItemCounts{Total: e.Total, Completed: e.Completed}, Message: "done"}, rep)
			require.Contains(t, r.stderr, `"msg":"shard finished"`, "JSON logs")
			// The contract's final report: the shard's row on the board is
			// done, with the final counts (the next reporter need not wait
			// for it to go stale).
			require.NotContains(t, r.stderr, "final progress not published", "shard %d", shard)
			require.NotContains(t, r.stderr, "stop requested", "shard %d: no signal came", shard)
			var done bool
			var completed int64
			require.NoError(t, d.pool.QueryRow(context.Background(),
				`SELECT done, completed FROM runledger.shard_progress WHERE run_uid = $1 AND shard = $2`, string(run.UID), shard).Scan(&done, &completed))
			require.True(t, done, "shard %d: its progress row is marked done at exit", shard)
			require.Equal(t, e.Completed, completed, "shard %d: the row holds the final counts", shard)
			sum.Add(e.ItemCounts)
		}
		require.Equal(t, v1alpha1.ItemCounts{Total: 300, Completed: 300}, sum)
		require.EqualValues(t, 300, d.committed(t))
		require.EqualValues(t, 300, d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, string(run.UID)))

		// A second attempt of shard 1 counts the first attempt's rows as completed.
		r := runWorker(t, k, bin, d, run, 1, 1, "--termination-log", filepath.Join(t.TempDir(), "t"))
		require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
		e := k.report(t, run, 1, 1)
		require.EqualValues(t, 1, e.Attempt)
		require.Equal(t, e.Total, e.Completed, "attempt 1: the rows of attempt 0 count as completed")

		// A ConfigMap batch, the key mounted as a file.
		var lines []string
		for i := range 50 {
			lines = append(lines, fmt.Sprintf(`{"entity":"cm-%d","occurrence":"2024-06"}`, i%40))
		}
		require.NoError(t, k.c.Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "june", Namespace: "default"},
			Data: map[string]string{"items.jsonl": strings.Join(lines, "\n")}}))
		cmRun := k.createRun(t, "configmap", 1, v1alpha1.BatchSpec{ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "june", Key: "items.jsonl"}})
		r = runWorker(t, k, bin, d, cmRun, 0, 0, "--termination-log", filepath.Join(t.TempDir(), "t"))
		require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
		e = k.report(t, cmRun, 0, 0)
		require.Equal(t, []int64{50, 40, 10, 0}, []int64{e.Total, e.Completed, e.AlreadyHandled, e.Failed})

		// Bad JSON Lines: exit 2, the message in the pod's report and the termination message.
		require.NoError(t, k.c.Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: "default"},
			Data: map[string]string{"items.jsonl": `{"entity":"a"}`}}))
		bad := k.createRun(t, "broken", 1, v1alpha1.BatchSpec{ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "broken", Key: "items.jsonl"}})
		tl := filepath.Join(t.TempDir(), "t")
		r = runWorker(t, k, bin, d, bad, 0, 0, "--termination-log", tl)
		require.Equal(t, 2, r.code, "bad input; stderr:\n%s", r.stderr)
		e = k.report(t, bad, 0, 0)
		require.Contains(t, e.Message, `line 1: field "occurrence" is missing`)
		raw, err := os.ReadFile(tl)
		require.NoError(t, err)
		require.Contains(t, string(raw), `line 1: field \"occurrence\" is missing`)

		// The pod of a deleted-and-recreated run: refused, exit 2.
		stale := *run
		stale.UID = "11111111-1111-1111-1111-111111111111"
		r = runWorker(t, k, bin, d, &stale, 0, 0, "--termination-log", filepath.Join(t.TempDir(), "t"))
		require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
		require.Contains(t, r.stderr, "the run this pod was created for is gone")

		// Credentials the server rejects: exit 2 at once, saying so, never
		// retried (a lockout risk) nor called unreachable; the same when the
		// shard makes the first connection (--skip-migrate, inline items).
		for _, args := range [][]string{nil, {"--skip-migrate"}} {
			if pgtest.ThroughPooler() {
				break // testBouncerTrusts
			}
			tl := filepath.Join(t.TempDir(), "t")
			wrong := &db{dsn: pgtest.PasswordDSN(t, d.dsn, password), pool: d.pool}
			r = runWorker(t, k, bin, wrong, run, 0, 0, append(args, "--termination-log", tl, "--retry-timeout", "5s")...)
			require.Equal(t, 2, r.code, "%v: stderr:\n%s", args, r.stderr)
			require.Contains(t, r.stderr, "the database server rejected the connection string's credentials")
			require.NotContains(t, r.stderr, "retrying")
			require.NotContains(t, r.stderr, "not reachable")
			raw, err := os.ReadFile(tl)
			require.NoError(t, err)
			require.Contains(t, string(raw), "rejected the connection string's credentials", "the termination message says why")
		}

		// SIGTERM mid-run: the chunk in flight commits, the final report (status
		// and termination message) is exactly what the run committed, exit 1.
		d.exec(t, fmt.Sprintf(sinkSchema, 0.003))
		big := k.createRun(t, "terminated", 1, v1alpha1.BatchSpec{Query: "SELECT 'big-' || i AS entity, 'x' AS occurrence, jsonb_build_object('amount', i) AS payload FROM generate_series(1, 50000) i"},
			"INSERT INTO invoices SELECT entity, occurrence, (payload->>'amount')::numeric FROM claimed")
		tl = filepath.Join(t.TempDir(), "t")
		cmd, wait := startWorker(t, k, bin, d, big, 0, 0, "--termination-log", tl)
		uid := string(big.UID)
		waitUntil(t, "the worker has committed", func() bool {
			return d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, uid) > 2000
		})
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		r = wait()
		require.Equal(t, 1, r.code, "stderr:\n%s", r.stderr)
		raw, err = os.ReadFile(tl)
		require.NoError(t, err)
		rep, err := v1alpha1.ParseShardReport(string(raw))
		require.NoError(t, err)
		committed := d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, uid)
		require.Equal(t, committed, rep.Completed, "the termination message is exact")
		require.Contains(t, rep.Message, "interrupted after")
		require.Contains(t, r.stderr, "stop requested: taking no new chunk", "the signal is said")
		e = k.report(t, big, 0, 0)
		require.Equal(t, committed, e.Completed, "the final status report is exact")
		require.EqualValues(t, 50000, e.Total)

		// No environment at all, either command.
		for _, cmd := range [][]string{{os.Args[0], "worker"}, {bin}} {
			c, stdout, stderr := commandOf(context.Background(), cmd[0], "", append(cmd[1:], "--termination-log", filepath.Join(t.TempDir(), "t"))...)
			err := c.Run()
			require.Error(t, err, "%v", cmd)
			require.Equal(t, 2, c.ProcessState.ExitCode(), "%v: stdout %s, stderr:\n%s", cmd, stdout, stderr)
			require.Contains(t, stderr.String(), "RUNLEDGER_RUN_NAME is not set")
		}
	})
}

// subcommand, as runWorker's bin: `runledger worker` (this test binary,
// see TestMain), which a pod runs when its run names its own image.
const subcommand = ""

// buildWorkerBinary builds the worker binary, cmd/runledger-worker, as the
// image holds it.
func buildWorkerBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "runledger-worker")
	build := exec.Command("go", "build", "-o", bin, "github.com/runledger/runledger/cmd/runledger-worker")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building cmd/runledger-worker:\n%s", out)
	return bin
}

// runWorker runs the worker, the binary bin (or subcommand), for a shard
// and attempt of run, with the environment and files the controller gives
// its pods and the token the kubelet mounts.
func runWorker(t *testing.T, k *kubeEnv, bin string, d *db, run *v1alpha1.ProcessingRun, shard, attempt int, args ...string) result {
	t.Helper()
	_, wait := startWorker(t, k, bin, d, run, shard, attempt, args...)
	return wait()
}

// startWorker starts the worker in the background.
func startWorker(t *testing.T, k *kubeEnv, bin string, d *db, run *v1alpha1.ProcessingRun, shard, attempt int, args ...string) (*exec.Cmd, func() result) {
	t.Helper()
	pod := k.workerPod(t, run, shard, attempt)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	tokenDir, apiEnv := k.env.WorkerTokenDir(t, pod)
	args = append(args, "--token-dir", tokenDir)
	if bin == subcommand {
		bin, args = os.Args[0], append([]string{"worker"}, args...)
	}
	cmd, stdout, stderr := commandOf(ctx, bin, "", args...)
	cmd.Env = append(cmd.Env, apiEnv...)
	cmd.Env = append(cmd.Env,
		v1alpha1.EnvRunNamespace+"="+run.Namespace,
		v1alpha1.EnvRunName+"="+run.Name,
		v1alpha1.EnvRunUID+"="+string(run.UID),
		v1alpha1.EnvShard+"="+strconv.Itoa(shard),
		v1alpha1.EnvShards+"="+strconv.Itoa(int(max(run.Spec.Workers, 1))),
		v1alpha1.EnvAttempt+"="+strconv.Itoa(attempt),
		v1alpha1.EnvPodName+"="+pod.Name,
		v1alpha1.EnvPodUID+"="+string(pod.UID),
		v1alpha1.EnvDatabaseURL+"="+d.dsn,
	)
	// The run's file, as the controller writes the stored run into its
	// ConfigMap and the kubelet mounts it: the worker reads no run through
	// the API (a stale run's UID is the environment's, not the file's).
	stored := &v1alpha1.ProcessingRun{}
	require.NoError(t, k.c.Get(ctx, types.NamespacedName{Namespace: run.Namespace, Name: run.Name}, stored))
	runFile, err := v1alpha1.EncodeRunFile(stored)
	require.NoError(t, err)
	runPath := filepath.Join(t.TempDir(), v1alpha1.WorkerRunFile)
	require.NoError(t, os.WriteFile(runPath, runFile, 0o444))
	cmd.Env = append(cmd.Env, v1alpha1.EnvRunFile+"="+runPath, v1alpha1.EnvRunDigest+"="+v1alpha1.RunFileDigest(runFile))
	if ref := run.Spec.Batch.ConfigMapRef; ref != nil {
		// As the kubelet mounts it (controllers/podspec.go): the worker
		// reads no ConfigMap through the API.
		var cm corev1.ConfigMap
		require.NoError(t, k.c.Get(ctx, types.NamespacedName{Namespace: run.Namespace, Name: ref.Name}, &cm))
		file := filepath.Join(t.TempDir(), v1alpha1.WorkerBatchFile)
		require.NoError(t, os.WriteFile(file, []byte(cm.Data[ref.Key]), 0o444))
		cmd.Env = append(cmd.Env, v1alpha1.EnvBatchFile+"="+file)
	}
	require.NoError(t, cmd.Start())
	return cmd, func() result {
		defer cancel()
		err := cmd.Wait()
		r := result{stdout: stdout.String(), stderr: stderr.String()}
		if err != nil {
			r.code = -1
			if cmd.ProcessState != nil {
				r.code = cmd.ProcessState.ExitCode()
			}
		}
		noSecret(t, r)
		return r
	}
}

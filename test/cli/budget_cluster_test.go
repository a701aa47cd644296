package clitest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/controllers"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestConnectionBudgetInACluster measures the README's formula end to end:
// the real controller (against a real kube-apiserver) runs a 256-shard run
// with spec.database.maxConnections 16, and each pod it creates is a real
// `runledger worker` process against the test PostgreSQL (the test plays
// the kubelet: it starts the process with the pod's environment and run
// file, and writes the pod's phase and termination message when it exits).
// pg_stat_activity, sampled all along by the application_name of the run's
// workers (runledger/<namespace>/<run>/shard-<i>), never shows more than
// 16 connections: at most 8 pods at once, 2 each; the run succeeds with
// exact counts.
func TestConnectionBudgetInACluster(t *testing.T) {
	t.Parallel()
	const (
		shards         = v1alpha1.MaxWorkers
		maxConnections = 16
		items          = 2560
	)
	d := newDB(t)
	d.exec(t, fmt.Sprintf(`CREATE TABLE usage AS SELECT 'acct-' || i AS account FROM generate_series(1, %d) i`, items))
	k := startKube(t)
	ctx := context.Background()
	require.NoError(t, k.c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runledger-worker", Namespace: "default"}}))
	startController(t, k)

	run := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: "budget", Namespace: "default"},
		Spec: v1alpha1.ProcessingRunSpec{
			Database:  v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}, MaxConnections: ptr.To[int32](maxConnections)},
			Batch:     v1alpha1.BatchSpec{Query: "SELECT account AS entity, 'budget' AS occurrence FROM usage"},
			Workers:   shards,
			ChunkSize: 3,
		},
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	peak := sampleConnections(sampleCtx, d, "runledger/default/budget/%")
	require.NoError(t, k.c.Create(ctx, run))

	kubelet := &fakeKubelet{t: t, k: k, d: d, dir: t.TempDir(), started: map[string]bool{}}
	deadline := time.Now().Add(8 * time.Minute)
	for {
		got := k.getRun(t, "budget")
		if got.Status.Phase == v1alpha1.RunSucceeded || got.Status.Phase == v1alpha1.RunFailed {
			require.Equal(t, v1alpha1.RunSucceeded, got.Status.Phase, "%+v", got.Status.Conditions)
			require.Equal(t, v1alpha1.ItemCounts{Total: items, Completed: items}, got.Status.ItemCounts)
			break
		}
		require.True(t, time.Now().Before(deadline), "the run did not finish: %+v", got.Status)
		kubelet.startNewPods(ctx)
		time.Sleep(50 * time.Millisecond)
	}
	kubelet.wg.Wait()
	stopSampling()
	most := <-peak
	t.Logf("256 shards, maxConnections %d: at most %d connections of the run's workers in pg_stat_activity; %d worker processes, at most %d at once",
		maxConnections, most, kubelet.total, kubelet.most)
	require.LessOrEqual(t, most, int64(maxConnections), "the documented formula: 2 x min(workers, maxConnections / 2)")
	require.LessOrEqual(t, kubelet.most, maxConnections/v1alpha1.ConnectionsPerWorker, "worker processes at once")
	require.GreaterOrEqual(t, most, sampledAtLeast(v1alpha1.ConnectionsPerWorker), "the run's connections are the ones sampled")
	require.Equal(t, int64(items), d.int(t, `SELECT count(*) FROM runledger.ledger WHERE run_uid = $1`, string(k.getRun(t, "budget").UID)))
}

// startController runs runledger's manager in this process against k.
func startController(t *testing.T, k *kubeEnv) {
	t.Helper()
	cacheOpts := controllers.CacheOptions()
	cacheOpts.DefaultNamespaces = map[string]cache.Config{"default": {}}
	mgr, err := ctrl.NewManager(k.env.Config, ctrl.Options{
		Scheme:                 k.env.Scheme,
		Cache:                  cacheOpts,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
		Logger:                 discard(),
	})
	require.NoError(t, err)
	r := &controllers.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Pods:        controllers.PodOptions{Image: "runledger:test", ServiceAccountName: "runledger-worker"},
		BackoffBase: 200 * time.Millisecond, BackoffMax: time.Second, DependencyRetry: 300 * time.Millisecond,
		StatusInterval: 250 * time.Millisecond,
	}
	require.NoError(t, r.SetupWithManager(mgr, controller.Options{}))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-stopped })
}

// sampleConnections counts the server's connections whose application_name
// matches pattern every 5 ms until ctx ends, then sends the most it saw.
// Behind a pooler, pg_stat_activity shows the pooler's server connections:
// an idle one keeps the name of the client that last used it and counts in
// the pooler's pool_size, not in the run's budget, so there it counts those
// serving a transaction (docs/poolers.md).
func sampleConnections(ctx context.Context, d *db, pattern string) <-chan int64 {
	sample := `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1`
	if pgtest.ThroughPooler() {
		sample += ` AND state <> 'idle'`
	}
	peak := make(chan int64, 1)
	go func() {
		var most int64
		defer func() { peak <- most }()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
			var n int64
			if err := d.pool.QueryRow(context.Background(), sample, pattern).Scan(&n); err == nil {
				most = max(most, n)
			}
		}
	}()
	return peak
}

// sampledAtLeast is the fewest connections sampleConnections must see of
// a run that holds n at once: behind a pooler, those in a transaction at
// the same instant may be only one.
func sampledAtLeast(n int) int64 {
	if pgtest.ThroughPooler() {
		return 1
	}
	return int64(n)
}

// fakeKubelet runs a `runledger worker` process for each pod the
// controller creates, as the kubelet would run its container.
type fakeKubelet struct {
	t       *testing.T
	dir     string // the pods' files
	k       *kubeEnv
	d       *db
	wg      sync.WaitGroup
	mu      sync.Mutex
	started map[string]bool
	running int
	most    int
	total   int
}

func (f *fakeKubelet) startNewPods(ctx context.Context) {
	t := f.t
	var pods corev1.PodList
	require.NoError(t, f.k.c.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{v1alpha1.LabelRun: "budget"}))
	for i := range pods.Items {
		pod := pods.Items[i].DeepCopy()
		if f.started[pod.Name] || pod.DeletionTimestamp != nil {
			continue
		}
		f.started[pod.Name] = true
		// The token the kubelet mounts, bound to the pod (on the test's
		// goroutine: it fails the test itself).
		tokenDir, apiEnv := f.k.env.WorkerTokenDir(t, pod)
		f.mu.Lock()
		f.running++
		f.total++
		f.most = max(f.most, f.running)
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.runPod(ctx, pod, tokenDir, apiEnv)
			f.mu.Lock()
			f.running--
			f.mu.Unlock()
		}()
	}
}

// runPod runs the pod's worker to its end and writes what the kubelet
// writes: Running, then the phase, exit code and termination message.
// It runs in a goroutine of its own: errors are reported with t.Errorf.
func (f *fakeKubelet) runPod(ctx context.Context, pod *corev1.Pod, tokenDir string, apiEnv []string) {
	t := f.t
	failed := func(err error) bool {
		if err != nil {
			t.Errorf("pod %s: %v", pod.Name, err)
		}
		return err != nil
	}
	shard, err := strconv.Atoi(pod.Labels[v1alpha1.LabelShard])
	if failed(err) {
		return
	}
	attempt, err := strconv.Atoi(pod.Labels[v1alpha1.LabelAttempt])
	if failed(err) {
		return
	}
	var digest string
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == v1alpha1.EnvRunDigest {
			digest = e.Value
		}
	}
	var cm corev1.ConfigMap
	if failed(f.k.c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: v1alpha1.RunConfigMapName(pod.Labels[v1alpha1.LabelRun], digest)}, &cm)) {
		return
	}
	dir, err := os.MkdirTemp(f.dir, pod.Name)
	if failed(err) {
		return
	}
	runPath, tl := filepath.Join(dir, v1alpha1.WorkerRunFile), filepath.Join(dir, "termination-log")
	if failed(os.WriteFile(runPath, cm.BinaryData[v1alpha1.WorkerRunFile], 0o444)) {
		return
	}
	if failed(f.setPodStatus(ctx, pod, corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}})) {
		return
	}
	cmdCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd, stdout, stderr := command(cmdCtx, "", "worker", "--termination-log", tl, "--token-dir", tokenDir)
	cmd.Env = append(cmd.Env, apiEnv...)
	cmd.Env = append(cmd.Env,
		v1alpha1.EnvRunNamespace+"="+pod.Namespace,
		v1alpha1.EnvRunName+"="+pod.Labels[v1alpha1.LabelRun],
		v1alpha1.EnvRunUID+"="+pod.Labels[v1alpha1.LabelRunUID],
		v1alpha1.EnvShard+"="+strconv.Itoa(shard),
		v1alpha1.EnvShards+"="+strconv.Itoa(v1alpha1.MaxWorkers),
		v1alpha1.EnvAttempt+"="+strconv.Itoa(attempt),
		v1alpha1.EnvPodName+"="+pod.Name,
		v1alpha1.EnvPodUID+"="+string(pod.UID),
		v1alpha1.EnvDatabaseURL+"="+f.d.dsn,
		v1alpha1.EnvRunFile+"="+runPath,
		v1alpha1.EnvRunDigest+"="+digest,
	)
	runErr := cmd.Run()
	code := 0
	if runErr != nil {
		code = -1
		if cmd.ProcessState != nil {
			code = cmd.ProcessState.ExitCode()
		}
	}
	if strings.Contains(stderr.String(), password) || strings.Contains(stdout.String(), password) {
		t.Errorf("pod %s: the password leaked to stderr", pod.Name)
	}
	msg, _ := os.ReadFile(tl)
	phase := corev1.PodSucceeded
	if code != 0 {
		phase = corev1.PodFailed
		t.Logf("pod %s: worker exited %d: %s", pod.Name, code, stderr.String())
	}
	failed(f.setPodStatus(ctx, pod, phase, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Message: string(msg), FinishedAt: metav1.Now()}}))
}

// setPodStatus writes the pod's phase and its worker container's state by
// merge patch (the worker patches the pod's annotations meanwhile).
func (f *fakeKubelet) setPodStatus(ctx context.Context, pod *corev1.Pod, phase corev1.PodPhase, state corev1.ContainerState) error {
	base := pod.DeepCopy()
	pod.Status.Phase = phase
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: v1alpha1.WorkerContainerName, Image: pod.Spec.Containers[0].Image,
		ImageID: "sha256:test", State: state, Started: ptr.To(state.Running != nil)}}
	return f.k.c.Status().Patch(ctx, pod, client.MergeFrom(base))
}

package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/worker"
)

// The envtest suites: each test gets its own namespace and its own manager
// (cache limited to that namespace), so they run in parallel against the
// one apiserver of the test binary. There is no kubelet: the tests play its
// part by writing pod status, and the workers' part by applying shard
// reports with the workers' field managers.

const (
	testSecret  = "ledger-db"
	testTimeout = 20 * time.Second
)

var setLoggerOnce sync.Once

func testLogger() logr.Logger {
	if os.Getenv("RUNLEDGER_TEST_LOG") != "" {
		return zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr))
	}
	return logr.Discard()
}

// setup returns the shared apiserver and a fresh namespace holding the
// run's Secret and the workers' ServiceAccount.
func setup(t *testing.T) (*envtestutil.Env, string) {
	t.Helper()
	setLoggerOnce.Do(func() { ctrl.SetLogger(testLogger()) })
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: testSecret, Namespace: ns},
		StringData: map[string]string{"dsn": "postgres://runledger:s3cret@db:5432/ledger"},
	}))
	require.NoError(t, env.Client.Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "runledger-worker", Namespace: ns},
	}))
	return env, ns
}

type managerConfig struct {
	name        string // user agent, hence the field manager of what it writes
	leaderElect bool
	// wrapClient, when set, wraps the reconciler's client.
	wrapClient func(client.Client) client.Client
	// restConfig, when set, replaces the admin config (e.g. to impersonate).
	restConfig *rest.Config
	// kueue turns the Kueue integration on.
	kueue bool
	// workerNetwork, when set, gives each run its NetworkPolicy.
	workerNetwork *WorkerNetwork
	// budget is the manager's default and maximum connection budget.
	budget v1alpha1.ConnectionBudgetSettings
}

type testManager struct {
	mgr     ctrl.Manager
	r       *Reconciler
	stop    func()
	stopped chan struct{}
}

// startManager runs a manager with the reconciler, fast back-offs and a
// cache limited to ns. It stops when the test ends (or with stop).
func startManager(t *testing.T, env *envtestutil.Env, ns string, mc managerConfig) *testManager {
	t.Helper()
	if mc.name == "" {
		mc.name = "runledger-test-manager"
	}
	cfg := rest.CopyConfig(env.Config)
	if mc.restConfig != nil {
		cfg = rest.CopyConfig(mc.restConfig)
	}
	cfg.UserAgent = mc.name
	cacheOpts := CacheOptions()
	cacheOpts.DefaultNamespaces = map[string]cache.Config{ns: {}}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  env.Scheme,
		Cache:                   cacheOpts,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		LeaderElection:          mc.leaderElect,
		LeaderElectionID:        "runledger-test",
		LeaderElectionNamespace: ns,
		LeaseDuration:           ptr.To(2 * time.Second),
		RenewDeadline:           ptr.To(1500 * time.Millisecond),
		RetryPeriod:             ptr.To(200 * time.Millisecond),
		Controller:              ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
		Logger:                  testLogger().WithName(mc.name),
	})
	require.NoError(t, err)
	c := mgr.GetClient()
	if mc.wrapClient != nil {
		c = mc.wrapClient(c)
	}
	r := &Reconciler{
		Client:          c,
		APIReader:       mgr.GetAPIReader(),
		Recorder:        mgr.GetEventRecorder("runledger-controller"),
		Pods:            PodOptions{Image: "runledger:test", ServiceAccountName: "runledger-worker"},
		BackoffBase:     300 * time.Millisecond,
		BackoffMax:      2 * time.Second,
		DependencyRetry: 300 * time.Millisecond,
		// Count-only status writes are spaced, as in production (2s).
		StatusInterval:   250 * time.Millisecond,
		Kueue:            mc.kueue,
		WorkerNetwork:    mc.workerNetwork,
		ConnectionBudget: mc.budget,
	}
	require.NoError(t, r.SetupWithManager(mgr, controller.Options{}))
	ctx, cancel := context.WithCancel(context.Background())
	tm := &testManager{mgr: mgr, r: r, stopped: make(chan struct{})}
	go func() {
		defer close(tm.stopped)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager %s: %v", mc.name, err)
		}
	}()
	var once sync.Once
	tm.stop = func() {
		once.Do(func() {
			cancel()
			<-tm.stopped
		})
	}
	t.Cleanup(tm.stop)
	return tm
}

// item i of a test batch.
func items(n int) []v1alpha1.Item {
	out := make([]v1alpha1.Item, n)
	for i := range out {
		out[i] = v1alpha1.Item{Entity: fmt.Sprintf("acct-%d", i), Occurrence: "2026-01"}
	}
	return out
}

func newRun(ns, name string, workers int32, nItems int) *v1alpha1.ProcessingRun {
	return &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.ProcessingRunSpec{
			Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: testSecret, Key: "dsn"}},
			Batch:    v1alpha1.BatchSpec{Items: items(nItems)},
			Workers:  workers,
		},
	}
}

func create(t *testing.T, env *envtestutil.Env, run *v1alpha1.ProcessingRun) *v1alpha1.ProcessingRun {
	t.Helper()
	require.NoError(t, env.Client.Create(context.Background(), run))
	return run
}

// waitFor polls check until it returns nil, failing the test with the last
// error after timeout.
func waitFor(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getRun(t *testing.T, env *envtestutil.Env, ns, name string) *v1alpha1.ProcessingRun {
	t.Helper()
	run := &v1alpha1.ProcessingRun{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, run))
	return run
}

// waitRun waits until the run satisfies check.
func waitRun(t *testing.T, env *envtestutil.Env, ns, name, what string, check func(*v1alpha1.ProcessingRun) error) *v1alpha1.ProcessingRun {
	t.Helper()
	var run *v1alpha1.ProcessingRun
	waitFor(t, what, func() error {
		run = &v1alpha1.ProcessingRun{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, run); err != nil {
			return err
		}
		if err := check(run); err != nil {
			st, _ := json.Marshal(run.Status)
			return fmt.Errorf("%w; status: %s", err, st)
		}
		return nil
	})
	return run
}

func phaseIs(p v1alpha1.RunPhase) func(*v1alpha1.ProcessingRun) error {
	return func(r *v1alpha1.ProcessingRun) error {
		if r.Status.Phase != p {
			return fmt.Errorf("phase %q, want %q", r.Status.Phase, p)
		}
		return nil
	}
}

func condition(r *v1alpha1.ProcessingRun, typ string) *metav1.Condition {
	return meta.FindStatusCondition(r.Status.Conditions, typ)
}

func conditionIs(typ string, status metav1.ConditionStatus, reason string) func(*v1alpha1.ProcessingRun) error {
	return func(r *v1alpha1.ProcessingRun) error {
		c := condition(r, typ)
		if c == nil || c.Status != status || (reason != "" && c.Reason != reason) {
			return fmt.Errorf("condition %s is %+v, want %s %s", typ, c, status, reason)
		}
		if c.ObservedGeneration != r.Generation {
			return fmt.Errorf("condition %s observed generation %d of %d", typ, c.ObservedGeneration, r.Generation)
		}
		return nil
	}
}

func noCondition(typ string) func(*v1alpha1.ProcessingRun) error {
	return func(r *v1alpha1.ProcessingRun) error {
		if c := condition(r, typ); c != nil {
			return fmt.Errorf("condition %s is %+v, want none", typ, c)
		}
		return nil
	}
}

func all(checks ...func(*v1alpha1.ProcessingRun) error) func(*v1alpha1.ProcessingRun) error {
	return func(r *v1alpha1.ProcessingRun) error {
		for _, c := range checks {
			if err := c(r); err != nil {
				return err
			}
		}
		return nil
	}
}

func countsAre(want v1alpha1.ItemCounts) func(*v1alpha1.ProcessingRun) error {
	return func(r *v1alpha1.ProcessingRun) error {
		if got := r.Status.ItemCounts; got != want {
			return fmt.Errorf("counts %+v, want %+v", got, want)
		}
		return nil
	}
}

// runPods lists the run's pods by name.
func runPods(t *testing.T, env *envtestutil.Env, ns, name string) map[string]*corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, env.Client.List(context.Background(), &pods, client.InNamespace(ns),
		client.MatchingLabels{v1alpha1.LabelRun: name}))
	out := map[string]*corev1.Pod{}
	for i := range pods.Items {
		out[pods.Items[i].Name] = &pods.Items[i]
	}
	return out
}

func podNames(pods map[string]*corev1.Pod) []string {
	var names []string
	for n := range pods {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// waitPods waits until the run's pods are exactly the given names.
func waitPods(t *testing.T, env *envtestutil.Env, ns, name string, want ...string) map[string]*corev1.Pod {
	t.Helper()
	sort.Strings(want)
	var pods map[string]*corev1.Pod
	waitFor(t, fmt.Sprintf("pods %v", want), func() error {
		pods = runPods(t, env, ns, name)
		if got := podNames(pods); strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Errorf("pods %v", got)
		}
		return nil
	})
	return pods
}

// stillPods checks for a while that the run's pods stay the given names.
func stillPods(t *testing.T, env *envtestutil.Env, ns, name string, d time.Duration, want ...string) {
	t.Helper()
	sort.Strings(want)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		got := podNames(runPods(t, env, ns, name))
		require.Equal(t, want, got)
	}
}

// setPod plays the kubelet: it writes a pod's phase and its worker
// container's state. A terminated container gets exitCode and the report
// as its termination message (a log line when report is nil).
func setPod(t *testing.T, env *envtestutil.Env, ns, name string, phase corev1.PodPhase, exitCode int32, report *v1alpha1.ShardReport) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod))
	now := metav1.Now()
	cs := corev1.ContainerStatus{Name: v1alpha1.WorkerContainerName, Image: pod.Spec.Containers[0].Image, ImageID: "sha256:test"}
	switch phase {
	case corev1.PodRunning:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
		cs.Started = ptr.To(true)
		cs.Ready = true
	case corev1.PodSucceeded, corev1.PodFailed:
		msg := "panic: something broke\n"
		if report != nil {
			b, err := report.TerminationMessage()
			require.NoError(t, err)
			msg = string(b)
		}
		reason := "Completed"
		if exitCode != 0 {
			reason = "Error"
		}
		if exitCode == 137 {
			reason, msg = "OOMKilled", ""
		}
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: exitCode, Reason: reason, Message: msg,
			StartedAt: now, FinishedAt: now}
	}
	pod.Status.Phase = phase
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	require.NoError(t, env.Client.Status().Update(ctx, pod))
}

// setPodWaiting plays a kubelet that cannot start the worker container.
func setPodWaiting(t *testing.T, env *envtestutil.Env, ns, name, reason, message string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod))
	pod.Status.Phase = corev1.PodPending
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: v1alpha1.WorkerContainerName,
		Image: pod.Spec.Containers[0].Image, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}}
	require.NoError(t, env.Client.Status().Update(ctx, pod))
}

// workerReport plays a worker: it writes its shard's report onto its own
// pod (the progress annotation, by JSON merge patch with the pod's UID as
// precondition), as the contract says.
func workerReport(t *testing.T, env *envtestutil.Env, run *v1alpha1.ProcessingRun, shard, attempt int32, c v1alpha1.ItemCounts, message string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: v1alpha1.PodName(run.Name, shard, attempt)}, pod))
	rep := *shardReport(shard, attempt, c, message)
	rep.ReportTime = ptr.To(metav1.Now())
	body, err := worker.ProgressPatch(string(pod.UID), rep)
	require.NoError(t, err)
	require.NoError(t, env.Client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body)))
}

func shardReport(shard, attempt int32, c v1alpha1.ItemCounts, message string) *v1alpha1.ShardReport {
	return &v1alpha1.ShardReport{Shard: shard, Attempt: attempt, ItemCounts: c, Message: message}
}

// events returns the reasons and notes of the Events about a run.
func runEvents(t *testing.T, env *envtestutil.Env, ns, name string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(ns)))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "ProcessingRun" && e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// waitEvent waits for an Event of the given reason about the run whose note
// contains substr.
func waitEvent(t *testing.T, env *envtestutil.Env, ns, name, eventType, reason, substr string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s event %s %q", eventType, reason, substr), func() error {
		var seen []string
		for _, e := range runEvents(t, env, ns, name) {
			if e.Type == eventType && e.Reason == reason && strings.Contains(e.Note, substr) {
				return nil
			}
			seen = append(seen, e.Type+"/"+e.Reason+": "+e.Note)
		}
		return fmt.Errorf("events: %q", seen)
	})
}

// printerColumns returns what `kubectl get prun` shows for a run (the
// server-side Table of the CRD's printer columns).
func printerColumns(t *testing.T, env *envtestutil.Env, ns, name string) map[string]any {
	t.Helper()
	hc, err := rest.HTTPClientFor(env.Config)
	require.NoError(t, err)
	url := fmt.Sprintf("%s/apis/%s/namespaces/%s/processingruns/%s", strings.TrimSuffix(env.Config.Host, "/"),
		v1alpha1.GroupVersion.String(), ns, name)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var table metav1.Table
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&table))
	require.Len(t, table.Rows, 1)
	out := map[string]any{}
	for i, col := range table.ColumnDefinitions {
		out[col.Name] = table.Rows[0].Cells[i]
	}
	return out
}

// livePodGuard watches the namespace's pods for the whole test and fails
// it if a shard ever has two live (not finished) pods at once.
func livePodGuard(t *testing.T, env *envtestutil.Env, ns string) {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns))
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		live := map[string]map[string]bool{} // shard key -> live pod names
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			key := pod.Labels[v1alpha1.LabelRunUID] + "/" + pod.Labels[v1alpha1.LabelShard]
			if live[key] == nil {
				live[key] = map[string]bool{}
			}
			isLive := ev.Type != watch.Deleted && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
			if isLive {
				live[key][pod.Name] = true
			} else {
				delete(live[key], pod.Name)
			}
			if len(live[key]) > 1 {
				t.Errorf("shard %s of run %s has %d live pods: %v", pod.Labels[v1alpha1.LabelShard],
					pod.Labels[v1alpha1.LabelRun], len(live[key]), live[key])
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-done
	})
}

func shardEntry(r *v1alpha1.ProcessingRun, i int32) *v1alpha1.ShardStatus {
	for k := range r.Status.Shards {
		if r.Status.Shards[k].Index == i {
			return &r.Status.Shards[k]
		}
	}
	return nil
}

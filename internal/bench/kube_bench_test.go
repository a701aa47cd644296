package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/worker"
)

// The Kubernetes benchmarks run the real `runledger manager` binary against
// a real kube-apiserver and etcd (envtest), with simulated workers (no
// kubelet: the benchmark plays it), and read the figures from the
// components' own Prometheus metrics.

// kubeBench is one control plane and one manager process.
type kubeBench struct {
	env        *envtestutil.Env
	c          client.Client     // fast client of the simulated workers and kubelet
	pods       *worker.PodClient // the simulated workers' reports
	kubeconfig string
	mgr        *exec.Cmd
	mgrMetrics string // URL of the manager's /metrics
}

func startKubeBench(b *testing.B) *kubeBench {
	b.Helper()
	env, err := envtestutil.Start()
	if err != nil {
		b.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	b.Cleanup(func() { _ = env.Stop() })
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 5000, 5000 // the simulation is not the manager: never throttle it client-side
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	kc := filepath.Join(b.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig, 0o600); err != nil {
		b.Fatal(err)
	}
	pods, err := env.PodClient()
	if err != nil {
		b.Fatal(err)
	}
	return &kubeBench{env: env, c: c, pods: pods, kubeconfig: kc}
}

// startManager runs `runledger manager` as a cluster would (defaults: 4
// concurrent reconciles, status interval 2 s), without leader election, its
// metrics on a free loopback port over plain HTTP.
func (k *kubeBench) startManager(b *testing.B, bin string) {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cmd := exec.Command(bin, "manager", "--leader-elect=false", "--metrics-bind-address", addr, "--metrics-secure=false",
		"--health-probe-bind-address", "0", "--worker-image", "registry.example/runledger:bench", "--log-level", "error")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k.kubeconfig)
	logf, err := os.Create(filepath.Join(b.TempDir(), "manager.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting the manager: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	k.mgr, k.mgrMetrics = cmd, "http://"+addr+"/metrics"
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := scrape(k.mgrMetrics); err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the manager's metrics never answered (log: %s)", logf.Name())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// namespace creates a namespace with the runs' Secret and the workers'
// ServiceAccount.
func (k *kubeBench) namespace(b *testing.B, name string) string {
	b.Helper()
	ctx := context.Background()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: name}, StringData: map[string]string{"dsn": "postgres://bench@db/ledger"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runledger-worker", Namespace: name}},
	} {
		if err := k.c.Create(ctx, obj); err != nil {
			b.Fatalf("creating %s: %v", obj.GetName(), err)
		}
	}
	return name
}

// newBenchRun is a run of n inline items (n > 0) or of a query (n == 0).
func newBenchRun(ns, name string, shards int32, n int) *v1alpha1.ProcessingRun {
	run := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.ProcessingRunSpec{
			Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}},
			Workers:  shards,
			Batch:    v1alpha1.BatchSpec{Query: "SELECT account AS entity, period AS occurrence, payload FROM usage WHERE period = '2026-11'"},
		},
	}
	if n > 0 {
		run.Spec.Batch = v1alpha1.BatchSpec{Items: inlineBenchItems(n)}
	}
	return run
}

func jsonRaw(s string) *apiextensionsv1.JSON { return &apiextensionsv1.JSON{Raw: []byte(s)} }

func inlineBenchItems(n int) []v1alpha1.Item {
	items := make([]v1alpha1.Item, n)
	for i := range items {
		items[i] = v1alpha1.Item{Entity: fmt.Sprintf("acct-%07d", i), Occurrence: "2026-11",
			Payload: jsonRaw(fmt.Sprintf(`{"amount":%d.%02d,"currency":"EUR"}`, i%1000, i%100))}
	}
	return items
}

// waitPods waits until the run has a pod per shard, and plays the kubelet:
// every pod Running.
func (k *kubeBench) waitPods(b *testing.B, run *v1alpha1.ProcessingRun) []corev1.Pod {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var pods corev1.PodList
		if err := k.c.List(ctx, &pods, client.InNamespace(run.Namespace), client.MatchingLabels{v1alpha1.LabelRunUID: string(run.UID)}); err != nil {
			b.Fatal(err)
		}
		if len(pods.Items) == int(run.Spec.Workers) {
			for i := range pods.Items {
				setRunning(b, k.c, &pods.Items[i])
			}
			return pods.Items
		}
		if time.Now().After(deadline) {
			b.Fatalf("run %s: %d of %d pods after 5 minutes", run.Name, len(pods.Items), run.Spec.Workers)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// setRunning plays the kubelet: the pod and its worker container run.
func setRunning(b *testing.B, c client.Client, pod *corev1.Pod) {
	b.Helper()
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: v1alpha1.WorkerContainerName, Image: pod.Spec.Containers[0].Image,
		ImageID: "sha256:bench", Ready: true, Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if err := c.Status().Update(context.Background(), pod); err != nil {
		b.Fatalf("pod %s Running: %v", pod.Name, err)
	}
}

// setSucceeded plays the kubelet: the worker exited 0 with its report as
// the termination message.
func setSucceeded(b *testing.B, c client.Client, pod *corev1.Pod, rep v1alpha1.ShardReport) {
	b.Helper()
	msg, err := rep.TerminationMessage()
	if err != nil {
		b.Fatal(err)
	}
	now := metav1.Now()
	ctx := context.Background()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodSucceeded
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: v1alpha1.WorkerContainerName, Image: pod.Spec.Containers[0].Image,
			ImageID: "sha256:bench", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", Message: string(msg), StartedAt: now, FinishedAt: now}}}}
		return c.Status().Update(ctx, pod)
	})
	if err != nil {
		b.Fatalf("pod %s Succeeded: %v", pod.Name, err)
	}
}

// drain waits (up to a minute) until the apiserver has no write in flight:
// what one configuration asked must not be served in the next one's window.
func (k *kubeBench) drain(b *testing.B) {
	b.Helper()
	for range 120 {
		if k.apiserverMetrics(b).sum("apiserver_current_inflight_requests", is("request_kind", "mutating")) <= 1 {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// metrics is one scrape of a Prometheus text endpoint.
type metrics string

func scrape(url string) (metrics, error) {
	resp, err := http.Get(url) //nolint:gosec,noctx // a loopback URL of our own process
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	return metrics(body), err
}

func mustScrape(b *testing.B, url string) metrics {
	b.Helper()
	m, err := scrape(url)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// apiserverMetrics scrapes the apiserver's /metrics (as admin).
func (k *kubeBench) apiserverMetrics(b *testing.B) metrics {
	b.Helper()
	cs, err := kubernetes.NewForConfig(k.env.Config)
	if err != nil {
		b.Fatal(err)
	}
	var body []byte
	// An apiserver under the old protocol's load may drop a scrape: retry.
	for try := 0; ; try++ {
		body, err = cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
		if err == nil {
			return metrics(body)
		}
		if try == 10 {
			b.Fatalf("apiserver /metrics: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

var labelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// sum adds the samples of metric name whose labels satisfy match (nil: all).
func (m metrics) sum(name string, match func(labels map[string]string) bool) float64 {
	total := 0.0
	m.samples(name, func(labels map[string]string, v float64) {
		if match == nil || match(labels) {
			total += v
		}
	})
	return total
}

// each calls fn with the labels of every sample of metric name.
func (m metrics) each(name string, fn func(labels map[string]string)) {
	m.samples(name, func(labels map[string]string, _ float64) { fn(labels) })
}

// samples calls fn with every sample of metric name.
func (m metrics) samples(name string, fn func(labels map[string]string, v float64)) {
	sc := bufio.NewScanner(strings.NewReader(string(m)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		labels := map[string]string{}
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.LastIndex(rest, "}")
			for _, kv := range labelRE.FindAllStringSubmatch(rest[:end], -1) {
				labels[kv[1]] = kv[2]
			}
			rest = rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric with this prefix
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			fn(labels, v)
		}
	}
}

func is(key, value string) func(map[string]string) bool {
	return func(l map[string]string) bool { return l[key] == value }
}

// writes are requests that write the object: every verb but reads.
func writeVerb(l map[string]string) bool {
	switch l["verb"] {
	case "GET", "LIST", "WATCH":
		return false
	}
	return true
}

// rss is a process's resident set (VmRSS), in bytes.
func rss(pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kib * 1024
		}
	}
	return 0
}

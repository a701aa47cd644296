//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/runledger/runledger/api/v1alpha1"
)

// Kueue as TestKueue installs it (hack/tools/kueue/install).
const (
	kueueNamespace     = "kueue-system"
	kueueManager       = "kueue-controller-manager"
	kueueUpstreamImage = "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue" // config/default's image name
	labelQueueName     = "kueue.x-k8s.io/queue-name"
	labelPriority      = "kueue.x-k8s.io/priority-class"
	// The reasons of a queued run's Admitted condition (and Events).
	reasonQueued   = "Queued"
	reasonAdmitted = "Admitted"
	reasonEvicted  = "Evicted"
)

// goIn runs the go command in dir (a module of its own: GOWORK off) and
// returns its trimmed output.
func goIn(ctx context.Context, t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	out, err := cmd.Output()
	var stderr []byte
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		stderr = ee.Stderr
	}
	require.NoError(t, err, "go %s in %s:\n%s", strings.Join(args, " "), dir, stderr)
	return strings.TrimSpace(string(out))
}

// kueueClient is a client that knows Kueue's API types.
func (e *env) kueueClient(t *testing.T) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	require.NoError(t, kueue.AddToScheme(scheme))
	// The client logs nothing the test reads; unset, controller-runtime
	// prints a stack trace saying so.
	ctrllog.SetLogger(logr.Discard())
	c, err := client.New(e.cfg, client.Options{Scheme: scheme})
	require.NoError(t, err, "kueue client")
	return c
}

// installKueue installs the real Kueue: its manager built from the module
// hack/tools/kueue pins (the Go module proxy's source), pushed to the
// cluster's registry with the project's image tool, and Kueue's own
// manifests of that module version (config/default, with the patches of
// hack/tools/kueue/install). It returns once Kueue's webhooks answer; Kueue
// is removed when the test ends, after the cleanups registered later.
func (e *env) installKueue(ctx context.Context, t *testing.T, kc client.Client) {
	t.Helper()
	t0 := time.Now()
	mod := filepath.Join(repoRoot(t), "hack", "tools", "kueue")
	version := goIn(ctx, t, mod, "list", "-m", "-f", "{{.Version}}", "sigs.k8s.io/kueue")
	require.Equal(t, goIn(ctx, t, repoRoot(t), "list", "-m", "-f", "{{.Version}}", "sigs.k8s.io/kueue"), version,
		"the Kueue the e2e installs is the one whose API the manager is built with (go.mod)")
	src := goIn(ctx, t, mod, "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kueue")
	dir := t.TempDir()
	// /manager: the path config/default runs (the image tool puts the
	// binary at /<its name>).
	bin := filepath.Join(dir, "manager")
	goIn(ctx, t, mod, "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "sigs.k8s.io/kueue/cmd/kueue")
	out, err := exec.CommandContext(ctx, e.clusterSh, "push", "kueue:"+version, bin).Output()
	require.NoError(t, err, "hack/cluster.sh push kueue:%s:\n%s", version, out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	ref := lines[len(lines)-1]
	name, digest, ok := strings.Cut(ref, "@")
	require.True(t, ok, "pushed by digest: %s", out)
	t.Logf("kueue %s: built and pushed as %s in %.0fs", version, ref, time.Since(t0).Seconds())

	// The overlay's ../config is the module's config (read-only in the
	// module cache: copied).
	require.NoError(t, os.CopyFS(filepath.Join(dir, "config"), os.DirFS(filepath.Join(src, "config"))))
	require.NoError(t, os.CopyFS(filepath.Join(dir, "install"), os.DirFS(filepath.Join(mod, "install"))))
	kfile := filepath.Join(dir, "install", "kustomization.yaml")
	k, err := os.ReadFile(kfile)
	require.NoError(t, err)
	k = fmt.Appendf(k, "images:\n- name: %s\n  newName: %s\n  digest: %s\n", kueueUpstreamImage, name, digest)
	require.NoError(t, os.WriteFile(kfile, k, 0o644))
	manifest, err := e.kubectlRun(ctx, "kustomize", filepath.Join(dir, "install"))
	require.NoError(t, err, manifest)
	require.Contains(t, manifest, "image: "+ref, "the manager runs the image built here")
	mfile := filepath.Join(dir, "kueue.yaml")
	require.NoError(t, os.WriteFile(mfile, []byte(manifest), 0o644))

	t.Cleanup(func() { e.uninstallKueue(t, kc, mfile) })
	// Server-side: the CRDs are too large for kubectl's last-applied annotation.
	out2, err := e.kubectlRun(ctx, "apply", "--server-side", "-f", mfile)
	require.NoError(t, err, out2)
	out2, err = e.kubectlRun(ctx, "-n", kueueNamespace, "rollout", "status", "deployment/"+kueueManager, "--timeout=180s")
	require.NoError(t, err, out2)
	t.Logf("kueue installed from its manifests and ready %.0fs after the build began", time.Since(t0).Seconds())
}

// uninstallKueue removes what installKueue applied: its webhooks and its
// controller first (nothing in the cluster waits on them then), the
// finalizers Kueue's controller would have removed, then the rest.
func (e *env) uninstallKueue(t *testing.T, kc client.Client, manifest string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"delete", "mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration", "--ignore-not-found"},
		{"delete", "validatingwebhookconfiguration", "kueue-validating-webhook-configuration", "--ignore-not-found"},
		{"-n", kueueNamespace, "delete", "deployment", kueueManager, "--ignore-not-found", "--wait=true"},
	} {
		if out, err := e.kubectlRun(ctx, args...); err != nil {
			t.Errorf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, list := range []client.ObjectList{&kueue.WorkloadList{}, &kueue.LocalQueueList{}, &kueue.ClusterQueueList{}, &kueue.ResourceFlavorList{}} {
		if err := kc.List(ctx, list); err != nil {
			t.Errorf("list %T: %v", list, err)
			continue
		}
		_ = meta.EachListItem(list, func(o runtime.Object) error {
			obj := o.(client.Object)
			if len(obj.GetFinalizers()) == 0 {
				return nil
			}
			patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`))
			if err := kc.Patch(ctx, obj, patch); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("drop the finalizers of %T %s: %v", obj, obj.GetName(), err)
			}
			return nil
		})
	}
	if out, err := e.kubectlRun(ctx, "delete", "-f", manifest, "--ignore-not-found", "--wait=true", "--timeout=4m"); err != nil {
		t.Errorf("uninstall kueue: %v\n%s", err, out)
	}
}

// enableKueueIntegration reinstalls the operator from config/kueue (the
// manager's --kueue and its Kueue ClusterRole) with the image and the worker
// image prefixes the harness installed; when the test ends it waits until
// the test's namespace *ns is gone (its runs' Workloads cleaned up by this
// manager) and puts the harness's install (dist/install.yaml) back.
func (e *env) enableKueueIntegration(ctx context.Context, t *testing.T, ns *string) {
	t.Helper()
	root := repoRoot(t)
	// Cleanups run last first: the namespace gone, the harness's install
	// back, then config/kueue's roles it no longer uses deleted (the
	// manager's and Kueue's manager's), so that an uninstall after this
	// test finds nothing of runledger's left.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := e.kubectlRun(ctx, "delete", "clusterrolebinding,clusterrole", "runledger-manager-kueue", "runledger-kueue-reader", "--ignore-not-found"); err != nil {
			t.Errorf("delete config/kueue's roles: %v\n%s", err, out)
		}
	})
	e.reinstallAfter(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if *ns != "" && !t.Failed() {
			for {
				err := e.c.Get(ctx, client.ObjectKey{Name: *ns}, &corev1.Namespace{})
				if apierrors.IsNotFound(err) {
					break
				}
				if ctx.Err() != nil {
					t.Errorf("namespace %s not gone 3 minutes after its deletion: %v", *ns, err)
					break
				}
				time.Sleep(time.Second)
			}
		}
	})
	image, err := e.kubectlRun(ctx, "-n", systemNamespace, "get", "deployment", managerName, "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	require.NoError(t, err, image)
	name, digest, ok := strings.Cut(image, "@")
	require.True(t, ok, "the harness installs the image by digest: %s", image)
	prefixes, err := e.kubectlRun(ctx, "-n", systemNamespace, "get", "configmap", "runledger-worker-restrictions", "-o", "jsonpath={.data.allowedImagePrefixes}")
	require.NoError(t, err, prefixes)
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(root, "config", "kueue"))
	require.NoError(t, err)
	// What make build-installer writes, over config/kueue.
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: runledger
  newName: %s
  digest: %s
patches:
- target: {kind: ConfigMap, name: runledger-worker-restrictions}
  patch: |-
    - {op: replace, path: /data/allowedImagePrefixes, value: %q}
`, base, name, digest, prefixes)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644))
	out, err := e.kubectlRun(ctx, "apply", "--server-side", "--force-conflicts", "-k", dir)
	require.NoError(t, err, out)
	out, err = e.kubectlRun(ctx, "-n", systemNamespace, "rollout", "status", "deployment/"+managerName, "--timeout=180s")
	require.NoError(t, err, out)
	args, err := e.kubectlRun(ctx, "-n", systemNamespace, "get", "deployment", managerName, "-o", "jsonpath={.spec.template.spec.containers[0].args}")
	require.NoError(t, err, args)
	require.Contains(t, args, "--kueue", "config/kueue turns the integration on")
}

// createKueueObject creates a Kueue object, trying again while Kueue's
// webhooks do not answer yet (their certificates are Kueue's own, made at
// its start).
func createKueueObject(ctx context.Context, t *testing.T, kc client.Client, obj client.Object) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := kc.Create(ctx, obj)
		if err == nil {
			return
		}
		require.True(t, time.Now().Before(deadline), "create %T %s: %v", obj, obj.GetName(), err)
		time.Sleep(time.Second)
	}
}

// kueueQueues creates the test's queues: a ResourceFlavor (all Linux nodes),
// a ClusterQueue for the test's namespace with quota for two worker pods
// (pods: 2; the rest is plenty) that preempts lower priorities within it, the
// LocalQueue "team", and two WorkloadPriorityClasses. Their names are the
// namespace's (they are cluster-wide), the classes' NAMESPACE-low and
// NAMESPACE-high.
func (f *fixture) kueueQueues(kc client.Client) (low, high string) {
	f.t.Helper()
	low, high = f.ns+"-low", f.ns+"-high"
	q := resource.MustParse
	createKueueObject(f.ctx, f.t, kc, &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: f.ns},
		Spec: kueue.ResourceFlavorSpec{NodeLabels: map[string]string{corev1.LabelOSStable: "linux"}}})
	createKueueObject(f.ctx, f.t, kc, &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: f.ns}, Spec: kueue.ClusterQueueSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: f.ns}},
		Preemption:        &kueue.ClusterQueuePreemption{WithinClusterQueue: kueue.PreemptionPolicyLowerPriority},
		ResourceGroups: []kueue.ResourceGroup{{
			CoveredResources: []corev1.ResourceName{corev1.ResourcePods, corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage},
			Flavors: []kueue.FlavorQuotas{{Name: kueue.ResourceFlavorReference(f.ns), Resources: []kueue.ResourceQuota{
				{Name: corev1.ResourcePods, NominalQuota: q("2")},
				{Name: corev1.ResourceCPU, NominalQuota: q("8")},
				{Name: corev1.ResourceMemory, NominalQuota: q("16Gi")},
				{Name: corev1.ResourceEphemeralStorage, NominalQuota: q("16Gi")},
			}}},
		}},
	}})
	createKueueObject(f.ctx, f.t, kc, &kueue.LocalQueue{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "team"},
		Spec: kueue.LocalQueueSpec{ClusterQueue: kueue.ClusterQueueReference(f.ns)}})
	createKueueObject(f.ctx, f.t, kc, &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: low}, Value: 100})
	createKueueObject(f.ctx, f.t, kc, &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: high}, Value: 1000})
	f.t.Cleanup(func() {
		for _, o := range []client.Object{
			&kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: low}},
			&kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: high}},
			&kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: f.ns}},
			&kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: f.ns}},
		} {
			if err := kc.Delete(context.Background(), o); err != nil && !apierrors.IsNotFound(err) {
				f.t.Logf("delete %T %s: %v", o, o.GetName(), err)
			}
		}
	})
	require.Eventually(f.t, func() bool {
		var cq kueue.ClusterQueue
		return kc.Get(f.ctx, client.ObjectKey{Name: f.ns}, &cq) == nil && meta.IsStatusConditionTrue(cq.Status.Conditions, kueue.ClusterQueueActive)
	}, time.Minute, time.Second, "ClusterQueue %s becomes Active", f.ns)
	return low, high
}

// createQueuedRun creates a run of two shards over accounts lo..hi in the
// LocalQueue "team" with a WorkloadPriorityClass.
func (f *fixture) createQueuedRun(name string, lo, hi int, priority string) *v1alpha1.ProcessingRun {
	f.t.Helper()
	run := f.newRun(name, runSpec{workers: 2, chunk: 10, batch: queryBatch(lo, hi, 0)})
	run.Labels = map[string]string{labelQueueName: "team", labelPriority: priority}
	require.NoError(f.t, f.c.Create(f.ctx, run), "create run %s", name)
	f.t.Logf("created run %s (%s, accounts %d..%d, 2 shards)", name, priority, lo, hi)
	return run
}

// admission is a run's Admitted condition ("" when it has none).
func admission(run *v1alpha1.ProcessingRun) (metav1.ConditionStatus, string) {
	c := meta.FindStatusCondition(run.Status.Conditions, v1alpha1.ConditionAdmitted)
	if c == nil {
		return "", ""
	}
	return c.Status, c.Reason
}

// livePods are the run's pods that are not terminal (stopping ones included).
func (f *fixture) livePods(run *v1alpha1.ProcessingRun) []string {
	f.t.Helper()
	var out []string
	for _, p := range f.runPods(run) {
		if live(&p) {
			out = append(out, p.Name)
		}
	}
	return out
}

// workload is the run's Workload, as status.queue names it.
func (f *fixture) workload(kc client.Client, name string) *kueue.Workload {
	f.t.Helper()
	run := f.get(name)
	require.NotNil(f.t, run.Status.Queue, "run %s: status.queue", name)
	wl := &kueue.Workload{}
	require.NoError(f.t, kc.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: run.Status.Queue.Workload}, wl))
	return wl
}

// queuedError says how the run is not queued, if it is not: it is shown
// queued (Suspended, Admitted False with reason Queued), has no pod, and its
// Workload has no quota.
func (f *fixture) queuedError(kc client.Client, name string) error {
	f.t.Helper()
	run := f.get(name)
	if status, reason := admission(run); status != metav1.ConditionFalse || reason != reasonQueued || run.Status.Phase != v1alpha1.RunSuspended {
		return fmt.Errorf("run %s is not shown queued: %s", name, statusLine(run))
	}
	if pods := f.runPods(run); len(pods) > 0 {
		return fmt.Errorf("run %s has %d pods while it waits", name, len(pods))
	}
	if wl := f.workload(kc, name); meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved) {
		return fmt.Errorf("run %s's Workload %s has quota: %v", name, wl.Name, wl.Status.Conditions)
	}
	return nil
}

// workloadFinished: the run's Workload is Finished (its quota free).
func (f *fixture) workloadFinished(kc client.Client, name string) bool {
	f.t.Helper()
	return meta.IsStatusConditionTrue(f.workload(kc, name).Status.Conditions, kueue.WorkloadFinished)
}

// TestKueue: the real Kueue controller queues runs. A ClusterQueue has quota
// for two worker pods; two runs of two shards each: the second waits (no
// pod, Admitted False Queued, its Workload without quota) until the first
// finishes. A higher-priority run then preempts the second mid-run: its
// pods stop, the higher one runs and completes, and the second is admitted
// again, resumes from the ledger and completes. Every item is committed
// once, the effect ran once per item, and each run's counts equal its
// ledger rows. It runs alone: it reinstalls the operator (config/kueue),
// and Kueue's webhooks see every pod while it is installed.
func TestKueue(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	t0 := time.Now()
	kc := e.kueueClient(t)
	e.installKueue(ctx, t, kc)
	var ns string
	e.enableKueueIntegration(ctx, t, &ns)
	t.Logf("the operator runs with --kueue (config/kueue), %.0fs after the test began", time.Since(t0).Seconds())

	// One second per chunk of 10: a shard of 150 items takes 15 s or more.
	f := newFixture(t, "kueue", 1)
	ns = f.ns
	t.Cleanup(func() {
		if t.Failed() {
			for _, args := range [][]string{
				{"-n", f.ns, "get", "workloads", "-o", "yaml"},
				{"get", "clusterqueue", f.ns, "-o", "yaml"},
				{"-n", kueueNamespace, "logs", "deployment/" + kueueManager, "--tail=80"},
			} {
				out, _ := e.kubectlRun(context.Background(), args...)
				t.Logf("$ kubectl %s\n%s", strings.Join(args, " "), out)
			}
		}
	})
	low, high := f.kueueQueues(kc)

	// 1. The first run takes the quota; the second waits for it.
	first := f.createQueuedRun("first", 1, 120, low)
	first = f.waitRun(first.Name, runTimeout, "the first run is admitted and its two pods run", func(r *v1alpha1.ProcessingRun) bool {
		s, _ := admission(r)
		return s == metav1.ConditionTrue && len(f.livePods(r)) == 2
	})
	require.NotNil(t, first.Status.Queue)
	require.Equal(t, f.ns, first.Status.Queue.ClusterQueue, "admitted by the test's ClusterQueue")
	for _, p := range f.runPods(first) {
		require.Equal(t, "linux", p.Spec.NodeSelector[corev1.LabelOSStable], "pod %s has the flavor's node label", p.Name)
	}
	second := f.createQueuedRun("second", 1001, 1300, low)
	f.waitRun(second.Name, runTimeout, "the second run is queued with its Workload", func(r *v1alpha1.ProcessingRun) bool {
		_, reason := admission(r)
		return reason == reasonQueued && r.Status.Queue != nil && r.Status.Queue.Workload != ""
	})
	// What the second run shows is read before the first run's Workload:
	// the manager finishes a Workload (Kueue may admit the next at once)
	// just before it writes the run's status.
	checks := 0
	for {
		queued := f.queuedError(kc, second.Name)
		if f.workloadFinished(kc, first.Name) {
			break
		}
		require.NoError(t, queued, "while the first run has the quota")
		checks++
		time.Sleep(500 * time.Millisecond)
	}
	require.Positive(t, checks, "the second run was seen queued while the first ran (else make the first run longer)")
	first = f.waitComplete(first.Name, runTimeout)
	t.Logf("the second run was queued, without a pod, through %d checks while the first ran", checks)
	require.True(t, f.workloadFinished(kc, first.Name), "the first run's Workload is Finished")

	second = f.waitRun(second.Name, runTimeout, "the second run is admitted once the first finished", func(r *v1alpha1.ProcessingRun) bool {
		s, _ := admission(r)
		return s == metav1.ConditionTrue
	})
	f.waitEvent(second.Name, reasonAdmitted, 30*time.Second)

	// 2. A higher-priority run preempts the second in the middle of it.
	f.waitRowsOfShard(second, 0, 20)
	urgent := f.createQueuedRun("urgent", 2001, 2080, high)
	second = f.waitRun(second.Name, runTimeout, "the second run is evicted", func(r *v1alpha1.ProcessingRun) bool {
		_, reason := admission(r)
		return reason == reasonEvicted
	})
	require.False(t, isTrue(second, v1alpha1.ConditionComplete), "the second run was preempted before it finished: %s", statusLine(second))
	ev := meta.FindStatusCondition(f.workload(kc, second.Name).Status.Conditions, kueue.WorkloadEvicted)
	require.NotNil(t, ev, "the second run's Workload is Evicted")
	require.Equal(t, kueue.WorkloadEvictedByPreemption, ev.Reason, "evicted by preemption: %s", ev.Message)
	f.waitEvent(second.Name, reasonEvicted, 30*time.Second)
	atEviction := f.committedRows(string(second.UID))
	require.Less(t, atEviction, int64(300), "the second run had items left when it was preempted")

	urgent = f.waitRun(urgent.Name, runTimeout, "the urgent run is admitted", func(r *v1alpha1.ProcessingRun) bool {
		s, _ := admission(r)
		return s == metav1.ConditionTrue
	})
	for {
		cur := f.get(second.Name)
		live := f.livePods(cur)
		if f.workloadFinished(kc, urgent.Name) {
			break
		}
		require.Empty(t, live, "the preempted run holds no live pod while the urgent one has the quota")
		st, reason := admission(cur)
		require.Equal(t, [2]string{"False", reasonEvicted}, [2]string{string(st), reason}, "the second run waits, evicted: %s", statusLine(cur))
		require.Equal(t, v1alpha1.RunSuspended, cur.Status.Phase, "the evicted run shows Suspended")
		time.Sleep(500 * time.Millisecond)
	}
	urgent = f.waitComplete(urgent.Name, runTimeout)
	t.Logf("the second run had %d rows committed when preempted; the urgent run completed meanwhile", atEviction)

	// 3. The preempted run is admitted again and completes from the ledger.
	second = f.waitComplete(second.Name, runTimeout)
	resumed := 0
	for i := range 2 {
		if n := len(f.mon.podsOfShard(second, i)); n > 1 {
			resumed++
		}
	}
	require.Positive(t, resumed, "a shard of the preempted run ran again in a new pod")

	for _, c := range []struct {
		run  *v1alpha1.ProcessingRun
		want int64
	}{{first, 120}, {second, 300}, {urgent, 80}} {
		require.Equal(t, counts{Total: c.want, Completed: c.want}, countsOf(c.run), "run %s: %s", c.run.Name, statusLine(c.run))
		f.requireShardsAddUp(c.run)
		require.Equal(t, c.run.Status.Completed, f.committedRows(string(c.run.UID)), "run %s: completed == its committed ledger rows", c.run.Name)
		require.True(t, f.workloadFinished(kc, c.run.Name), "run %s's Workload is Finished", c.run.Name)
	}
	f.requireExactlyOnce(120 + 300 + 80)
	t.Logf("queueing, preemption and resumption checked %.0fs after the test began", time.Since(t0).Seconds())
}

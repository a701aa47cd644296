//go:build e2e

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// pushExampleProcessor builds examples/processor (static) and pushes it to
// the cluster's registry; it returns the image by digest.
func (f *fixture) pushExampleProcessor() string {
	return f.pushImage("../../examples/processor", "runledger-example-processor:e2e")
}

// pushImage builds the Go command in pkgDir (static) and pushes it to the
// cluster's registry as name (NAME:TAG); it returns the image by digest.
func (f *fixture) pushImage(pkgDir, name string) string {
	f.t.Helper()
	bin := filepath.Join(f.t.TempDir(), "processor")
	build := exec.CommandContext(f.ctx, "go", "build", "-trimpath", "-o", bin, pkgDir)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(f.t, err, "go build %s:\n%s", pkgDir, out)
	push := exec.CommandContext(f.ctx, f.clusterSh, "push", name, bin)
	out, err = push.Output()
	require.NoError(f.t, err, "hack/cluster.sh push:\n%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	ref := lines[len(lines)-1]
	require.Contains(f.t, ref, "@sha256:", "pushed by digest: %s", out)
	return ref
}

// restricted is the securityContext the namespace's Pod Security level asks.
func restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// deployPayments runs the example payment service (examples/processor
// -serve-payments) behind a Service and returns its ClusterIP address.
func (f *fixture) deployPayments(image string) string {
	f.t.Helper()
	labels := map[string]string{"app": "payments"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "payments"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "payments", Image: image, Args: []string{"-serve-payments", "-listen", ":8080"},
					Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
					ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
					SecurityContext: restricted(),
				}}},
			},
		},
	}
	require.NoError(f.t, f.c.Create(f.ctx, dep))
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "payments"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromString("http")}}},
	}
	require.NoError(f.t, f.c.Create(f.ctx, svc))
	require.Eventually(f.t, func() bool {
		var d appsv1.Deployment
		return f.c.Get(f.ctx, client.ObjectKeyFromObject(dep), &d) == nil && d.Status.AvailableReplicas == 1
	}, 2*time.Minute, time.Second, "the payment service becomes available")
	require.NoError(f.t, f.c.Get(f.ctx, client.ObjectKeyFromObject(svc), svc))
	return svc.Spec.ClusterIP + ":8080"
}

// paymentStats asks the payment service (through the apiserver's service
// proxy) how many calls and distinct idempotency keys it saw.
func (f *fixture) paymentStats() (calls, keys int64) {
	f.t.Helper()
	raw, err := f.cs.CoreV1().Services(f.ns).ProxyGet("http", "payments", "8080", "/stats", nil).DoRaw(f.ctx)
	require.NoError(f.t, err, "GET payments /stats: %s", raw)
	var s struct{ Calls, Keys int64 }
	require.NoError(f.t, json.Unmarshal(raw, &s), "%s", raw)
	return s.Calls, s.Keys
}

// TestProcessorSidecar: a run whose effect is the example processor, a
// native sidecar in each worker pod, charging the payment service by
// idempotency key; a worker pod is force-deleted mid-run. At the end each
// key is committed once, the payment service saw exactly `completed`
// distinct keys, and at least that many calls.
func TestProcessorSidecar(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "processor", 0)
	image := f.pushExampleProcessor()
	payments := f.deployPayments(image)

	// The run's own NetworkPolicy lets its pods reach only the API server,
	// the database and DNS: the processor's calls to the payment service
	// need a policy of the user's, which adds to it.
	require.NoError(t, f.c.Create(f.ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "charge-to-payments"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelRun: "charge"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "payments"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(8080))}},
			}},
		},
	}))
	// Chunks of 10, one call each: the pod is killed with chunks of its shard
	// committed and chunks to go (a chunk's calls go in one transaction).
	run := f.newRun("charge", runSpec{workers: 2, chunk: 10, batch: inlineItems(1, 400)})
	run.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{
		Image: image, Args: []string{"-payments", "http://" + payments, "-delay", "400ms"}, MaxItemsPerCall: 10,
	}}
	require.NoError(t, f.c.Create(f.ctx, run))
	t.Logf("created run %s/%s (uid %s) with the processor %s, payments at %s", f.ns, run.Name, run.UID, image, payments)

	before := f.waitRowsOfShard(run, 0, 30)
	victim := v1alpha1.PodName(run.Name, 0, 0)
	var pod corev1.Pod
	require.NoError(t, f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: victim}, &pod))
	require.Len(t, pod.Spec.InitContainers, 1)
	require.Equal(t, v1alpha1.ProcessorContainerName, pod.Spec.InitContainers[0].Name)
	out, err := f.kubectl("delete", "pod", victim, "--grace-period=0", "--force")
	require.NoError(t, err, out)
	t.Logf("shard 0 had committed %d rows; $ kubectl delete pod %s --grace-period=0 --force\n%s", before, victim, out)

	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: 400, Completed: 400}, countsOf(run))
	f.requireShardsAddUp(run)
	require.GreaterOrEqual(t, len(f.mon.podsOfShard(run, 0)), 2, "the deleted pod was replaced")
	require.EqualValues(t, 400, f.committedRows(string(run.UID)))
	require.Zero(t, f.int(`SELECT count(*) FROM (SELECT 1 FROM runledger.ledger WHERE state = 'committed' GROUP BY entity, occurrence HAVING count(*) > 1) d`),
		"no business key has two committed ledger rows")
	calls, keys := f.paymentStats()
	t.Logf("the payment service saw %d calls for %d distinct idempotency keys", calls, keys)
	require.Equal(t, run.Status.Completed, keys, "distinct idempotency keys == completed")
	require.GreaterOrEqual(t, calls, keys)
	pods := f.waitPodsFinished(run, 2*time.Minute)
	for _, p := range pods {
		require.Equal(t, corev1.PodSucceeded, p.Status.Phase, "pod %s: the pod completes when its worker exits", p.Name)
	}
	// Only the worker container had a token: the processor logged none.
	out, err = f.kubectl("logs", pods[0].Name, "-c", v1alpha1.ProcessorContainerName)
	require.NoError(t, err, out)
	require.Contains(t, out, "no Kubernetes ServiceAccount token mounted", "the processor's log")
	f.requireWorkerTokenOwnPodOnly(pods[0], pods[1])
}

// requireWorkerTokenOwnPodOnly: a token of the workers' ServiceAccount bound
// to pod own (as the kubelet's projected volume holds it) may write own's
// report annotation, and the install's admission policy refuses it
// another pod, another field and another annotation.
func (f *fixture) requireWorkerTokenOwnPodOnly(own, other corev1.Pod) {
	f.t.Helper()
	tok, err := f.cs.CoreV1().ServiceAccounts(f.ns).CreateToken(f.ctx, workerSA, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: own.Name, UID: own.UID},
	}}, metav1.CreateOptions{})
	require.NoError(f.t, err)
	cfg := rest.AnonymousClientConfig(f.cfg)
	cfg.BearerToken = tok.Status.Token
	wc, err := client.New(cfg, client.Options{Scheme: f.c.Scheme()})
	require.NoError(f.t, err)
	patch := func(name, body string) error {
		return wc.Patch(f.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	report := `{"metadata":{"annotations":{"` + v1alpha1.AnnotationProgress + `":` + strconv.Quote(own.Annotations[v1alpha1.AnnotationProgress]) + `}}}`
	require.NoError(f.t, patch(own.Name, report), "its own report")
	for what, tc := range map[string]struct{ pod, body, want string }{
		"another pod":        {other.Name, report, "a worker may only patch its own pod"},
		"another field":      {own.Name, `{"spec":{"activeDeadlineSeconds":1}}`, "not its spec"},
		"another annotation": {own.Name, `{"metadata":{"annotations":{"example.com/x":"1"}}}`, "no other annotation"},
	} {
		err := patch(tc.pod, tc.body)
		require.Error(f.t, err, what)
		require.Contains(f.t, err.Error(), tc.want, what)
		f.t.Logf("a worker's token, %s: %v", what, err)
	}
	// Reads: none, its own run neither (the kubelet mounted it from the
	// run's ConfigMap, which the token cannot read either).
	runFile := ""
	for _, v := range own.Spec.Volumes {
		if v.Name == v1alpha1.WorkerRunVolume {
			runFile = v.ConfigMap.Name
		}
	}
	require.NotEmpty(f.t, runFile, "pod %s mounts its run's file", own.Name)
	for what, obj := range map[string]client.Object{
		"its run":             &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Name: own.Labels[v1alpha1.LabelRun]}},
		"its run's ConfigMap": &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: runFile}},
	} {
		err := wc.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: obj.GetName()}, obj)
		require.True(f.t, apierrors.IsForbidden(err), "%s: %v", what, err)
		f.t.Logf("a worker's token, get %s: %v", what, err)
	}
}

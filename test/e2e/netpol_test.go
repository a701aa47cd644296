//go:build e2e

package e2e

import (
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// pushSmoke builds hack/tools/smoke (its own module) and pushes it to the
// cluster's registry; it returns the image by digest.
func (f *fixture) pushSmoke() string {
	f.t.Helper()
	bin := filepath.Join(f.t.TempDir(), "smoke")
	build := exec.CommandContext(f.ctx, "go", "build", "-trimpath", "-o", bin, ".")
	build.Dir = filepath.Join("..", "..", "hack", "tools", "smoke")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	out, err := build.CombinedOutput()
	require.NoError(f.t, err, "go build hack/tools/smoke:\n%s", out)
	out, err = exec.CommandContext(f.ctx, f.clusterSh, "push", "runledger-smoke:e2e", bin).Output()
	require.NoError(f.t, err, "hack/cluster.sh push:\n%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// dial runs `smoke dial ADDR` in a pod of the fixture's namespace with the
// given labels; it returns whether the connection was made, and the log.
func (f *fixture) dial(image, name string, labels map[string]string, addr string) (bool, string) {
	f.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "dial", Image: image, Args: []string{"dial", addr}, SecurityContext: restricted()}},
		},
	}
	require.NoError(f.t, f.c.Create(f.ctx, pod))
	require.Eventually(f.t, func() bool {
		return f.c.Get(f.ctx, client.ObjectKeyFromObject(pod), pod) == nil &&
			(pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed)
	}, 2*time.Minute, 500*time.Millisecond, "pod %s finishes", name)
	out, err := f.kubectl("logs", name)
	require.NoError(f.t, err, out)
	f.t.Logf("pod %s (%v) dials %s: %s: %s", name, labels, addr, pod.Status.Phase, strings.TrimSpace(out))
	return pod.Status.Phase == corev1.PodSucceeded, out
}

// TestNetworkPolicyEnforced: the cluster enforces NetworkPolicy
// (kube-network-policies on each node) and the shipped policies deny. A run
// completes under its NetworkPolicy; a pod that policy selects (the run's
// labels) connects to the database but not to the cluster's registry,
// which a pod of the same namespace outside the policy reaches; any pod
// connects to the manager's metrics port but not to its probes' port.
func TestNetworkPolicyEnforced(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "netpol", 0)
	run := f.createRun("fenced", runSpec{workers: 2, batch: inlineItems(1, 200)})
	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: 200, Completed: 200}, countsOf(run), "the run completes under its NetworkPolicy")
	require.EqualValues(t, 200, f.committedRows(string(run.UID)))

	var np networkingv1.NetworkPolicy
	require.NoError(t, f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: "runledger-" + run.Name}, &np))
	fenced := np.Spec.PodSelector.MatchLabels
	require.NotEmpty(t, fenced)

	image := f.pushSmoke()
	u, err := url.Parse(f.adminDSN)
	require.NoError(t, err)
	database := u.Host
	if _, _, err := net.SplitHostPort(database); err != nil {
		database = net.JoinHostPort(database, "5432")
	}
	out, err := exec.CommandContext(f.ctx, f.clusterSh, "registry").Output()
	require.NoError(t, err)
	registry := strings.TrimSpace(string(out))
	mgrs, err := f.managerPods(f.ctx)
	require.NoError(t, err)
	var manager string
	for _, m := range mgrs {
		if m.Status.PodIP != "" && m.DeletionTimestamp == nil {
			manager = m.Status.PodIP
		}
	}
	require.NotEmpty(t, manager, "a manager pod with an IP")

	// The run's pods, one at a time (the pod monitor takes two live pods of
	// a run's labels for one shard's).
	ok, _ := f.dial(image, "fenced-database", fenced, database)
	require.True(t, ok, "the run's policy lets its pods reach the database")
	ok, log := f.dial(image, "fenced-registry", fenced, registry)
	require.False(t, ok, "the run's policy refuses its pods a connection to %s: %s", registry, log)
	require.Contains(t, log, "i/o timeout", "dropped by the node, not refused by the registry")

	results := map[string]bool{}
	for name, addr := range map[string]string{
		"plain-registry": registry,
		"plain-metrics":  net.JoinHostPort(manager, strconv.Itoa(8443)),
		"plain-probes":   net.JoinHostPort(manager, strconv.Itoa(8081)),
	} {
		results[name], _ = f.dial(image, name, map[string]string{"app": "probe"}, addr)
	}
	require.True(t, results["plain-registry"], "a pod no policy selects reaches the registry: the refusal above is the run's policy")
	require.True(t, results["plain-metrics"], "the manager accepts connections to its metrics port")
	require.False(t, results["plain-probes"], "the manager's policy refuses a pod a connection to its probes' port")
}

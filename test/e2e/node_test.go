//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// clusterNode is a node of the local cluster, as hack/cluster.sh node-env
// describes it: its network namespace, its link to the control plane's, and
// the pids cgroups of its daemons and of its pods.
type clusterNode struct {
	e    *env
	name string
	vars map[string]string
	// off: powered off by the test and not on again yet.
	off bool
	// blackholed: its link drops everything (powerOff), not undone yet.
	blackholed bool
	// cut: partitioned by the test and not healed yet.
	cut bool
}

// clusterNodes are the names of the cluster's Ready nodes; the test skips
// (fails with RUNLEDGER_E2E_REQUIRE=1) when there are fewer than n.
func (e *env) clusterNodes(t *testing.T, n int) []string {
	t.Helper()
	var nodes corev1.NodeList
	require.NoError(t, e.c.List(context.Background(), &nodes))
	var ready []string
	for _, node := range nodes.Items {
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = append(ready, node.Name)
			}
		}
	}
	if len(ready) < n {
		msg := "needs " + strconv.Itoa(n) + " Ready nodes, the cluster has " + strconv.Itoa(len(ready)) + " (make e2e starts two)"
		if os.Getenv("RUNLEDGER_E2E_REQUIRE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return ready
}

// node describes a node of the local cluster.
func (e *env) node(t *testing.T, name string) *clusterNode {
	t.Helper()
	out, err := exec.Command(e.clusterSh, "node-env", name).CombinedOutput()
	require.NoError(t, err, "hack/cluster.sh node-env %s: %s", name, out)
	n := &clusterNode{e: e, name: name, vars: map[string]string{}}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			n.vars[k] = v
		}
	}
	for _, k := range []string{"NETNS", "CP_NETNS", "CP_IP", "CP_LINK", "DAEMON_CGROUP", "POD_CGROUP"} {
		require.NotEmpty(t, n.vars[k], "node-env %s: no %s in:\n%s", name, k, out)
	}
	return n
}

// blackholeRules, in the control plane's netns, drop every packet to or
// from the node: a dead machine answers nothing, and its peers find out only
// by their timeouts (a link set down would instead remove the routes and
// fail their sends at once).
func (n *clusterNode) blackholeRules() [][]string {
	link := n.vars["CP_LINK"]
	return [][]string{
		{"FORWARD", "-i", link, "-j", "DROP"},
		{"FORWARD", "-o", link, "-j", "DROP"},
		{"INPUT", "-i", link, "-j", "DROP"},
		{"OUTPUT", "-o", link, "-j", "DROP"},
	}
}

// powerOff stops the node the hard way, like a power loss: first nothing
// gets to or from it any more (not even the FIN of its connections), then
// its kubelet, containerd, kube-proxy, the containerd shims and every
// process of its pods are killed (SIGKILL, by PID), until none is left.
func (n *clusterNode) powerOff(t *testing.T) {
	t.Helper()
	for _, r := range n.blackholeRules() {
		n.iptables(t, n.vars["CP_NETNS"], append([]string{"-I"}, r...)...)
	}
	n.off, n.blackholed = true, true
	killed := 0
	for i := 0; ; i++ {
		pids := append(cgroupPIDs(t, n.vars["DAEMON_CGROUP"]), cgroupPIDs(t, n.vars["POD_CGROUP"])...)
		if len(pids) == 0 {
			break
		}
		require.Less(t, i, 100, "node %s: processes still alive after SIGKILL: %v", n.name, pids)
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				killed++
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("node %s powered off: its link %s drops everything, %d processes killed", n.name, n.vars["CP_LINK"], killed)
}

// powerOn reconnects the node and starts it again (hack/cluster.sh
// node-start), as a machine that reboots, and waits until it is Ready.
func (n *clusterNode) powerOn(t *testing.T) {
	t.Helper()
	if !n.off {
		return
	}
	if n.blackholed { // a cleanup after a failed node-start only starts it again
		for _, r := range n.blackholeRules() {
			n.iptables(t, n.vars["CP_NETNS"], append([]string{"-D"}, r...)...)
		}
		n.blackholed = false
	}
	out, err := exec.Command(n.e.clusterSh, "node-start", n.name).CombinedOutput()
	require.NoError(t, err, "hack/cluster.sh node-start %s:\n%s", n.name, out)
	n.off = false
	t.Logf("node %s powered on", n.name)
}

// partitionRules cut the node off the control plane (the apiserver, every
// packet both ways: its kubelet, kube-proxy and pods cannot reach it nor
// hear from it, it cannot reach the kubelet; dropping one direction only
// would still deliver a watch's events) while everything else, PostgreSQL
// on the same address included, still gets through.
func (n *clusterNode) partitionRules() [][]string {
	cp := n.vars["CP_IP"]
	return [][]string{
		{"OUTPUT", "-d", cp, "-p", "tcp", "--dport", "6443", "-j", "DROP"},
		{"FORWARD", "-d", cp, "-p", "tcp", "--dport", "6443", "-j", "DROP"},
		{"INPUT", "-s", cp, "-p", "tcp", "--sport", "6443", "-j", "DROP"},
		{"FORWARD", "-s", cp, "-p", "tcp", "--sport", "6443", "-j", "DROP"},
		{"INPUT", "-s", cp, "-p", "tcp", "--dport", "10250", "-j", "DROP"},
		{"OUTPUT", "-d", cp, "-p", "tcp", "--sport", "10250", "-j", "DROP"},
	}
}

// partition cuts the node's link to the control plane, not to PostgreSQL.
func (n *clusterNode) partition(t *testing.T) {
	t.Helper()
	for _, r := range n.partitionRules() {
		n.iptables(t, n.vars["NETNS"], append([]string{"-I"}, r...)...)
	}
	n.cut = true
	t.Logf("node %s partitioned from the apiserver (%s:6443); PostgreSQL (%s:5432) still reachable", n.name, n.vars["CP_IP"], n.vars["CP_IP"])
}

// heal undoes partition.
func (n *clusterNode) heal(t *testing.T) {
	t.Helper()
	if !n.cut {
		return
	}
	for _, r := range n.partitionRules() {
		n.iptables(t, n.vars["NETNS"], append([]string{"-D"}, r...)...)
	}
	n.cut = false
	t.Logf("node %s healed", n.name)
}

// iptables runs iptables in network namespace netns.
func (n *clusterNode) iptables(t *testing.T, netns string, args ...string) {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + netns, "--", "iptables", "-w"}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "iptables %v in %s: %s", args, netns, out)
}

// waitReady waits until the node's Ready condition is status.
func (n *clusterNode) waitReady(t *testing.T, status corev1.ConditionStatus, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var node corev1.Node
		require.NoError(t, n.e.c.Get(context.Background(), client.ObjectKey{Name: n.name}, &node))
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == status {
				return time.Since(start)
			}
		}
		require.Less(t, time.Since(start), timeout, "node %s: Ready is not %s after %s", n.name, status, timeout)
		time.Sleep(250 * time.Millisecond)
	}
}

// cgroupPIDs are the processes in a pids cgroup and every cgroup below it.
func cgroupPIDs(t *testing.T, dir string) []int {
	t.Helper()
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		if d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	require.NoError(t, err, "reading cgroup %s", dir)
	return pids
}

//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// TestLedgerFailover (issue #44.6, e2e tier): the ledger on an HA
// PostgreSQL run by a real failover manager (pg_auto_failover, from
// Debian's packages: hack/cluster.sh ha), a run whose Secret names both
// nodes (target_session_attrs=read-write). Mid-run the primary crashes
// (kill -9 of its postmaster: the monitor promotes the standby and the old
// primary rejoins as its standby). The run Succeeds with the counts the
// surviving ledger proves, and the effect ran once per ledger row: nothing
// lost, nothing doubled.
func TestLedgerFailover(t *testing.T) {
	f := newFixtureOn(t, haEnv(t), "failover", 0.5, true)
	const items = 18000
	f.allowLedgerNodes("failover")
	run := f.createRun("failover", runSpec{workers: 3, chunk: 100, batch: queryBatch(1, items, 0)})
	f.waitRowsOfShard(run, 0, 500)

	before := f.committedRows(string(run.UID))
	f.haFailover("--crash")
	t.Logf("the run had committed %d of %d at the crash", before, items)

	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: items, Completed: items}, countsOf(run))
	f.requireShardsAddUp(run)
	proof := f.proveRun(run)
	require.True(t, proof.Proven(), "the survivor's ledger proves every item of the batch: %+v", proof)
	require.Equal(t, countsOf(run), counts{proof.Total, proof.Completed, proof.AlreadyHandled, proof.Failed},
		"the run's counts are what the survivor's ledger proves")
	f.requireExactlyOnce(items)

	if c := meta.FindStatusCondition(run.Status.Conditions, v1alpha1.ConditionSynchronousReplication); c != nil {
		t.Logf("condition %s=%s: %s", c.Type, c.Status, c.Message)
	}
	noticed, succeeded := 0, 0
	for _, p := range f.runPods(run) {
		if logs, err := f.kubectl("logs", p.Name); err == nil && strings.Contains(logs, "another server now") {
			noticed++
			if p.Status.Phase == corev1.PodSucceeded {
				succeeded++
			}
		}
	}
	t.Logf("%d of %d worker pods logged that the ledger's server changed", noticed, len(f.runPods(run)))
	if succeeded > 0 {
		// A shard that succeeded across the failover is announced on the run.
		e := f.waitEvent(run.Name, "LedgerServerChanged", time.Minute)
		require.Equal(t, corev1.EventTypeWarning, e.Type)
		t.Logf("Event %s: %s", e.Reason, e.Message)
	}
}

// allowLedgerNodes adds to run's NetworkPolicy (which lets its pods reach
// the database's usual port only, --worker-database-ports) the HA nodes'
// hosts and ports, as a user's own policy would.
func (f *fixture) allowLedgerNodes(run string) {
	f.t.Helper()
	f.allowLedgerNodesTo(run+"-to-ledger-nodes", metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelRun: run}})
}

// allowLedgerNodesTo is allowLedgerNodes for the pods of selector, in a
// NetworkPolicy of that name (the soak's: every run's pods).
func (f *fixture) allowLedgerNodesTo(name string, selector metav1.LabelSelector) {
	f.t.Helper()
	cfg, err := pgconn.ParseConfig(f.dsn)
	require.NoError(f.t, err)
	var to []networkingv1.NetworkPolicyPeer
	var ports []networkingv1.NetworkPolicyPort
	for _, h := range append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port}}, cfg.Fallbacks...) {
		to = append(to, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: h.Host + "/32"}})
		ports = append(ports, networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(int32(h.Port)))})
	}
	require.NoError(f.t, f.c.Create(f.ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: selector,
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: to, Ports: ports}},
		},
	}))
}

// haEnv brings up the HA PostgreSQL (hack/cluster.sh ha up installs
// pg_auto_failover with apt-get if missing) and returns the environment
// with its DSN as the admin's; the test's end takes it down again, unless
// the test failed (hack/cluster.sh down does then, after a look).
func haEnv(t *testing.T) *env {
	t.Helper()
	e := setup(t)
	t0 := time.Now()
	e.clusterCmd(t, 5*time.Minute, "ha", "up")
	t.Logf("hack/cluster.sh ha up took %s", time.Since(t0).Round(time.Second))
	t.Cleanup(func() {
		if !t.Failed() {
			e.clusterCmd(t, 2*time.Minute, "ha", "down")
		}
	})
	ha := *e
	ha.adminDSN = strings.TrimSpace(e.clusterCmd(t, time.Minute, "ha", "dsn"))
	_, err := ha.sql(context.Background(), ha.adminDSN, "SELECT 1")
	require.NoError(t, err, "the HA PostgreSQL answers through its multi-host DSN")
	return &ha
}

// clusterCmd runs hack/cluster.sh and returns its standard output (its log
// lines, on standard error, go to the test's log).
func (e *env) clusterCmd(t *testing.T, timeout time.Duration, args ...string) string {
	t.Helper()
	out, logs := e.runClusterCmd(t, timeout, args...)
	t.Logf("$ hack/cluster.sh %s\n%s", strings.Join(args, " "), logs)
	return out
}

// clusterCmdQuiet is clusterCmd without the log of a command that
// succeeded (a poll).
func (e *env) clusterCmdQuiet(t *testing.T, timeout time.Duration, args ...string) string {
	t.Helper()
	out, _ := e.runClusterCmd(t, timeout, args...)
	return out
}

// runClusterCmd runs hack/cluster.sh, failing the test (with its log) if
// it fails, and returns its standard output and its log.
func (e *env) runClusterCmd(t *testing.T, timeout time.Duration, args ...string) (out, logs string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, e.clusterSh, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "hack/cluster.sh %s:\n%s", strings.Join(args, " "), stderr.String())
	return stdout.String(), stderr.String()
}

// haFailover fails the HA PostgreSQL's primary over (hack/cluster.sh ha
// failover ARGS), waits until the old primary follows the new one, and
// returns the new primary's name.
func (f *fixture) haFailover(args ...string) string {
	f.t.Helper()
	t0 := time.Now()
	out := f.clusterCmd(f.t, 5*time.Minute, append([]string{"ha", "failover"}, args...)...)
	primary := strings.TrimSpace(out)
	f.t.Logf("failover %v: %s is primary, the formation whole again after %s; the run has committed %d",
		args, primary, time.Since(t0).Round(100*time.Millisecond), f.int(`SELECT count(*) FROM runledger.ledger WHERE state = 'committed'`))
	return primary
}

// proveRun is what the ledger (of the server the test's DSN reaches)
// proves of the run (ledger.Store.ProveRun, as `runledger verify` does).
func (f *fixture) proveRun(run *v1alpha1.ProcessingRun) ledger.RunProof {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, f.dsn)
	require.NoError(f.t, err)
	defer pool.Close()
	store := ledger.NewStore(pool)
	runs, err := store.FindRuns(ctx, run.Namespace, run.Name)
	require.NoError(f.t, err)
	require.Len(f.t, runs, 1, "the ledger holds the run")
	var unproven []string
	proof, err := store.ProveRun(ctx, runs[0], nil, func(k ledger.KeyProof, v ledger.KeyVerdict) error {
		if v.Verdict != ledger.ProofCompleted && v.Verdict != ledger.ProofAlreadyHandled && len(unproven) < 5 {
			unproven = append(unproven, fmt.Sprintf("%s %s (%s)", k.Key, v.Verdict, v.Problem))
		}
		return nil
	})
	require.NoError(f.t, err)
	if len(unproven) > 0 {
		f.t.Logf("keys the ledger does not prove (first %d): %s", len(unproven), strings.Join(unproven, "; "))
	}
	return proof
}

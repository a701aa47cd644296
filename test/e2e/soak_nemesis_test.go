//go:build e2e

package e2e

// The soak's nemesis: faults from a seeded schedule, one at a time, each
// healed before the next (a node is powered on again, a partition healed).

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// The kinds of fault and how often the nemesis picks each after its first
// round (which injects every kind once, in a seeded order).
var soakFaultWeights = map[string]int{
	"pod-delete":           3,
	"leader-kill":          2,
	"backend-terminate":    2,
	"lock-stall":           2,
	"processor-crash":      2,
	"processor-slow":       2,
	"pg-restart-fast":      1,
	"pg-restart-immediate": 1,
	"node-power-off":       1,
	"node-partition":       1,
}

// soakFailoverWeights are the faults of a soak whose ledger is the HA
// formation (soakConfig.Failovers), beside soakFaultWeights: a crash of
// the primary under synchronous replication (pg_auto_failover's default),
// and under asynchronous replication after a hiccup of the standby's WAL
// (the failover that loses acknowledged commits). A soak without them
// draws its faults as it always did: kept seeds replay their schedule.
var soakFailoverWeights = map[string]int{
	"pg-failover":       1,
	"pg-failover-async": 1,
}

// faultWeights are the soak's kinds of fault and their weights.
func (c soakConfig) faultWeights() map[string]int {
	w := maps.Clone(soakFaultWeights)
	if c.Failovers {
		maps.Copy(w, soakFailoverWeights)
	}
	return w
}

// faultPlan is the nemesis' seeded schedule: before each fault a gap of
// 2-6 s, then its kind, every kind once in a seeded order first, then by
// weight. Its rng is also the faults' own (victims, durations), drawn in
// the order they are injected.
type faultPlan struct {
	rng        *rand.Rand
	kinds, bag []string
	n          int
}

func newFaultPlan(seed uint64, weights map[string]int) *faultPlan {
	p := &faultPlan{rng: rand.New(rand.NewPCG(seed, 2))}
	for k, w := range weights {
		p.kinds = append(p.kinds, k)
		for range w {
			p.bag = append(p.bag, k)
		}
	}
	sort.Strings(p.kinds)
	sort.Strings(p.bag)
	p.rng.Shuffle(len(p.kinds), func(i, j int) { p.kinds[i], p.kinds[j] = p.kinds[j], p.kinds[i] })
	return p
}

// next is the gap before the next fault and its kind.
func (p *faultPlan) next() (time.Duration, string) {
	gap := time.Duration(2000+p.rng.IntN(4000)) * time.Millisecond
	kind := p.bag[p.rng.IntN(len(p.bag))]
	if p.n < len(p.kinds) {
		kind = p.kinds[p.n]
	}
	p.n++
	return gap, kind
}

// nemesis injects faults until ctx ends, 2-6 s apart.
func (s *soak) nemesis(t *testing.T, ctx context.Context) {
	plan := newFaultPlan(s.cfg.Seed, s.cfg.faultWeights())
	for {
		gap, kind := plan.next()
		select {
		case <-ctx.Done():
			return
		case <-time.After(gap):
		}
		what, ok := s.inject(t, kind, plan.rng)
		if ok {
			s.faults[kind]++
		} else {
			s.skipped[kind]++
		}
		t.Logf("nemesis %s +%s: %s: %s", time.Now().UTC().Format("15:04:05"), time.Since(s.start).Round(time.Second), kind, what)
	}
}

// inject injects one fault; false when there was nothing to hit (no
// worker pod, no ready leader).
func (s *soak) inject(t *testing.T, kind string, rng *rand.Rand) (string, bool) {
	switch kind {
	case "pod-delete":
		return s.deleteWorkerPod(rng)
	case "leader-kill":
		return s.killLeader(t)
	case "backend-terminate":
		return s.terminateBackends(rng)
	case "lock-stall":
		return s.stallLocks(rng)
	case "processor-crash":
		return s.processorFault("crash", 0.3, 0, 15*time.Second)
	case "processor-slow":
		return s.processorFault("slow", 0.5, float64(2+rng.IntN(6)), 15*time.Second)
	case "pg-restart-fast":
		return s.restartPostgres(t)
	case "pg-restart-immediate":
		return s.restartPostgres(t, "--immediate")
	case "pg-failover":
		return s.failover(t, rng, true)
	case "pg-failover-async":
		return s.failover(t, rng, false)
	case "node-power-off":
		return s.nodeFault(t, rng, true)
	case "node-partition":
		return s.nodeFault(t, rng, false)
	}
	t.Fatalf("unknown fault kind %q", kind)
	return "", false
}

// liveWorkerPods are the namespace's worker pods that run and are not being
// deleted, by name.
func (s *soak) liveWorkerPods() []corev1.Pod {
	var pods corev1.PodList
	if err := s.f.c.List(s.f.ctx, &pods, client.InNamespace(s.f.ns), client.HasLabels{v1alpha1.LabelRunUID}); err != nil {
		return nil
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// waitFor polls find every 500 ms for up to 15 s until it returns n > 0:
// a fault waits a little for something to hit.
func waitFor(find func() int) bool {
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if find() > 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func (s *soak) deleteWorkerPod(rng *rand.Rand) (string, bool) {
	var pods []corev1.Pod
	if !waitFor(func() int { pods = s.liveWorkerPods(); return len(pods) }) {
		return "no running worker pod", false
	}
	p := pods[rng.IntN(len(pods))]
	if err := s.f.c.Delete(s.f.ctx, &p, client.GracePeriodSeconds(0)); err != nil {
		return fmt.Sprintf("delete pod %s: %v", p.Name, err), false
	}
	return fmt.Sprintf("force-deleted worker pod %s on %s", p.Name, p.Spec.NodeName), true
}

// killLeader SIGKILLs the leading manager's container (no Lease handed over).
func (s *soak) killLeader(t *testing.T) (string, bool) {
	e := s.f.env
	leader, err := e.leaderPod(s.f.ctx)
	if err != nil || leader == "" {
		return fmt.Sprintf("no leader (%v)", err), false
	}
	pods, err := e.managerPods(s.f.ctx)
	if err != nil {
		return err.Error(), false
	}
	p, ok := pods[leader]
	if !ok || !podReady(p) {
		return fmt.Sprintf("leader %s is not ready", leader), false
	}
	e.managerKiller(t, p)()
	return fmt.Sprintf("SIGKILL to the leader's manager container (%s on %s)", p.Name, p.Spec.NodeName), true
}

// terminateBackends ends 1-3 of the workers' PostgreSQL sessions
// (pg_terminate_backend), picked by the seed among those open.
func (s *soak) terminateBackends(rng *rand.Rand) (string, bool) {
	var pids []int32
	var apps []string
	if !waitFor(func() int {
		s.f.rows(func() { pids, apps = nil, nil }, func(r pgx.Rows) error {
			var pid int32
			var app string
			err := r.Scan(&pid, &app)
			pids, apps = append(pids, pid), append(apps, app)
			return err
		}, `SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'runledger/%' ORDER BY pid`)
		return len(pids)
	}) {
		return "no worker session", false
	}
	var ended []string
	picked := map[int]bool{}
	for range 1 + rng.IntN(3) {
		i := rng.IntN(len(pids)) // drawn with repeats, as kept seeds were: a session ends once
		if picked[i] {
			continue
		}
		picked[i] = true
		if n := s.f.int(`SELECT count(*) FROM (SELECT pg_terminate_backend($1::int)) t`, pids[i]); n == 1 {
			ended = append(ended, fmt.Sprintf("%d (%s)", pids[i], apps[i]))
		}
	}
	return fmt.Sprintf("pg_terminate_backend %v", ended), true
}

// stallLocks holds an EXCLUSIVE lock on the effects' tables for 3-15 s:
// their inserts wait, beyond the runs' 10 s lock timeout sometimes. (With
// failovers the processor's table is in its own database: locked there.)
func (s *soak) stallLocks(rng *rand.Rand) (string, bool) {
	hold := time.Duration(3+rng.IntN(13)) * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), hold+time.Minute)
	defer cancel()
	locks := []struct{ dsn, tables string }{{s.f.dsn, "soak_sink, soak_processor_work"}}
	if dbs := s.databases(); len(dbs) > 1 {
		locks = []struct{ dsn, tables string }{{s.f.dsn, "soak_sink"}, {s.svc.dsn, "soak_processor_work"}}
	}
	start := time.Now()
	var txs []pgx.Tx
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback(context.Background())
			_ = tx.Conn().Close(context.Background())
		}
	}()
	for _, l := range locks {
		conn, err := pgx.Connect(ctx, l.dsn)
		if err != nil {
			return fmt.Sprintf("connect: %v", err), false
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			_ = conn.Close(context.Background())
			return fmt.Sprintf("begin: %v", err), false
		}
		txs = append(txs, tx)
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'`); err != nil {
			return fmt.Sprintf("lock timeout: %v", err), false
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE `+l.tables+` IN EXCLUSIVE MODE`); err != nil {
			return fmt.Sprintf("lock: %v", err), false
		}
	}
	got := time.Since(start)
	time.Sleep(hold)
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			return fmt.Sprintf("held the lock, commit: %v", err), true
		}
	}
	return fmt.Sprintf("held EXCLUSIVE on soak_sink and soak_processor_work for %s (got it in %s)", hold, got.Round(time.Millisecond)), true
}

// processorFault tells the processors to crash or answer slowly for a while.
func (s *soak) processorFault(kind string, rate, seconds float64, d time.Duration) (string, bool) {
	s.svc.int(`INSERT INTO soak_fault (kind, until, rate, seconds) VALUES ($1, now() + make_interval(secs => $2), $3, $4)
		ON CONFLICT (kind) DO UPDATE SET until = EXCLUDED.until, rate = EXCLUDED.rate, seconds = EXCLUDED.seconds`,
		kind, d.Seconds(), rate, seconds)
	if kind == "slow" {
		return fmt.Sprintf("processors answer %.0f%% of calls %.0fs late for %s (their timeout is 5s)", rate*100, seconds, d), true
	}
	return fmt.Sprintf("processors exit after the work and before the answer on %.0f%% of calls for %s", rate*100, d), true
}

// restartPostgres restarts the ledger's PostgreSQL (fast, or immediate):
// the cluster's, or on the HA formation its current primary (whose keeper
// starts it again, or whose monitor fails over meanwhile: then the old
// primary demotes, its fast shutdown made immediate after 30 s, counted in
// s.stoppedImmediately, when it does not end: see ha_demote_or_stop).
func (s *soak) restartPostgres(t *testing.T, args ...string) (string, bool) {
	if s.cfg.Failovers {
		before := s.haPrimary(t)
		// Its output: the primary's name ("-": none), then what it did to the old one.
		out := strings.Split(strings.TrimSpace(s.f.clusterCmd(t, 5*time.Minute, append([]string{"ha", "restart"}, args...)...)), "\n")
		what := strings.TrimSpace("hack/cluster.sh ha restart " + strings.Join(args, " "))
		after := strings.TrimSpace(out[0])
		if after == before {
			return fmt.Sprintf("%s: primary %s restarted in place", what, before), true
		}
		demoted := "demoted"
		if slices.Contains(out[1:], "stopped-immediately") {
			s.stoppedImmediately++
			demoted = "stopped immediately, its fast shutdown not ended after 30s (what it waited for: the command's log)"
		}
		return fmt.Sprintf("%s: primary %s restarted, the monitor failed over to %s meanwhile; %s %s", what, before, after, before, demoted), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.f.clusterSh, append([]string{"postgres", "restart"}, args...)...).CombinedOutput()
	require.NoError(t, err, "hack/cluster.sh postgres restart %v:\n%s", args, out)
	return strings.TrimSpace("hack/cluster.sh postgres restart " + strings.Join(args, " ")), true
}

// haStates is `hack/cluster.sh ha state`: each node's name, port,
// reported and assigned state.
func (s *soak) haStates(t *testing.T) [][]string {
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(s.f.clusterCmdQuiet(t, time.Minute, "ha", "state")), "\n") {
		if f := strings.Fields(line); len(f) == 4 {
			out = append(out, f)
		}
	}
	return out
}

// haPrimary is the node that takes writes ("" when none does).
func (s *soak) haPrimary(t *testing.T) string {
	for _, n := range s.haStates(t) {
		if n[2] == n[3] && (n[2] == "primary" || n[2] == "wait_primary") {
			return n[0]
		}
	}
	return ""
}

// haWhole reports whether one node is primary and the other its
// secondary, waiting up to timeout for it (after a failover the old
// primary rejoins as a standby, in seconds or, under load, minutes).
func (s *soak) haWhole(t *testing.T, timeout time.Duration) (bool, string) {
	for deadline := time.Now().Add(timeout); ; time.Sleep(2 * time.Second) {
		states := s.haStates(t)
		roles := map[string]int{}
		var line []string
		for _, n := range states {
			line = append(line, strings.Join(n, " "))
			if n[2] == n[3] {
				roles[n[2]]++
			}
		}
		if roles["primary"] == 1 && roles["secondary"] == 1 {
			return true, ""
		}
		if time.Now().After(deadline) {
			return false, strings.Join(line, "; ")
		}
	}
}

// failover crashes the HA formation's primary's machine (hack/cluster.sh
// ha failover --crash: its keeper frozen, its postmaster SIGKILLed) after
// a hiccup of 0.5-3 s in which its standby receives no WAL; the monitor
// promotes the standby, the old primary rejoins as its standby. sync: under synchronous replication (the
// hiccup's commits wait, unacknowledged, and are never lost); else under
// asynchronous replication, set for the fault (the hiccup's commits are
// acknowledged and lost with the old primary), synchronous again after.
// Nothing to hit when the formation is not whole (the last failover's old
// primary not back) within 2 minutes.
func (s *soak) failover(t *testing.T, rng *rand.Rand, sync bool) (string, bool) {
	hold := time.Duration(500+rng.IntN(2500)) * time.Millisecond
	if whole, states := s.haWhole(t, 2*time.Minute); !whole {
		t.Logf("the formation is not whole: hack/cluster.sh ha diag:\n%s", s.f.clusterCmdQuiet(t, time.Minute, "ha", "diag"))
		return "the formation is not a primary and its secondary after 2m: " + states, false
	}
	mode := "synchronous"
	if !sync {
		mode = "asynchronous"
		s.f.clusterCmd(t, 2*time.Minute, "ha", "sync", "off")
		defer s.f.clusterCmd(t, 2*time.Minute, "ha", "sync", "on")
	}
	before := s.haPrimary(t)
	t0 := time.Now()
	after := strings.TrimSpace(s.f.clusterCmd(t, 5*time.Minute, "ha", "failover", "--crash", "--hold-wal", strconv.Itoa(int(hold.Milliseconds()))))
	return fmt.Sprintf("%s replication: %s's WAL held from its standby for %s, then its keeper frozen and its postmaster SIGKILLed; %s primary (the command took %s)",
		mode, before, hold, after, time.Since(t0).Round(time.Second)), true
}

// nodeFault powers a node off (or cuts it off the control plane) until it
// is NotReady and 5 s more, then brings it back and waits until it is Ready.
func (s *soak) nodeFault(t *testing.T, rng *rand.Rand, power bool) (string, bool) {
	names := s.f.clusterNodes(t, 2)
	sort.Strings(names)
	victim := names[rng.IntN(len(names))]
	n := s.f.node(t, victim)
	s.f.mon.nodeLost(victim)
	start := time.Now()
	if power {
		t.Cleanup(func() { n.powerOn(t) })
		n.powerOff(t)
	} else {
		t.Cleanup(func() { n.heal(t) })
		n.partition(t)
	}
	unready := n.waitReady(t, corev1.ConditionUnknown, 2*time.Minute)
	time.Sleep(5 * time.Second)
	if power {
		n.powerOn(t)
	} else {
		n.heal(t)
	}
	n.waitReady(t, corev1.ConditionTrue, 3*time.Minute)
	s.f.mon.nodeBack(victim)
	what := "partitioned from the apiserver"
	if power {
		what = "powered off"
	}
	return fmt.Sprintf("node %s %s (NotReady after %s), back and Ready after %s", victim, what, unready.Round(time.Second), time.Since(start).Round(time.Second)), true
}

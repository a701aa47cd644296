//go:build e2e

package e2e

// The soak's nemesis: faults from a seeded schedule, one at a time, each
// healed before the next (a node is powered on again, a partition healed).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"sort"
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

// nemesis injects faults until ctx ends, 2-6 s apart.
func (s *soak) nemesis(t *testing.T, ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.cfg.Seed, 2))
	var kinds, bag []string
	for k, w := range soakFaultWeights {
		kinds = append(kinds, k)
		for range w {
			bag = append(bag, k)
		}
	}
	sort.Strings(kinds)
	sort.Strings(bag)
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(2000+rng.IntN(4000)) * time.Millisecond):
		}
		kind := bag[rng.IntN(len(bag))]
		if i < len(kinds) {
			kind = kinds[i]
		}
		what, ok := s.inject(t, kind, rng)
		if ok {
			s.faults[kind]++
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
// their inserts wait, beyond the runs' 10 s lock timeout sometimes.
func (s *soak) stallLocks(rng *rand.Rand) (string, bool) {
	hold := time.Duration(3+rng.IntN(13)) * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), hold+time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.f.dsn)
	if err != nil {
		return fmt.Sprintf("connect: %v", err), false
	}
	defer func() { _ = conn.Close(context.Background()) }()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Sprintf("begin: %v", err), false
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	start := time.Now()
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '30s'`); err != nil {
		return fmt.Sprintf("lock timeout: %v", err), false
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE soak_sink, soak_processor_work IN EXCLUSIVE MODE`); err != nil {
		return fmt.Sprintf("lock: %v", err), false
	}
	got := time.Since(start)
	time.Sleep(hold)
	if err := tx.Commit(ctx); err != nil {
		return fmt.Sprintf("held the lock, commit: %v", err), true
	}
	return fmt.Sprintf("held EXCLUSIVE on soak_sink and soak_processor_work for %s (got it in %s)", hold, got.Round(time.Millisecond)), true
}

// processorFault tells the processors to crash or answer slowly for a while.
func (s *soak) processorFault(kind string, rate, seconds float64, d time.Duration) (string, bool) {
	s.f.int(`INSERT INTO soak_fault (kind, until, rate, seconds) VALUES ($1, now() + make_interval(secs => $2), $3, $4)
		ON CONFLICT (kind) DO UPDATE SET until = EXCLUDED.until, rate = EXCLUDED.rate, seconds = EXCLUDED.seconds`,
		kind, d.Seconds(), rate, seconds)
	if kind == "slow" {
		return fmt.Sprintf("processors answer %.0f%% of calls %.0fs late for %s (their timeout is 5s)", rate*100, seconds, d), true
	}
	return fmt.Sprintf("processors exit after the work and before the answer on %.0f%% of calls for %s", rate*100, d), true
}

// restartPostgres restarts the cluster's PostgreSQL (fast, or immediate).
func (s *soak) restartPostgres(t *testing.T, args ...string) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.f.clusterSh, append([]string{"postgres", "restart"}, args...)...).CombinedOutput()
	require.NoError(t, err, "hack/cluster.sh postgres restart %v:\n%s", args, out)
	return strings.TrimSpace("hack/cluster.sh postgres restart " + strings.Join(args, " ")), true
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

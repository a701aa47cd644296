//go:build e2e

package e2e

// The soak (`make soak`, and a short version in the e2e tier): a generator
// of runs (soak_work_test.go), a seeded nemesis of faults
// (soak_nemesis_test.go) and an independent checker (soak_check_test.go)
// that reads the effects' own tables rather than runledger's report.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/api/v1alpha1"
)

// soakConfig is one soak: its seed and how long the nemesis and the
// generator run (the drain and the checks come after).
type soakConfig struct {
	Name     string `json:"-"`
	Seed     uint64 `json:"seed"`
	Duration string `json:"duration"`
	// Failovers: the ledger is an HA formation (pg_auto_failover,
	// hack/cluster.sh ha) and the nemesis fails it over too
	// (soakFailoverWeights); without, the ledger is the cluster's
	// PostgreSQL and the faults are drawn as before failovers existed, so
	// that the seeds kept then replay their schedule.
	Failovers bool `json:"failovers,omitempty"`
	// Found is what the soak found when this seed was kept (a kept seed's file).
	Found string `json:"found,omitempty"`
}

// The CI short version: these soaks for ciDuration each, then every seed
// kept under test/soak/seeds/. Its seed draws both failovers before any
// node fault, pg-failover first (TestSoakSchedule; 20261202's, the seed
// before failovers, ninth and tenth); a failover and the old primary's
// rejoin take one to two minutes, so ciDuration sees the first.
var ciSoaks = []soakConfig{{Seed: ciSeed, Failovers: true}}

const (
	ciSeed     = 20261204
	ciDuration = "2m"
)

// soakSeedsDir holds the seeds of soaks that failed, each a replayable case.
const soakSeedsDir = "../soak/seeds"

// soakConfigs: RUNLEDGER_SOAK_DURATION (and RUNLEDGER_SOAK_SEED, random when
// unset; RUNLEDGER_SOAK_FAILOVERS=1 for the HA ledger and its failovers)
// ask for one soak (make soak); without them, the CI short version.
func soakConfigs(t *testing.T) []soakConfig {
	t.Helper()
	if d := os.Getenv("RUNLEDGER_SOAK_DURATION"); d != "" {
		seed := rand.Uint64() % 1_000_000_000
		if s := os.Getenv("RUNLEDGER_SOAK_SEED"); s != "" {
			var err error
			seed, err = strconv.ParseUint(s, 10, 64)
			require.NoError(t, err, "RUNLEDGER_SOAK_SEED=%q: a seed is a non-negative integer", s)
		}
		var failovers bool
		switch v := os.Getenv("RUNLEDGER_SOAK_FAILOVERS"); v {
		case "1":
			failovers = true
		case "", "0":
		default:
			t.Fatalf("RUNLEDGER_SOAK_FAILOVERS=%q: 1 (the HA ledger and its failovers) or 0", v)
		}
		return []soakConfig{{Name: fmt.Sprintf("seed-%d", seed), Seed: seed, Duration: d, Failovers: failovers}}
	}
	var out []soakConfig
	for _, c := range ciSoaks {
		c.Name, c.Duration = fmt.Sprintf("ci-%d", c.Seed), ciDuration
		if c.Failovers {
			c.Name += "-failovers"
		}
		out = append(out, c)
	}
	files, err := filepath.Glob(filepath.Join(soakSeedsDir, "*.json"))
	require.NoError(t, err)
	sort.Strings(files)
	for _, file := range files {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		var c soakConfig
		require.NoError(t, json.Unmarshal(b, &c), "seed file %s", file)
		c.Name = strings.TrimSuffix(filepath.Base(file), ".json")
		out = append(out, c)
	}
	return out
}

// TestSoak: runs of every kind stream through the cluster while the
// nemesis injects faults; afterwards every run is terminal, the effects'
// own tables show every item applied once or failed visibly, each run's
// counts equal what the tables and the ledger hold, and nothing leaked.
// It prints a summary (and writes it to the cluster's log directory).
func TestSoak(t *testing.T) {
	e := setup(t)
	e.clusterNodes(t, 2)
	var recap []string
	for _, c := range soakConfigs(t) {
		var problems []string
		if !t.Run(c.Name, func(t *testing.T) { problems = runSoak(t, c) }) {
			recap = append(recap, soakRecap(c, problems))
		}
	}
	// Each failed soak's reason again, last: the soaks after it print pages
	// of their own, and what reads only the end of the output (CI's
	// excerpt) would miss it.
	if len(recap) > 0 {
		t.Logf("the soaks that failed:\n%s", strings.Join(recap, "\n"))
	}
}

// soakRecap is one line on a soak that failed: its problems, or that a
// step of the harness stopped it (its error is in the soak's log).
func soakRecap(c soakConfig, problems []string) string {
	if len(problems) == 0 {
		return fmt.Sprintf("  %s (seed %d): stopped by a step of the harness or the cluster before its check: the first error in its log above says which", c.Name, c.Seed)
	}
	return fmt.Sprintf("  %s (seed %d): %s", c.Name, c.Seed, strings.Join(problems[:min(len(problems), 5)], "; "))
}

// soak is one soak's state, shared by the generator, the nemesis and the
// checker.
type soak struct {
	f *fixture // the ledger's database (and the effects')
	// svc is the processor's own database, where it keeps what it did
	// (soak_processor_*, and soak_fault): f's, or with failovers one on
	// the cluster's PostgreSQL, which no failover touches (as a payment
	// service's own records), behind Secret svcSecret.
	svc       *fixture
	svcSecret string
	cfg       soakConfig
	image     string
	start     time.Time
	faults    map[string]int
	// skipped: the faults the nemesis drew and could not inject (nothing
	// to hit: no worker pod, no standby to fail over to), by kind.
	skipped map[string]int
	// stoppedImmediately: old primaries whose demotion (a fast shutdown)
	// did not end after a failover and was made immediate.
	stoppedImmediately int

	mu   sync.Mutex
	runs []*soakRun // generated, in order of creation
}

// runSoak runs one soak and returns the problems its check found.
func runSoak(t *testing.T, cfg soakConfig) []string {
	d, err := time.ParseDuration(cfg.Duration)
	require.NoError(t, err, "soak duration %q", cfg.Duration)
	e := setup(t)
	if cfg.Failovers {
		e = haEnv(t) // hack/cluster.sh ha up; down again at the end
	}
	e.scaleManager(t, 2) // a standby: the nemesis kills leaders
	t.Cleanup(func() { e.scaleManager(t, 1) })
	f := newFixtureOn(t, e, "soak", 0, true)
	_, err = e.sql(f.ctx, f.dsn, soakSchema)
	require.NoError(t, err, "soak schema")
	s := &soak{f: f, svc: f, svcSecret: secretName, cfg: cfg, faults: map[string]int{}, skipped: map[string]int{}}
	if cfg.Failovers {
		f.allowLedgerNodesTo("soak-to-ledger-nodes", metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: v1alpha1.LabelRun, Operator: metav1.LabelSelectorOpExists}}})
		s.svc, s.svcSecret = f.serviceDatabase(t, setup(t)), "soak-service-db"
		s.svc.createSecret(s.svcSecret)
	}
	_, err = e.sql(f.ctx, s.svc.dsn, soakServiceSchema)
	require.NoError(t, err, "soak service schema")
	s.image = f.pushImage("../soak/processor", "runledger-soak-processor:soak")
	replay := fmt.Sprintf("make soak SEED=%d DURATION=%s", cfg.Seed, cfg.Duration)
	if cfg.Failovers {
		t.Logf("soak %s: seed %d for %s, the ledger on the HA formation and failovers among the faults (replay: %s FAILOVERS=1)", cfg.Name, cfg.Seed, d, replay)
	} else {
		t.Logf("soak %s: seed %d for %s, the ledger on the cluster's PostgreSQL, no failovers (replay: %s FAILOVERS=0)", cfg.Name, cfg.Seed, d, replay)
	}

	s.start = time.Now()
	s.createSchedule()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	genDone := make(chan struct{})
	go func() {
		defer close(genDone)
		s.generate(ctx)
	}()
	s.nemesis(t, ctx) // in the test's goroutine: the cluster helpers may fail the test
	<-genDone
	s.suspendSchedule()
	waits := s.drain(15 * time.Minute)
	leaks := s.leaks(3 * time.Minute)
	rep := s.check(t)
	rep.notTerminal = append(rep.notTerminal, waits...)
	rep.leaks = append(rep.leaks, leaks...)
	summary := rep.summary(s)
	fmt.Println(summary) // the quotable block, without the test's log prefix
	t.Log("\n" + summary)
	if dir := os.Getenv("RUNLEDGER_CLUSTER_LOGS"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "soak-"+cfg.Name+".txt"), []byte(summary+"\n"), 0o644)
	}
	problems := rep.problems()
	if len(problems) > 0 {
		s.keepSeed(t, problems)
		t.Errorf("soak %s (seed %d) found:\n  %s", cfg.Name, cfg.Seed, strings.Join(problems, "\n  "))
	}
	return problems
}

// serviceDatabase is a database of the fixture's own on e's PostgreSQL
// (the cluster's), as a fixture of the same namespace: the processor's
// store in a soak with failovers. Dropped at the end unless the test failed.
func (f *fixture) serviceDatabase(t *testing.T, e *env) *fixture {
	t.Helper()
	name := f.db + "_service"
	svc := *f
	svc.db, svc.dsn = name, e.createDatabase(t, name)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept the processor's database %s for debugging", name)
			return
		}
		if err := e.dropDatabase(name); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	return &svc
}

// keepSeed writes the failing seed as a replayable case under
// test/soak/seeds/ of the checkout (hack/e2e.sh runs the tests from a copy).
func (s *soak) keepSeed(t *testing.T, problems []string) {
	if strings.HasPrefix(s.cfg.Name, "kept-") {
		return // a replay of a kept seed: it is kept already
	}
	dir := soakSeedsDir
	if co := os.Getenv("RUNLEDGER_E2E_CHECKOUT"); co != "" {
		dir = filepath.Join(co, "test", "soak", "seeds")
	}
	found := strings.Join(problems[:min(len(problems), 5)], "; ")
	b, _ := json.MarshalIndent(soakConfig{Seed: s.cfg.Seed, Duration: s.cfg.Duration, Failovers: s.cfg.Failovers, Found: found}, "", "  ")
	path := filepath.Join(dir, fmt.Sprintf("kept-%d.json", s.cfg.Seed))
	if err := os.MkdirAll(dir, 0o755); err == nil {
		err = os.WriteFile(path, append(b, '\n'), 0o644)
		if err == nil {
			t.Logf("kept the failing seed as %s: commit it with the fix (the CI short version replays it)", path)
			return
		}
	}
	t.Logf("could not keep the failing seed in %s: %s", dir, b)
}

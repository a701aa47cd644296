//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

// previousRelease is the commit TestUpgradeWithRunInFlight installs as the
// release before this one (CHANGELOG.md: v0.1.0); move it to the last
// release's tag when one is cut.
const (
	previousRelease        = "54189775ccd679d52718974cef642ab3fcea51c0"
	previousReleaseVersion = "v0.1.0"
)

// repoRoot is the checkout under test (hack/e2e.sh's copy of it).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return root
}

// shell runs a bash script in dir and returns its output (no -x: the DSN
// holds a password).
func shell(ctx context.Context, t *testing.T, dir, script string, env ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "in %s:\n%s\noutput:\n%s", dir, script, out)
	return string(out)
}

// reinstallAfter puts the operator under test back as the harness installed
// it (dist/install.yaml) when the test ends, for the tests that follow.
func (e *env) reinstallAfter(t *testing.T) {
	root := repoRoot(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := e.kubectlRun(ctx, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(root, "dist", "install.yaml"))
		require.NoError(t, err, out)
		out, err = e.kubectlRun(ctx, "-n", systemNamespace, "rollout", "status", "deployment/"+managerName, "--timeout=180s")
		require.NoError(t, err, out)
	})
}

// uninstallManifest removes the harness's install (dist/install.yaml), CRD included.
func (e *env) uninstallManifest(ctx context.Context, t *testing.T) {
	t.Helper()
	out, err := e.kubectlRun(ctx, "delete", "processingruns", "--all", "--all-namespaces", "--wait=true")
	require.NoError(t, err, out)
	out, err = e.kubectlRun(ctx, "delete", "-f", filepath.Join(repoRoot(t), "dist", "install.yaml"), "--wait=true", "--ignore-not-found")
	require.NoError(t, err, out)
}

// helmOnPath: a directory holding `helm`, the pinned one (make helm).
func helmOnPath(ctx context.Context, t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	out := shell(ctx, t, root, `make -s helm >&2; ls bin/helm-v*`)
	fields := strings.Fields(out)
	helm := fields[len(fields)-1]
	dir := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Join(root, helm), filepath.Join(dir, "helm")))
	return dir
}

// readmeSection is the sh blocks between <!-- NAME:begin --> and <!-- NAME:end --> of README.md.
func readmeSection(t *testing.T, name string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(raw), "<!-- "+name+":begin -->")
	require.True(t, ok, "README.md has <!-- %s:begin -->", name)
	section, _, ok := strings.Cut(rest, "<!-- "+name+":end -->")
	require.True(t, ok, "README.md has <!-- %s:end -->", name)
	var blocks []string
	for _, m := range shBlock.FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// requireUninstalled: nothing of the operator is left but what the user
// keeps on purpose (the ledger, in PostgreSQL).
func (e *env) requireUninstalled(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, kind := range []string{"deployments,services,serviceaccounts,roles,rolebindings,configmaps", "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings"} {
		out, err := e.kubectlRun(ctx, "get", kind, "-A", "-l", "app.kubernetes.io/name=runledger", "-o", "name")
		require.NoError(t, err, out)
		require.Empty(t, strings.TrimSpace(out), "left after the uninstall")
	}
	out, err := e.kubectlRun(ctx, "get", "crd", "processingruns.processing.runledger.dev", "--ignore-not-found", "-o", "name")
	require.NoError(t, err, out)
	require.Empty(t, strings.TrimSpace(out), "the CRD is gone")
}

// TestHelmInstall follows the README's Helm install word for word (the
// chart from this checkout, the image the harness pushed), runs a batch,
// and uninstalls the way the README says: nothing is left but the ledger.
func TestHelmInstall(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	root := repoRoot(t)
	registry, err := exec.CommandContext(ctx, e.clusterSh, "registry").Output()
	require.NoError(t, err, "hack/cluster.sh registry")
	img := strings.TrimSpace(string(registry)) + "/runledger:dev"
	blocks := readmeSection(t, "readme-helm")
	require.Len(t, blocks, 2, "the README's Helm section: install, uninstall")
	path := "PATH=" + helmOnPath(ctx, t) + ":" + os.Getenv("PATH")

	e.uninstallManifest(ctx, t)
	e.reinstallAfter(t)
	settings := fmt.Sprintf("IMG=%q\nexport INSECURE=1 # the cluster's registry speaks plain HTTP\n", img)
	out := shell(ctx, t, root, settings+blocks[0], path)
	t.Logf("helm install:\n%s", out)
	out, err = e.kubectlRun(ctx, "get", "deployment", "-n", systemNamespace, managerName, "-o", "jsonpath={.metadata.annotations.meta\\.helm\\.sh/release-name}")
	require.NoError(t, err, out)
	require.Equal(t, "runledger", out, "the manager is the chart's release's")

	f := newFixture(t, "helm", 0)
	run := f.createRun("helm", runSpec{workers: 2, chunk: 50, batch: queryBatch(1, 400, 0)})
	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: 400, Completed: 400}, countsOf(run))
	f.requireExactlyOnce(400)

	out = shell(ctx, t, root, settings+blocks[1], path)
	t.Logf("helm uninstall:\n%s", out)
	e.requireUninstalled(ctx, t)
	require.EqualValues(t, 400, f.int(`SELECT count(*) FROM runledger.ledger WHERE state = 'committed'`), "the ledger stays")
}

// buildPrevious builds the previous release from its commit (a clone of the
// checkout, as a release manager would from the tag): its image pushed as
// REGISTRY/runledger:previousReleaseVersion and its dist/install.yaml.
func buildPrevious(ctx context.Context, t *testing.T, registry string) (dir, ref string) {
	t.Helper()
	checkout := os.Getenv("RUNLEDGER_E2E_CHECKOUT") // hack/e2e.sh: the git checkout it copied
	require.NotEmpty(t, checkout, "RUNLEDGER_E2E_CHECKOUT (hack/e2e.sh sets it)")
	dir = filepath.Join(t.TempDir(), "previous")
	img := registry + "/runledger:" + previousReleaseVersion
	shell(ctx, t, repoRoot(t), fmt.Sprintf(`
git clone --quiet --no-local --no-checkout %[1]q %[2]q
git -C %[2]q checkout --quiet %[3]s
mkdir -p %[2]q/bin && ln -s %[4]q %[2]q/bin/k8s
# One platform: the cluster's nodes are amd64.
make -s -C %[2]q build-installer IMG=%[5]q INSECURE=1 PLATFORMS=linux/amd64 VERSION=%[6]s COMMIT=%[3]s >&2
make -s -C %[2]q push IMG=%[5]q INSECURE=1 PLATFORMS=linux/amd64 VERSION=%[6]s COMMIT=%[3]s
`, checkout, dir, previousRelease, filepath.Join(checkout, "bin", "k8s"), img, previousReleaseVersion))
	raw, err := os.ReadFile(filepath.Join(dir, "dist", "install.yaml"))
	require.NoError(t, err)
	for _, l := range strings.Split(string(raw), "\n") {
		if s := strings.TrimSpace(l); strings.HasPrefix(s, "image: ") {
			ref = strings.TrimPrefix(s, "image: ")
		}
	}
	require.Contains(t, ref, "@sha256:")
	return dir, ref
}

// TestUpgradeWithRunInFlight: the previous release is installed
// (dist/install.yaml built from its commit) and run A starts, its workers
// migrating its ledger to the previous release's schema as they do at
// start; then the README's documented steps bring the current code. Their
// migrate runs while A's v0.1.0 shards commit and waits for them (each
// holds a transaction while it runs, which 00016's index builds
// CONCURRENTLY wait for), saying so; meanwhile the previous manager starts
// run B, whose v0.1.0 workers start on a ledger half migrated and wait for
// the migration lock. Right after migrate, run C starts, still under the
// previous manager: the new one takes it over in flight. All three complete
// with exact counts, no item committed or effected twice. Two ways, each
// from the previous release: the manifest's upgrade (push, migrate, render,
// apply), and the move to the Helm chart (push, migrate, CRD, helm upgrade
// --install --take-ownership: the previous release had no chart).
func TestUpgradeWithRunInFlight(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	root := repoRoot(t)
	registry, err := exec.CommandContext(ctx, e.clusterSh, "registry").Output()
	require.NoError(t, err, "hack/cluster.sh registry")
	reg := strings.TrimSpace(string(registry))

	prev, prevRef := buildPrevious(ctx, t, reg)
	t.Logf("the previous release %s (%s): %s", previousReleaseVersion, previousRelease[:7], prevRef)
	// What the upgrade builds, built once before the runs start, so that
	// the upgrade itself takes as long as it does with a warm build cache.
	shell(ctx, t, root, fmt.Sprintf("make -s push IMG=%q INSECURE=1 >&2 && make -s build && make -s helm >&2", reg+"/runledger:dev"))
	e.reinstallAfter(t)

	t.Run("manifest", func(t *testing.T) {
		upgradeWithRunInFlight(ctx, t, e, prev, prevRef, "upgrade", readmeUpgrade(t), "")
	})
	t.Run("helm", func(t *testing.T) {
		blocks := readmeSection(t, "readme-helm-adopt")
		require.Len(t, blocks, 1, "the README's move of an install to the chart: one block")
		path := "PATH=" + helmOnPath(ctx, t) + ":" + os.Getenv("PATH")
		t.Cleanup(func() {
			// The chart's release goes (reinstallAfter puts the manifest
			// back): later tests install the chart afresh.
			c, stop := context.WithTimeout(context.Background(), 5*time.Minute)
			defer stop()
			shell(c, t, root, "helm uninstall runledger --namespace runledger-system --wait", path)
		})
		upgradeWithRunInFlight(ctx, t, e, prev, prevRef, "upgrade-helm", blocks[0], path)
		out, err := e.kubectlRun(ctx, "get", "deployment", "-n", systemNamespace, managerName, "-o", "jsonpath={.metadata.annotations.meta\\.helm\\.sh/release-name}")
		require.NoError(t, err, out)
		require.Equal(t, "runledger", out, "the manager is the chart's release's")
	})
}

// upgradeWithRunInFlight installs the previous release's manifest, starts a
// long run on a ledger its workers migrate, runs steps (a README block) and
// checks the run goes on under the new manager to exact counts.
func upgradeWithRunInFlight(ctx context.Context, t *testing.T, e *env, prev, prevRef, name, steps string, env ...string) {
	root := repoRoot(t)
	registry, err := exec.CommandContext(ctx, e.clusterSh, "registry").Output()
	require.NoError(t, err, "hack/cluster.sh registry")
	reg := strings.TrimSpace(string(registry))
	// What installed runledger goes first (the harness's install, or the
	// last subtest's): the previous release is installed the way its users
	// did.
	e.uninstallManifest(ctx, t)
	out, err := e.kubectlRun(ctx, "apply", "-f", filepath.Join(prev, "dist", "install.yaml"))
	require.NoError(t, err, out)
	out, err = e.kubectlRun(ctx, "-n", systemNamespace, "rollout", "status", "deployment/"+managerName, "--timeout=180s")
	require.NoError(t, err, out)
	prevDigest := prevRef[strings.Index(prevRef, "@"):]
	pods, err := e.managerPods(ctx)
	require.NoError(t, err)
	for name, p := range pods {
		if p.DeletionTimestamp == nil {
			require.True(t, strings.HasSuffix(p.Spec.Containers[0].Image, prevDigest), "manager pod %s runs the previous release", name)
		}
	}

	// Each run's pace, per chunk, by its occurrence: the statement-level
	// trigger sees the chunk's rows. Four seconds a chunk until the test
	// lets a run go at full pace.
	f := newFixtureOf(t, name, 4, false)
	_, err = e.sql(ctx, f.dsn, `
CREATE TABLE pace (occurrence text PRIMARY KEY, seconds float8 NOT NULL);
INSERT INTO pace VALUES ('2026-01', 4), ('2026-02', 4);
GRANT SELECT ON pace TO runledger_effect;
CREATE OR REPLACE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(coalesce((SELECT max(p.seconds) FROM public.pace p JOIN chunk c USING (occurrence)), 0)); RETURN NULL; END $$;
DROP TRIGGER slow ON sink;
CREATE TRIGGER slow AFTER INSERT ON sink REFERENCING NEW TABLE AS chunk FOR EACH STATEMENT EXECUTE FUNCTION slow();`)
	require.NoError(t, err, "the sink's pace")
	fullPace := func(occurrence string) {
		_, err := e.sql(ctx, f.dsn, `UPDATE pace SET seconds = 0.05 WHERE occurrence = $1`, occurrence)
		require.NoError(t, err, "run %s at full pace", occurrence)
	}
	const size = 3000
	// A: in flight when the steps start (3 shards of 100 chunks: 400 s at
	// its pace, longer than the steps before migrate take).
	runA := f.createRun(name+"-a", runSpec{workers: 3, chunk: 10, batch: queryBatchIn("2026-01", 1, size)})
	f.waitRowsOfShard(runA, 0, 10)
	for _, p := range f.runPods(f.get(runA.Name)) {
		require.True(t, strings.HasSuffix(p.Spec.Containers[0].Image, prevDigest), "the previous release's workers: %s", p.Spec.Containers[0].Image)
	}
	const schemaVersion = `SELECT max(version_id) FROM runledger.goose_db_version WHERE is_applied`
	require.EqualValues(t, previousReleaseSchema, f.int(schemaVersion), "the previous release's workers migrated the ledger to its schema")

	// The README's steps, word for word, against this test's database.
	// After the settings, each command is logged as written (unexpanded:
	// the DSN holds a password) with the seconds since the steps began.
	settings := fmt.Sprintf("IMG=%q\nDSN=%q\nexport INSECURE=1 # the cluster's registry speaks plain HTTP\n"+
		"export PLATFORMS=linux/amd64 # the cluster's nodes\n"+
		"SECONDS=0; trap 'echo \"+ [${SECONDS}s] ${BASH_COMMAND}\" >&2' DEBUG\n", reg+"/runledger:dev", f.dsn)
	started := time.Now()
	stepsDone, stepsOut := startShell(ctx, t, root, settings+steps, env...)
	// waitSteps polls until cond holds, failing if the steps end first.
	waitSteps := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Minute)
		for !cond() {
			select {
			case err := <-stepsDone:
				require.Failf(t, "the steps ended first", "waiting for %s: %v:\n%s", what, err, stepsOut())
			default:
			}
			require.True(t, time.Now().Before(deadline), "timed out waiting for %s:\n%s", what, stepsOut())
			time.Sleep(200 * time.Millisecond)
		}
	}

	// migrate waits while A's v0.1.0 shards hold their transactions (00016
	// builds indexes CONCURRENTLY); A commits on meanwhile.
	const migrating = `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'runledger migrate' AND wait_event_type = 'Lock'`
	waitSteps("migrate to wait for run A's shards", func() bool { return f.int(migrating) > 0 })
	a := f.committedRows(string(runA.UID))
	require.Less(t, a, int64(size), "run A in flight while migrate runs")
	waitSteps("run A to commit on while migrate waits", func() bool { return f.committedRows(string(runA.UID)) >= a+30 })
	// B: created by the previous release's manager while migrate runs (as
	// it is until the new manager is applied); its v0.1.0 workers start on
	// a ledger half migrated, and wait for the migration lock in one
	// statement (the deadlock Migrate tries again after).
	runB := f.createRun(name+"-b", runSpec{workers: 3, chunk: 10, batch: queryBatchIn("2026-02", 1, size)})
	waitSteps("run B's pods", func() bool { return len(f.runPods(f.get(runB.Name))) == 3 })
	// Said every 10 s of waiting: A keeps its slow pace (its shards' open
	// transactions, so the wait) until migrate has said it once.
	waitSteps("migrate to say what it waits for", func() bool { return strings.Contains(stepsOut(), "runledger migrate: waiting for ") })
	// A and B end (their shards' transactions with them), migrate applies.
	fullPace("2026-01")
	fullPace("2026-02")
	waitSteps("migrate to apply", func() bool { return strings.Contains(stepsOut(), "migrations applied: ") })

	// C: started right after migrate, by the previous manager (the steps
	// still build and apply the new one): the run the new manager takes
	// over in flight. Its effect's role set as the upgrade notes say
	// (--effect-role), should a pod of the new release ever run it.
	sandboxEffects(t, f.dsn)
	_, err = e.sql(ctx, f.dsn, `INSERT INTO pace VALUES ('2026-03', 4)`)
	require.NoError(t, err, "run C's pace")
	runC := f.createRun(name+"-c", runSpec{workers: 3, chunk: 10, batch: queryBatchIn("2026-03", 1, size)})

	var stepsErr error
	select {
	case stepsErr = <-stepsDone:
	case <-ctx.Done():
		stepsErr = ctx.Err()
	}
	out = stepsOut()
	t.Logf("the README's steps (%.0fs):\n%s", time.Since(started).Seconds(), out)
	require.NoError(t, stepsErr, "the README's steps")
	require.Contains(t, out, `runledger migrate: waiting for `, "migrate said what it waited for")
	require.NotContains(t, out, f.dsn, "the steps' output holds no DSN")
	require.Contains(t, out, fmt.Sprintf("migrations applied: %d", countMigrationsAfter(t, previousReleaseSchema)))
	require.EqualValues(t, latestMigration(t), f.int(schemaVersion), "the README's migrate brought the ledger to this release's schema")
	mid := f.get(runC.Name)
	require.False(t, isTrue(mid, v1alpha1.ConditionComplete) || isTrue(mid, v1alpha1.ConditionFailed),
		"run C was still going when the new manager took over (else make it slower): %s", statusLine(mid))
	for _, p := range f.runPods(mid) {
		require.True(t, strings.HasSuffix(p.Spec.Containers[0].Image, prevDigest), "run C's pods are the previous manager's (v0.1.0 workers): %s", p.Spec.Containers[0].Image)
	}
	pods, err = e.managerPods(ctx)
	require.NoError(t, err)
	for name, p := range pods {
		if p.DeletionTimestamp == nil {
			require.False(t, strings.HasSuffix(p.Spec.Containers[0].Image, prevDigest), "manager pod %s runs the new release", name)
		}
	}
	fullPace("2026-03")

	for _, r := range []*v1alpha1.ProcessingRun{runA, runB, runC} {
		done := f.waitComplete(r.Name, 2*runTimeout)
		require.Equal(t, counts{Total: size, Completed: size}, countsOf(done), r.Name)
		f.requireShardsAddUp(done)
		require.EqualValues(t, size, f.committedRows(string(done.UID)), r.Name)
	}
	f.requireExactlyOnce(3 * size)
}

// startShell starts a bash script in dir: done gets its end, out what it
// printed so far (stdout and stderr).
func startShell(ctx context.Context, t *testing.T, dir, script string, env ...string) (done <-chan error, out func() string) {
	t.Helper()
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = w, w
	require.NoError(t, cmd.Start(), "starting the steps")
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return ch, func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
}

// writerFunc is an io.Writer of a func.
type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// countMigrationsAfter is how many of this checkout's migrations come after
// version.
func countMigrationsAfter(t *testing.T, version int64) int {
	t.Helper()
	n := 0
	for _, v := range migrationVersions(t) {
		if v > version {
			n++
		}
	}
	return n
}

// previousReleaseSchema is the last migration of the previous release.
const previousReleaseSchema = 6

// latestMigration is the last migration of this checkout.
func latestMigration(t *testing.T) int64 {
	t.Helper()
	vs := migrationVersions(t)
	require.NotEmpty(t, vs)
	return slices.Max(vs)
}

// migrationVersions are the versions of this checkout's migrations.
func migrationVersions(t *testing.T) []int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "migrations", "*.sql"))
	require.NoError(t, err)
	var vs []int64
	for _, f := range files {
		var v int64
		_, err := fmt.Sscanf(filepath.Base(f), "%05d_", &v)
		require.NoError(t, err, f)
		vs = append(vs, v)
	}
	return vs
}

// readmeUpgrade is the README install section's upgrade block (the sh
// block after "**Upgrade**").
func readmeUpgrade(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(raw), readmeBegin)
	require.True(t, ok)
	section, _, ok := strings.Cut(rest, readmeEnd)
	require.True(t, ok)
	_, after, ok := strings.Cut(section, "**Upgrade**")
	require.True(t, ok, "the README's install section has an **Upgrade** step")
	m := shBlock.FindStringSubmatch(after)
	require.NotNil(t, m, "the upgrade step has its commands in an sh block")
	require.Contains(t, m[1], "runledger migrate", "the upgrade migrates the ledger")
	return m[1]
}

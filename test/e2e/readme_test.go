//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	readmeBegin = "<!-- readme-install:begin -->"
	readmeEnd   = "<!-- readme-install:end -->"
)

// shBlock matches a fenced ```sh block of Markdown.
var shBlock = regexp.MustCompile("(?s)```sh\n(.*?)```")

// readmeInstall is the README's install section as one script: its sh
// blocks in order, the first (the settings) replaced by settings.
func readmeInstall(t *testing.T, readme, settings string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, readmeBegin)
	require.True(t, ok, "README.md has %s", readmeBegin)
	section, _, ok := strings.Cut(rest, readmeEnd)
	require.True(t, ok, "README.md has %s", readmeEnd)
	blocks := shBlock.FindAllStringSubmatch(section, -1)
	require.Greater(t, len(blocks), 2, "the install section has its commands in sh blocks")

	// The settings block holds only the settings the test replaces.
	for _, line := range strings.Split(strings.TrimSpace(blocks[0][1]), "\n") {
		require.Regexp(t, `^(IMG|DSN)=`, line, "the README's first block holds only IMG= and DSN=")
	}
	var script strings.Builder
	script.WriteString("set -euo pipefail\n") // no -x: the DSN holds a password
	script.WriteString(settings)
	for _, b := range blocks[1:] {
		script.WriteString(b[1])
	}
	return script.String()
}

// TestReadmeInstall follows the README's "Install into your cluster" word
// for word on the local cluster: push the image to the cluster's registry,
// render and apply dist/install.yaml, the namespace, Secret, worker
// ServiceAccount and RoleBinding, a first run that must Succeed, an upgrade
// and an uninstall. Only IMG (the cluster's registry) and DSN (a database
// of the cluster's PostgreSQL) differ. Afterwards the operator is installed
// again for the tests that follow (it runs alone: no t.Parallel).
func TestReadmeInstall(t *testing.T) {
	e := setup(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	registry, err := exec.CommandContext(ctx, e.clusterSh, "registry").Output()
	require.NoError(t, err, "hack/cluster.sh registry")
	db := "e2e_readme_" + randSuffix()
	dsn := e.createDatabase(t, db)
	t.Cleanup(func() { _ = e.dropDatabase(db) })

	// The image the harness installed (hack/demo.sh install), so that the
	// operator installed again afterwards is the one under test.
	img := strings.TrimSpace(string(registry)) + "/runledger:dev"
	settings := fmt.Sprintf("IMG=%q\nDSN=%q\nexport INSECURE=1 # the cluster's registry speaks plain HTTP\n", img, dsn)
	script := readmeInstall(t, string(readme), settings)

	t.Cleanup(func() {
		// The operator again, as the harness installed it, for the next tests.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := e.kubectlRun(ctx, "delete", "namespace", "billing", "--ignore-not-found", "--wait=true")
		require.NoError(t, err, out)
		out, err = e.kubectlRun(ctx, "apply", "-f", filepath.Join(root, "dist", "install.yaml"))
		require.NoError(t, err, out)
		out, err = e.kubectlRun(ctx, "-n", systemNamespace, "rollout", "status", "deployment/"+managerName, "--timeout=180s")
		require.NoError(t, err, out)
	})

	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	t.Logf("the README's install section:\n%s", out)
	require.NoError(t, err, "a README command failed (output above)")

	// What the README promised happened: the first run Succeeded (the wait
	// said so) and committed its items; the uninstall removed the CRD.
	require.Contains(t, string(out), "processingrun.processing.runledger.dev/first-run condition met")
	n, err := e.sql(ctx, dsn, "SELECT count(*) FROM runledger.ledger WHERE run_name = 'first-run' AND state = 'committed'")
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "both items of the first run are in the ledger")
	got, err := e.kubectlRun(ctx, "get", "crd", "processingruns.processing.runledger.dev", "--ignore-not-found")
	require.NoError(t, err, got)
	require.Empty(t, strings.TrimSpace(got), "the uninstall removed the CRD")
}

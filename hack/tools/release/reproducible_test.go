package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReleaseReproducible (make release-check): make release from two
// fresh clones of HEAD gives the same SHA256SUMS, byte for byte, and every
// artifact it lists; the image goes to a throwaway registry on loopback.
func TestReleaseReproducible(t *testing.T) {
	root := os.Getenv("RUNLEDGER_RELEASE_CHECK")
	if root == "" {
		t.Skip("make release-check runs it (RUNLEDGER_RELEASE_CHECK=the checkout)")
	}
	const version = "v0.0.0-check"
	tmp := t.TempDir()

	// The registry of the local cluster (hack/tools/registry), on a free loopback port.
	registry := filepath.Join(tmp, "registry")
	sh(t, filepath.Join(root, "hack", "tools", "registry"), nil, "go", "build", "-o", registry, ".")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	reg := exec.Command(registry, "-addr", addr, "-dir", filepath.Join(tmp, "blobs"))
	reg.Stdout, reg.Stderr = os.Stderr, os.Stderr
	require.NoError(t, reg.Start())
	t.Cleanup(func() { _ = reg.Process.Kill(); _ = reg.Wait() })
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the registry listens")

	// One commit for both clones: the checkout may move while they build.
	commit := strings.TrimSpace(sh(t, root, nil, "git", "rev-parse", "HEAD"))
	var sums []string
	var refs []string
	for i := range 2 {
		clone := filepath.Join(tmp, "clone"+string(rune('a'+i)))
		sh(t, root, nil, "git", "clone", "--quiet", "--no-local", root, clone)
		sh(t, clone, nil, "git", "checkout", "--quiet", "-B", "release-check", commit)
		sh(t, clone, nil, "git", "tag", version)
		// The Kubernetes binaries (kubectl) take long to build: the checkout's.
		require.NoError(t, os.MkdirAll(filepath.Join(clone, "bin"), 0o755))
		if _, err := os.Stat(filepath.Join(root, "bin", "k8s")); err == nil {
			require.NoError(t, os.Symlink(filepath.Join(root, "bin", "k8s"), filepath.Join(clone, "bin", "k8s")))
		}
		// The second clone builds with an empty build cache of its own, so it
		// compiles everything again instead of reusing the first one's objects
		// (unless RUNLEDGER_RELEASE_CHECK_CACHE=shared: CI's, for time).
		cmd := []string{"make", "-s", "release", "VERSION=" + version, "IMG=" + addr + "/runledger", "INSECURE=1"}
		unset := []string{"VERSION", "COMMIT", "GOFLAGS"}
		if i == 1 && os.Getenv("RUNLEDGER_RELEASE_CHECK_CACHE") != "shared" {
			cmd = append([]string{"GOCACHE=" + filepath.Join(tmp, "gocache-b")}, cmd...)
			unset = append(unset, "GOCACHE")
		}
		out := sh(t, clone, unset, "env", cmd...)
		t.Logf("make release in clone %d:\n%s", i+1, out)
		raw, err := os.ReadFile(filepath.Join(clone, "dist", "SHA256SUMS"))
		require.NoError(t, err)
		sums = append(sums, string(raw))
		ref, err := os.ReadFile(filepath.Join(clone, "bin", "release", "image"))
		require.NoError(t, err)
		refs = append(refs, strings.TrimSpace(string(ref)))

		// Every artifact is listed, and the list checks.
		names := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			_, name, ok := strings.Cut(line, "  ")
			require.True(t, ok, line)
			names[name] = true
		}
		for _, want := range []string{"install.yaml", "install-namespaced.yaml", "crds.yaml", "runledger-0.0.0-check.tgz", "runledger.cdx.json",
			"runledger.yaml", "kubectl-runledger_linux_amd64.tar.gz", "kubectl-runledger_linux_arm64.tar.gz",
			"kubectl-runledger_darwin_amd64.tar.gz", "kubectl-runledger_darwin_arm64.tar.gz"} {
			require.True(t, names[want], "SHA256SUMS lists %s", want)
		}
		sh(t, filepath.Join(clone, "dist"), nil, "sha256sum", "-c", "--quiet", "SHA256SUMS")
		krew, err := os.ReadFile(filepath.Join(clone, "dist", "runledger.yaml"))
		require.NoError(t, err)
		require.Contains(t, string(krew), "uri: https://github.com/runledger/runledger/releases/download/"+version+"/kubectl-runledger_linux_amd64.tar.gz")
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			if sum, name, _ := strings.Cut(line, "  "); strings.HasPrefix(name, "kubectl-runledger_") {
				require.Contains(t, string(krew), "sha256: "+sum, "runledger.yaml holds the sum of %s", name)
			}
		}
		install, err := os.ReadFile(filepath.Join(clone, "dist", "install.yaml"))
		require.NoError(t, err)
		require.Contains(t, string(install), "image: "+refs[i], "install.yaml pins the pushed image by digest")
		sbom, err := os.ReadFile(filepath.Join(clone, "dist", "runledger.cdx.json"))
		require.NoError(t, err)
		for _, mod := range []string{"pkg:golang/github.com/runledger/runledger@" + version, "pkg:golang/github.com/jackc/pgx/v5@", "pkg:golang/sigs.k8s.io/controller-runtime@"} {
			require.Contains(t, string(sbom), mod, "the SBOM lists the modules inside the binary")
		}
		// The binaries say their version.
		bin := filepath.Join(clone, "bin", "platforms", "linux_amd64", "runledger")
		if out, err := exec.CommandContext(t.Context(), bin, "version").CombinedOutput(); err == nil {
			require.Contains(t, string(out), version, "runledger version")
		}
		if out, err := exec.CommandContext(t.Context(), bin+"-worker", "--version").CombinedOutput(); err == nil {
			require.Contains(t, string(out), version, "runledger-worker --version")
		}
		plugin := filepath.Join(clone, "bin", "release", "plugin", "linux_amd64", "kubectl-runledger")
		if out, err := exec.CommandContext(t.Context(), plugin, "version").CombinedOutput(); err == nil {
			require.Contains(t, string(out), version, "kubectl-runledger version")
		}
	}
	require.Equal(t, refs[0], refs[1], "the same image digest")
	require.Equal(t, sums[0], sums[1], "the same SHA256SUMS, byte for byte")

	// A dirty tree, an untagged commit or a bad version is refused.
	clone := filepath.Join(tmp, "clonea")
	require.NoError(t, os.WriteFile(filepath.Join(clone, "README.md"), []byte("dirty\n"), 0o644))
	out, err := shErr(t, clone, "make", "-s", "release", "VERSION="+version, "IMG="+addr+"/runledger", "INSECURE=1")
	require.Error(t, err)
	require.Contains(t, out, "the tree is not clean")
	sh(t, clone, nil, "git", "checkout", "--quiet", "README.md")
	out, err = shErr(t, clone, "make", "-s", "release", "VERSION=v0.0.1", "IMG="+addr+"/runledger", "INSECURE=1")
	require.Error(t, err)
	require.Contains(t, out, "HEAD is not tagged v0.0.1")
	out, err = shErr(t, clone, "make", "-s", "release", "VERSION=0.0.1", "IMG="+addr+"/runledger")
	require.Error(t, err)
	require.Contains(t, out, "set VERSION=vMAJOR.MINOR.PATCH")
	out, err = shErr(t, clone, "make", "-s", "release", "VERSION="+version, "IMG="+addr+"/runledger:latest")
	require.Error(t, err)
	require.Contains(t, out, "without a tag")
}

// run runs a command in dir (without the environment variables unset) and returns its output.
func sh(t *testing.T, dir string, unset []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		keep := k != "GOWORK" && k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL"
		for _, u := range unset {
			keep = keep && k != u
		}
		if keep {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v in %s:\n%s", name, args, dir, out)
	return string(out)
}

func shErr(t *testing.T, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/testtier"
)

// execAs runs the command tree of the binary invoked as name with args,
// and returns its stdout.
func execAs(t *testing.T, name string, args ...string) string {
	t.Helper()
	root, args := rootFor(name, args)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	require.NoError(t, root.Execute(), "%s %v", name, args)
	return out.String()
}

// TestPluginNames: invoked as kubectl-runledger, the help's usage lines and
// examples say kubectl runledger; invoked as runledger, nothing changes;
// invoked as kubectl_complete-runledger, it answers cobra's __complete.
func TestPluginNames(t *testing.T) {
	t.Parallel()
	help := execAs(t, "kubectl-runledger", "items", "--help")
	require.Contains(t, help, "\n  kubectl runledger items RUN [--namespace NS]")
	require.Contains(t, help, "\n  kubectl runledger items june-invoices -n billing --failed --dsn-file ledger.dsn\n")
	require.Contains(t, help, "-o yaml | kubectl runledger items may-refunds -n billing -f - --already-handled")
	require.Contains(t, help, "rules as kubectl runledger run ($RUNLEDGER_DATABASE_URL", "a command line in the description")
	require.Contains(t, help, "may read schema runledger will do", "not a command line")
	require.NotContains(t, help, "kubectl kubectl")
	require.NotRegexp(t, `(^|[ |;])runledger (items|run) `, strings.ReplaceAll(help, "kubectl runledger", "kubectl-runledger"), "every command line")

	top := execAs(t, "kubectl-runledger", "--help")
	require.Contains(t, top, "Usage:\n  kubectl runledger [command]")
	require.Contains(t, top, `Use "kubectl runledger [command] --help"`)
	verify := execAs(t, "/usr/local/bin/kubectl-runledger", "verify", "--help")
	require.Contains(t, verify, "--output json > june.json; kubectl runledger verify june-invoices")

	plain := execAs(t, "runledger", "items", "--help")
	require.Contains(t, plain, "\n  runledger items june-invoices -n billing --failed --dsn-file ledger.dsn\n")
	require.NotContains(t, plain, "kubectl runledger")

	// kubectl runledger ite<TAB>: kubectl runs kubectl_complete-runledger ite.
	comps := execAs(t, "kubectl_complete-runledger", "ite")
	require.Regexp(t, `(?m)^items\t`, comps)
	require.Regexp(t, `(?m)^:4$`, comps, "ShellCompDirectiveNoFileComp")
	flags := execAs(t, "kubectl_complete-runledger", "items", "x", "--outp")
	require.Regexp(t, `(?m)^--output\t`, flags)

	// The completion script cobra writes completes the executable kubectl-runledger.
	script := execAs(t, "kubectl-runledger", "completion", "bash")
	require.Contains(t, script, "complete -o default -F __start_kubectl-runledger kubectl-runledger")
}

// TestKubectlRunsThePlugin: the binary named kubectl-runledger on PATH is
// what kubectl runs for kubectl runledger, and kubectl plugin list lists
// it; kubectl's completion of kubectl runledger asks
// kubectl_complete-runledger (a link to the same binary).
func TestKubectlRunsThePlugin(t *testing.T) {
	testtier.Needs(t, "kubectl (hack/k8s-bins.sh) and the go toolchain")
	t.Parallel()
	kubectl, err := envtestutil.Kubectl()
	require.NoError(t, err)
	dir := t.TempDir()
	bin := filepath.Join(dir, "kubectl-runledger")
	const stamped = "v9.9.9-plugin"
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin,
		"-ldflags", "-X github.com/runledger/runledger/internal/version.version="+stamped, ".")
	build.Dir = envtestutil.RepoRoot()
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))
	require.NoError(t, os.Symlink("kubectl-runledger", filepath.Join(dir, "kubectl_complete-runledger")))

	// kubectl's PATH holds only the plugin, so that plugin list is this one;
	// a HOME of its own, so that no kubeconfig of the machine is read.
	kube := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), kubectl, args...)
		cmd.Env = []string{"PATH=" + dir, "HOME=" + dir, "KUBECONFIG=" + filepath.Join(dir, "kubeconfig")}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "kubectl %v: %s", args, stderr.String())
		return stdout.String()
	}
	help := kube("runledger", "--help")
	require.Contains(t, help, "Usage:\n  kubectl runledger [command]")
	require.Contains(t, help, "items       List a run's items")
	require.Contains(t, kube("runledger", "items", "--help"), "\n  kubectl runledger items june-invoices -n billing")
	require.Contains(t, kube("runledger", "version"), stamped)

	list := kube("plugin", "list", "--name-only")
	require.Regexp(t, `(?m)^kubectl-runledger$`, list)
	require.NotContains(t, list, "kubectl_complete-runledger", "not a plugin: its completion helper")

	// What the shell's completion script asks kubectl for kubectl runledger it<TAB>.
	comps := kube("__complete", "runledger", "it")
	require.Regexp(t, `(?m)^items\t`, comps)
	require.Regexp(t, `(?m)^:4$`, comps)
	comps = kube("__complete", "runledger", "schedule", "")
	require.Regexp(t, `(?m)^trigger\t`, comps)
}

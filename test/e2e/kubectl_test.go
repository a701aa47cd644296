//go:build e2e

package e2e

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestWhatAUserSees: kubectl wait, the printer columns and kubectl describe
// show what a user needs, for a run that succeeds and for one that fails.
func TestWhatAUserSees(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "kubectl", 0)
	f.createRun("ok", runSpec{workers: 2, batch: inlineItems(1, 10)})

	out, err := f.kubectl("wait", "processingrun/ok", "--for=condition=Complete", "--timeout=300s")
	require.NoError(t, err, "kubectl wait --for=condition=Complete: %s", out)
	require.Contains(t, out, "processingrun.processing.runledger.dev/ok condition met")

	out, err = f.kubectl("get", "processingruns")
	require.NoError(t, err, out)
	t.Logf("$ kubectl get processingruns\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	require.Equal(t, []string{"NAME", "PHASE", "COMPLETED", "ALREADY-HANDLED", "FAILED", "TOTAL", "ACTIVE", "REASON", "ADMISSION", "DURATION", "AGE"}, strings.Fields(lines[0]), "printer columns")
	ok := tableRow(lines[0], lines[1])
	require.Equal(t, []string{"ok", "Succeeded", "10", "0", "0", "10", ""},
		[]string{ok["NAME"], ok["PHASE"], ok["COMPLETED"], ok["ALREADY-HANDLED"], ok["FAILED"], ok["TOTAL"], ok["REASON"]}, "a run that succeeded has no reason")
	require.NotEmpty(t, ok["DURATION"], "a finished run shows how long it took")
	require.Empty(t, ok["ADMISSION"], "a run in no Kueue queue shows no admission")
	require.Equal(t, "0", ok["ACTIVE"], "a finished run has no live pod")

	out, err = f.kubectl("get", "prun", "-o", "wide")
	require.NoError(t, err, out)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	require.Equal(t, []string{"NAME", "PHASE", "COMPLETED", "ALREADY-HANDLED", "FAILED", "TOTAL", "ACTIVE", "REASON", "ADMISSION", "CLUSTERQUEUE", "DURATION", "WORKERS", "MAX-CONNECTIONS", "WAITING", "AGE"}, strings.Fields(lines[0]), "-o wide adds CLUSTERQUEUE, WORKERS and the connection budget's MAX-CONNECTIONS and WAITING")
	require.Equal(t, "2", tableRow(lines[0], lines[1])["WORKERS"])

	out, err = f.kubectl("get", "runledger")
	require.NoError(t, err, "the runledger category: %s", out)
	require.Contains(t, out, "ok")

	out, err = f.kubectl("describe", "processingrun", "ok")
	require.NoError(t, err, out)
	t.Logf("$ kubectl describe processingrun ok\n%s", out)
	for _, want := range []string{
		`(?m)^  Phase:\s+Succeeded$`,
		`(?m)^  Completed:\s+10$`,
		`(?m)^  Already Handled:\s+0$`,
		`(?m)^  Total:\s+10$`,
		`(?m)^    Type:\s+Complete$`,
		`(?m)^    Message:\s+10 items: 10 completed, 0 already handled, 0 failed$`,
		`(?m)^    Pod:\s+ok-0-0$`,
		`(?m)^    Pod:\s+ok-1-0$`,
		`(?m)^  Normal\s+PodCreated\s+.*Created pod ok-0-0 for shard 0$`,
		`(?m)^  Normal\s+Succeeded\s+.*10 items: 10 completed`,
	} {
		require.Regexp(t, regexp.MustCompile(want), out, "kubectl describe shows %s", want)
	}

	// A run that fails: its effect names a table that does not exist.
	bad := f.newRun("bad", runSpec{workers: 1, batch: inlineItems(1, 5)})
	bad.Spec.Effect = &v1alpha1.EffectSpec{SQL: "INSERT INTO no_such_table SELECT entity FROM claimed"}
	require.NoError(t, f.c.Create(f.ctx, bad))
	out, err = f.kubectl("wait", "processingrun/bad", "--for=condition=Failed", "--timeout=300s")
	require.NoError(t, err, "kubectl wait --for=condition=Failed: %s", out)
	out, err = f.kubectl("wait", "processingrun/bad", "--for=condition=Complete", "--timeout=3s")
	require.Error(t, err, "waiting for Complete on a Failed run times out: %s", out)

	out, err = f.kubectl("get", "prun", "bad")
	require.NoError(t, err, out)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	badRow := tableRow(lines[0], lines[1])
	require.Equal(t, []string{"bad", "Failed", "0", "0", "0", "5", "BadInput"},
		[]string{badRow["NAME"], badRow["PHASE"], badRow["COMPLETED"], badRow["ALREADY-HANDLED"], badRow["FAILED"], badRow["TOTAL"], badRow["REASON"]}, "a failed run says why")
	out, err = f.kubectl("describe", "prun", "bad")
	require.NoError(t, err, out)
	t.Logf("$ kubectl describe processingrun bad (status and events)\n%s", out[strings.Index(out, "Status:"):])
	for _, want := range []string{
		`(?m)^  Phase:\s+Failed$`,
		`(?m)^    Type:\s+Failed$`,
		`(?m)^    Reason:\s+BadInput$`,
		`no_such_table`,
		`(?m)^  Warning\s+BadInput\s+`,
	} {
		require.Regexp(t, regexp.MustCompile(want), out, "kubectl describe shows %s", want)
	}
}

// tableRow reads a line of kubectl's table by the header's column positions,
// so that an empty cell (REASON of a run that succeeded) stays in its column.
func tableRow(header, line string) map[string]string {
	names := strings.Fields(header)
	starts := make([]int, len(names)+1)
	pos := 0
	for i, name := range names {
		starts[i] = pos + strings.Index(header[pos:], name)
		pos = starts[i] + len(name)
	}
	starts[len(names)] = len(line)
	out := make(map[string]string, len(names))
	for i, name := range names {
		lo, hi := min(starts[i], len(line)), min(starts[i+1], len(line))
		out[name] = strings.TrimSpace(line[lo:hi])
	}
	return out
}

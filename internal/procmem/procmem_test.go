package procmem_test

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/procmem"
)

// TestRusageReportsTheParent: a child started by a process holding 256 MiB
// reports, through getrusage, the parent's peak as its own; Run reports the
// child's.
func TestRusageReportsTheParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/PID/status is Linux's")
	}
	held := make([]byte, 256<<20)
	for i := range held {
		held[i] = 1
	}
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)

	cmd := exec.Command(sleep, "0.1")
	require.NoError(t, cmd.Run())
	rusage := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10 // KiB
	require.GreaterOrEqual(t, rusage, int64(256<<20), "getrusage reports the parent's peak as the child's (%d MiB)", rusage>>20)

	peak, err := procmem.Run(exec.Command(sleep, "0.1"))
	require.NoError(t, err)
	require.Positive(t, peak)
	require.Less(t, peak, int64(32<<20), "the child's own peak (%d MiB)", peak>>20)
	runtime.KeepAlive(held)
}

// TestRunReturnsTheCommandsError: a command that fails is Wait's error.
func TestRunReturnsTheCommandsError(t *testing.T) {
	_, err := procmem.Run(exec.Command("sh", "-c", "exit 3"))
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 3, exit.ExitCode())
	_, err = procmem.Run(exec.Command("/nonexistent/command"))
	require.ErrorContains(t, err, "starting /nonexistent/command")
}

// Package procmem reads how much memory a child process used, from
// /proc/PID/status while it runs. The kernel's own answer after the fact,
// getrusage's ru_maxrss of the child, is not the child's: a Go parent starts
// it sharing the parent's memory until exec (CLONE_VM), and exec records
// the peak of that shared memory as the child's, so a child of a large test
// process reports the test process's peak (TestRusageReportsTheParent).
package procmem

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Interval is how often Follow reads the process's status. VmHWM is the
// kernel's high-water mark, so a peak between two reads is not missed; only
// one within the last Interval before the process exits may be.
const Interval = 20 * time.Millisecond

// Follow follows process pid's peak resident set (VmHWM) and the largest
// private part of it seen (RssAnon: the rest is file pages, such as the
// binary's, shared with every process that maps them), in bytes, until
// exited is closed.
func Follow(pid int, exited <-chan struct{}) (peak, anon int64) {
	for {
		p, a := status(pid)
		peak, anon = max(peak, p), max(anon, a)
		select {
		case <-exited:
			return peak, anon
		case <-time.After(Interval):
		}
	}
}

// Run starts cmd, waits for it and returns its peak resident set in bytes
// (Follow's) with Wait's error.
func Run(cmd *exec.Cmd) (peak int64, err error) {
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	peak, _ = Follow(cmd.Process.Pid, exited)
	return peak, waitErr
}

// status reads VmHWM and RssAnon of pid, in bytes; 0 when unreadable (the
// process is gone, or has no memory of its own yet or any more).
func status(pid int) (hwm, anon int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, v, _ := strings.Cut(line, ":")
		kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		switch {
		case err != nil:
		case name == "VmHWM":
			hwm = kib << 10
		case name == "RssAnon":
			anon = kib << 10
		}
	}
	return hwm, anon
}

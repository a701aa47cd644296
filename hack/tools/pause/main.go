// Command pause is the pod sandbox process of the local cluster
// (hack/cluster.sh): it holds the pod's namespaces, waits for SIGTERM or
// SIGINT and exits 0, and, as PID 1 of a pod that shares its PID namespace,
// reaps orphaned children so they never pile up as zombies. It is what
// registry.k8s.io/pause does, built from source so no registry is needed.
//
// Built with CGO_ENABLED=0 it is a static binary and the only file of its
// image (see hack/tools/image).
//
// With -exit it prints a line and exits 0 at once: a smallest "job" image for
// smoke tests.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-exit" || os.Args[1] == "--exit") {
		fmt.Println("pause: -exit given, exiting 0")
		return
	}
	if len(os.Args) > 1 {
		fmt.Fprintf(os.Stderr, "usage: %s [-exit]\n", os.Args[0])
		os.Exit(2)
	}

	// Registered before anything can arrive, so no signal is lost.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)

	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not PID 1, orphans are not reparented to me")
	}

	for sig := range sigs {
		switch sig {
		case syscall.SIGCHLD:
			reap()
		default:
			fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
			os.Exit(0)
		}
	}
}

// reap collects every child that has exited. SIGCHLD is not queued, so one
// signal may stand for several exits: loop until none is left.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// Command pause is the sandbox ("pause") container of the test cluster's
// pods, in the image test/registry pushes as registry.k8s.io/pause: it holds
// the pod's namespaces by doing nothing until SIGINT or SIGTERM, then exits
// 0. As PID 1 of a pod that shares its process namespace it is the parent of
// every orphan there, so it reaps exited children on SIGCHLD.
//
// It must be static (CGO_ENABLED=0): the image holds this binary and nothing
// else.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: pause (no arguments; exits 0 on SIGINT or SIGTERM)")
		os.Exit(2)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	child := make(chan os.Signal, 1)
	signal.Notify(child, syscall.SIGCHLD)
	// Children that exited before the handler was in place.
	reap()
	for {
		select {
		case <-child:
			reap()
		case <-stop:
			os.Exit(0)
		}
	}
}

// reap waits for every child that has exited, without blocking. One SIGCHLD
// may stand for several exits.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}

package cluster

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// initMarker, in the environment, makes a program that links this package
// run as a node's init (PID 1 of the node's PID namespace) instead of itself.
const initMarker = "HYBRIDCCM_CLUSTER_NODE_INIT"

func init() {
	if os.Getenv(initMarker) == "1" && os.Getpid() == 1 {
		os.Exit(nodeInit())
	}
}

// nodeInit is a node's PID 1: it reaps every orphan (containerd's shims and
// the containers they leave behind when killed) and exits on SIGTERM or
// SIGINT. When it exits, the kernel kills every process of the node.
func nodeInit() int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return 0
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}

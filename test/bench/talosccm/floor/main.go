// Command floor is the memory baseline of the talos-ccm benchmark: a process that
// links k8s.io/cloud-provider/app, as every cloud-controller-manager built on it
// does, runs its package initialization and then only waits. Its peak RSS is the
// part of talos-ccm's RSS that comes with the framework before any work is done.
package main

import (
	"os"
	"os/signal"
	"syscall"

	_ "k8s.io/cloud-provider/app"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
}

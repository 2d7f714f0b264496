// Command floor is the memory baseline of the talos-ccm benchmark: a process
// that links what talos-ccm must link (k8s.io/cloud-provider/app, as every
// cloud-controller-manager built on it does, and the Talos machinery client),
// runs their package initialization and then only waits. Its anonymous memory
// and Go heap are the part of talos-ccm's that comes with those libraries
// before any work.
package main

import (
	"os"
	"os/signal"
	"syscall"

	_ "github.com/siderolabs/talos/pkg/machinery/client"
	_ "k8s.io/cloud-provider/app"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
}

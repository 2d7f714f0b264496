// Command floor is the memory baseline of the coordinator scale benchmark: a
// process that links what ccm-coordinator must link (controller-runtime,
// fluxcd/pkg/runtime and the Helm v3 SDK), runs their package initialization
// and then only waits. Its anonymous memory and Go heap are the part of the
// coordinator's that comes with those libraries before any work.
package main

import (
	"os"
	"os/signal"
	"syscall"

	_ "github.com/fluxcd/pkg/runtime/controller"
	_ "helm.sh/helm/v3/pkg/action"
	_ "sigs.k8s.io/controller-runtime"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
}

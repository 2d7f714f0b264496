// Command talos-ccm is the Talos cloud-controller-manager of Hybrid CCM.
package main

import (
	"os"
	"runtime/debug"

	"k8s.io/component-base/cli"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/app"
)

// defaultGCPercent trades a little CPU for a smaller heap (a controller's heap
// is mostly its informer cache). GOGC overrides it.
const defaultGCPercent = 50

func main() {
	// Before anything else: give back what package initialization faulted in.
	if _, err := app.ReleaseInitPages(); err != nil {
		// only memory is at stake: say so and go on
		os.Stderr.WriteString("talos-ccm: " + err.Error() + " (continuing)\n")
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	cmd, err := app.NewCommand(nil)
	if err != nil {
		os.Stderr.WriteString("talos-ccm: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(cli.Run(cmd))
}

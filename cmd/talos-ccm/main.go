// Command talos-ccm is the Talos cloud-controller-manager of Hybrid CCM.
package main

import (
	"os"

	"k8s.io/component-base/cli"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/app"
)

func main() {
	cmd, err := app.NewCommand(nil)
	if err != nil {
		os.Stderr.WriteString("talos-ccm: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(cli.Run(cmd))
}

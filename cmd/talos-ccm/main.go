// Command talos-ccm is the Talos cloud-controller-manager of Hybrid CCM.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/app"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/procmem"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version"
)

// defaultGCPercent trades a little CPU for a smaller heap (a controller's heap
// is mostly its informer cache). GOGC overrides it.
const defaultGCPercent = 50

func main() {
	procmem.DefaultGCPercent(defaultGCPercent)
	cmd, err := app.NewCommand(nil)
	if err != nil {
		os.Stderr.WriteString("talos-ccm: " + err.Error() + "\n")
		os.Exit(1)
	}
	// --version (k8s.io/component-base's flag, which would print the
	// Kubernetes libraries' version) prints the release's and exits before
	// any configuration is checked.
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if f := cmd.Flags().Lookup("version"); f != nil && f.Value.String() != "false" {
			fmt.Println(version.Line("talos-ccm"))
			return nil
		}
		return run(cmd, args)
	}
	os.Exit(cli.Run(cmd))
}

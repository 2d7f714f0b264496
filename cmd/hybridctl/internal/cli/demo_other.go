//go:build !linux || nodemo

package cli

import (
	"errors"
	"runtime"

	"github.com/spf13/cobra"
)

// newDemoCommand: the demo needs Linux (network and mount namespaces), and
// a checkout of the repository; the release images' hybridctl is built with
// the tag nodemo (hack/ship) and so links no control-plane starter: envtest
// creates a cache directory when the program starts, which a read-only image
// running as a user without a home does not allow.
func newDemoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Run Hybrid CCM locally (Linux, from a checkout: make demo)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if runtime.GOOS == "linux" {
				return errors.New("this hybridctl is built without the demo (the release images' is): run `make demo` in a checkout of the repository")
			}
			return errors.New("the demo runs on Linux only: it needs network and mount namespaces")
		},
	}
}

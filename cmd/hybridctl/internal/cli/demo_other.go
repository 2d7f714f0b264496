//go:build !linux

package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// newDemoCommand: the demo needs Linux (network and mount namespaces).
func newDemoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Run Hybrid CCM locally (Linux only: it needs network and mount namespaces)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("the demo runs on Linux only: it needs network and mount namespaces")
		},
	}
}

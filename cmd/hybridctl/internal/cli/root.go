// Package cli implements hybridctl's commands. It owns the command line only:
// flags, reading the user's files, and printing. What a command reports comes
// from the packages that own the domain (transform rules from ccm/transform,
// and so on); it must not re-implement them.
//
// Layout: root.go builds the root command; every subcommand lives in its own
// file(s) named after it (transform.go, transform_explain.go, ...) with a
// constructor new<Name>Command() *cobra.Command that NewRootCommand adds.
package cli

import (
	"github.com/spf13/cobra"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version"
)

// NewRootCommand returns the hybridctl command with all its subcommands.
// Errors are returned, not printed: main prints them and exits non-zero.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "hybridctl",
		Short: "Operate Hybrid CCM: one cluster, nodes in several clouds and on bare metal, all Talos",
		Long: "hybridctl helps operate Hybrid CCM: talos-ccm (the Talos CCM core) and the ccm-coordinator\n" +
			"that runs each cloud's own CCM in lifecycle-only mode, fenced to that cloud's nodes.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newTransformCommand(),
		newDemoCommand(),
		newDoctorCommand(),
		newCleanupCommand(),
		newVersionCommand(),
	)
	root.Version = version.Version
	root.SetVersionTemplate(version.Line("hybridctl") + "\n")
	return root
}

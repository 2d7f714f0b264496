package cli

import "github.com/spf13/cobra"

// newTransformCommand groups the commands about talos-ccm's transformation
// rules (docs/transformations.md).
func newTransformCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "transform",
		Aliases: []string{"transformations"},
		Short:   "Work with talos-ccm transformation rules",
	}
	cmd.AddCommand(newTransformExplainCommand())
	return cmd
}

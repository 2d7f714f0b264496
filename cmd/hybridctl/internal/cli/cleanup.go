package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/cleanup"
)

func newCleanupCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove what Hybrid CCM left behind, without Helm",
	}
	cmd.AddCommand(newCleanupNativeCCMCommand())
	return cmd
}

func newCleanupNativeCCMCommand() *cobra.Command {
	var (
		kubeconfig, kubeContext string
		opts                    = cleanup.Options{Namespace: "hybrid-ccm-system"}
	)
	cmd := &cobra.Command{
		Use:   "native-ccm NAME",
		Short: "Delete a native CCM's objects and Helm records when the coordinator cannot",
		Long: "cleanup native-ccm deletes every object the coordinator labelled as NativeCCM NAME's release\n" +
			"(hybridccm.io/managed-by=ccm-coordinator, hybridccm.io/native-ccm=native-ccm-NAME), in every\n" +
			"namespace and cluster-wide, then the release's Helm records in --namespace. It runs no Helm: a\n" +
			"record the coordinator wrote is never trusted input (Helm would run its hooks and delete what its\n" +
			"manifest lists with your rights). Use it when the coordinator is gone or a NativeCCM hangs in\n" +
			"Terminating; then remove the NativeCCM's finalizer.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient(kubeconfig, kubeContext)
			if err != nil {
				return err
			}
			deleted, err := cleanup.NativeCCM(cmd.Context(), c, args[0], opts)
			verb := "deleted"
			if opts.DryRun {
				verb = "would delete"
			}
			for _, d := range deleted {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", verb, d)
			}
			if err == nil && len(deleted) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing of native CCM %s found\n", args[0])
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&kubeContext, "context", "", "kubeconfig context")
	fs.StringVarP(&opts.Namespace, "namespace", "n", opts.Namespace, "the coordinator's namespace (where the release's Helm records are)")
	fs.BoolVar(&opts.DryRun, "dry-run", false, "list what would be deleted, delete nothing")
	return cmd
}

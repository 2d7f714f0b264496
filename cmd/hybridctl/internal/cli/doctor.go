package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/safetext"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/doctor"
)

// ErrFindings is returned (exit code non-zero) when doctor found problems.
var ErrFindings = errors.New("problems found")

func newDoctorCommand() *cobra.Command {
	var (
		kubeconfig, kubeContext, output string
		opts                            = doctor.Options{UninitializedAfter: 10 * time.Minute, CSRPendingAfter: 5 * time.Minute}
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Report what needs fixing in a cluster running Hybrid CCM",
		Long: "doctor reads the cluster and reports: nodes uninitialized for too long, initialized nodes without\n" +
			"the platform label or a providerID, CCMs not managed by Hybrid CCM that run cloud-node or share a\n" +
			"leader-election lease, NativeCCMs that are not Ready, undecided kubelet-serving CSRs, pod CIDR\n" +
			"overlaps, a fence the API server does not enforce, NativeCCMs without their fence grant, native CCM\n" +
			"identities and grants whose NativeCCM is gone, and node rights granted to identities no fence\n" +
			"confines. It exits non-zero when it found something.\n\n" +
			"--component talos-ccm or ccm-coordinator with --namespace checks only what that chart installed\n" +
			"(its controller in that namespace, and for talos-ccm the nodes and CSRs, for ccm-coordinator the\n" +
			"fence and the NativeCCMs), reading no more than the chart's helm test ServiceAccount may. In a pod\n" +
			"without a kubeconfig it uses the pod's ServiceAccount (in-cluster configuration).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (opts.Component == "") != (opts.Namespace == "") {
				return errors.New("--component and --namespace go together")
			}
			c, err := newClient(kubeconfig, kubeContext)
			if err != nil {
				return err
			}
			rep, err := doctor.Run(cmd.Context(), c, opts)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch output {
			case "json":
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			case "text":
				switch opts.Component {
				case doctor.ComponentTalosCCM:
					fmt.Fprintf(out, "Inspected talos-ccm in namespace %s, %d nodes, %d kubelet-serving CSRs.\n",
						opts.Namespace, rep.Inspected.Nodes, rep.Inspected.CSRs)
				case doctor.ComponentCoordinator:
					fmt.Fprintf(out, "Inspected ccm-coordinator in namespace %s, the fence, %d NativeCCMs.\n",
						opts.Namespace, rep.Inspected.NativeCCMs)
				default:
					fmt.Fprintf(out, "Inspected %d nodes, %d NativeCCMs, %d kubelet-serving CSRs, %d CCM workloads.\n",
						rep.Inspected.Nodes, rep.Inspected.NativeCCMs, rep.Inspected.CSRs, rep.Inspected.Workloads)
				}
				// findings quote what others wrote (events, conditions, names)
				p := safetext.Line
				for _, n := range rep.Notes {
					fmt.Fprintf(out, "note: %s\n", p(n))
				}
				if len(rep.Findings) == 0 {
					fmt.Fprintln(out, "No problems found.")
					return nil
				}
				fmt.Fprintf(out, "\n%d problem(s):\n\n", len(rep.Findings))
				tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CHECK\tOBJECT\tPROBLEM")
				for _, f := range rep.Findings {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", p(f.Check), p(f.Object), p(f.Message))
				}
				_ = tw.Flush()
				fmt.Fprintln(out, "\nHow to fix:")
				seen := map[string]bool{}
				for _, f := range rep.Findings {
					if k := f.Check + f.Fix; !seen[k] {
						seen[k] = true
						fmt.Fprintf(out, "  %s: %s\n", p(f.Check), p(f.Fix))
					}
				}
			default:
				return fmt.Errorf("--output %q: want text or json", output)
			}
			if len(rep.Findings) > 0 {
				return fmt.Errorf("%w: %d", ErrFindings, len(rep.Findings))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in a pod its ServiceAccount)")
	fs.StringVar(&kubeContext, "context", "", "kubeconfig context")
	fs.StringVarP(&output, "output", "o", "text", "output format: text or json")
	fs.DurationVar(&opts.UninitializedAfter, "uninitialized-after", opts.UninitializedAfter, "report nodes still uninitialized after this long")
	fs.StringVar(&opts.Component, "component", "", "check only what one chart installed: "+strings.Join(doctor.Components, " or ")+" (needs --namespace)")
	fs.StringVarP(&opts.Namespace, "namespace", "n", "", "with --component: the namespace of its controller")
	fs.DurationVar(&opts.CSRPendingAfter, "csr-pending-after", opts.CSRPendingAfter, "report kubelet-serving CSRs undecided after this long")
	return cmd
}

// newClient is a client for the cluster of a kubeconfig file (default:
// $KUBECONFIG, ~/.kube/config, else in a pod its ServiceAccount) and context.
func newClient(kubeconfig, kubeContext string) (client.Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return doctor.NewClient(cfg)
}

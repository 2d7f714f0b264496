package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version"
)

// components are the app.kubernetes.io/name labels of the product's
// Deployments (talos-ccm, the coordinator, each native CCM release).
var components = []string{"talos-ccm", "ccm-coordinator", "native-ccm"}

// Component is one Deployment of the product running in the cluster.
type Component struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Component is its app.kubernetes.io/name.
	Component string `json:"component"`
	// Images are those of the product's own containers (the upstream CCM of
	// a native CCM release keeps its own version and is left out).
	Images []string `json:"images"`
	// Versions are the tags of Images.
	Versions []string `json:"versions"`
	Ready    int32    `json:"ready"`
	Replicas int32    `json:"replicas"`
}

// VersionReport is `hybridctl version -o json`.
type VersionReport struct {
	Client     string      `json:"client"`
	Components []Component `json:"components,omitempty"`
	// Error is why the cluster could not be read (the client's version is
	// printed all the same).
	Error string `json:"error,omitempty"`
}

func newVersionCommand() *cobra.Command {
	var kubeconfig, kubeContext, output string
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print hybridctl's version and the versions of the components running in the cluster",
		Long: "version prints hybridctl's own version and, unless --client, every Deployment of Hybrid CCM in the\n" +
			"cluster (talos-ccm, ccm-coordinator, each native CCM release's ccm-gate) with the version of its\n" +
			"images and its ready replicas: after an upgrade, every component should show the new version.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			rep := VersionReport{Client: version.Version}
			var readErr error
			if !clientOnly {
				rules := clientcmd.NewDefaultClientConfigLoadingRules()
				rules.ExplicitPath = kubeconfig
				cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
					&clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
				if err == nil {
					var cs *kubernetes.Clientset
					if cs, err = kubernetes.NewForConfig(cfg); err == nil {
						rep.Components, err = runningComponents(cmd.Context(), cs)
					}
				}
				if err != nil {
					readErr = fmt.Errorf("the cluster's components: %w", err)
					rep.Error = readErr.Error()
				}
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
				return readErr
			}
			fmt.Fprintln(out, "Client: "+version.Line("hybridctl"))
			if clientOnly {
				return nil
			}
			if readErr != nil {
				return readErr
			}
			if len(rep.Components) == 0 {
				fmt.Fprintln(out, "No Hybrid CCM component runs in the cluster.")
				return nil
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAMESPACE\tDEPLOYMENT\tCOMPONENT\tVERSION\tREADY")
			for _, c := range rep.Components {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\n", c.Namespace, c.Name, c.Component, strings.Join(c.Versions, ","), c.Ready, c.Replicas)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "Path to the kubeconfig (default: $KUBECONFIG, ~/.kube/config).")
	cmd.Flags().StringVar(&kubeContext, "context", "", "The kubeconfig context to use.")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json.")
	cmd.Flags().BoolVar(&clientOnly, "client", false, "Print hybridctl's version only; do not read the cluster.")
	return cmd
}

// runningComponents lists the product's Deployments in every namespace.
func runningComponents(ctx context.Context, cs kubernetes.Interface) ([]Component, error) {
	list, err := cs.AppsV1().Deployments(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name in (" + strings.Join(components, ",") + ")"})
	if err != nil {
		return nil, err
	}
	var out []Component
	for _, d := range list.Items {
		out = append(out, component(d))
	}
	slices.SortFunc(out, func(a, b Component) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, nil
}

// component is what version reports of a Deployment: the images of the
// product's own containers (talos-ccm, ccm-coordinator, ccm-gate) and their
// tags.
func component(d appsv1.Deployment) Component {
	c := Component{Namespace: d.Namespace, Name: d.Name, Component: d.Labels["app.kubernetes.io/name"],
		Ready: d.Status.ReadyReplicas, Replicas: 1}
	if d.Spec.Replicas != nil {
		c.Replicas = *d.Spec.Replicas
	}
	spec := d.Spec.Template.Spec
	for _, ct := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if !slices.Contains([]string{"talos-ccm", "ccm-coordinator", "ccm-gate"}, ct.Name) {
			continue
		}
		c.Images = append(c.Images, ct.Image)
		c.Versions = append(c.Versions, imageTag(ct.Image))
	}
	return c
}

// imageTag is the tag of an image reference ("" for a digest-only one).
func imageTag(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	slash := strings.LastIndex(ref, "/")
	if colon := strings.LastIndex(ref, ":"); colon > slash {
		return ref[colon+1:]
	}
	return ""
}

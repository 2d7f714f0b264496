package doctor

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// CheckForeignNodeLabels: a NativeCCM's upstream CCM leaves foreign nodes
// alone by a label (status.upstream.nodeFilter.foreignNodeLabels, e.g. GCP's
// components.gke.io/gke-unmanaged-node=true), and initialized nodes of other
// platforms lack it: its second layer behind the gate is off for them.
const CheckForeignNodeLabels = "ForeignNodeWithoutOptOutLabel"

// checkForeignNodeLabels reports, per NativeCCM whose CCM filters by such
// labels, the initialized nodes of other platforms that do not carry them.
func (r *Report) checkForeignNodeLabels(nccms []v1.NativeCCM, nodes []corev1.Node) {
	for i := range nccms {
		n := &nccms[i]
		u := n.Status.Upstream
		if u == nil || u.NodeFilter == nil || len(u.NodeFilter.ForeignNodeLabels) == 0 {
			continue
		}
		var missing []string
		for j := range nodes {
			node := &nodes[j]
			platform, labelled := node.Labels[names.PlatformLabel]
			if !labelled || platform == n.Spec.Platform || uninitialized(node) {
				continue
			}
			for _, kv := range u.NodeFilter.ForeignNodeLabels {
				k, v, _ := strings.Cut(kv, "=")
				if got, ok := node.Labels[k]; !ok || got != v {
					missing = append(missing, node.Name)
					break
				}
			}
		}
		if len(missing) == 0 {
			continue
		}
		shown := missing
		if len(shown) > 5 {
			shown = append(shown[:5:5], fmt.Sprintf("and %d more", len(missing)-5))
		}
		r.add(CheckForeignNodeLabels, "nativeccm/"+n.Name,
			"add the talos-ccm rule of docs/profiles.md (\"Native second layers\") that labels every node not of platform "+n.Spec.Platform+", with transformations.enforce: true for nodes initialized before it",
			"its CCM (%s) leaves other platforms' nodes alone by %s, and %d of them lack it: %s (the gate still hides them)",
			u.Image, strings.Join(u.NodeFilter.ForeignNodeLabels, ","), len(missing), strings.Join(shown, ", "))
	}
}

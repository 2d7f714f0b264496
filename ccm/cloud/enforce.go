package cloud

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// derivedLabels are the labels talos-ccm derives from the (overridden)
// metadata itself (NodeLabels), beside the rules' own.
var derivedLabels = []string{
	corev1.LabelInstanceTypeStable, corev1.LabelInstanceType,
	corev1.LabelTopologyZone, corev1.LabelFailureDomainBetaZone,
	corev1.LabelTopologyRegion, corev1.LabelFailureDomainBetaRegion,
	names.PlatformLabel, LabelLifecycle,
}

// enforced returns what enforce mode keeps reconciled on the node
// (transform.Plan): the rule output, plus every label talos-ccm derives from
// the metadata after the rules' platformMetadata overrides — topology,
// instance type, platform, lifecycle and cluster name (f.Labels) — so that an
// override changed later reaches initialized nodes too, and a derived label
// talos-ccm wrote that no longer has a value (an override removed, a spot
// instance no longer spot) is removed. These keys are producible whatever
// matched: Plan removes such a key only if the node's ownership record lists
// it, that is if talos-ccm wrote it there.
//
// The routing label is the exception: an initialized node's providerID is
// write-once, so when the rules now give the node another platform and
// another providerID than the one it was initialized with (a rule moving
// openstack nodes to cloudscale, say), the node keeps its platform label —
// relabelling it would hand it to a native CCM that cannot recognise its
// providerID. held says so, for an event; recreate the Node to move it.
func enforced(node *corev1.Node, res *transform.Result, f *facts.Facts, clusterName string) (r *transform.Result, held string) {
	r = res.Clone()
	r.Labels = make(map[string]string, len(f.Labels))
	for k, v := range f.Labels {
		r.Labels[k] = v
	}
	producible := append(slices.Clone(r.Producible.Labels), derivedLabels...)
	if clusterName != "" {
		producible = append(producible, LabelClusterName)
	}
	slices.Sort(producible)
	r.Producible.Labels = slices.Compact(producible)

	current, labelled := node.Labels[names.PlatformLabel]
	if node.Spec.ProviderID != "" && node.Spec.ProviderID != f.ProviderID && labelled && current != f.Platform {
		r.Labels[names.PlatformLabel] = current
		held = fmt.Sprintf("the rules now give platform %q (providerID %q), but the node was initialized as %q with providerID %q, which cannot change: "+
			"it keeps the label %s=%s; delete the Node so that it registers again to move it", f.Platform, f.ProviderID, current, node.Spec.ProviderID, names.PlatformLabel, current)
	}
	return r, held
}

// Package names holds the well-known names every part of Hybrid CCM shares:
// the routing label, the taints and annotations of the cloud-provider
// contract, the provider name and the controller names with their aliases.
// It is a leaf: it imports only the core API types, so that talos-ccm, the
// coordinator, the gate and hybridctl can all use it. Nothing else defines
// these names.
package names

import corev1 "k8s.io/api/core/v1"

const (
	// ProviderName is talos-ccm's --cloud-provider and providerID scheme for
	// platforms without one of their own (talos://<platform>/<ip>).
	ProviderName = "talos"

	// PlatformLabel is the routing label talos-ccm writes on every node it
	// initializes: which native CCM the node belongs to.
	PlatformLabel = "node.cloudprovider.kubernetes.io/platform"

	// UninitializedTaint is the taint kubelets with --cloud-provider=external
	// register with, until a CCM initializes the node
	// (k8s.io/cloud-provider/api.TaintExternalCloudProvider).
	UninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"

	// ShutdownTaint is the taint cloud-node-lifecycle puts on a node whose
	// instance is shut down (k8s.io/cloud-provider/api.TaintNodeShutdown).
	ShutdownTaint = "node.cloudprovider.kubernetes.io/shutdown"
)

// Annotations of talos-ccm's TalosAPIUnavailable events on Nodes (ccm/reach):
// what the message says in words, for tools (hybridctl doctor).
const (
	// TalosAPIAddressAnnotation: the node's address the request named.
	TalosAPIAddressAnnotation = "talos-api.hybridccm.io/address"
	// TalosAPIEndpointAnnotation: the Talos API endpoint (a control plane's
	// apid, host:port) that took the request; absent when talos-ccm got no
	// connection to one.
	TalosAPIEndpointAnnotation = "talos-api.hybridccm.io/endpoint"
	// TalosAPIHopAnnotation: where the request stopped: "endpoint" (between
	// talos-ccm and the endpoint) or "node" (between the endpoint and the
	// node: apid's forwarding).
	TalosAPIHopAnnotation = "talos-api.hybridccm.io/hop"
	// TalosAPICauseAnnotation: why (ccm/talos.Causes: refused, timeout,
	// no-route, tls, permission-denied, no-endpoint, other).
	TalosAPICauseAnnotation = "talos-api.hybridccm.io/cause"
)

// talos-ccm's controllers, as --controllers names them.
const (
	CloudNodeController   = "cloud-node"
	CSRApprovalController = "node-csr-approval"
	IPAMController        = "node-ipam-controller"
)

// CoordinatorController is ccm-coordinator's controller name (events, field
// manager, metrics).
const CoordinatorController = "ccm-coordinator"

// CoordinatorLease is ccm-coordinator's leader-election Lease, in its own
// namespace.
const CoordinatorLease = "ccm-coordinator.hybridccm.io"

// ControllerAliases are other spellings of talos-ccm's controller names that
// --controllers accepts (k8s.io/cloud-provider's alias map: alias → name).
func ControllerAliases() map[string]string {
	return map[string]string{
		"cloud-node-controller":        CloudNodeController,
		"node-csr-approval-controller": CSRApprovalController,
		"csr-approval":                 CSRApprovalController,
		"node-ipam":                    IPAMController,
		"nodeipam":                     IPAMController,
	}
}

// Uninitialized reports whether taints hold UninitializedTaint.
func Uninitialized(taints []corev1.Taint) bool {
	for _, t := range taints {
		if t.Key == UninitializedTaint {
			return true
		}
	}
	return false
}

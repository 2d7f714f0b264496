// Package facts owns what talos-ccm knows about each node: the facts it
// established from the node's own Talos API (providerID, topology, addresses,
// labels and the rest of the rule output). A Source is the only way a
// controller learns about a node: cloud-node and the "talos" cloud provider
// (ccm/cloud), node-csr-approval (ccm/csr) and the node IPAM cloud allocator
// (ccm/ipam) all ask the one Source of the process.
//
// A Source dials the addresses the kubelet gives for the node (at most one
// per family, refused before anything is dialled otherwise), believes an
// answer only from a machine that names itself as the node (its Talos
// k8s/Nodename), runs at most one lookup per node at a time under a deadline
// of its own, and remembers what it established until the node is
// forgotten. It does not decide what a reading means for Kubernetes: an
// Interpreter does (ccm/cloud, with the transformation rules). It never
// writes to the API server, and never takes what the kubelet wrote as proof.
package facts

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
)

// Facts is everything talos-ccm established for a node from its Talos API.
type Facts struct {
	Platform     string
	ProviderID   string
	InstanceType string
	Region       string
	Zone         string
	// Addresses are the node's status.addresses as talos-ccm establishes them.
	Addresses []corev1.NodeAddress
	// TalosAddresses are the node's addresses as its Talos API reports them
	// (network/AddressStatus: link and prefix), set by the Source; the cloud
	// allocator carves pod CIDRs from their prefixes.
	TalosAddresses []talos.Address
	// Labels are every label talos-ccm writes (ccm/cloud.NodeLabels): rule
	// labels, instance type, topology, routing, cluster name and lifecycle.
	Labels      map[string]string
	Annotations map[string]string
	Taints      []corev1.Taint
	// Rules are the names of the transformation rules that matched.
	Rules []string
	// Result is what enforce mode keeps reconciled on an initialized node: the
	// rule output and the labels derived from the metadata after overrides
	// (ccm/cloud's enforced).
	Result *transform.Result
	// PlatformHeld, when set, says why enforce mode keeps the node's current
	// platform label instead of the one the rules now give.
	PlatformHeld string
	// ReadAt is when the Talos API was read, set by the Source.
	ReadAt time.Time
}

// remembered is what a Source keeps of f between lookups: the node's identity
// and addresses (what Established's callers read), not the labels, rule
// output and the rest, which a node's initialization writes to the Node.
// Kept for every node of the cluster, it is most of talos-ccm's memory that
// grows with the cluster after the node cache.
func (f *Facts) remembered() *Facts {
	return &Facts{
		Platform:       f.Platform,
		ProviderID:     f.ProviderID,
		Addresses:      f.Addresses,
		TalosAddresses: f.TalosAddresses,
		ReadAt:         f.ReadAt,
	}
}

// Reading is what a node's Talos API answered, once the machine proved to be
// the node. An Interpreter turns it into Facts.
type Reading struct {
	// NodeIPs are the addresses the node is reached by (NodeIPs: provided
	// node IPs, else InternalIPs), preferred family first.
	NodeIPs []netip.Addr
	// Answered is the one whose Talos API answered.
	Answered netip.Addr
	// Metadata is runtime/PlatformMetadata.
	Metadata *talos.PlatformMetadata
	// Addresses are network/AddressStatus.
	Addresses []talos.Address
	// Links are network/LinkStatus, read only when NeedsLinks(Addresses).
	Links []talos.Link
	// System is hardware/SystemInformation: nil unless the Interpreter needs
	// it and the node has it.
	System *talos.SystemInformation
}

var (
	// ErrMetadataIncomplete: the node answered but its metadata cannot produce a
	// correct providerID yet; retry later (never write a placeholder).
	ErrMetadataIncomplete = errors.New("platform metadata incomplete")
	// ErrNoNodeIP: the node has neither a provided-node-ip annotation nor an
	// InternalIP, so its Talos API cannot be addressed.
	ErrNoNodeIP = errors.New("node has no address to reach its Talos API")
	// ErrTalosAPI: no address of the node answered the Talos API.
	ErrTalosAPI = errors.New("talos API unavailable for node")
	// ErrRules: the transformation rules failed for this node.
	ErrRules = errors.New("transformation rules failed")
	// ErrIdentity: the machine answering on the node's address is another node
	// (its Talos k8s/Nodename differs). Nothing is established from it, and
	// what was established before is forgotten.
	ErrIdentity = errors.New("talos machine identity does not match the node")
	// ErrProvidedNodeIP: the kubelet-written addresses to reach the node by
	// (provided-node-ip, else InternalIPs) are unparsable or name more than one
	// address per family, which the kubelet itself never does. Nothing is dialled.
	ErrProvidedNodeIP = errors.New("invalid node IPs")
	// ErrProviderIDMismatch: an uninitialized Node already carries a providerID
	// that differs from the one its Talos API establishes (a kubelet can register
	// with any providerID). Nothing is established for the node until an admin
	// resolves it or the Talos metadata changes.
	ErrProviderIDMismatch = errors.New("providerID does not match the Talos API")
)

// TalosAPIError is ErrTalosAPI with what failed at each address dialled:
// the Talos API requests' failures, classified (one per address, the first
// that says something about reaching the node).
type TalosAPIError struct {
	Failures []talos.Failure
	err      error
}

func (e *TalosAPIError) Error() string { return e.err.Error() }

func (e *TalosAPIError) Unwrap() error { return e.err }

// failures classifies the errors of each address dialled: per address, the
// first of its requests' errors that talos.Classify classifies.
func failures(perAddress []error) []talos.Failure {
	var out []talos.Failure
	for _, err := range perAddress {
		for _, e := range flatten(err) {
			if f, ok := talos.Classify(e); ok {
				out = append(out, f)
				break
			}
		}
	}
	return out
}

// flatten lists the errors errors.Join joined in err (err itself otherwise).
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// ProviderIDMismatchError is ErrProviderIDMismatch with both values.
type ProviderIDMismatchError struct {
	// Registered is the providerID the Node carries; Established the one its
	// Talos API gives.
	Registered, Established string
}

func (e *ProviderIDMismatchError) Error() string {
	return fmt.Sprintf("%v: the Node has providerID %q, its Talos API establishes %q", ErrProviderIDMismatch, e.Registered, e.Established)
}

func (e *ProviderIDMismatchError) Unwrap() error { return ErrProviderIDMismatch }

// Event reasons for a node whose facts cannot be established, one per error
// above; every controller that reports such a failure on the node uses them.
const (
	ReasonTalosAPIUnavailable = "TalosAPIUnavailable"
	ReasonMetadataIncomplete  = "MetadataIncomplete"
	ReasonNoNodeIP            = "NoNodeIP"
	ReasonTransformFailed     = "TransformationFailed"
	ReasonIdentityMismatch    = "NodeIdentityMismatch"
	ReasonProvidedIPInvalid   = "ProvidedNodeIPInvalid"
	ReasonProviderIDMismatch  = "ProviderIDMismatch"
)

// Reason is the event reason for an error of Source, or "" when err is none
// of its errors.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrTalosAPI):
		return ReasonTalosAPIUnavailable
	case errors.Is(err, ErrMetadataIncomplete):
		return ReasonMetadataIncomplete
	case errors.Is(err, ErrNoNodeIP):
		return ReasonNoNodeIP
	case errors.Is(err, ErrRules):
		return ReasonTransformFailed
	case errors.Is(err, ErrIdentity):
		return ReasonIdentityMismatch
	case errors.Is(err, ErrProvidedNodeIP):
		return ReasonProvidedIPInvalid
	case errors.Is(err, ErrProviderIDMismatch):
		return ReasonProviderIDMismatch
	}
	return ""
}

package csr

import (
	"crypto/x509"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
)

// AddressHolders is what a NodeFacts may offer besides Established: for
// which nodes talos-ccm established an address (an IP or a DNS name),
// current ones and ones deleted recently (ccm/facts.Source has it). With it,
// a SAN established for another node is refused, naming that node.
type AddressHolders interface {
	Holders(address string) (current, departed []string)
	// Looked reports whether the node's Talos API has been read since the
	// process started: until then, what its status lists may still be
	// established for it.
	Looked(node string) bool
}

// nodesByAddress indexes Nodes by their status.addresses and their name
// (facts.AddressKey): the nodes that claim an address.
const nodesByAddress = "node-csr-approval/nodes-by-address"

// uninitializedClaimWait is how long a SAN another node lists while it is
// not initialized yet postpones a CSR.
const uninitializedClaimWait = 15 * time.Minute

func indexNodesByAddress(obj any) ([]string, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return nil, nil
	}
	keys := []string{facts.AddressKey(n.Name)}
	for _, a := range n.Status.Addresses {
		if a.Address != "" {
			keys = append(keys, facts.AddressKey(a.Address))
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// sanKeys returns every SAN of the request as facts.AddressKey.
func sanKeys(x *x509.CertificateRequest) []string {
	out := make([]string, 0, len(x.DNSNames)+len(x.IPAddresses))
	for _, n := range x.DNSNames {
		out = append(out, facts.AddressKey(n))
	}
	for _, raw := range x.IPAddresses {
		if ip, ok := netip.AddrFromSlice(raw); ok {
			out = append(out, facts.AddressKey(ip.String()))
		}
	}
	return out
}

// exclusive refuses a request whose SANs talos-ccm established for another
// node, or that are another node's name (Deny, naming it), or that another
// initialized node lists in its status while talos-ccm has not read that node
// since it started, or that a node deleted within the facts source's hold had
// (Retry: the truth may still arrive). Every address of this node was
// already proven by checkNode.
func (c *Controller) exclusive(node *corev1.Node, x *x509.CertificateRequest) Decision {
	holders, _ := c.facts.(AddressHolders)
	for _, key := range sanKeys(x) {
		if holders != nil {
			current, departed := holders.Holders(key)
			for _, other := range current {
				if other != node.Name {
					return deny(ReasonAddressOfOtherNode, "SAN %s is an address talos-ccm established for node %q, not only for node %q", clip(key), other, node.Name)
				}
			}
			for _, other := range departed {
				if other != node.Name {
					return Decision{Action: Retry, Reason: ReasonAddressClaimedByOtherNode,
						Message: fmt.Sprintf("SAN %s was established for node %q, deleted recently; it stays refused for a while", clip(key), other)}
				}
			}
		}
		claimants, _ := c.nodeIndexer.ByIndex(nodesByAddress, key)
		for _, o := range claimants {
			other, ok := o.(*corev1.Node)
			if !ok || other.Name == node.Name {
				continue
			}
			if other.Name == key {
				return deny(ReasonAddressOfOtherNode, "DNS SAN %s is the name of node %q", clip(key), other.Name)
			}
			// Another node's status lists the SAN. A kubelet writes its status
			// itself, so that alone decides nothing; but an initialized node
			// talos-ccm has not read since it started may hold it (Holders
			// above does not know yet): wait for its facts.
			if holders != nil && Initialized(other) && !holders.Looked(other.Name) {
				return Decision{Action: Retry, Reason: ReasonAddressClaimedByOtherNode,
					Message: fmt.Sprintf("SAN %s is listed by node %q, whose addresses talos-ccm has not read since it started", clip(key), other.Name)}
			}
			// A node that joined and is not initialized yet may be the SAN's
			// owner, whose facts talos-ccm reads when it initializes it: the
			// first to ask must not take its address. Bounded, so that a node
			// kept uninitialized cannot hold other nodes' certificates back.
			if !Initialized(other) && time.Since(other.CreationTimestamp.Time) < uninitializedClaimWait {
				return Decision{Action: Retry, Reason: ReasonAddressClaimedByOtherNode,
					Message: fmt.Sprintf("SAN %s is listed by node %q, which talos-ccm has not initialized yet", clip(key), other.Name)}
			}
		}
	}
	return Decision{}
}

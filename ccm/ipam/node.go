package ipam

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// internalIPs are the InternalIP addresses among addrs (talos-ccm's
// established addresses of a node).
func internalIPs(addrs []corev1.NodeAddress) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// hostAddrs are every address a node is known to use in Kubernetes (provided
// IPs, InternalIP, ExternalIP): pod CIDRs carved from a shared prefix avoid
// them. They only keep addresses out of pod CIDRs, so an unparsable
// provided-node-ip annotation is passed over, not refused.
func hostAddrs(n *corev1.Node) []netip.Addr {
	out, _ := iplist.Addrs(n.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr])
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// uninitialized reports whether the node still waits for its cloud provider.
func uninitialized(n *corev1.Node) bool { return names.Uninitialized(n.Spec.Taints) }

// podCIDRs parses spec.podCIDRs (or the legacy spec.podCIDR); unparsable
// entries are skipped.
func podCIDRs(n *corev1.Node) []netip.Prefix {
	src := n.Spec.PodCIDRs
	if len(src) == 0 && n.Spec.PodCIDR != "" {
		src = []string{n.Spec.PodCIDR}
	}
	out := make([]netip.Prefix, 0, len(src))
	for _, s := range src {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// GlobalPrefix chooses the node's global (non-ULA) IPv6 prefix from its Talos
// addresses for the cloud allocator and the mask size of the pod CIDRs carved
// from it (CloudMaskSize with the configured IPv6 mask size). Among usable
// prefixes it prefers one that contains a node IP, then the largest, then the
// lowest. ok is false when the node has no global IPv6 prefix at all (host
// routes, /128, do not count); err is ErrPrefixTooSmall when it has some but
// all are too small.
func GlobalPrefix(addrs []talos.Address, nodeIPs []netip.Addr, configured int) (prefix netip.Prefix, bits int, ok bool, err error) {
	type candidate struct {
		p       netip.Prefix
		bits    int
		hasNode bool
	}
	var usable []candidate
	var tooSmall error
	for _, a := range addrs {
		p := a.Prefix
		if !p.IsValid() || !isGlobalIPv6(p.Addr()) || p.Bits() >= 128 {
			continue
		}
		m, merr := CloudMaskSize(p.Bits(), configured)
		if merr != nil {
			tooSmall = merr
			continue
		}
		pm := p.Masked()
		usable = append(usable, candidate{p: pm, bits: m, hasNode: slices.ContainsFunc(nodeIPs, pm.Contains)})
	}
	if len(usable) == 0 {
		if tooSmall != nil {
			return netip.Prefix{}, 0, true, tooSmall
		}
		return netip.Prefix{}, 0, false, nil
	}
	best := slices.MinFunc(usable, func(x, y candidate) int {
		if x.hasNode != y.hasNode {
			if x.hasNode {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(x.p.Bits(), y.p.Bits()); c != 0 {
			return c
		}
		return x.p.Addr().Compare(y.p.Addr())
	})
	return best.p, best.bits, true, nil
}

// addrsIn keeps the addresses inside p, sorted, each once (in O(n log n):
// on a shared LAN every node of the cluster may be inside p).
func addrsIn(p netip.Prefix, addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if p.Contains(a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

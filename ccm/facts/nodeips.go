package facts

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
)

// NodeIPs are the addresses under which the node's Talos API is reached, in
// the order they are dialled: the kubelet's provided node IPs
// (alpha.kubernetes.io/provided-node-ip), else the node's InternalIPs,
// preferred family first. Both are written by the kubelet, which allows one
// address per family (--node-ip): more, or an unparsable one, is refused
// (ErrProvidedNodeIP) before anything is dialled, so a node cannot make a
// lookup try many addresses one after another. No address at all is
// ErrNoNodeIP.
func NodeIPs(node *corev1.Node, preferIPv6 bool) ([]netip.Addr, error) {
	if ann, ok := node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]; ok {
		ips, err := iplist.Addrs(ann)
		if err == nil {
			err = onePerFamily(ips)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: annotation %s=%q: %v", ErrProvidedNodeIP, cloudproviderapi.AnnotationAlphaProvidedIPAddr, clip(ann), err)
		}
		if len(ips) > 0 {
			return iplist.SortByFamily(ips, preferIPv6), nil
		}
	}
	var ips []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			return nil, fmt.Errorf("%w: InternalIP %q: %v", ErrProvidedNodeIP, clip(a.Address), err)
		}
		ips = append(ips, ip.Unmap())
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("%w: no %s annotation and no InternalIP in status", ErrNoNodeIP, cloudproviderapi.AnnotationAlphaProvidedIPAddr)
	}
	if err := onePerFamily(ips); err != nil {
		return nil, fmt.Errorf("%w: status InternalIPs: %v", ErrProvidedNodeIP, err)
	}
	return iplist.SortByFamily(ips, preferIPv6), nil
}

// onePerFamily refuses more than one address of a family.
func onePerFamily(ips []netip.Addr) error {
	var v4, v6 int
	for _, ip := range ips {
		if ip.Is4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 > 1 || v6 > 1 {
		return fmt.Errorf("%d IPv4 and %d IPv6 addresses, at most one of each family is allowed", v4, v6)
	}
	return nil
}

// clip shortens a kubelet-written value quoted in an error (and so in events).
func clip(s string) string {
	const max = 100
	if len(s) <= max {
		return s
	}
	return s[:max] + fmt.Sprintf("…(%d bytes)", len(s))
}

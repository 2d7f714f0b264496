package cloud

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

// ExternalLink is the Talos link that carries a cloud's public (1:1 NAT) address.
const ExternalLink = "external"

// publicDiscoveryPlatforms publish their public addresses on ordinary links;
// global unicast, non-private addresses found there are ExternalIPs.
var publicDiscoveryPlatforms = map[string]bool{"metal": true, "nocloud": true, "openstack": true, "oracle": true}

// nodeIPs parses the kubelet's provided-node-ip annotation (one IP or a
// dual-stack pair, comma separated).
func nodeIPs(annotation string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range strings.Split(annotation, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, err
		}
		out = append(out, a.Unmap())
	}
	return out, nil
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

// orderByFamily puts the preferred family first, keeping the order otherwise.
func orderByFamily(ips []netip.Addr, preferIPv6 bool) []netip.Addr {
	out := slices.Clone(ips)
	slices.SortStableFunc(out, func(a, b netip.Addr) int {
		av, bv := a.Is6() == preferIPv6, b.Is6() == preferIPv6
		switch {
		case av && !bv:
			return -1
		case bv && !av:
			return 1
		}
		return 0
	})
	return out
}

// discoverable reports whether public addresses found on a link may be the
// node's ExternalIPs. Never those of loopback, Talos' own overlays (KubeSpan,
// SideroLink), Cilium's host interface (it holds an address of the node's pod
// CIDR, global unicast when the cloud allocator carves it from the node's
// prefix) or dummy interfaces (addresses bound locally for services); the
// upstream Talos CCM leaves out the same links.
func discoverable(link string) bool {
	switch link {
	case "lo", "kubespan", "siderolink", "cilium_host":
		return false
	}
	return !strings.HasPrefix(link, "dummy")
}

func isPublic(a netip.Addr) bool {
	return a.IsGlobalUnicast() && !a.IsPrivate() && !a.IsLoopback() && !a.IsLinkLocalUnicast()
}

// nodeAddresses builds status.addresses: InternalIP = the provided node IPs that
// are addresses of the node per its Talos API (at most one per family, preferred
// family first); ExternalIP = the external link's addresses, plus public
// global-unicast addresses where the platform (or a rule's publicIPDiscovery)
// says so; Hostname = the node name; InternalDNS = the metadata's host name
// when it is a domain name, and the metadata's InternalDNS; ExternalDNS.
//
// Hostname is the node name, as the upstream Talos CCM and the kubelet itself
// report it (it is also the kubernetes.io/hostname label), not the metadata's
// host name: where that is a fully qualified name (aws, some metal), it is an
// InternalDNS address instead, so nothing is lost and every name stays one the
// node's serving certificate may carry (docs/talos-ccm.md).
//
// A provided node IP the Talos API does not report is left out: the kubelet
// writes provided-node-ip itself, and only one of its addresses needs to reach
// the node's Talos API, so an extra entry (a second family, or an unreachable
// address listed first) would otherwise be "established" from the kubelet's
// word alone. The cloud-node controller then reports ProvidedNodeIPNotFound.
func nodeAddresses(nodeName string, internal []netip.Addr, talosAddrs []talos.Address, md *Metadata, discoverPublic bool, preferIPv6 bool) []corev1.NodeAddress {
	var out []corev1.NodeAddress
	seen := map[netip.Addr]bool{}
	onNode := map[netip.Addr]bool{}
	for _, a := range talosAddrs {
		onNode[a.Prefix.Addr().Unmap().WithZone("")] = true
	}
	var v4, v6 bool
	for _, ip := range orderByFamily(internal, preferIPv6) {
		if (ip.Is4() && v4) || (ip.Is6() && v6) || !onNode[ip.Unmap().WithZone("")] {
			continue
		}
		v4, v6 = v4 || ip.Is4(), v6 || ip.Is6()
		seen[ip] = true
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	discover := discoverPublic || publicDiscoveryPlatforms[md.Platform]
	var external []netip.Addr
	for _, a := range talosAddrs {
		ip := a.Prefix.Addr().Unmap()
		if seen[ip] || !ip.IsValid() {
			continue
		}
		if a.Link == ExternalLink || (discover && isPublic(ip) && discoverable(a.Link)) {
			seen[ip] = true
			external = append(external, ip)
		}
	}
	for _, ip := range orderByFamily(external, preferIPv6) {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip.String()})
	}
	if nodeName != "" {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeHostName, Address: nodeName})
	}
	if strings.IndexByte(md.Hostname, '.') > 0 && md.Hostname != md.InternalDNS {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: md.Hostname})
	}
	if md.InternalDNS != "" {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: md.InternalDNS})
	}
	if md.ExternalDNS != "" {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeExternalDNS, Address: md.ExternalDNS})
	}
	return out
}

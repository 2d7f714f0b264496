package cloud

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

// ExternalLink is the Talos link that carries a cloud's public (1:1 NAT) address.
const ExternalLink = "external"

// publicDiscoveryPlatforms publish their public addresses on ordinary links;
// global unicast, non-private addresses found there are ExternalIPs.
var publicDiscoveryPlatforms = map[string]bool{"metal": true, "nocloud": true, "openstack": true, "oracle": true}

// clip shortens a kubelet-written value quoted in an error (and so in events).
func clip(s string) string {
	const max = 100
	if len(s) <= max {
		return s
	}
	return s[:max] + fmt.Sprintf("…(%d bytes)", len(s))
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
	for _, ip := range iplist.SortByFamily(internal, preferIPv6) {
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
	for _, ip := range iplist.SortByFamily(external, preferIPv6) {
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

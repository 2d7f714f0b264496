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

// selfServedMetadata are the platforms whose metadata the machine itself
// serves (metal: the machine config and its kernel arguments; nocloud: a
// volume or URL the machine reads): root on the node can make them say
// anything, so their DNS names only count when they are the node's own name
// with a domain (selfNamed).
var selfServedMetadata = map[string]bool{"metal": true, "nocloud": true}

// addressLinks is what the node's Talos API says about the links that hold
// its addresses (network/LinkStatus), by link name.
type addressLinks map[string]talos.Link

func linksByName(links []talos.Link) addressLinks {
	m := make(addressLinks, len(links))
	for _, l := range links {
		m[l.Name] = l
	}
	return m
}

// platformExternal reports whether an address on link is one of the cloud's
// public (1:1 NAT) addresses that Talos' platform configuration puts on the
// pseudo-link "external". That link has no LinkStatus: a kernel link of the
// same name (`ip link add external type dummy` by root on the node) holds
// whatever its creator put there, and counts for nothing.
func (l addressLinks) platformExternal(link string) bool {
	_, kernel := l[ExternalLink]
	return link == ExternalLink && !kernel
}

// discoverable reports whether public addresses found on a link may be the
// node's ExternalIPs: only a link Talos reports as a physical ethernet device,
// or a bond or VLAN (built on such devices by the machine config). Never one
// of a virtual kind — loopback, dummy, veth (Cilium's host interface, pods),
// wireguard (KubeSpan, SideroLink), bridges (CNI), tunnels — whatever its
// name, and never a link Talos does not report. It is decided from what
// Talos says about the link (network/LinkStatus), not from the link's name,
// which whoever creates a link chooses.
func (l addressLinks) discoverable(link string) bool {
	s, ok := l[link]
	if !ok {
		return false
	}
	return s.Physical || s.Kind == "bond" || s.Kind == "vlan"
}

// nodeScoped reports whether ip can be a node's address at all: never
// loopback, link-local, unspecified, multicast or IPv4 broadcast, whatever a
// node reports.
func nodeScoped(ip netip.Addr) bool {
	return ip.IsValid() && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() && !ip.IsLinkLocalMulticast() &&
		!ip.IsUnspecified() && !ip.IsMulticast() && !ip.IsInterfaceLocalMulticast() && ip != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// selfNamed reports whether a DNS name from self-served metadata is the
// node's own name with a domain: its first label is the node name.
func selfNamed(name, nodeName string) bool {
	first, _, _ := strings.Cut(name, ".")
	return nodeName != "" && strings.EqualFold(first, nodeName)
}

func isPublic(a netip.Addr) bool {
	return a.IsGlobalUnicast() && !a.IsPrivate() && !a.IsLoopback() && !a.IsLinkLocalUnicast()
}

// nodeAddresses builds status.addresses: InternalIP = the provided node IPs that
// are addresses of the node per its Talos API (at most one per family, preferred
// family first); ExternalIP = the external link's addresses, plus public
// global-unicast addresses where the platform (or a rule's publicIPDiscovery)
// says so, on links Talos reports as physical (discoverable); Hostname = the
// node name; InternalDNS = the metadata's host name when it is a domain name,
// and the metadata's InternalDNS; ExternalDNS. On platforms whose metadata
// the machine serves itself (metal, nocloud), a DNS name counts only when its
// first label is the node name. No address is ever loopback, link-local,
// unspecified or multicast (nodeScoped).
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
func nodeAddresses(nodeName string, internal []netip.Addr, talosAddrs []talos.Address, links []talos.Link, md *Metadata, discoverPublic bool, preferIPv6 bool) []corev1.NodeAddress {
	var out []corev1.NodeAddress
	byName := linksByName(links)
	seen := map[netip.Addr]bool{}
	onNode := map[netip.Addr]bool{}
	for _, a := range talosAddrs {
		onNode[a.Prefix.Addr().Unmap().WithZone("")] = true
	}
	var v4, v6 bool
	for _, ip := range iplist.SortByFamily(internal, preferIPv6) {
		if (ip.Is4() && v4) || (ip.Is6() && v6) || !onNode[ip.Unmap().WithZone("")] || !nodeScoped(ip.Unmap()) {
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
		if seen[ip] || !nodeScoped(ip) {
			continue
		}
		if byName.platformExternal(a.Link) || (discover && isPublic(ip) && byName.discoverable(a.Link)) {
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
	named := func(name string) bool {
		return name != "" && (!selfServedMetadata[md.Platform] || selfNamed(name, nodeName))
	}
	if strings.IndexByte(md.Hostname, '.') > 0 && md.Hostname != md.InternalDNS && named(md.Hostname) {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: md.Hostname})
	}
	if named(md.InternalDNS) {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: md.InternalDNS})
	}
	if named(md.ExternalDNS) {
		out = append(out, corev1.NodeAddress{Type: corev1.NodeExternalDNS, Address: md.ExternalDNS})
	}
	return out
}

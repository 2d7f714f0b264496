package cloud

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

func TestProviderID(t *testing.T) {
	cases := []struct {
		name  string   // case
		md    Metadata // transformed metadata
		ip    string   // address the Talos API answered on
		want  string   // expected providerID ("" with wantRetry)
		retry bool     // expect ErrMetadataIncomplete
	}{
		{name: "native from metadata", md: Metadata{Platform: "aws", ProviderID: "aws:///us-east-1a/i-1"}, want: "aws:///us-east-1a/i-1"},
		{name: "aws built from zone+id", md: Metadata{Platform: "aws", Zone: "eu-west-1b", InstanceID: "i-9"}, want: "aws:///eu-west-1b/i-9"},
		{name: "aws without zone retries", md: Metadata{Platform: "aws", InstanceID: "i-9"}, retry: true},
		{name: "hcloud from instance id", md: Metadata{Platform: "hcloud", InstanceID: "42"}, want: "hcloud://42"},
		{name: "hcloud without id retries", md: Metadata{Platform: "hcloud"}, retry: true},
		{name: "gcp needs metadata providerID", md: Metadata{Platform: "gcp", InstanceID: "123"}, retry: true},
		{name: "azure resource group lower-cased", md: Metadata{Platform: "azure",
			ProviderID: "azure:///subscriptions/S/resourceGroups/My-RG/providers/Microsoft.Compute/virtualMachines/VM1"},
			want: "azure:///subscriptions/S/resourceGroups/my-rg/providers/Microsoft.Compute/virtualMachines/VM1"},
		{name: "metal falls back to talos://", md: Metadata{Platform: "metal"}, ip: "192.0.2.1", want: "talos://metal/192.0.2.1"},
		{name: "nocloud v6 fallback", md: Metadata{Platform: "nocloud"}, ip: "2001:db8::1", want: "talos://nocloud/2001:db8::1"},
		{name: "no platform retries", md: Metadata{}, retry: true},
		{name: "scaleway", md: Metadata{Platform: "scaleway", Zone: "fr-par-1", InstanceID: "u-1"}, want: "scaleway://instance/fr-par-1/u-1"},
		{name: "cloudscale from the server UUID, lower-cased", md: Metadata{Platform: "cloudscale", InstanceID: "5F0C7E1A-9B2D-4C3E-8F4A-1B2C3D4E5F60"},
			want: "cloudscale://5f0c7e1a-9b2d-4c3e-8f4a-1b2c3d4e5f60"},
		{name: "cloudscale instance ID not a UUID retries", md: Metadata{Platform: "cloudscale", InstanceID: "i-123"}, retry: true},
		{name: "cloudscale without instance ID retries", md: Metadata{Platform: "cloudscale"}, retry: true},
		{name: "cloudscale providerID from a rule", md: Metadata{Platform: "cloudscale", ProviderID: "cloudscale://5f0c7e1a-9b2d-4c3e-8f4a-1b2c3d4e5f60"},
			want: "cloudscale://5f0c7e1a-9b2d-4c3e-8f4a-1b2c3d4e5f60"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ProviderID(&c.md, c.ip)
			if c.retry {
				if !errors.Is(err, facts.ErrMetadataIncomplete) || got != "" {
					t.Fatalf("want retry, got %q, %v", got, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// A cloudscale node whose instance ID is not a UUID is retried with a
// message saying what the cloudscale CCM needs.
func TestCloudscaleProviderIDMessage(t *testing.T) {
	_, err := ProviderID(&Metadata{Platform: "cloudscale", InstanceID: "i-123"}, "10.0.0.1")
	if err == nil || !strings.Contains(err.Error(), "server's UUID") || !strings.Contains(err.Error(), `"i-123"`) {
		t.Fatalf("error %v should say that the instance ID must be the server UUID and name it", err)
	}
}

func TestNodeAddresses(t *testing.T) {
	ips := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, x := range s {
			out = append(out, netip.MustParseAddr(x))
		}
		return out
	}
	ta := func(link, p string) talos.Address { return talos.Address{Link: link, Prefix: netip.MustParsePrefix(p)} }
	dev := func(name string) talos.Link { return talos.Link{Name: name, Physical: true} }
	virtual := func(name, kind string) talos.Link { return talos.Link{Name: name, Kind: kind} }
	a := func(typ corev1.NodeAddressType, s string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: typ, Address: s}
	}
	cases := []struct {
		name     string               // case
		node     string               // node name
		internal []netip.Addr         // provided node IPs
		talos    []talos.Address      // AddressStatus
		links    []talos.Link         // LinkStatus; nil means physicalLinks of talos
		md       Metadata             // metadata
		discover bool                 // publicIPDiscovery feature
		v6       bool                 // preferIPv6
		want     []corev1.NodeAddress // expected order and content
	}{
		{name: "cloud external link only", node: "n1", internal: ips("10.0.0.1"),
			talos: []talos.Address{ta("eth0", "10.0.0.1/24"), ta("eth0", "2001:db8::1/64"), ta("external", "203.0.113.1/32")},
			md:    Metadata{Platform: "aws", Hostname: "n1"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "10.0.0.1"), a(corev1.NodeExternalIP, "203.0.113.1"), a(corev1.NodeHostName, "n1")}},
		// Hostname is the node name; a fully qualified host name is InternalDNS
		{name: "metal discovers public v6, skips private and link-local", node: "m", internal: ips("192.168.1.5"),
			talos: []talos.Address{ta("eth0", "192.168.1.5/24"), ta("eth0", "fe80::1/64"), ta("eth0", "2001:db8::5/64"), ta("eth1", "10.9.9.9/8")},
			md:    Metadata{Platform: "metal", Hostname: "m.example.com"},
			want: []corev1.NodeAddress{a(corev1.NodeInternalIP, "192.168.1.5"), a(corev1.NodeExternalIP, "2001:db8::5"),
				a(corev1.NodeHostName, "m"), a(corev1.NodeInternalDNS, "m.example.com")}},
		{name: "aws: FQDN host name equal to InternalDNS is listed once", node: "aws-1", internal: ips("10.0.1.10"),
			talos: []talos.Address{ta("eth0", "10.0.1.10/24")},
			md:    Metadata{Platform: "aws", Hostname: "ip-10-0-1-10.ec2.internal", InternalDNS: "ip-10-0-1-10.ec2.internal"},
			want: []corev1.NodeAddress{a(corev1.NodeInternalIP, "10.0.1.10"), a(corev1.NodeHostName, "aws-1"),
				a(corev1.NodeInternalDNS, "ip-10-0-1-10.ec2.internal")}},
		{name: "a short host name other than the node name is not an address", node: "web-1", internal: ips("10.0.0.1"),
			talos: []talos.Address{ta("eth0", "10.0.0.1/24")},
			md:    Metadata{Platform: "hcloud", Hostname: "web"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "10.0.0.1"), a(corev1.NodeHostName, "web-1")}},
		{name: "discovery skips overlay, CNI host, dummy and loopback links", node: "m", internal: ips("192.168.1.5"),
			talos: []talos.Address{ta("eth0", "192.168.1.5/24"), ta("kubespan", "2001:db8:ff::5/128"), ta("siderolink", "2001:db8:fe::5/64"),
				ta("cilium_host", "2001:db8:5:1::1/128"), ta("dummy0", "198.51.100.80/32"), ta("lo", "198.51.100.81/32"), ta("eth1", "198.51.100.5/24")},
			links: []talos.Link{dev("eth0"), virtual("kubespan", "wireguard"), virtual("siderolink", "wireguard"), virtual("cilium_host", "veth"),
				virtual("dummy0", "dummy"), {Name: "lo"}, dev("eth1")},
			md:   Metadata{Platform: "metal", Hostname: "m"},
			want: []corev1.NodeAddress{a(corev1.NodeInternalIP, "192.168.1.5"), a(corev1.NodeExternalIP, "198.51.100.5"), a(corev1.NodeHostName, "m")}},
		{name: "feature enables discovery on a cloud", internal: ips("10.0.0.1"), discover: true,
			talos: []talos.Address{ta("eth0", "10.0.0.1/24"), ta("eth0", "198.51.100.4/32")},
			md:    Metadata{Platform: "gcp"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "10.0.0.1"), a(corev1.NodeExternalIP, "198.51.100.4")}},
		{name: "dual-stack preferIPv6 orders v6 first, one per family", internal: ips("10.0.0.1", "fd00::1", "10.0.0.2"), v6: true,
			talos: []talos.Address{ta("eth0", "10.0.0.1/24"), ta("eth0", "10.0.0.2/24"), ta("eth0", "fd00::1/64")},
			md:    Metadata{Platform: "openstack", InternalDNS: "i.example", ExternalDNS: "e.example"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "fd00::1"), a(corev1.NodeInternalIP, "10.0.0.1"), a(corev1.NodeInternalDNS, "i.example"), a(corev1.NodeExternalDNS, "e.example")}},
		// the kubelet writes provided-node-ip: an entry the Talos API does not
		// report is not established, whichever family or position it has
		{name: "provided IPs not on the node are left out", node: "n1", internal: ips("10.99.0.1", "10.0.0.1", "fd00::99"),
			talos: []talos.Address{ta("eth0", "10.0.0.1/24"), ta("eth0", "fd00::1/64")},
			md:    Metadata{Platform: "aws", Hostname: "n1"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "10.0.0.1"), a(corev1.NodeHostName, "n1")}},
		// security round three: which addresses count is decided from
		// LinkStatus, never from a link's name
		{name: "a kernel link named external holds nothing of the node's", node: "n1", internal: ips("10.0.0.1"),
			talos: []talos.Address{ta("eth0", "10.0.0.1/24"), ta("external", "10.0.0.2/32"), ta("external", "203.0.113.9/32")},
			links: []talos.Link{dev("eth0"), virtual("external", "dummy")},
			md:    Metadata{Platform: "aws", Hostname: "n1"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "10.0.0.1"), a(corev1.NodeHostName, "n1")}},
		{name: "discovery by link kind, not name: a dummy called eth1 is refused, a bond counts", node: "m", internal: ips("192.168.1.5"),
			talos: []talos.Address{ta("eth0", "192.168.1.5/24"), ta("eth1", "198.51.100.7/32"), ta("bond0", "198.51.100.8/24"), ta("br0", "198.51.100.9/24"), ta("eth2", "198.51.100.10/24")},
			links: []talos.Link{dev("eth0"), virtual("eth1", "dummy"), virtual("bond0", "bond"), virtual("br0", "bridge")},
			md:    Metadata{Platform: "metal", Hostname: "m"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "192.168.1.5"), a(corev1.NodeExternalIP, "198.51.100.8"), a(corev1.NodeHostName, "m")}},
		{name: "never loopback, link-local, multicast or unspecified, even on external", node: "n1", internal: ips("127.0.0.1", "fe80::1"),
			talos: []talos.Address{ta("eth0", "127.0.0.1/8"), ta("eth0", "fe80::1/64"), ta("external", "169.254.169.254/32"), ta("external", "224.0.0.1/32"), ta("external", "0.0.0.0/32"), ta("external", "::1/128")},
			md:    Metadata{Platform: "aws", Hostname: "n1"},
			want:  []corev1.NodeAddress{a(corev1.NodeHostName, "n1")}},
		{name: "metal and nocloud: DNS names only under the node's own name", node: "m", internal: ips("10.0.0.1"),
			talos: []talos.Address{ta("eth0", "10.0.0.1/24")},
			md:    Metadata{Platform: "nocloud", Hostname: "other.example.com", InternalDNS: "m.internal.example", ExternalDNS: "kubernetes.example.com"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "10.0.0.1"), a(corev1.NodeHostName, "m"), a(corev1.NodeInternalDNS, "m.internal.example")}},
		{name: "IPv4-mapped AddressStatus matches", internal: ips("10.0.0.1"),
			talos: []talos.Address{ta("eth0", "::ffff:10.0.0.1/128")},
			md:    Metadata{Platform: "aws"},
			want:  []corev1.NodeAddress{a(corev1.NodeInternalIP, "10.0.0.1")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			links := c.links
			if links == nil {
				for _, a := range c.talos {
					if a.Link != "external" {
						links = append(links, dev(a.Link))
					}
				}
			}
			got := nodeAddresses(c.node, c.internal, c.talos, links, &c.md, c.discover, c.v6)
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got  %v\nwant %v", got, c.want)
			}
		})
	}
}

// talos-ccm has no cloud API: it must never be the reason a node is deleted or
// tainted as shut down, whatever the node (unknown, foreign, uninitialized).
func TestLifecycleAnswersNeverHarmNodes(t *testing.T) {
	p := New(nil)
	for _, n := range []*corev1.Node{
		{},
		{Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/i-gone"}},
		{Spec: corev1.NodeSpec{ProviderID: "talos://metal/10.0.0.1"}},
	} {
		exists, err := p.InstanceExists(context.Background(), n)
		if !exists || err != nil {
			t.Fatalf("InstanceExists(%q) = %v, %v", n.Spec.ProviderID, exists, err)
		}
		shutdown, err := p.InstanceShutdown(context.Background(), n)
		if shutdown || err != nil {
			t.Fatalf("InstanceShutdown(%q) = %v, %v", n.Spec.ProviderID, shutdown, err)
		}
	}
}

func TestNodeLabels(t *testing.T) {
	got := NodeLabels(&Metadata{Platform: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "t3.small", Spot: true},
		map[string]string{"node-role.kubernetes.io/web": ""}, "prod")
	want := map[string]string{
		"node-role.kubernetes.io/web":              "",
		"node.kubernetes.io/instance-type":         "t3.small",
		"beta.kubernetes.io/instance-type":         "t3.small",
		"topology.kubernetes.io/zone":              "us-east-1a",
		"failure-domain.beta.kubernetes.io/zone":   "us-east-1a",
		"topology.kubernetes.io/region":            "us-east-1",
		"failure-domain.beta.kubernetes.io/region": "us-east-1",
		names.PlatformLabel:                        "aws",
		LabelClusterName:                           "prod",
		LabelLifecycle:                             "spot",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	if got := NodeLabels(&Metadata{Platform: "metal"}, nil, ""); !reflect.DeepEqual(got, map[string]string{names.PlatformLabel: "metal"}) {
		t.Fatalf("empty values must not be written: %v", got)
	}
}

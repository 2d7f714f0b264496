package integration

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/ipam"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// cloudNode is one simulated node for the cloud allocator.
type cloudNode struct {
	name     string   // node name
	ips      []string // provided-node-ip (the first routes to its Talos API)
	prefixes []string // its Talos AddressStatus prefixes besides the IPv4 one
	wantV6   string   // expected IPv6 pod CIDR; "fallback" = from the cluster CIDR
	event    string   // expected Warning event reason ("" = none)
}

// metal is the platform metadata of a simulated bare-metal machine: the cloud
// allocator learns a node's prefixes from the facts talos-ccm establishes, and
// those need the node's platform.
func metal(name string) *runtime.PlatformMetadataSpec {
	return &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name}
}

func TestCloudAllocationFromNodePrefixes(t *testing.T) {
	cleanNodes(t)
	ep, tc := talosEndpoint(t)
	v4, v6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:140::/56")
	cases := []cloudNode{
		{name: "cl-64", ips: []string{"10.140.0.1"}, prefixes: []string{"2001:db8:64::5/64", "fe80::1/64"},
			wantV6: "2001:db8:64:0:1::/80"},
		{name: "cl-80", ips: []string{"10.140.0.2"}, prefixes: []string{"2001:db8:80:0:5::5/80"},
			wantV6: "2001:db8:80:0:5:1::/96"},
		{name: "cl-96", ips: []string{"10.140.0.3"}, prefixes: []string{"2001:db8:96::7:0:5/96"},
			wantV6: "2001:db8:96::7:1:0/112"},
		{name: "cl-112", ips: []string{"10.140.0.4"}, prefixes: []string{"2001:db8:112::9:5/112"},
			wantV6: "2001:db8:112::9:8000/113"},
		{name: "cl-123", ips: []string{"10.140.0.5"}, prefixes: []string{"2001:db8:123::a:3/123"},
			wantV6: "2001:db8:123::a:10/124"},
		// the node's IPv6 is its provided IP: the prefix containing it wins over a larger one
		{name: "cl-dual", ips: []string{"10.140.0.6", "2001:db8:d0::6"}, prefixes: []string{"2001:db8:d0::6/64", "2001:db8:d1::6/56"},
			wantV6: "2001:db8:d0:0:1::/80"},
		{name: "cl-tiny", ips: []string{"10.140.0.7"}, prefixes: []string{"2001:db8:126::5/126"},
			wantV6: "fallback", event: ipam.EventReasonNodePrefixTooSmall},
		{name: "cl-ula", ips: []string{"10.140.0.8"}, prefixes: []string{"fd00:99::5/64"},
			wantV6: "fallback"},
		{name: "cl-v4only", ips: []string{"10.140.0.9"}, wantV6: "fallback"},
	}
	for _, c := range cases {
		addrs := []talosnode.Address{{Link: "eth0", Prefix: c.ips[0] + "/24"}}
		for _, p := range c.prefixes {
			addrs = append(addrs, talosnode.Address{Link: "eth0", Prefix: p})
		}
		if _, err := ep.AddNode(c.name, c.ips, talosnode.Spec{Metadata: metal(c.name), Addresses: addrs}); err != nil {
			t.Fatal(err)
		}
	}
	// two nodes on one shared /64: each pod CIDR avoids both hosts' addresses
	// (/80 number 0 is never used, shared-b's address lies in number 1)
	for _, s := range []struct{ name, v4, v6 string }{
		{"cl-shared-a", "10.140.1.1", "2001:db8:5a::a"}, {"cl-shared-b", "10.140.1.2", "2001:db8:5a:0:1::b"},
	} {
		if _, err := ep.AddNode(s.name, []string{s.v4, s.v6}, talosnode.Spec{Metadata: metal(s.name), Addresses: []talosnode.Address{
			{Link: "eth0", Prefix: s.v4 + "/24"}, {Link: "eth0", Prefix: s.v6 + "/64"},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	// a node whose Talos API is down, and one not yet initialized by cloud-node
	down, err := ep.AddNode("cl-down", []string{"10.140.2.1"}, talosnode.Spec{Metadata: metal("cl-down"), Addresses: []talosnode.Address{
		{Link: "eth0", Prefix: "10.140.2.1/24"}, {Link: "eth0", Prefix: "2001:db8:dd::1/64"}}})
	if err != nil {
		t.Fatal(err)
	}
	down.SetUnreachable(true, false)
	if _, err := ep.AddNode("cl-uninit", []string{"10.140.2.2"}, talosnode.Spec{Metadata: metal("cl-uninit"), Addresses: []talosnode.Address{
		{Link: "eth0", Prefix: "10.140.2.2/24"}, {Link: "eth0", Prefix: "2001:db8:ee::2/64"}}}); err != nil {
		t.Fatal(err)
	}

	startController(t, ipam.Config{AllocatorType: ipam.CloudAllocator, ClusterCIDRs: []netip.Prefix{v4, v6}}, tc)
	// shared-b is registered first: shared-a must then avoid its address
	createNode(t, node("cl-shared-b", "10.140.1.2", "2001:db8:5a:0:1::b"))
	waitAllocated(t, 30*time.Second, "cl-shared-b")
	createNode(t, node("cl-shared-a", "10.140.1.1", "2001:db8:5a::a"))
	for _, c := range cases {
		createNode(t, node(c.name, c.ips...))
	}
	createNode(t, node("cl-down", "10.140.2.1"))
	uninit := node("cl-uninit", "10.140.2.2")
	uninit.Spec.Taints = []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	createNode(t, uninit)

	all := []string{"cl-shared-a", "cl-shared-b"}
	for _, c := range cases {
		all = append(all, c.name)
	}
	got := waitAllocated(t, 30*time.Second, all...)
	for _, c := range cases {
		cidrs := got[c.name]
		if len(cidrs) != 2 || !v4.Contains(cidrs[0].Addr()) || cidrs[0].Bits() != 24 {
			t.Errorf("%s: podCIDRs %v, want an IPv4 /24 of %s first", c.name, cidrs, v4)
			continue
		}
		switch c.wantV6 {
		case "fallback":
			if !v6.Contains(cidrs[1].Addr()) || cidrs[1].Bits() != 64 {
				t.Errorf("%s: IPv6 %s, want a /64 of the cluster CIDR %s", c.name, cidrs[1], v6)
			}
		default:
			if cidrs[1].String() != c.wantV6 {
				t.Errorf("%s: IPv6 %s, want %s", c.name, cidrs[1], c.wantV6)
			}
		}
		if c.event != "" {
			ev := waitEvent(t, c.name, c.event, 10*time.Second)
			if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, v6.String()) {
				t.Errorf("%s: %s event %q should be a Warning naming the fallback %s", c.name, c.event, ev.Message, v6)
			}
		}
	}
	shared := []netip.Prefix{got["cl-shared-a"][1], got["cl-shared-b"][1]}
	if shared[0].String() != "2001:db8:5a:0:3::/80" || shared[1].String() != "2001:db8:5a:0:2::/80" {
		t.Errorf("shared /64: a %s, b %s; want 2001:db8:5a:0:3::/80 and 2001:db8:5a:0:2::/80", shared[0], shared[1])
	}
	for _, p := range shared {
		if p.Bits() != 80 || !netip.MustParsePrefix("2001:db8:5a::/64").Contains(p.Addr()) {
			t.Errorf("shared /64: got %s", p)
		}
		for _, host := range []string{"2001:db8:5a::a", "2001:db8:5a:0:1::b"} {
			if p.Contains(netip.MustParseAddr(host)) {
				t.Errorf("pod CIDR %s contains the host address %s", p, host)
			}
		}
	}
	assertNoOverlap(t, got)

	// the unreachable node is reported and waits; the uninitialized one waits silently
	ev := waitEvent(t, "cl-down", ipam.EventReasonTalosAPIUnavailable, 20*time.Second)
	if !strings.Contains(ev.Message, "10.140.2.1") {
		t.Errorf("event should name the address tried: %q", ev.Message)
	}
	for _, n := range listNodes(t) {
		if (n.Name == "cl-down" || n.Name == "cl-uninit") && len(n.Spec.PodCIDRs) > 0 {
			t.Fatalf("%s got %v before its prefix was known", n.Name, n.Spec.PodCIDRs)
		}
	}
	down.SetUnreachable(false, false)
	ctx := context.Background()
	n, err := env.Client.CoreV1().Nodes().Get(ctx, "cl-uninit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil
	if _, err := env.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = waitAllocated(t, 60*time.Second, "cl-down", "cl-uninit")
	if got["cl-down"][1].String() != "2001:db8:dd:0:1::/80" || got["cl-uninit"][1].String() != "2001:db8:ee:0:1::/80" {
		t.Errorf("late nodes: cl-down %v, cl-uninit %v", got["cl-down"], got["cl-uninit"])
	}
	assertNoOverlap(t, got)
	waitMetric(t, "talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": ipam.CloudPoolName}, float64(len(all)+2-3))
}

// Without --cluster-cidr the pod and service CIDRs come from the control
// plane's k8s/ControllerManagerConfig through the Talos API; nodes wait until
// a control-plane node is known.
func TestClusterNetworkFromTalos(t *testing.T) {
	cleanNodes(t)
	ep, tc := talosEndpoint(t)
	cp, err := ep.AddNode("cp-1", []string{"10.150.255.1"}, talosnode.Spec{Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.150.255.1/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	cm := k8s.NewControllerManagerConfig()
	cm.TypedSpec().PodCIDRs = []string{"10.150.0.0/16", "fd00:150::/56"}
	cm.TypedSpec().ServiceCIDRs = []string{"10.150.0.0/20", "fd00:150::/60"}
	if err := cp.State().Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	workers := names("tw-", 10)
	for _, name := range workers {
		createNode(t, node(name))
	}
	// the controller starts before any control-plane node is registered
	r := startControllerNoWait(t, ipam.Config{}, tc)
	select {
	case <-r.c.Ready():
		t.Fatal("ready without cluster CIDRs")
	case <-time.After(2 * time.Second):
	}
	cpNode := node("cp-1", "10.150.255.1")
	cpNode.Labels[ipam.LabelControlPlane] = ""
	createNode(t, cpNode)
	got := waitAllocated(t, 60*time.Second, append(workers, "cp-1")...)
	v4, v6 := netip.MustParsePrefix("10.150.0.0/16"), netip.MustParsePrefix("fd00:150::/56")
	svc4, svc6 := netip.MustParsePrefix("10.150.0.0/20"), netip.MustParsePrefix("fd00:150::/60")
	for name, cidrs := range got {
		if len(cidrs) != 2 || !v4.Contains(cidrs[0].Addr()) || !v6.Contains(cidrs[1].Addr()) {
			t.Errorf("%s: %v, want one CIDR of each of %s, %s", name, cidrs, v4, v6)
			continue
		}
		if cidrs[0].Overlaps(svc4) || cidrs[1].Overlaps(svc6) {
			t.Errorf("%s: %v overlaps the service range", name, cidrs)
		}
	}
	assertNoOverlap(t, got)
	if slices.ContainsFunc(got["tw-0"], func(p netip.Prefix) bool { return p.String() == "10.150.0.0/24" }) {
		t.Error("service range handed out")
	}
}

// The cloud allocator believes only what talos-ccm established for the node
// itself: a node whose provided-node-ip leads to another machine's Talos API
// gets nothing from that machine's prefix (NodeIdentityMismatch), and one
// whose kubelet lists more than one address per family is refused
// (ProvidedNodeIPInvalid). Both wait without pod CIDRs; the honest node is
// served.
func TestCloudAllocatorBelievesOnlyTheNodesOwnTalosAPI(t *testing.T) {
	cleanNodes(t)
	ep, tc := talosEndpoint(t)
	if _, err := ep.AddNode("own-1", []string{"10.141.0.1"}, talosnode.Spec{Metadata: metal("own-1"), Addresses: []talosnode.Address{
		{Link: "eth0", Prefix: "10.141.0.1/24"}, {Link: "eth0", Prefix: "2001:db8:141::1/64"}}}); err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParsePrefix("10.245.0.0/16"), netip.MustParsePrefix("fd00:141::/56")
	startController(t, ipam.Config{AllocatorType: ipam.CloudAllocator, ClusterCIDRs: []netip.Prefix{v4, v6}}, tc)
	createNode(t, node("own-1", "10.141.0.1"))
	createNode(t, node("impostor-1", "10.141.0.1"))
	createNode(t, node("many-1", "10.141.0.2", "10.141.0.3"))

	got := waitAllocated(t, 30*time.Second, "own-1")
	if len(got["own-1"]) != 2 || got["own-1"][1].String() != "2001:db8:141:0:1::/80" {
		t.Fatalf("own-1: %v, want an IPv6 /80 of its own prefix", got["own-1"])
	}
	for name, reason := range map[string]string{"impostor-1": facts.ReasonIdentityMismatch, "many-1": facts.ReasonProvidedIPInvalid} {
		ev := waitEvent(t, name, reason, 30*time.Second)
		if ev.Type != corev1.EventTypeWarning {
			t.Errorf("%s: %s event is %s, want Warning", name, reason, ev.Type)
		}
	}
	for _, n := range listNodes(t) {
		if (n.Name == "impostor-1" || n.Name == "many-1") && (len(n.Spec.PodCIDRs) > 0 || n.Spec.PodCIDR != "") {
			t.Errorf("%s got pod CIDRs %v from facts talos-ccm did not establish for it", n.Name, n.Spec.PodCIDRs)
		}
	}
}

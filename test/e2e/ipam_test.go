package e2e

import (
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// talos-ccm with --allocate-node-cidrs and the cloud allocator: cloud-node
// initializes the nodes, node-ipam-controller then gives each an IPv4 /24 of
// the cluster CIDR and an IPv6 /80 of its own global /64 (or a /64 of the
// cluster's IPv6 CIDR when it has none).
func TestTalosCCMAllocatesPodCIDRs(t *testing.T) {
	ep := startEndpoint(t)
	type ipamNode struct {
		name, ip, prefix6 string // node name, IPv4 (provided-node-ip), global IPv6 address/prefix ("" = none)
		want6             string // expected IPv6 pod CIDR ("" = from the cluster CIDR)
	}
	nodes := []ipamNode{
		{"ipam-1", "10.70.0.1", "2001:db8:71::1/64", "2001:db8:71:0:1::/80"},
		{"ipam-2", "10.70.0.2", "2001:db8:72::1/64", "2001:db8:72:0:1::/80"},
		{"ipam-3", "10.70.0.3", "", ""},
	}
	for _, n := range nodes {
		addrs := []talosnode.Address{{Link: "eth0", Prefix: n.ip + "/24"}}
		if n.prefix6 != "" {
			addrs = append(addrs, talosnode.Address{Link: "eth0", Prefix: n.prefix6})
		}
		if _, err := ep.AddNode(n.name, []string{n.ip}, talosnode.Spec{
			Metadata: &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: n.name}, Addresses: addrs,
		}); err != nil {
			t.Fatal(err)
		}
	}
	v4, v6 := netip.MustParsePrefix("10.180.0.0/16"), netip.MustParsePrefix("fd00:180::/56")
	startTalosCCM(t, talosCCMArgs(t, ep,
		"--allocate-node-cidrs",
		"--cidr-allocator-type=CloudAllocator",
		"--cluster-cidr="+v4.String()+","+v6.String(),
		"--service-cluster-ip-range=10.180.0.0/20",
	))
	for _, n := range nodes {
		register(t, kubeletNode(n.name, n.ip), n.ip)
	}
	for _, n := range nodes {
		got := waitNode(t, n.name, 60*time.Second, func(node *corev1.Node) bool { return initialized(node) && len(node.Spec.PodCIDRs) == 2 })
		c4, err4 := netip.ParsePrefix(got.Spec.PodCIDRs[0])
		c6, err6 := netip.ParsePrefix(got.Spec.PodCIDRs[1])
		if err4 != nil || err6 != nil || got.Spec.PodCIDR != got.Spec.PodCIDRs[0] {
			t.Fatalf("%s: podCIDR %q podCIDRs %v", n.name, got.Spec.PodCIDR, got.Spec.PodCIDRs)
		}
		if !v4.Contains(c4.Addr()) || c4.Bits() != 24 || c4.Overlaps(netip.MustParsePrefix("10.180.0.0/20")) {
			t.Errorf("%s: IPv4 pod CIDR %s, want a /24 of %s outside the service range", n.name, c4, v4)
		}
		switch {
		case n.want6 != "" && c6.String() != n.want6:
			t.Errorf("%s: IPv6 pod CIDR %s, want %s (from its own prefix)", n.name, c6, n.want6)
		case n.want6 == "" && (!v6.Contains(c6.Addr()) || c6.Bits() != 64):
			t.Errorf("%s: IPv6 pod CIDR %s, want a /64 of %s", n.name, c6, v6)
		}
	}
}

// A bad node IPAM flag stops talos-ccm before it starts, naming the flag.
func TestInvalidIPAMFlagsExitNonZero(t *testing.T) {
	ep := startEndpoint(t)
	cmd := exec.Command(filepath.Join(binaries, "talos-ccm"), talosCCMArgs(t, ep,
		"--allocate-node-cidrs", "--cluster-cidr=10.0.0.1/16")...)
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if err == nil || !asExit(err, &exitErr) || exitErr.ExitCode() == 0 {
		t.Fatalf("want non-zero exit, got %v\n%s", err, tail(string(out), 2000))
	}
	if !strings.Contains(string(out), "--cluster-cidr=10.0.0.1/16") || !strings.Contains(string(out), "10.0.0.0/16") {
		t.Errorf("error output should name the flag and the fix:\n%s", tail(string(out), 2000))
	}
}

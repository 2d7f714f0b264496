package ipam

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

func addrs(ss ...string) []talos.Address {
	out := make([]talos.Address, len(ss))
	for i, s := range ss {
		out[i] = talos.Address{Link: "eth0", Prefix: netip.MustParsePrefix(s)}
	}
	return out
}

func TestGlobalPrefix(t *testing.T) {
	cases := []struct {
		name     string   // case
		addrs    []string // the node's Talos AddressStatus prefixes
		nodeIPs  []string // provided-node-ip
		want     string   // chosen prefix ("" = none)
		bits     int      // pod CIDR mask size
		tooSmall bool     // ErrPrefixTooSmall expected
	}{
		{"one /64", []string{"10.0.0.5/24", "2001:db8:1::5/64", "fe80::1/64"}, nil, "2001:db8:1::/64", 80, false},
		{"ULA and link-local only", []string{"fd00::5/64", "fe80::1/64", "10.0.0.5/24"}, nil, "", 0, false},
		{"host route /128 does not count", []string{"2001:db8:2::5/128"}, nil, "", 0, false},
		{"the one with the node IP wins", []string{"2001:db8:3::5/56", "2001:db8:4::5/64"}, []string{"2001:db8:4::5"}, "2001:db8:4::/64", 80, false},
		{"else the largest", []string{"2001:db8:5::5/64", "2001:db8:6::5/56"}, []string{"10.0.0.5"}, "2001:db8:6::/56", 80, false},
		{"else the lowest", []string{"2001:db8:8::5/64", "2001:db8:7::5/64"}, nil, "2001:db8:7::/64", 80, false},
		{"/112", []string{"2001:db8:9::1:5/112"}, nil, "2001:db8:9::1:0/112", 113, false},
		{"/123", []string{"2001:db8:9::1:5/123"}, nil, "2001:db8:9::1:0/123", 124, false},
		{"too small", []string{"2001:db8:9::1:5/126"}, nil, "", 0, true},
		{"too small next to a usable one", []string{"2001:db8:9::1:5/126", "2001:db8:a::5/96"}, nil, "2001:db8:a::/96", 112, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ips []netip.Addr
			for _, s := range c.nodeIPs {
				ips = append(ips, netip.MustParseAddr(s))
			}
			p, bits, found, err := GlobalPrefix(addrs(c.addrs...), ips, 80)
			if c.tooSmall {
				if !found || !errors.Is(err, ErrPrefixTooSmall) {
					t.Fatalf("got %s, %v, %v; want ErrPrefixTooSmall", p, found, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.want == "" {
				if found {
					t.Fatalf("got %s, want none", p)
				}
				return
			}
			if !found || p.String() != c.want || bits != c.bits {
				t.Fatalf("got %s /%d (%v), want %s /%d", p, bits, found, c.want, c.bits)
			}
		})
	}
}

func TestOptionsConfig(t *testing.T) {
	cases := []struct {
		name     string  // case
		opts     Options // flags
		typ      string  // --cidr-allocator-type
		cluster  string  // --cluster-cidr
		wantErr  string  // substring of the error ("" = valid)
		v4, v6   int     // resulting mask sizes (for the cluster CIDRs)
		services int     // number of service CIDRs
	}{
		{name: "defaults dual-stack", opts: Options{Workers: 1}, typ: "RangeAllocator", cluster: "10.244.0.0/16,fd00:10:244::/56", v4: 24, v6: 64},
		{name: "single-stack mask size", opts: Options{Workers: 1, NodeCIDRMaskSize: 26}, typ: "RangeAllocator", cluster: "10.244.0.0/16", v4: 26, v6: 64},
		{name: "per-family", opts: Options{Workers: 1, NodeCIDRMaskSizeIPv4: 25, NodeCIDRMaskSizeIPv6: 80}, typ: "CloudAllocator", cluster: "10.244.0.0/16,2001:db8::/56", v4: 25, v6: 80},
		{name: "from Talos", opts: Options{Workers: 1}, typ: "", cluster: "", v4: 24, v6: 64},
		{name: "service range", opts: Options{Workers: 1, ServiceClusterIPRange: "10.96.0.0/12,fd00:96::/112"}, typ: "RangeAllocator", cluster: "10.244.0.0/16", v4: 24, v6: 64, services: 2},
		{name: "bad type", opts: Options{Workers: 1}, typ: "IPAMFromCluster", cluster: "10.0.0.0/8", wantErr: "--cidr-allocator-type=IPAMFromCluster"},
		{name: "host bits", opts: Options{Workers: 1}, typ: "RangeAllocator", cluster: "10.244.0.1/16", wantErr: "did you mean 10.244.0.0/16"},
		{name: "two IPv4", opts: Options{Workers: 1}, typ: "RangeAllocator", cluster: "10.0.0.0/16,10.1.0.0/16", wantErr: "different families"},
		{name: "mask larger than cluster", opts: Options{Workers: 1, NodeCIDRMaskSizeIPv4: 8}, typ: "RangeAllocator", cluster: "10.0.0.0/16", wantErr: "larger than the cluster CIDR"},
		{name: "ambiguous mask dual-stack", opts: Options{Workers: 1, NodeCIDRMaskSize: 24}, typ: "RangeAllocator", cluster: "10.0.0.0/16,fd00::/48", wantErr: "ambiguous"},
		{name: "unparsable", opts: Options{Workers: 1}, typ: "RangeAllocator", cluster: "10.0.0.0/33", wantErr: "--cluster-cidr=10.0.0.0/33"},
		{name: "bad service", opts: Options{Workers: 1, ServiceClusterIPRange: "nope"}, typ: "RangeAllocator", cluster: "10.0.0.0/16", wantErr: "--service-cluster-ip-range=nope"},
		{name: "no workers", opts: Options{}, typ: "RangeAllocator", cluster: "10.0.0.0/16", wantErr: "--node-ipam-workers=0"},
		{name: "too many subnets", opts: Options{Workers: 1, NodeCIDRMaskSizeIPv6: 120}, typ: "RangeAllocator", cluster: "fd00::/32", wantErr: "more than 2^62"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := c.opts.Config(c.typ, c.cluster)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.typ == "" && cfg.AllocatorType != RangeAllocator {
				t.Errorf("default type = %s", cfg.AllocatorType)
			}
			if len(cfg.ServiceCIDRs) != c.services {
				t.Errorf("services = %v", cfg.ServiceCIDRs)
			}
			for _, p := range cfg.ClusterCIDRs {
				want := c.v4
				if p.Addr().Is6() {
					want = c.v6
				}
				if got := cfg.MaskSize(p, cfg.ClusterCIDRs); got != want {
					t.Errorf("mask size for %s = %d, want %d", p, got, want)
				}
			}
		})
	}
}

func TestAddrsIn(t *testing.T) {
	p := netip.MustParsePrefix("2001:db8:1::/64")
	var in []netip.Addr
	for _, s := range []string{"2001:db8:1::9", "10.0.0.1", "2001:db8:1::2", "2001:db8:2::1", "2001:db8:1::9", "2001:db8:1::2"} {
		in = append(in, netip.MustParseAddr(s))
	}
	got := addrsIn(p, in)
	want := []netip.Addr{netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("2001:db8:1::9")}
	if !slices.Equal(got, want) {
		t.Fatalf("addrsIn(%s, %v) = %v, want %v", p, in, got, want)
	}
	if got := addrsIn(p, nil); len(got) != 0 {
		t.Fatalf("addrsIn of nothing = %v", got)
	}
}

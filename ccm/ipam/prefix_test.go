package ipam

import (
	"errors"
	"net/netip"
	"testing"
)

func TestSubnetArithmetic(t *testing.T) {
	cases := []struct {
		parent string // pool CIDR
		bits   int    // subnet mask size
		idx    uint64 // subnet index
		want   string // idx-th subnet
		last   string // last address of that subnet
		count  uint64 // number of subnets
	}{
		{"10.0.0.0/16", 24, 0, "10.0.0.0/24", "10.0.0.255", 256},
		{"10.0.0.0/16", 24, 255, "10.0.255.0/24", "10.0.255.255", 256},
		{"10.0.0.0/8", 26, 5, "10.0.1.64/26", "10.0.1.127", 1 << 18},
		{"0.0.0.0/0", 32, 1<<32 - 1, "255.255.255.255/32", "255.255.255.255", 1 << 32},
		{"10.0.0.0/24", 24, 0, "10.0.0.0/24", "10.0.0.255", 1},
		{"fd00::/48", 64, 0, "fd00::/64", "fd00::ffff:ffff:ffff:ffff", 65536},
		{"fd00::/48", 64, 65535, "fd00:0:0:ffff::/64", "fd00::ffff:ffff:ffff:ffff:ffff", 65536},
		{"2001:db8:1:2::/64", 80, 1, "2001:db8:1:2:1::/80", "2001:db8:1:2:1:ffff:ffff:ffff", 65536},
		{"2001:db8:1:2::/64", 112, 1<<48 - 1, "2001:db8:1:2:ffff:ffff:ffff:0/112", "2001:db8:1:2:ffff:ffff:ffff:ffff", 1 << 48},
		{"2001:db8::/32", 64, 1 << 31, "2001:db8:8000::/64", "2001:db8:8000:0:ffff:ffff:ffff:ffff", 1 << 32},
		// crossing the 64-bit word boundary of the address
		{"2001:db8::/60", 68, 17, "2001:db8:0:1:1000::/68", "2001:db8:0:1:1fff:ffff:ffff:ffff", 256},
		{"2001:db8::1:0/112", 124, 4095, "2001:db8::1:fff0/124", "2001:db8::1:ffff", 4096},
		{"2001:db8::/123", 124, 1, "2001:db8::10/124", "2001:db8::1f", 2},
	}
	for _, c := range cases {
		t.Run(c.parent+"/"+c.want, func(t *testing.T) {
			parent := netip.MustParsePrefix(c.parent)
			n, err := subnetCount(parent, c.bits)
			if err != nil || n != c.count {
				t.Fatalf("subnetCount = %d, %v; want %d", n, err, c.count)
			}
			got := subnetAt(parent, c.bits, c.idx)
			if got.String() != c.want {
				t.Fatalf("subnetAt = %s, want %s", got, c.want)
			}
			if l := lastAddr(got); l.String() != c.last {
				t.Errorf("lastAddr = %s, want %s", l, c.last)
			}
			if i := subnetIndex(parent, c.bits, got.Addr()); i != c.idx {
				t.Errorf("subnetIndex(first) = %d, want %d", i, c.idx)
			}
			if i := subnetIndex(parent, c.bits, lastAddr(got)); i != c.idx {
				t.Errorf("subnetIndex(last) = %d, want %d", i, c.idx)
			}
		})
	}
}

func TestSubnetCountRejects(t *testing.T) {
	cases := []struct {
		parent string // pool CIDR
		bits   int    // subnet mask size
	}{
		{"10.0.0.0/16", 8},    // larger than the pool
		{"10.0.0.0/16", 33},   // beyond the family
		{"::/0", 64},          // 2^64 subnets
		{"fd00::/48", 129},    // beyond the family
		{"2001:db8::/32", 96}, // 2^64 subnets
	}
	for _, c := range cases {
		if _, err := subnetCount(netip.MustParsePrefix(c.parent), c.bits); !errors.Is(err, errSubnetBits) {
			t.Errorf("subnetCount(%s, /%d) = %v, want errSubnetBits", c.parent, c.bits, err)
		}
	}
}

func TestLastAddrHostRoutes(t *testing.T) {
	for _, p := range []string{"10.1.2.3/32", "2001:db8::5/128"} {
		pp := netip.MustParsePrefix(p)
		if got := lastAddr(pp); got != pp.Addr() {
			t.Errorf("lastAddr(%s) = %s", p, got)
		}
	}
	if got := lastAddr(netip.MustParsePrefix("::/0")); got.String() != "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" {
		t.Errorf("lastAddr(::/0) = %s", got)
	}
	if got := lastAddr(netip.MustParsePrefix("0.0.0.0/0")); got.String() != "255.255.255.255" {
		t.Errorf("lastAddr(0.0.0.0/0) = %s", got)
	}
}

func TestCloudMaskSize(t *testing.T) {
	cases := []struct {
		node       int  // node prefix length
		configured int  // --node-cidr-mask-size-ipv6
		want       int  // pod CIDR mask size
		tooSmall   bool // ErrPrefixTooSmall expected
	}{
		{48, 64, 64, false},   // configured size fits: /64s of a /48
		{56, 64, 64, false},   // /64s of a /56
		{64, 64, 80, false},   // configured = node prefix: 16 bits more
		{64, 80, 80, false},   // explicit /80
		{64, 96, 96, false},   // explicit /96
		{64, 0, 80, false},    // unset
		{80, 64, 96, false},   // /80 → /96
		{96, 64, 112, false},  // /96 → /112
		{100, 64, 112, false}, // capped at /112
		{104, 64, 112, false}, // capped at /112
		{112, 64, 113, false}, // halves once the cap is reached
		{120, 64, 121, false}, // halves
		{123, 64, 124, false}, // the smallest usable prefix: two /124s
		{124, 64, 0, true},    // /125 pod CIDRs would have 8 addresses
		{127, 64, 0, true},    // a point-to-point prefix
		{64, 126, 0, true},    // explicit size too small
		{0, 64, 64, false},    // ::/0 with /64: 2^64 subnets is capped below
	}
	for _, c := range cases {
		got, err := CloudMaskSize(c.node, c.configured)
		if c.tooSmall {
			if !errors.Is(err, ErrPrefixTooSmall) {
				t.Errorf("CloudMaskSize(/%d, %d) = %d, %v; want ErrPrefixTooSmall", c.node, c.configured, got, err)
			}
			continue
		}
		if c.node == 0 {
			// 64 bits of split would overflow the index: it is capped
			if err != nil || got-c.node > maxSubnetBits {
				t.Errorf("CloudMaskSize(/0, 64) = %d, %v", got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("CloudMaskSize(/%d, %d) = %d, %v; want %d", c.node, c.configured, got, err, c.want)
		}
	}
}

func TestIsGlobalIPv6(t *testing.T) {
	cases := []struct {
		addr string // address
		want bool   // global, non-ULA IPv6
	}{
		{"2001:db8::1", true},
		{"2a01:4f8:c17::1", true},
		{"fd00::1", false},  // ULA
		{"fc00::1", false},  // ULA
		{"fe80::1", false},  // link-local
		{"::1", false},      // loopback
		{"ff02::1", false},  // multicast
		{"10.0.0.1", false}, // IPv4
		{"::ffff:8.8.8.8", false},
	}
	for _, c := range cases {
		if got := isGlobalIPv6(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("isGlobalIPv6(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
}

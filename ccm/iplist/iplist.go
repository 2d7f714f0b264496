// Package iplist is the one parser of comma-separated lists of IP addresses
// and CIDRs in talos-ccm: the kubelet's alpha.kubernetes.io/provided-node-ip
// annotation, --cluster-cidr, --service-cluster-ip-range and
// --csr-allowed-ip-ranges. It checks syntax only; how many entries of a family
// are allowed, and whether host bits may be set, is the caller's policy and
// the caller's error message.
package iplist

import (
	"net/netip"
	"slices"
	"strings"
)

// Addrs parses a comma-separated list of IP addresses. Blanks around entries
// and empty entries are ignored (an empty or blank list is no address); an
// IPv4-mapped IPv6 address becomes the IPv4 address. The error is the first
// entry that is not an address (net/netip's error quotes it).
func Addrs(s string) ([]netip.Addr, error) {
	return parse(s, func(e string) (netip.Addr, error) {
		a, err := netip.ParseAddr(e)
		return a.Unmap(), err
	})
}

// Prefixes parses a comma-separated list of CIDRs, as Addrs does addresses.
// Prefixes are kept as written: host bits and IPv4-mapped IPv6 prefixes are
// for the caller to report, not silently corrected.
func Prefixes(s string) ([]netip.Prefix, error) {
	return parse(s, netip.ParsePrefix)
}

func parse[T any](s string, one func(string) (T, error)) ([]T, error) {
	var out []T
	for e := range strings.SplitSeq(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		v, err := one(e)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Join writes a list the way Addrs and Prefixes read it (no blanks).
func Join[T interface{ String() string }](xs []T) string {
	ss := make([]string, len(xs))
	for i, x := range xs {
		ss[i] = x.String()
	}
	return strings.Join(ss, ",")
}

// SortByFamily puts the addresses of the preferred family first and keeps the
// order otherwise; ips is not changed.
func SortByFamily(ips []netip.Addr, preferIPv6 bool) []netip.Addr {
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

// PrefixesValue is a comma-separated list of CIDRs as a command-line flag
// (pflag.Value); setting it replaces the list.
type PrefixesValue []netip.Prefix

// String implements pflag.Value.
func (v *PrefixesValue) String() string { return Join(*v) }

// Set implements pflag.Value.
func (v *PrefixesValue) Set(s string) error {
	ps, err := Prefixes(s)
	if err != nil {
		return err
	}
	*v = ps
	return nil
}

// Type implements pflag.Value.
func (v *PrefixesValue) Type() string { return "cidrs" }

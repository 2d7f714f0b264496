package ipam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
)

// Prefix arithmetic on netip values. IPv4 and IPv6 addresses are handled as
// 128-bit unsigned integers (IPv4 in the low 32 bits) so that one code path
// serves both families.

// u128 is an unsigned 128-bit integer.
type u128 struct{ hi, lo uint64 }

func toU128(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
}

// addr converts back to an address of the family of like.
func (u u128) addr(like netip.Addr) netip.Addr {
	if like.Is4() {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(u.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], u.hi)
	binary.BigEndian.PutUint64(b[8:], u.lo)
	return netip.AddrFrom16(b)
}

func (u u128) add(v u128) u128 {
	lo, carry := bits.Add64(u.lo, v.lo, 0)
	hi, _ := bits.Add64(u.hi, v.hi, carry)
	return u128{hi, lo}
}

func (u u128) sub(v u128) u128 {
	lo, borrow := bits.Sub64(u.lo, v.lo, 0)
	hi, _ := bits.Sub64(u.hi, v.hi, borrow)
	return u128{hi, lo}
}

func (u u128) shl(n int) u128 {
	switch {
	case n <= 0:
		return u
	case n >= 128:
		return u128{}
	case n >= 64:
		return u128{hi: u.lo << (n - 64)}
	}
	return u128{hi: u.hi<<n | u.lo>>(64-n), lo: u.lo << n}
}

func (u u128) shr(n int) u128 {
	switch {
	case n <= 0:
		return u
	case n >= 128:
		return u128{}
	case n >= 64:
		return u128{lo: u.hi >> (n - 64)}
	}
	return u128{hi: u.hi >> n, lo: u.lo>>n | u.hi<<(64-n)}
}

// addrBits is 32 for IPv4 and 128 for IPv6.
func addrBits(a netip.Addr) int { return a.BitLen() }

// maxSubnetBits bounds how many bits a pool may split off its CIDR: indices are
// uint64 and counts must stay exact.
const maxSubnetBits = 62

var errSubnetBits = errors.New("subnet mask size out of range")

// subnetCount is the number of /bits subnets of parent.
func subnetCount(parent netip.Prefix, bits int) (uint64, error) {
	d := bits - parent.Bits()
	if d < 0 || d > maxSubnetBits || bits > addrBits(parent.Addr()) {
		return 0, fmt.Errorf("%w: /%d in %s", errSubnetBits, bits, parent)
	}
	return uint64(1) << d, nil
}

// subnetAt is the idx-th /bits subnet of parent (parent must be masked; idx must
// be below subnetCount).
func subnetAt(parent netip.Prefix, bits int, idx uint64) netip.Prefix {
	base := toU128(parent.Addr())
	off := u128{lo: idx}.shl(addrBits(parent.Addr()) - bits)
	return netip.PrefixFrom(base.add(off).addr(parent.Addr()), bits)
}

// subnetIndex is the index of the /bits subnet of parent that contains a (which
// parent must contain).
func subnetIndex(parent netip.Prefix, bits int, a netip.Addr) uint64 {
	off := toU128(a).sub(toU128(parent.Addr()))
	return off.shr(addrBits(a) - bits).lo
}

// lastAddr is the highest address inside p.
func lastAddr(p netip.Prefix) netip.Addr {
	host := addrBits(p.Addr()) - p.Bits()
	ones := u128{hi: ^uint64(0), lo: ^uint64(0)}.shr(128 - host)
	if host == 0 {
		ones = u128{}
	}
	return toU128(p.Addr()).add(ones).addr(p.Addr())
}

// overlaps reports whether a and b share an address.
func overlaps(a, b netip.Prefix) bool {
	return a.Addr().Is4() == b.Addr().Is4() && a.Overlaps(b)
}

// MinCloudPodAddresses is the smallest pod CIDR the cloud allocator hands out
// (a /124: 16 addresses). A node prefix that cannot be split into at least two
// such subnets (one of them keeps the node's own addresses) is too small.
const MinCloudPodAddresses = 16

// maxCloudMaskSize is the pod CIDR mask size of MinCloudPodAddresses.
const maxCloudMaskSize = 124

// cloudCarveMaxMaskSize caps the automatic split of a large node prefix: a pod
// CIDR never needs to be smaller than a /112 (65536 addresses) just because the
// node prefix is small.
const cloudCarveMaxMaskSize = 112

// ErrPrefixTooSmall means a node's IPv6 prefix has no room for a pod CIDR.
var ErrPrefixTooSmall = errors.New("node prefix too small for a pod CIDR")

// CloudMaskSize is the mask size of the pod CIDRs carved from a node's own IPv6
// prefix of nodeBits bits, given the configured IPv6 mask size:
//
//   - the configured size when it is smaller than the node prefix (a /64 node
//     prefix with --node-cidr-mask-size-ipv6=80 gives /80 pod CIDRs);
//   - otherwise 16 bits more than the node prefix (a /64 gives /80s, a /80 gives
//     /96s, a /96 gives /112s), but never smaller than a /112 unless the node
//     prefix itself is that small, and always at least one bit more than the
//     node prefix (a /112 gives /113s, a /123 gives /124s).
//
// Pod CIDRs smaller than a /124 are refused (ErrPrefixTooSmall).
func CloudMaskSize(nodeBits, configured int) (int, error) {
	if nodeBits < 0 || nodeBits > 128 {
		return 0, fmt.Errorf("invalid IPv6 prefix length /%d", nodeBits)
	}
	m := configured
	if m <= nodeBits {
		m = max(nodeBits+1, min(nodeBits+16, cloudCarveMaxMaskSize))
	}
	if m-nodeBits > maxSubnetBits {
		m = nodeBits + maxSubnetBits
	}
	if m > maxCloudMaskSize {
		return 0, fmt.Errorf("%w: /%d leaves pod CIDRs of /%d (fewer than %d addresses)", ErrPrefixTooSmall, nodeBits, m, MinCloudPodAddresses)
	}
	return m, nil
}

// isGlobalIPv6 reports whether a is a global unicast IPv6 address that is not a
// unique local address (fc00::/7).
func isGlobalIPv6(a netip.Addr) bool {
	return a.Is6() && !a.Is4In6() && a.IsGlobalUnicast() && !a.IsPrivate()
}

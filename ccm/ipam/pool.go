package ipam

import (
	"net/netip"
)

// Pool names for metrics and messages.
const (
	// CloudPoolName labels the pod CIDRs carved from nodes' own IPv6 prefixes
	// (one pool per node prefix, reported together).
	CloudPoolName = "node-ipv6-prefixes"
)

// maxProbes bounds one candidate search (pathological ledgers must not stall a
// worker; the search then reports the pool as exhausted).
const maxProbes = 1 << 22

// pool hands out the /bits subnets of one CIDR: a cluster CIDR (range
// allocator) or one node's IPv6 prefix (cloud allocator). It only proposes
// candidates and keeps counts; the ledger decides whether a candidate is free.
type pool struct {
	name      string // metric label: the CIDR, or CloudPoolName
	cidr      netip.Prefix
	bits      int
	total     uint64 // subnets that may be handed out
	reserved  uint64 // subnets blocked by reservations (service range, skipped first)
	allocated uint64 // subnets held by nodes
	next      uint64 // index where the next search starts
	full      bool   // the last search found nothing and nothing was freed since
	skipFirst bool   // never hand out subnet 0 (cloud pools: subnet-router anycast, gateway ::1)
}

func newPool(name string, cidr netip.Prefix, bits int, skipFirst bool) (*pool, error) {
	n, err := subnetCount(cidr, bits)
	if err != nil {
		return nil, err
	}
	p := &pool{name: name, cidr: cidr.Masked(), bits: bits, total: n, skipFirst: skipFirst}
	if skipFirst {
		p.reserved = 1
		p.next = 1
	}
	return p, nil
}

func (p *pool) free() uint64 {
	used := p.reserved + p.allocated
	if used >= p.total {
		return 0
	}
	return p.total - used
}

// covered is how many subnets of the pool q blocks (q overlaps the pool).
func (p *pool) covered(q netip.Prefix) uint64 {
	switch {
	case q.Bits() <= p.cidr.Bits():
		return p.total
	case q.Bits() >= p.bits:
		return 1
	}
	return uint64(1) << (p.bits - q.Bits())
}

// contains reports whether the address a lies in the candidate subnet.
func containsAny(c netip.Prefix, addrs []netip.Addr) bool {
	for _, a := range addrs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// pick finds a free subnet: not taken in the ledger and containing none of
// avoid. It scans from where the last search ended, jumping over large taken
// prefixes, and wraps around once.
func (p *pool) pick(l *ledger, avoid []netip.Addr) (netip.Prefix, bool) {
	// The counts are exact only while node CIDRs do not overlap each other
	// (overlaps come from foreign writes and are reported), so they are not
	// trusted to declare exhaustion: a failed full scan is.
	if p.full {
		return netip.Prefix{}, false
	}
	probes := 0
	start := p.next % p.total
	for pass := range 2 {
		lo, hi := start, p.total
		if pass == 1 {
			lo, hi = 0, start
		}
		for idx := lo; idx < hi; {
			if probes++; probes > maxProbes {
				return netip.Prefix{}, false
			}
			if p.skipFirst && idx == 0 {
				idx++
				continue
			}
			c := subnetAt(p.cidr, p.bits, idx)
			if containsAny(c, avoid) {
				idx++
				continue
			}
			q, taken := l.conflict(c)
			if !taken {
				p.next = idx + 1
				return c, true
			}
			if q.Bits() < c.Bits() && p.cidr.Contains(lastAddr(q)) {
				// a larger taken prefix: continue after its end
				idx = subnetIndex(p.cidr, p.bits, lastAddr(q)) + 1
				continue
			}
			if q.Bits() < c.Bits() {
				break // it covers the rest of the pool
			}
			idx++
		}
	}
	// what was avoided for this node may be fine for another
	p.full = len(avoid) == 0
	return netip.Prefix{}, false
}

package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// ErrExhausted means a pool has no free subnet for a node.
var ErrExhausted = errors.New("no free CIDR")

// serviceHolder reserves the service range(s).
var serviceHolder = holder{name: "service-cluster-ip-range"}

// Overlap is a CIDR found on a node that overlaps a CIDR held by another node
// or a reservation. It can only come from outside this allocator (another
// writer, an earlier configuration, a manual edit): spec.podCIDRs is
// write-once, so it is reported, never "fixed".
type Overlap struct {
	Node    string       // the node carrying CIDR
	NodeUID types.UID    // and its UID
	CIDR    netip.Prefix // its CIDR
	With    netip.Prefix // the CIDR it overlaps
	By      []string     // holders of With (node names, or "service-cluster-ip-range")
}

// want is one family of a node's request: a subnet of pool that contains none
// of avoid.
type want struct {
	pool  *pool
	avoid []netip.Addr
}

// allocator is the in-memory state of node IPAM: the ledger of taken CIDRs and
// the pools candidates come from, behind one mutex. It never talks to the API;
// the controller rebuilds it from the nodes and keeps it in step with them.
type allocator struct {
	mu       sync.Mutex
	ledger   *ledger
	ranges   []*pool                // one per cluster CIDR, in order
	cloud    map[netip.Prefix]*pool // per node IPv6 prefix
	services []netip.Prefix         // reserved
	cloudOn  bool                   // attribute node prefixes outside the ranges to CloudPoolName
	cloudAll uint64                 // node-held prefixes outside every range pool (cloud mode)
	publish  func(name string, allocated, free uint64)
}

func newAllocator(clusterCIDRs []netip.Prefix, maskSize func(netip.Prefix) int, services []netip.Prefix, cloud bool) (*allocator, error) {
	a := &allocator{ledger: newLedger(), cloud: map[netip.Prefix]*pool{}, cloudOn: cloud,
		services: slices.Clone(services), publish: func(string, uint64, uint64) {}}
	for _, c := range clusterCIDRs {
		p, err := newPool(c.String(), c, maskSize(c), false)
		if err != nil {
			return nil, err
		}
		a.ranges = append(a.ranges, p)
	}
	a.loadServices()
	return a, nil
}

func (a *allocator) loadServices() {
	for _, s := range a.services {
		s = s.Masked()
		a.ledger.add(s, serviceHolder)
		for _, p := range a.ranges {
			if overlaps(p.cidr, s) {
				p.reserved += p.covered(s)
			}
		}
	}
}

// rangePool returns the range pool of a's family, if any.
func (a *allocator) rangePool(is6 bool) *pool {
	for _, p := range a.ranges {
		if p.cidr.Addr().Is6() == is6 {
			return p
		}
	}
	return nil
}

// cloudPool returns (creating it) the pool of /bits subnets of a node's prefix.
func (a *allocator) cloudPool(prefix netip.Prefix, bits int) (*pool, error) {
	prefix = prefix.Masked()
	if p := a.cloud[prefix]; p != nil && p.bits == bits {
		return p, nil
	}
	p, err := newPool(CloudPoolName, prefix, bits, true)
	if err != nil {
		return nil, err
	}
	// count what is already taken inside (adopted after a restart, or reserved)
	if q, ok := a.ledger.conflict(prefix); ok && q.Bits() <= prefix.Bits() {
		p.reserved = p.total
	}
	i, _ := slices.BinarySearchFunc(a.ledger.sorted, prefix, comparePrefix)
	for ; i < len(a.ledger.sorted); i++ {
		q := a.ledger.sorted[i]
		if q.Addr().Is4() || q.Addr().Compare(lastAddr(prefix)) > 0 {
			break
		}
		if q.Bits() <= prefix.Bits() {
			continue
		}
		if slices.ContainsFunc(a.ledger.holders(q), holder.isNode) {
			p.allocated += p.covered(q)
		} else {
			p.reserved += p.covered(q)
		}
	}
	a.cloud[prefix] = p
	return p, nil
}

// cloudPoolFor is cloudPool under the lock.
func (a *allocator) cloudPoolFor(prefix netip.Prefix, bits int) (*pool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cloudPool(prefix, bits)
}

// account adds (sign=+1) or removes (-1) the node-held prefix q from the
// counts of every pool it falls into.
func (a *allocator) account(q netip.Prefix, sign int) {
	in := false
	for _, p := range a.ranges {
		if overlaps(p.cidr, q) {
			in = true
			p.allocated = addSigned(p.allocated, p.covered(q), sign)
			p.full = p.full && sign > 0
		}
	}
	if !a.cloudOn || !q.Addr().Is6() {
		return
	}
	if !in {
		a.cloudAll = addSigned(a.cloudAll, 1, sign)
	}
	for b := q.Bits() - 1; b >= 0 && len(a.cloud) > 0; b-- {
		if p := a.cloud[netip.PrefixFrom(q.Addr(), b).Masked()]; p != nil {
			p.allocated = addSigned(p.allocated, p.covered(q), sign)
			p.full = p.full && sign > 0
		}
	}
}

func addSigned(v, d uint64, sign int) uint64 {
	if sign > 0 {
		return v + d
	}
	if d > v {
		return 0
	}
	return v - d
}

// hold records h on q and keeps the counts; it returns an Overlap when q
// overlaps something another holder has.
func (a *allocator) hold(q netip.Prefix, h holder) *Overlap {
	q = q.Masked()
	var ov *Overlap
	if other, ok := a.ledger.conflict(q); ok {
		var by []string
		for _, o := range a.ledger.holders(other) {
			if o != h {
				by = append(by, o.name)
			}
		}
		if len(by) > 0 {
			ov = &Overlap{Node: h.name, NodeUID: h.uid, CIDR: q, With: other, By: by}
		}
	}
	hadNode := slices.ContainsFunc(a.ledger.holders(q), holder.isNode)
	a.ledger.add(q, h)
	if !hadNode {
		a.account(q, +1)
	}
	return ov
}

// drop forgets that the node uid holds q. It reports whether q is no longer
// held by any node (it may still be reserved).
func (a *allocator) drop(q netip.Prefix, uid types.UID) bool {
	before := slices.ContainsFunc(a.ledger.holders(q), holder.isNode)
	if !a.ledger.remove(q, uid) {
		return false
	}
	if before && !slices.ContainsFunc(a.ledger.holders(q), holder.isNode) {
		a.account(q, -1)
		return true
	}
	return false
}

// reserve takes one subnet per want for the node h, all or nothing. If the node
// already holds CIDRs (an earlier attempt whose write may have landed), it gets
// the same ones again, so retries are idempotent.
func (a *allocator) reserve(h holder, wants []want) ([]netip.Prefix, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	have := a.ledger.of(h.uid)
	out := make([]netip.Prefix, 0, len(wants))
	for _, w := range wants {
		if i := slices.IndexFunc(have, func(q netip.Prefix) bool { return q.Addr().Is6() == w.pool.cidr.Addr().Is6() }); i >= 0 {
			out = append(out, have[i])
			continue
		}
		c, ok := w.pool.pick(a.ledger, w.avoid)
		if !ok {
			for _, q := range out {
				if !slices.Contains(have, q) {
					a.drop(q, h.uid)
				}
			}
			a.emit()
			return nil, fmt.Errorf("%w: pool %s has no free /%d (%d allocated, %d reserved of %d): %w",
				ErrExhausted, w.pool.cidr, w.pool.bits, w.pool.allocated, w.pool.reserved, w.pool.total, &exhaustedPool{name: w.pool.name})
		}
		a.hold(c, h)
		out = append(out, c)
	}
	a.emit()
	return out, nil
}

// exhaustedPool carries the metric label of the exhausted pool.
type exhaustedPool struct{ name string }

func (e *exhaustedPool) Error() string { return "pool " + e.name }

// observe records the CIDRs a node carries in the API.
func (a *allocator) observe(h holder, cidrs []netip.Prefix) []Overlap {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Overlap
	have := a.ledger.of(h.uid)
	for _, c := range cidrs {
		if slices.Contains(have, c.Masked()) {
			continue
		}
		if ov := a.hold(c, h); ov != nil {
			out = append(out, *ov)
		}
	}
	// anything else held for the node (a reservation whose write lost) is free again
	for _, q := range have {
		if !slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Masked() == q }) {
			a.drop(q, h.uid)
		}
	}
	a.emit()
	return out
}

// release frees everything the node uid holds; it reports whether anything
// became free.
func (a *allocator) release(uid types.UID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	freed := false
	for _, q := range a.ledger.of(uid) {
		freed = a.drop(q, uid) || freed
	}
	if freed {
		a.emit()
	}
	return freed
}

// held lists what the node uid holds.
func (a *allocator) held(uid types.UID) []netip.Prefix {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ledger.of(uid)
}

// nodeCIDRs is what one node carries, for rebuild.
type nodeCIDRs struct {
	holder
	cidrs []netip.Prefix
}

// rebuild replaces the state with the service reservations and the CIDRs the
// nodes carry, sorting once, and returns the overlaps among them.
func (a *allocator) rebuild(nodes []nodeCIDRs) []Overlap {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.ranges {
		p.allocated, p.reserved, p.full = 0, 0, false
	}
	a.cloud = map[netip.Prefix]*pool{}
	a.cloudAll = 0
	entries := map[netip.Prefix][]holder{}
	for _, s := range a.services {
		entries[s.Masked()] = append(entries[s.Masked()], serviceHolder)
	}
	for _, n := range nodes {
		for _, c := range n.cidrs {
			c = c.Masked()
			if !slices.Contains(entries[c], n.holder) {
				entries[c] = append(entries[c], n.holder)
			}
		}
	}
	a.ledger.bulkLoad(entries)
	for _, s := range a.services {
		for _, p := range a.ranges {
			if overlaps(p.cidr, s) {
				p.reserved += p.covered(s)
			}
		}
	}
	var out []Overlap
	// in (address, length) order a prefix nested in another follows it: keep
	// the chain of prefixes that are still "open" at the current address
	var open []netip.Prefix
	for _, q := range a.ledger.sorted {
		hs := a.ledger.held[q]
		nodeHeld := slices.ContainsFunc(hs, holder.isNode)
		if nodeHeld {
			a.account(q, +1)
		}
		for len(open) > 0 && (open[len(open)-1].Addr().Is4() != q.Addr().Is4() || lastAddr(open[len(open)-1]).Compare(q.Addr()) < 0) {
			open = open[:len(open)-1]
		}
		if len(hs) > 1 {
			for _, h := range hs[1:] {
				if h.isNode() {
					out = append(out, Overlap{Node: h.name, NodeUID: h.uid, CIDR: q, With: q, By: holderNames(hs[:1])})
				}
			}
		}
		if len(open) > 0 && nodeHeld {
			outer := open[len(open)-1]
			for _, h := range hs {
				if h.isNode() {
					out = append(out, Overlap{Node: h.name, NodeUID: h.uid, CIDR: q, With: outer, By: holderNames(a.ledger.held[outer])})
				}
			}
		}
		open = append(open, q)
	}
	a.emit()
	return out
}

func holderNames(hs []holder) []string {
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		out = append(out, h.name)
	}
	return out
}

// emit publishes the counts of every pool.
func (a *allocator) emit() {
	for _, p := range a.ranges {
		a.publish(p.name, p.allocated, p.free())
	}
	if a.cloudOn {
		var free uint64
		for _, p := range a.cloud {
			free += p.free()
		}
		a.publish(CloudPoolName, a.cloudAll, free)
	}
}

// stats returns allocated and free of every pool (by metric name).
func (a *allocator) stats() map[string][2]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string][2]uint64{}
	for _, p := range a.ranges {
		out[p.name] = [2]uint64{p.allocated, p.free()}
	}
	if a.cloudOn {
		var free uint64
		for _, p := range a.cloud {
			free += p.free()
		}
		out[CloudPoolName] = [2]uint64{a.cloudAll, free}
	}
	return out
}

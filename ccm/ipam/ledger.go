package ipam

import (
	"cmp"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// holder is who holds a CIDR: a node (by UID, the name is for messages) or a
// reservation (empty UID), such as the service range.
type holder struct {
	uid  types.UID
	name string
}

func (h holder) isNode() bool { return h.uid != "" }

// ledger records every CIDR that is taken and answers "does this candidate
// overlap anything taken?" exactly, for any mix of prefix lengths. It is the
// single source of truth against overlaps; pools only choose candidates.
//
// Prefixes are either nested or disjoint, so a candidate overlaps something
// taken iff a taken prefix contains it (found by looking up its ancestors) or a
// taken prefix starts inside it (found by a binary search over the taken
// prefixes sorted by address).
type ledger struct {
	held   map[netip.Prefix][]holder
	sorted []netip.Prefix // keys of held, ordered by (address, length)
	byUID  map[types.UID][]netip.Prefix
}

func newLedger() *ledger {
	return &ledger{held: map[netip.Prefix][]holder{}, byUID: map[types.UID][]netip.Prefix{}}
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// conflict returns a taken prefix that overlaps p, preferring the largest one
// that contains p (so that a scan can jump past it).
func (l *ledger) conflict(p netip.Prefix) (netip.Prefix, bool) {
	for b := 0; b <= p.Bits(); b++ {
		q := netip.PrefixFrom(p.Addr(), b).Masked()
		if _, ok := l.held[q]; ok {
			return q, true
		}
	}
	// the first taken prefix sorting after p starts inside p iff it is nested in p
	if i, _ := slices.BinarySearchFunc(l.sorted, p, comparePrefix); i < len(l.sorted) {
		q := l.sorted[i]
		if q.Addr().Is4() == p.Addr().Is4() && q.Addr().Compare(lastAddr(p)) <= 0 {
			return q, true
		}
	}
	return netip.Prefix{}, false
}

// add records that h holds p. It reports whether p was free before.
func (l *ledger) add(p netip.Prefix, h holder) (first bool) {
	hs, taken := l.held[p]
	if slices.Contains(hs, h) {
		return false
	}
	if !taken {
		i, _ := slices.BinarySearchFunc(l.sorted, p, comparePrefix)
		l.sorted = slices.Insert(l.sorted, i, p)
	}
	l.held[p] = append(hs, h)
	if h.isNode() {
		l.byUID[h.uid] = append(l.byUID[h.uid], p)
	}
	return !taken
}

// remove forgets that the node uid holds p. It reports whether uid held p.
func (l *ledger) remove(p netip.Prefix, uid types.UID) (removed bool) {
	hs, ok := l.held[p]
	if !ok {
		return false
	}
	i := slices.IndexFunc(hs, func(h holder) bool { return h.uid == uid })
	if i < 0 {
		return false
	}
	hs = slices.Delete(hs, i, i+1)
	if ps := slices.DeleteFunc(l.byUID[uid], func(q netip.Prefix) bool { return q == p }); len(ps) > 0 {
		l.byUID[uid] = ps
	} else {
		delete(l.byUID, uid)
	}
	if len(hs) > 0 {
		l.held[p] = hs
		return true
	}
	delete(l.held, p)
	if j, found := slices.BinarySearchFunc(l.sorted, p, comparePrefix); found {
		l.sorted = slices.Delete(l.sorted, j, j+1)
	}
	return true
}

// holders of exactly p.
func (l *ledger) holders(p netip.Prefix) []holder { return l.held[p] }

// of lists the prefixes the node uid holds.
func (l *ledger) of(uid types.UID) []netip.Prefix { return slices.Clone(l.byUID[uid]) }

// bulkLoad replaces the content with entries, sorting once (start-up rebuild).
func (l *ledger) bulkLoad(entries map[netip.Prefix][]holder) {
	l.held = entries
	l.byUID = map[types.UID][]netip.Prefix{}
	l.sorted = make([]netip.Prefix, 0, len(entries))
	for p, hs := range entries {
		l.sorted = append(l.sorted, p)
		for _, h := range hs {
			if h.isNode() {
				l.byUID[h.uid] = append(l.byUID[h.uid], p)
			}
		}
	}
	slices.SortFunc(l.sorted, comparePrefix)
}

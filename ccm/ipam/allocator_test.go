package ipam

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func nodeHolder(i int) holder {
	return holder{uid: types.UID(fmt.Sprintf("uid-%d", i)), name: fmt.Sprintf("node-%d", i)}
}

// newTestAllocator builds an allocator over cluster CIDRs with one mask size
// per family.
func newTestAllocator(t *testing.T, cluster []netip.Prefix, v4, v6 int, services []netip.Prefix, cloud bool) *allocator {
	t.Helper()
	a, err := newAllocator(cluster, func(p netip.Prefix) int {
		if p.Addr().Is4() {
			return v4
		}
		return v6
	}, services, cloud)
	if err != nil {
		t.Fatal(err)
	}
	a.rebuild(nil)
	return a
}

func rangeWants(a *allocator) []want {
	var ws []want
	for _, p := range a.ranges {
		ws = append(ws, want{pool: p})
	}
	return ws
}

// assertDisjoint fails if any two node-held CIDRs overlap.
func assertDisjoint(t *testing.T, a *allocator) {
	t.Helper()
	var all []netip.Prefix
	for p, hs := range a.ledger.held {
		if slices.ContainsFunc(hs, holder.isNode) {
			if len(hs) > 1 {
				t.Fatalf("%s held by %v", p, hs)
			}
			all = append(all, p)
		}
	}
	slices.SortFunc(all, comparePrefix)
	for i := 1; i < len(all); i++ {
		if overlaps(all[i-1], all[i]) {
			t.Fatalf("overlap: %s and %s", all[i-1], all[i])
		}
	}
}

func TestRangeAllocationDualStack(t *testing.T) {
	a := newTestAllocator(t, mustPrefixes("10.10.0.0/22", "fd10::/62"), 24, 64, nil, false)
	var got [][]netip.Prefix
	for i := range 4 {
		cidrs, err := a.reserve(nodeHolder(i), rangeWants(a))
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		got = append(got, cidrs)
	}
	want := [][]string{
		{"10.10.0.0/24", "fd10::/64"}, {"10.10.1.0/24", "fd10:0:0:1::/64"},
		{"10.10.2.0/24", "fd10:0:0:2::/64"}, {"10.10.3.0/24", "fd10:0:0:3::/64"},
	}
	for i := range want {
		if fmt.Sprint(got[i]) != fmt.Sprint(mustPrefixes(want[i]...)) {
			t.Errorf("node %d: %v, want %v", i, got[i], want[i])
		}
	}
	// exhausted: the fifth node gets nothing, in neither family
	if _, err := a.reserve(nodeHolder(4), rangeWants(a)); !errors.Is(err, ErrExhausted) {
		t.Fatalf("fifth node: %v, want ErrExhausted", err)
	}
	if held := a.held(nodeHolder(4).uid); len(held) != 0 {
		t.Fatalf("partial reservation kept: %v", held)
	}
	if s := a.stats(); s["10.10.0.0/22"] != [2]uint64{4, 0} || s["fd10::/62"] != [2]uint64{4, 0} {
		t.Fatalf("stats = %v", s)
	}
	// a deleted node's CIDRs go to the next node
	if !a.release(nodeHolder(1).uid) {
		t.Fatal("release freed nothing")
	}
	cidrs, err := a.reserve(nodeHolder(4), rangeWants(a))
	if err != nil || fmt.Sprint(cidrs) != fmt.Sprint(mustPrefixes("10.10.1.0/24", "fd10:0:0:1::/64")) {
		t.Fatalf("after release: %v, %v", cidrs, err)
	}
	// a retry for the same node gets the same CIDRs
	again, err := a.reserve(nodeHolder(4), rangeWants(a))
	if err != nil || fmt.Sprint(again) != fmt.Sprint(cidrs) {
		t.Fatalf("retry: %v, %v", again, err)
	}
	assertDisjoint(t, a)
}

// One family exhausted must not leave the other family allocated.
func TestExhaustionIsAllOrNothing(t *testing.T) {
	a := newTestAllocator(t, mustPrefixes("10.20.0.0/16", "fd20::/63"), 24, 64, nil, false)
	for i := range 2 {
		if _, err := a.reserve(nodeHolder(i), rangeWants(a)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := a.reserve(nodeHolder(2), rangeWants(a))
	var ep *exhaustedPool
	if !errors.Is(err, ErrExhausted) || !errors.As(err, &ep) || ep.name != "fd20::/63" {
		t.Fatalf("err = %v, want exhaustion of fd20::/63", err)
	}
	if s := a.stats(); s["10.20.0.0/16"] != [2]uint64{2, 254} {
		t.Fatalf("IPv4 pool kept a partial allocation: %v", s)
	}
}

func TestServiceRangeIsNeverHandedOut(t *testing.T) {
	cases := []struct {
		name     string // case
		cluster  string // cluster CIDR
		mask     int    // node mask size
		services string // service CIDR
		first    string // first CIDR handed out ("" = exhausted)
		free     uint64 // free subnets before the first allocation
	}{
		{"service at the start", "10.0.0.0/16", 24, "10.0.0.0/20", "10.0.16.0/24", 240},
		{"service inside one subnet", "10.0.0.0/16", 24, "10.0.0.128/25", "10.0.1.0/24", 255},
		{"service elsewhere", "10.0.0.0/16", 24, "10.96.0.0/12", "10.0.0.0/24", 256},
		{"service covers the pool", "10.0.0.0/16", 24, "10.0.0.0/8", "", 0},
		{"IPv6 service in the middle", "fd00::/56", 64, "fd00:0:0:0::/60", "fd00:0:0:10::/64", 240},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newTestAllocator(t, mustPrefixes(c.cluster), c.mask, c.mask, mustPrefixes(c.services), false)
			if got := a.stats()[c.cluster][1]; got != c.free {
				t.Errorf("free = %d, want %d", got, c.free)
			}
			cidrs, err := a.reserve(nodeHolder(0), rangeWants(a))
			if c.first == "" {
				if !errors.Is(err, ErrExhausted) {
					t.Fatalf("got %v, %v; want exhausted", cidrs, err)
				}
				return
			}
			if err != nil || cidrs[0].String() != c.first {
				t.Fatalf("first = %v, %v; want %s", cidrs, err, c.first)
			}
			// fill the pool: nothing ever overlaps the service range
			svc := netip.MustParsePrefix(c.services)
			for i := 1; ; i++ {
				cidrs, err := a.reserve(nodeHolder(i), rangeWants(a))
				if err != nil {
					break
				}
				if overlaps(cidrs[0], svc) {
					t.Fatalf("handed out %s inside the service range %s", cidrs[0], svc)
				}
			}
			assertDisjoint(t, a)
		})
	}
}

func TestRebuildAdoptsAndReportsOverlaps(t *testing.T) {
	a := newTestAllocator(t, mustPrefixes("10.30.0.0/22"), 24, 64, mustPrefixes("10.96.0.0/12"), false)
	overlaps := a.rebuild([]nodeCIDRs{
		{nodeHolder(1), mustPrefixes("10.30.0.0/24")},
		{nodeHolder(2), mustPrefixes("10.30.2.0/24")},
		{nodeHolder(3), mustPrefixes("10.30.2.0/24")},   // duplicate of node-2 (written by someone else)
		{nodeHolder(4), mustPrefixes("10.30.2.128/25")}, // nested in node-2's
		{nodeHolder(5), mustPrefixes("10.99.0.0/24")},   // inside the service range
		{nodeHolder(6), mustPrefixes("192.168.0.0/24")}, // outside every pool (old configuration)
	})
	got := map[string]bool{}
	for _, o := range overlaps {
		got[o.Node+" "+o.CIDR.String()+" "+o.With.String()] = true
	}
	for _, w := range []string{
		"node-3 10.30.2.0/24 10.30.2.0/24",
		"node-4 10.30.2.128/25 10.30.2.0/24",
		"node-5 10.99.0.0/24 10.96.0.0/12",
	} {
		if !got[w] {
			t.Errorf("overlap %q not reported; got %v", w, overlaps)
		}
	}
	if len(overlaps) != 3 {
		t.Errorf("overlaps = %v", overlaps)
	}
	// only 10.30.1.0/24 and 10.30.3.0/24 are free
	var out []string
	for i := 10; ; i++ {
		cidrs, err := a.reserve(nodeHolder(i), rangeWants(a))
		if err != nil {
			break
		}
		out = append(out, cidrs[0].String())
	}
	if fmt.Sprint(out) != "[10.30.1.0/24 10.30.3.0/24]" {
		t.Fatalf("allocated after rebuild: %v", out)
	}
	// node-2 and node-3 share 10.30.2.0/24: it becomes free only when both are gone
	a.release(nodeHolder(2).uid)
	if _, err := a.reserve(nodeHolder(20), rangeWants(a)); !errors.Is(err, ErrExhausted) {
		t.Fatalf("a CIDR still held by node-3 was handed out: %v", err)
	}
	a.release(nodeHolder(3).uid)
	a.release(nodeHolder(4).uid)
	cidrs, err := a.reserve(nodeHolder(20), rangeWants(a))
	if err != nil || cidrs[0].String() != "10.30.2.0/24" {
		t.Fatalf("after both holders left: %v, %v", cidrs, err)
	}
}

func TestObserveForeignWrites(t *testing.T) {
	a := newTestAllocator(t, mustPrefixes("10.40.0.0/22"), 24, 64, nil, false)
	// another writer gave node-1 the CIDR our cursor would pick next
	if ov := a.observe(nodeHolder(1), mustPrefixes("10.40.0.0/24")); len(ov) != 0 {
		t.Fatalf("unexpected overlaps %v", ov)
	}
	cidrs, err := a.reserve(nodeHolder(2), rangeWants(a))
	if err != nil || cidrs[0].String() != "10.40.1.0/24" {
		t.Fatalf("reserve = %v, %v", cidrs, err)
	}
	// our write for node-2 lost: the API says it has 10.40.3.0/24; ours is free again
	if ov := a.observe(nodeHolder(2), mustPrefixes("10.40.3.0/24")); len(ov) != 0 {
		t.Fatalf("unexpected overlaps %v", ov)
	}
	if held := a.held(nodeHolder(2).uid); fmt.Sprint(held) != "[10.40.3.0/24]" {
		t.Fatalf("node-2 holds %v", held)
	}
	// a write that overlaps another node's CIDR is recorded and reported
	ov := a.observe(nodeHolder(3), mustPrefixes("10.40.3.0/25"))
	if len(ov) != 1 || ov[0].With.String() != "10.40.3.0/24" || fmt.Sprint(ov[0].By) != "[node-2]" {
		t.Fatalf("overlaps = %v", ov)
	}
	var out []string
	for i := 10; ; i++ {
		cidrs, err := a.reserve(nodeHolder(i), rangeWants(a))
		if err != nil {
			break
		}
		out = append(out, cidrs[0].String())
	}
	slices.Sort(out)
	if fmt.Sprint(out) != "[10.40.1.0/24 10.40.2.0/24]" {
		t.Fatalf("allocated: %v", out)
	}
}

func TestCloudPoolCarving(t *testing.T) {
	cases := []struct {
		name   string   // case
		prefix string   // the node's global prefix
		avoid  []string // addresses to keep out (the node's and its neighbours')
		want   []string // CIDRs handed out one after another until exhausted
	}{
		{"/64 split into /80s, subnet 0 skipped", "2001:db8:1:2::/64", []string{"2001:db8:1:2::5"},
			[]string{"2001:db8:1:2:1::/80", "2001:db8:1:2:2::/80"}},
		{"/64 with a SLAAC address in subnet 1", "2001:db8:1:3::/64", []string{"2001:db8:1:3:1:2:3:4"},
			[]string{"2001:db8:1:3:2::/80", "2001:db8:1:3:3::/80"}},
		{"/80 split into /96s", "2001:db8:1:4:5::/80", []string{"2001:db8:1:4:5::1"},
			[]string{"2001:db8:1:4:5:1::/96", "2001:db8:1:4:5:2::/96"}},
		{"/96 split into /112s", "2001:db8::7:0:0/96", []string{"2001:db8::7:0:1"},
			[]string{"2001:db8::7:1:0/112", "2001:db8::7:2:0/112"}},
		{"/112 halved", "2001:db8::8:0/112", []string{"2001:db8::8:1"},
			[]string{"2001:db8::8:8000/113"}},
		{"/112 with the address in the upper half", "2001:db8::9:0/112", []string{"2001:db8::9:9000"},
			nil},
		{"/123 halved", "2001:db8::a:0/123", []string{"2001:db8::a:3"},
			[]string{"2001:db8::a:10/124"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newTestAllocator(t, mustPrefixes("10.50.0.0/16", "fd50::/56"), 24, 64, nil, true)
			prefix := netip.MustParsePrefix(c.prefix)
			bits, err := CloudMaskSize(prefix.Bits(), 80)
			if err != nil {
				t.Fatal(err)
			}
			var avoid []netip.Addr
			for _, s := range c.avoid {
				avoid = append(avoid, netip.MustParseAddr(s))
			}
			var got []string
			for i := range len(c.want) + 1 {
				p, err := a.cloudPoolFor(prefix, bits)
				if err != nil {
					t.Fatal(err)
				}
				cidrs, err := a.reserve(nodeHolder(i), []want{{pool: p, avoid: avoid}})
				if err != nil {
					if !errors.Is(err, ErrExhausted) {
						t.Fatal(err)
					}
					if len(c.want) > 2 || i < len(c.want) {
						t.Fatalf("exhausted after %v", got)
					}
					break
				}
				got = append(got, cidrs[0].String())
				if len(got) == 2 && len(c.want) == 2 {
					break
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) && !(len(got) == 0 && len(c.want) == 0) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for _, s := range got {
				for _, ad := range avoid {
					if netip.MustParsePrefix(s).Contains(ad) {
						t.Fatalf("%s contains the host address %s", s, ad)
					}
				}
			}
			if s := a.stats()[CloudPoolName]; s[0] != uint64(len(got)) {
				t.Errorf("cloud allocated = %d, want %d", s[0], len(got))
			}
		})
	}
}

// After a restart the cloud pool of a prefix counts what nodes already carry.
func TestCloudPoolAfterRebuild(t *testing.T) {
	a := newTestAllocator(t, mustPrefixes("10.60.0.0/16", "fd60::/56"), 24, 64, nil, true)
	a.rebuild([]nodeCIDRs{
		{nodeHolder(1), mustPrefixes("10.60.0.0/24", "2001:db8:6::8000/113")},
	})
	p, err := a.cloudPoolFor(netip.MustParsePrefix("2001:db8:6::/112"), 113)
	if err != nil {
		t.Fatal(err)
	}
	if p.free() != 0 {
		t.Fatalf("free = %d, want 0 (subnet 0 skipped, subnet 1 held)", p.free())
	}
	if _, err := a.reserve(nodeHolder(2), []want{{pool: p}}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("want exhausted, got %v", err)
	}
	if s := a.stats()[CloudPoolName]; s[0] != 1 {
		t.Fatalf("cloud allocated = %v", s)
	}
}

// Random churn with mixed foreign writes: whatever the allocator hands out
// never overlaps anything held, and its counts match the ledger.
func TestRandomChurnNeverOverlaps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	a := newTestAllocator(t, mustPrefixes("10.70.0.0/20", "fd70::/58"), 26, 64, mustPrefixes("10.70.0.0/23"), false)
	live := map[int]bool{}
	for step := range 20000 {
		i := r.IntN(300)
		switch op := r.IntN(10); {
		case op < 6 && !live[i]:
			if _, err := a.reserve(nodeHolder(i), rangeWants(a)); err == nil {
				live[i] = true
			} else if !errors.Is(err, ErrExhausted) {
				t.Fatal(err)
			}
		case op < 9 && live[i]:
			a.release(nodeHolder(i).uid)
			delete(live, i)
		case op == 9 && !live[i]:
			// a foreign write of some IPv4 /26..28 that may collide: recorded, never reused
			q := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 70, byte(r.IntN(16)), byte(r.IntN(4) * 64)}), 26+r.IntN(3)).Masked()
			a.observe(nodeHolder(i), []netip.Prefix{q})
			live[i] = true
		}
		if step%500 == 0 {
			var v4 uint64
			for p, hs := range a.ledger.held {
				if p.Addr().Is4() && slices.ContainsFunc(hs, holder.isNode) && a.ranges[0].cidr.Overlaps(p) {
					v4++
				}
			}
			if got := a.stats()["10.70.0.0/20"][0]; got != v4 {
				t.Fatalf("step %d: allocated = %d, ledger has %d", step, got, v4)
			}
		}
	}
	// only CIDRs the allocator handed out are checked for disjointness; foreign
	// writes may overlap each other by construction
	var handed []netip.Prefix
	for i := range live {
		for _, p := range a.held(nodeHolder(i).uid) {
			if p.Addr().Is6() || p.Bits() == 26 {
				handed = append(handed, p)
			}
		}
	}
	slices.SortFunc(handed, comparePrefix)
	for i := 1; i < len(handed); i++ {
		if handed[i-1] == handed[i] && handed[i].Addr().Is6() {
			t.Fatalf("IPv6 %s handed out twice", handed[i])
		}
	}
}

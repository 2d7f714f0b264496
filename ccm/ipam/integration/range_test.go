package integration

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/ipam"
)

// 230 nodes registered at once get one CIDR per family, in the cluster's
// family order, disjoint, outside the service range; deleted nodes' CIDRs go
// to new nodes.
func TestRangeAllocationDualStack(t *testing.T) {
	cleanNodes(t)
	v4, v6 := netip.MustParsePrefix("10.128.0.0/16"), netip.MustParsePrefix("fd00:128::/56")
	svc := netip.MustParsePrefix("10.128.0.0/20")
	startController(t, ipam.Config{
		AllocatorType: ipam.RangeAllocator,
		ClusterCIDRs:  []netip.Prefix{v4, v6},
		ServiceCIDRs:  []netip.Prefix{svc},
	}, nil)

	all := names("ds-", 230)
	var wg sync.WaitGroup
	for _, name := range all {
		wg.Go(func() { createNode(t, node(name)) })
	}
	wg.Wait()
	got := waitAllocated(t, 60*time.Second, all...)
	for _, name := range all {
		cidrs := got[name]
		if len(cidrs) != 2 {
			t.Fatalf("%s: podCIDRs %v, want one per family", name, cidrs)
		}
		if !v4.Contains(cidrs[0].Addr()) || cidrs[0].Bits() != 24 {
			t.Errorf("%s: IPv4 %s not a /24 of %s (or not first)", name, cidrs[0], v4)
		}
		if !v6.Contains(cidrs[1].Addr()) || cidrs[1].Bits() != 64 {
			t.Errorf("%s: IPv6 %s not a /64 of %s", name, cidrs[1], v6)
		}
		if cidrs[0].Overlaps(svc) {
			t.Errorf("%s: %s inside the service range %s", name, cidrs[0], svc)
		}
	}
	assertNoOverlap(t, got)
	waitMetric(t, "talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": v4.String()}, 230)
	waitMetric(t, "talos_ccm_ipam_cidrs_free", map[string]string{"pool": v4.String()}, 256-16-230)
	waitMetric(t, "talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": v6.String()}, 230)
	waitMetric(t, "talos_ccm_ipam_cidrs_free", map[string]string{"pool": v6.String()}, 256-230)

	// delete 40, add 40: the pool has 10 never-used /24s left, so at least 30
	// newcomers get a freed CIDR
	freed := map[netip.Prefix]bool{}
	for _, name := range all[:40] {
		freed[got[name][0]] = true
		deleteNode(t, name)
	}
	waitMetric(t, "talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": v4.String()}, 190)
	more := names("ds-new-", 40)
	for _, name := range more {
		createNode(t, node(name))
	}
	got = waitAllocated(t, 60*time.Second, more...)
	reused := 0
	for _, name := range more {
		if freed[got[name][0]] {
			reused++
		}
	}
	if reused < 30 {
		t.Errorf("only %d of 40 new nodes got a freed CIDR", reused)
	}
	assertNoOverlap(t, got)
	waitMetric(t, "talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": v4.String()}, 230)
}

// A pool of four: the fifth and sixth nodes wait with a Warning event and a
// metric, without crashing or retrying in a tight loop, and get CIDRs as soon
// as nodes are deleted.
func TestExhaustionAndRecovery(t *testing.T) {
	cleanNodes(t)
	pool := netip.MustParsePrefix("10.131.0.0/28")
	startController(t, ipam.Config{ClusterCIDRs: []netip.Prefix{pool}, NodeCIDRMaskSizeIPv4: 30}, nil)
	labels := map[string]string{"pool": pool.String()}
	before := metric(t, "talos_ccm_ipam_exhausted_total", labels)

	first := names("small-", 4)
	for _, name := range first {
		createNode(t, node(name))
	}
	got := waitAllocated(t, 30*time.Second, first...)
	assertNoOverlap(t, got)
	createNode(t, node("small-late-0"))
	createNode(t, node("small-late-1"))
	for _, name := range []string{"small-late-0", "small-late-1"} {
		ev := waitEvent(t, name, ipam.EventReasonCIDRNotAvailable, 20*time.Second)
		if ev.Type != "Warning" || !strings.Contains(ev.Message, pool.String()) {
			t.Errorf("event %s: %q", ev.Type, ev.Message)
		}
	}
	if m := metric(t, "talos_ccm_ipam_exhausted_total", labels); m <= before {
		t.Errorf("exhausted_total did not grow: %v", m)
	}
	waitMetric(t, "talos_ccm_ipam_cidrs_free", labels, 0)
	for _, n := range listNodes(t) {
		if (n.Name == "small-late-0" || n.Name == "small-late-1") && len(n.Spec.PodCIDRs) > 0 {
			t.Fatalf("%s got %v from an exhausted pool", n.Name, n.Spec.PodCIDRs)
		}
	}
	// a waiting node is retried with back-off, not hammered: few events
	time.Sleep(3 * time.Second)
	if ev := eventsFor(t, "small-late-0", ipam.EventReasonCIDRNotAvailable); len(ev) != 1 || ev[0].Count > 5 {
		t.Errorf("events while waiting: %d objects, count %d", len(ev), ev[0].Count)
	}

	deleteNode(t, first[0])
	deleteNode(t, first[1])
	got = waitAllocated(t, 20*time.Second, "small-late-0", "small-late-1")
	delete(got, first[0])
	delete(got, first[1])
	assertNoOverlap(t, got)
	waitMetric(t, "talos_ccm_ipam_cidrs_allocated", labels, 4)
}

// A node that already carries CIDRs (written by another controller, or an
// earlier configuration) keeps them; nobody else gets them; an overlapping
// foreign write is reported on the node.
func TestForeignCIDRsAreAdoptedAndOverlapsReported(t *testing.T) {
	cleanNodes(t)
	pool := netip.MustParsePrefix("10.133.0.0/22")
	// before the controller starts: node a has the first /24
	pre := node("foreign-a")
	pre.Spec.PodCIDR, pre.Spec.PodCIDRs = "10.133.0.0/24", []string{"10.133.0.0/24"}
	createNode(t, pre)
	startController(t, ipam.Config{ClusterCIDRs: []netip.Prefix{pool}}, nil)
	createNode(t, node("foreign-b"))
	got := waitAllocated(t, 20*time.Second, "foreign-b")
	if got["foreign-b"][0].String() == "10.133.0.0/24" {
		t.Fatalf("foreign-b got foreign-a's CIDR")
	}
	// while it runs: a node created with foreign-b's CIDR (a second writer)
	dup := node("foreign-c")
	dup.Spec.PodCIDR, dup.Spec.PodCIDRs = got["foreign-b"][0].String(), []string{got["foreign-b"][0].String()}
	createNode(t, dup)
	ev := waitEvent(t, "foreign-c", ipam.EventReasonCIDROverlap, 20*time.Second)
	if !strings.Contains(ev.Message, "foreign-b") {
		t.Errorf("overlap event should name the other node: %q", ev.Message)
	}
	// the two remaining /24s go to new nodes; the fourth node waits
	for _, name := range names("foreign-new-", 3) {
		createNode(t, node(name))
	}
	got = waitAllocated(t, 20*time.Second, "foreign-new-0", "foreign-new-1")
	waitEvent(t, "foreign-new-2", ipam.EventReasonCIDRNotAvailable, 20*time.Second)
	delete(got, "foreign-c")
	assertNoOverlap(t, got)
	ctx := context.Background()
	n, err := env.Client.CoreV1().Nodes().Get(ctx, "foreign-a", metav1.GetOptions{})
	if err != nil || n.Spec.PodCIDR != "10.133.0.0/24" {
		t.Fatalf("foreign-a: %v %v", n.Spec.PodCIDRs, err)
	}
}

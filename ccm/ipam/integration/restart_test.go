package integration

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/ipam"
	"github.com/hybrid-ccm/hybrid-ccm/test/nodechurn"
)

// Nodes are created and deleted concurrently while the controller is
// restarted twice (stopped, a pause like a leader-election hand-over, a new
// instance that rebuilds from the API). Afterwards: every node has CIDRs, none
// overlap, the metrics count exactly the live nodes, and filling the pool to
// its exact capacity works (nothing leaked) and one more node is refused.
func TestRestartMidChurn(t *testing.T) {
	cleanNodes(t)
	v4, v6 := netip.MustParsePrefix("10.170.0.0/22"), netip.MustParsePrefix("fd00:170::/58")
	cfg := ipam.Config{ClusterCIDRs: []netip.Prefix{v4, v6}, NodeCIDRMaskSizeIPv4: 28, NodeCIDRMaskSizeIPv6: 64}
	const capacity = 64 // /28s of a /22, /64s of a /58
	const maxLive = 48

	a := startController(t, cfg, nil)
	churn := nodechurn.Start(env.Client, nodechurn.Options{Workers: 4, MaxLive: maxLive, Prefix: "churn-", NewNode: func(name string) *corev1.Node { return node(name) }})
	waitCreated := func(n int64) {
		if err := churn.WaitCreated(n); err != nil {
			t.Error(err)
		}
	}
	waitCreated(120)
	a.stop()
	time.Sleep(time.Second) // no leader while the lease runs out; churn goes on
	b := startController(t, cfg, nil)
	waitCreated(240)
	b.stop()
	time.Sleep(time.Second)
	startController(t, cfg, nil)
	waitCreated(360)
	names, err := churn.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		return
	}
	live := len(names)

	got := waitAllocated(t, 60*time.Second, names...)
	if len(got) != live {
		t.Fatalf("API has %d nodes, the test believes %d are live", len(got), live)
	}
	for name, cidrs := range got {
		if len(cidrs) != 2 || !v4.Contains(cidrs[0].Addr()) || !v6.Contains(cidrs[1].Addr()) {
			t.Fatalf("%s: %v", name, cidrs)
		}
	}
	assertNoOverlap(t, got)
	waitMetric(t, "talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": v4.String()}, float64(live))
	waitMetric(t, "talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": v6.String()}, float64(live))
	waitMetric(t, "talos_ccm_ipam_cidrs_free", map[string]string{"pool": v4.String()}, float64(capacity-live))

	// nothing leaked: the pool takes exactly capacity nodes
	var fill []string
	for i := range capacity - live {
		name := "fill-" + strconv.Itoa(i)
		createNode(t, node(name))
		fill = append(fill, name)
	}
	got = waitAllocated(t, 60*time.Second, append(names, fill...)...)
	assertNoOverlap(t, got)
	createNode(t, node("one-too-many"))
	waitEvent(t, "one-too-many", ipam.EventReasonCIDRNotAvailable, 20*time.Second)
	deleteNode(t, fill[0])
	waitAllocated(t, 20*time.Second, "one-too-many")
}

// staleInformer is a node informer whose view never shows the pod CIDRs of
// one node, as a controller's cache can lag behind a write made elsewhere.
type staleInformer struct{ inf cache.SharedIndexInformer }

func (s staleInformer) Informer() cache.SharedIndexInformer { return s.inf }
func (s staleInformer) Lister() corelisters.NodeLister {
	return corelisters.NewNodeLister(s.inf.GetIndexer())
}

func newStaleInformer(cs kubernetes.Interface, hide string) coreinformers.NodeInformer {
	strip := func(o runtime.Object) {
		if n, ok := o.(*corev1.Node); ok && n.Name == hide {
			n.Spec.PodCIDR, n.Spec.PodCIDRs = "", nil
		}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			l, err := cs.CoreV1().Nodes().List(ctx, opts)
			if err == nil {
				for i := range l.Items {
					strip(&l.Items[i])
				}
			}
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := cs.CoreV1().Nodes().Watch(ctx, opts)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) { strip(e.Object); return e, true }), nil
		},
	}
	return staleInformer{inf: cache.NewSharedIndexInformer(lw, &corev1.Node{}, 0, cache.Indexers{})}
}

// The API server is the arbiter: a controller whose cache does not show a
// node's CIDRs proposes others, the write is refused (spec.podCIDRs is
// write-once), and the controller adopts what the node really has: the node
// keeps its CIDR, nobody else ever gets it, the proposal is free again.
func TestStaleViewAdoptsWhatTheAPIHas(t *testing.T) {
	cleanNodes(t)
	pool := netip.MustParsePrefix("10.160.0.0/22")
	pre := node("stale-a")
	pre.Spec.PodCIDR, pre.Spec.PodCIDRs = "10.160.3.0/24", []string{"10.160.3.0/24"}
	createNode(t, pre)
	adopted := metric(t, "talos_ccm_ipam_assignments_total", map[string]string{"result": "adopted"})

	startControllerWith(t, ipam.Config{ClusterCIDRs: []netip.Prefix{pool}}, nil, newStaleInformer(controllerClient(t), "stale-a")).waitReady(t)
	waitMetric(t, "talos_ccm_ipam_assignments_total", map[string]string{"result": "adopted"}, adopted+1)

	for _, name := range names("stale-new-", 4) {
		createNode(t, node(name))
	}
	got := waitAllocated(t, 20*time.Second, "stale-new-0", "stale-new-1", "stale-new-2")
	waitEvent(t, "stale-new-3", ipam.EventReasonCIDRNotAvailable, 20*time.Second)
	assertNoOverlap(t, got)
	if got["stale-a"][0].String() != "10.160.3.0/24" {
		t.Fatalf("stale-a: %v", got["stale-a"])
	}
	seen := map[string]bool{}
	for _, name := range names("stale-new-", 3) {
		seen[got[name][0].String()] = true
	}
	for _, want := range []string{"10.160.0.0/24", "10.160.1.0/24", "10.160.2.0/24"} {
		if !seen[want] {
			t.Errorf("%s (proposed to stale-a, then freed) not handed out: %v", want, seen)
		}
	}
}

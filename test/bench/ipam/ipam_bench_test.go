// Package ipam benchmarks node-ipam-controller against a real kube-apiserver:
// allocation for N nodes (1000, 5000; 10000 with make bench-10k), compared to its floor (test/writefloor: the
// controller's writes, counted by the API server, priced at the API server's
// ceiling for the same pod CIDR patch with as many workers as the controller
// has), and the start-up rebuild with N allocated nodes, compared to one
// LIST of those nodes; baselines measured in the same run.
package ipam

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/ipam"
	"github.com/hybrid-ccm/hybrid-ccm/test/benchproc"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
	"github.com/hybrid-ccm/hybrid-ccm/test/writefloor"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	if !testenv.BenchmarksRequested() {
		os.Exit(m.Run())
	}
	os.Exit(testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e }))
}

// workers is the controller's default, and the ceiling's concurrency.
var workers = ipam.NewOptions().Workers

// clusterCIDRs has room for 65536 nodes in both families.
var clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/48")}

func parallelDo(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// createNodes creates n nodes named prefix-i; withCIDRs gives each the CIDRs
// the controller would (as if allocated earlier).
func createNodes(b *testing.B, prefix string, n int, withCIDRs bool) {
	b.Helper()
	ctx := context.Background()
	err := parallelDo(n, 32, func(i int) error {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-" + strconv.Itoa(i), Labels: map[string]string{"bench": prefix}}}
		if withCIDRs {
			c4 := fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
			c6 := fmt.Sprintf("fd00:0:0:%x::/64", i)
			node.Spec.PodCIDR, node.Spec.PodCIDRs = c4, []string{c4, c6}
		}
		_, err := env.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
}

func deleteNodes(b *testing.B, prefix string) {
	ctx := context.Background()
	if err := env.Client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "bench=" + prefix}); err != nil {
		b.Fatal(err)
	}
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "bench=" + prefix, Limit: 1})
		return err == nil && len(l.Items) == 0, nil
	})
}

// cidrWrite is the controller's one write per node: a JSON patch of spec.podCIDR
// and spec.podCIDRs, guarded by a test of the node's UID.
var cidrWrite = writefloor.Kind{Verb: "PATCH", Resource: "nodes"}

// cidrPatch is the patch the controller writes (ipam.Controller.assign).
func cidrPatch(uid types.UID, cidrs []string) []byte {
	p, _ := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": string(uid)},
		{"op": "add", "path": "/spec/podCIDR", "value": cidrs[0]},
		{"op": "add", "path": "/spec/podCIDRs", "value": cidrs},
	})
	return p
}

// ceiling measures the API server's parallel ceiling for the controller's
// write on n new nodes named prefix-i (deleted again): the patch the
// controller writes, with CIDRs of the sizes it assigns, by as many workers as
// the controller has.
func ceiling(b *testing.B, prefix string, n int) writefloor.Ceiling {
	b.Helper()
	ctx := context.Background()
	createNodes(b, prefix, n, false)
	defer deleteNodes(b, prefix)
	list, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "bench=" + prefix})
	if err != nil {
		b.Fatal(err)
	}
	return writefloor.Measure(b, cidrWrite, len(list.Items), workers, func(i int) error {
		cidrs := []string{
			netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)).String(),
			netip.MustParsePrefix(fmt.Sprintf("fd00:0:0:%x::/64", i)).String(),
		}
		_, err := env.Client.CoreV1().Nodes().Patch(ctx, list.Items[i].Name, types.JSONPatchType,
			cidrPatch(list.Items[i].UID, cidrs), metav1.PatchOptions{FieldManager: names.IPAMController})
		return err
	})
}

// counter reads a counter or gauge from the legacy registry.
func counter(name string, labels map[string]string) float64 {
	mfs, _ := legacyregistry.DefaultGatherer.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// startController runs a fresh controller (its own informer, like a new
// talos-ccm process) and returns when it is ready, with the time that took.
func startController(b *testing.B) (stop func(), startup time.Duration) {
	b.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	c, err := ipam.NewController(cs, factory.Core().V1().Nodes(), nil, nil, nil, ipam.Config{ClusterCIDRs: clusterCIDRs, Workers: workers})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	begin := time.Now()
	factory.Start(ctx.Done())
	go func() { defer close(done); c.Run(ctx) }()
	select {
	case <-c.Ready():
	case <-time.After(5 * time.Minute):
		b.Fatal("controller not ready")
	}
	startup = time.Since(begin)
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done; factory.Shutdown() }) }, startup
}

// BenchmarkAllocate: N registered nodes without pod CIDRs (N from
// benchproc.Nodes: 1000 and 5000; 10000 with `make bench-10k`), then a
// controller starts; measured until every node carries its dual-stack CIDRs.
func BenchmarkAllocate(b *testing.B) { forEachSize(b, allocate) }

func forEachSize(b *testing.B, run func(b *testing.B, nodes int)) {
	sizes, err := benchproc.Nodes()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { run(b, n) })
	}
}

func allocate(b *testing.B, nodes int) {
	const prefix = "alloc"
	// the ceiling before and after the figure, on as many nodes as the API
	// server holds during it
	before := ceiling(b, "ceiling-a", nodes)
	createNodes(b, prefix, nodes, false)
	defer deleteNodes(b, prefix)

	assigned := map[string]string{"result": "assigned"}
	assignedBefore := counter("talos_ccm_ipam_assignments_total", assigned)
	window := writefloor.Open(b, env.Client)
	b.ResetTimer()
	begin := time.Now()
	stop, startup := startController(b)
	defer stop()
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
		return counter("talos_ccm_ipam_assignments_total", assigned)-assignedBefore >= float64(nodes), nil
	}); err != nil {
		b.Fatalf("not all nodes allocated: %v of %d", counter("talos_ccm_ipam_assignments_total", assigned)-assignedBefore, nodes)
	}
	alloc := time.Since(begin)
	b.StopTimer()
	writes := window.Close(b)

	// every node has two CIDRs, none shared
	list, err := env.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: "bench=" + prefix})
	if err != nil {
		b.Fatal(err)
	}
	seen := map[string]bool{}
	for _, n := range list.Items {
		if len(n.Spec.PodCIDRs) != 2 {
			b.Fatalf("%s: %v", n.Name, n.Spec.PodCIDRs)
		}
		for _, c := range n.Spec.PodCIDRs {
			if seen[c] {
				b.Fatalf("%s handed out twice", c)
			}
			seen[c] = true
		}
	}

	stop()
	deleteNodes(b, prefix)
	floor := writefloor.Floor{Writes: writes, Ceilings: writefloor.Best(before, ceiling(b, "ceiling-b", nodes)), Objects: nodes}
	b.ReportMetric(startup.Seconds()*1000, "startup-ms")
	b.ReportMetric(float64(nodes)/alloc.Seconds(), "nodes/s")
	b.Logf("dual-stack pod CIDRs for %d nodes, controller start (incl. node LIST, %s) to the last assignment, %d workers: %s",
		nodes, startup.Round(time.Millisecond), workers, floor.Report(b, "alloc", alloc))
}

// BenchmarkRebuild: N nodes that already carry CIDRs; a controller
// starts and rebuilds its ledger from them before it allocates anything.
func BenchmarkRebuild(b *testing.B) { forEachSize(b, rebuild) }

func rebuild(b *testing.B, nodes int) {
	const prefix = "rebuild"
	createNodes(b, prefix, nodes, true)
	defer deleteNodes(b, prefix)

	// baseline: one LIST of the nodes, as the controller's informer starts with
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	begin := time.Now()
	if _, err := cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
	list := time.Since(begin)

	window := writefloor.Open(b, env.Client)
	b.ResetTimer()
	stop, startup := startController(b)
	b.StopTimer()
	defer stop()
	writes := window.Close(b)
	rebuild := time.Duration(counter("talos_ccm_ipam_rebuild_duration_seconds", nil) * float64(time.Second))
	if got := counter("talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": clusterCIDRs[0].String()}); got != float64(nodes) {
		b.Fatalf("rebuilt %v allocations, want %d", got, nodes)
	}

	b.ReportMetric(startup.Seconds()*1000, "startup-ms")
	b.ReportMetric(rebuild.Seconds()*1000, "rebuild-ms")
	b.ReportMetric(list.Seconds()*1000, "list-ms")
	b.ReportMetric(startup.Seconds()/list.Seconds(), "x-list")
	b.ReportMetric(writes.Total(), "writes")
	b.Logf("start-up with %d allocated nodes: %s until ready (node LIST + rebuild), rebuild alone %s (target < 1s); one LIST of the nodes %s (%.2fx); writes served meanwhile: %s",
		nodes, startup.Round(time.Millisecond), rebuild.Round(time.Microsecond), list.Round(time.Millisecond), startup.Seconds()/list.Seconds(), writes)
}

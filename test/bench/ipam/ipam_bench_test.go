// Package ipam benchmarks node-ipam-controller against a real kube-apiserver:
// allocation for 5000 nodes and the start-up rebuild with 5000 allocated
// nodes, each printed next to the raw node PATCH throughput of the same API
// server measured in the same run.
package ipam

import (
	"context"
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
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	if !testenv.BenchmarksRequested() {
		os.Exit(m.Run())
	}
	os.Exit(testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e }))
}

const (
	nodes   = 5000
	workers = 16 // the controller's default, and the baseline's concurrency
)

// clusterCIDRs has room for 5000 nodes in both families.
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

// rawPatches times one label PATCH per node with the controller's concurrency.
func rawPatches(b *testing.B, prefix string, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	err := parallelDo(n, workers, func(i int) error {
		_, err := env.Client.CoreV1().Nodes().Patch(ctx, prefix+"-"+strconv.Itoa(i), types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"bench-patched":"true"}}}`), metav1.PatchOptions{})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
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
	return func() { cancel(); <-done; factory.Shutdown() }, startup
}

// BenchmarkAllocate5000Nodes: 5000 registered nodes without pod CIDRs, then a
// controller starts; measured until every node carries its dual-stack CIDRs.
func BenchmarkAllocate5000Nodes(b *testing.B) {
	const prefix = "alloc"
	createNodes(b, prefix, nodes, false)
	defer deleteNodes(b, prefix)
	raw := rawPatches(b, prefix, nodes)

	assigned := map[string]string{"result": "assigned"}
	before := counter("talos_ccm_ipam_assignments_total", assigned)
	b.ResetTimer()
	begin := time.Now()
	stop, startup := startController(b)
	defer stop()
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
		return counter("talos_ccm_ipam_assignments_total", assigned)-before >= nodes, nil
	}); err != nil {
		b.Fatalf("not all nodes allocated: %v of %d", counter("talos_ccm_ipam_assignments_total", assigned)-before, nodes)
	}
	alloc := time.Since(begin)
	b.StopTimer()

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

	ratio := alloc.Seconds() / raw.Seconds()
	b.ReportMetric(alloc.Seconds(), "alloc-s")
	b.ReportMetric(startup.Seconds()*1000, "startup-ms")
	b.ReportMetric(raw.Seconds(), "raw-patch-s")
	b.ReportMetric(ratio, "alloc/raw")
	b.ReportMetric(float64(nodes)/alloc.Seconds(), "nodes/s")
	b.Logf("allocation for %d nodes: %s (%.0f nodes/s; start-up incl. node LIST %s) vs raw PATCH %s (%.0f/s, %d workers): %.2fx (target ≤ 2x)",
		nodes, alloc.Round(time.Millisecond), float64(nodes)/alloc.Seconds(), startup.Round(time.Millisecond),
		raw.Round(time.Millisecond), float64(nodes)/raw.Seconds(), workers, ratio)
}

// BenchmarkRebuild5000Nodes: 5000 nodes that already carry CIDRs; a controller
// starts and rebuilds its ledger from them before it allocates anything.
func BenchmarkRebuild5000Nodes(b *testing.B) {
	const prefix = "rebuild"
	createNodes(b, prefix, nodes, true)
	defer deleteNodes(b, prefix)
	raw := rawPatches(b, prefix, nodes)

	b.ResetTimer()
	stop, startup := startController(b)
	b.StopTimer()
	defer stop()
	rebuild := time.Duration(counter("talos_ccm_ipam_rebuild_duration_seconds", nil) * float64(time.Second))
	if got := counter("talos_ccm_ipam_cidrs_allocated", map[string]string{"pool": clusterCIDRs[0].String()}); got != nodes {
		b.Fatalf("rebuilt %v allocations, want %d", got, nodes)
	}

	b.ReportMetric(startup.Seconds()*1000, "startup-ms")
	b.ReportMetric(rebuild.Seconds()*1000, "rebuild-ms")
	b.ReportMetric(raw.Seconds(), "raw-patch-s")
	b.ReportMetric(float64(nodes)/raw.Seconds(), "raw-patch/s")
	b.Logf("start-up with %d allocated nodes: %s until ready (node LIST + rebuild), rebuild alone %s (target < 1s); raw PATCH %s for %d nodes (%.0f/s)",
		nodes, startup.Round(time.Millisecond), rebuild.Round(time.Microsecond), raw.Round(time.Millisecond), nodes, float64(nodes)/raw.Seconds())
}

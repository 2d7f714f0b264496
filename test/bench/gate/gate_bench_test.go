// Package gate benchmarks ccm-gate, the view proxy, as the native CCM uses it:
// the real ccm-gate binary as a subprocess (HTTPS on loopback, forwarding the
// CCM's ServiceAccount token) in front of a real kube-apiserver, measured
// against the same API server directly in the same run: 5000 nodes, and (in a
// second gate with the Service view on) 5000 Services. It also reports the
// gates' peak anonymous memory (RssAnon, sampled from each gate's start).
//
// GATE_BENCH_CANDIDATE=<ccm-gate binary> adds a third gate of the Service
// view's configuration, built from other code, timed in the same rotation as
// the first: two versions of the gate compared under the same load.
package gate

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/test/benchproc"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const (
	// nodes of the platform in the cluster (all visible through the gate, the
	// worst case for its cache and the same answer as the direct list).
	nodes = 5000
	// lists and initial-event streams per path; the median is reported.
	lists       = 30
	initialRuns = 30
	// watchEvents are node updates streamed to both watchers.
	watchEvents = 1000
	platform    = "hcloud"
	ccmNS       = "kube-system"
	ccmName     = "native-ccm-hcloud"
)

var (
	env *testenv.Env
	bin string
	// workDir holds the binary, the gate's kubeconfig, certificate and log.
	workDir string
)

func TestMain(m *testing.M) {
	if !testenv.BenchmarksRequested() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "hybrid-ccm-bench-gate-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	if bin, err = gatetest.BuildGate(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// 5000 Services need more cluster IPs than envtest's /24.
	opts := testenv.Options{APIServerFlags: map[string]string{"service-cluster-ip-range": "10.96.0.0/16"}}
	code := testenv.Run(m, opts, func(e *testenv.Env) { env = e })
	if shared != nil {
		shared.gate.Stop()
	}
	if sharedServices != nil {
		sharedServices.gate.Stop()
		if sharedServices.candidate != nil {
			sharedServices.candidate.Stop()
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is the cluster, the CCM identity and a running ccm-gate process.
type fixture struct {
	direct, gated *rest.Config
	gate          *gatetest.Gate
}

var (
	setupOnce sync.Once
	shared    *fixture
	setupErr  error
)

func setup(b *testing.B) *fixture {
	b.Helper()
	setupOnce.Do(func() { shared, setupErr = start(workDir, b.Logf) })
	if setupErr != nil {
		b.Fatal(setupErr)
	}
	return shared
}

func start(dir string, logf benchproc.Logf) (*fixture, error) {
	ctx := context.Background()
	if err := gatetest.GrantNativeCCM(ctx, env.Client, ccmNS, ccmName); err != nil {
		return nil, err
	}
	token, err := gatetest.ServiceAccountToken(ctx, env.Client, ccmNS, ccmName)
	if err != nil {
		return nil, err
	}
	specs := make([]gatetest.NodeSpec, nodes)
	for i := range specs {
		specs[i] = gatetest.NodeSpec{Name: fmt.Sprintf("bench-%05d", i), Platform: platform, ProviderID: fmt.Sprintf("hcloud://%d", i), Ready: true}
	}
	if err := gatetest.CreateNodes(ctx, env.Client, specs...); err != nil {
		return nil, err
	}
	direct := &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: token, QPS: -1, Burst: -1}
	// GATE_BENCH_FLAGS adds flags, e.g. --cache=false to compare.
	if err := benchproc.ColdStart(logf, bin); err != nil { // measured from a cold start
		return nil, err
	}
	g, err := gatetest.StartGate(bin, dir, platform, direct, token, strings.Fields(os.Getenv("GATE_BENCH_FLAGS"))...)
	if err != nil {
		return nil, err
	}
	watchMemory(g)
	return &fixture{direct: direct, gated: g.Config, gate: g}, nil
}

// report prints direct vs gate as medians and minima (the minimum is the least
// disturbed by other work on the machine).
func report(b *testing.B, what string, d, g []time.Duration) {
	reportArm(b, what, "gate", "ccm-gate", d, g)
}

// reportArm reports one arm g (metrics prefixed name) against direct d.
func reportArm(b *testing.B, what, name, label string, d, g []time.Duration) {
	md, mg := median(d), median(g)
	nd, ng := slices.Min(d), slices.Min(g)
	b.ReportMetric(ms(md), "direct-ms")
	b.ReportMetric(ms(mg), name+"-ms")
	b.ReportMetric(float64(mg)/float64(md), name+"/direct")
	b.ReportMetric(float64(ng)/float64(nd), "min-"+name+"/direct")
	b.Logf("%s, %d runs each: median direct %.1f ms, through %s %.1f ms (%.2fx); min direct %.1f ms, through %s %.1f ms (%.2fx)",
		what, len(d), ms(md), label, ms(mg), float64(mg)/float64(md), ms(nd), label, ms(ng), float64(ng)/float64(nd))
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkList5000 lists the platform's 5000 nodes directly (with the same
// label selector the gate injects) and through the gate, alternating, as
// protobuf (the CCM default) and JSON.
func BenchmarkList5000(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	for _, enc := range encodings {
		b.Run(enc.name, func(b *testing.B) {
			direct, gated := clientIn(f.direct, enc.contentType), clientIn(f.gated, enc.contentType)
			list := func(cs kubernetes.Interface, selector string) func() time.Duration {
				return func() time.Duration {
					start := time.Now()
					l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
					d := time.Since(start)
					if err != nil || len(l.Items) != nodes {
						b.Fatalf("list: %d nodes, %v", len(l.Items), err)
					}
					return d
				}
			}
			alternate(b, fmt.Sprintf("list %d nodes (%s)", nodes, enc.name), lists,
				list(direct, names.PlatformLabel+"="+platform), list(gated, ""))
		})
	}
}

// alternate warms both paths (connections, watch cache, TLS), then times runs
// of each, alternating, and reports them.
func alternate(b *testing.B, what string, runs int, direct, gated func() time.Duration) {
	b.Helper()
	alternateWith(b, what, runs, direct, gated, nil)
}

// alternateWith is alternate with a third path, candidate (nil: none): a
// gate built from other code (GATE_BENCH_CANDIDATE), timed in the same
// rotation so that both gates meet the same load.
func alternateWith(b *testing.B, what string, runs int, direct, gated, candidate func() time.Duration) {
	b.Helper()
	direct()
	gated()
	if candidate != nil {
		candidate()
	}
	b.ResetTimer()
	for range b.N {
		var d, g, c []time.Duration
		for range runs {
			d = append(d, direct())
			g = append(g, gated())
			if candidate != nil {
				c = append(c, candidate())
			}
		}
		report(b, what, d, g)
		if candidate != nil {
			reportArm(b, what, "candidate", "the candidate ccm-gate", d, c)
		}
	}
}

// initialEvents opens a WatchList with selector (the objects there are now
// as initial events, then a bookmark) and times it until that bookmark; the
// initial events must number want.
func initialEvents(b *testing.B, want int, selector string, open func(context.Context, metav1.ListOptions) (watch.Interface, error)) time.Duration {
	b.Helper()
	start := time.Now()
	w, err := open(context.Background(), metav1.ListOptions{
		LabelSelector: selector, SendInitialEvents: ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	n := 0
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Bookmark:
			if m, err := meta.Accessor(ev.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				if n != want {
					b.Fatalf("%d initial events, want %d", n, want)
				}
				return time.Since(start)
			}
		case watch.Error:
			b.Fatalf("watch error: %v", apierrors.FromObject(ev.Object))
		default:
			n++
		}
	}
	b.Fatalf("the watch ended after %d initial events, before its bookmark", n)
	return 0
}

// BenchmarkWatch streams node updates to two watchers at once, one direct and
// one through the gate, and compares when each update arrives. It also times
// the initial events of a WatchList (what a CCM's informer does at start).
func BenchmarkWatch(b *testing.B) {
	f := setup(b)
	ctx := context.Background()

	for _, enc := range encodings {
		b.Run("initial-events/"+enc.name, func(b *testing.B) {
			direct, gated := clientIn(f.direct, enc.contentType), clientIn(f.gated, enc.contentType)
			alternate(b, fmt.Sprintf("WatchList initial events for %d nodes (%s)", nodes, enc.name), initialRuns,
				func() time.Duration {
					return initialEvents(b, nodes, names.PlatformLabel+"="+platform, direct.CoreV1().Nodes().Watch)
				},
				func() time.Duration { return initialEvents(b, nodes, "", gated.CoreV1().Nodes().Watch) })
		})
	}

	b.Run("updates", func(b *testing.B) {
		direct, gated := kubernetes.NewForConfigOrDie(f.direct), kubernetes.NewForConfigOrDie(f.gated)
		for range b.N {
			l, err := direct.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
			if err != nil {
				b.Fatal(err)
			}
			rv := l.ResourceVersion
			open := func(cs kubernetes.Interface, selector string) watch.Interface {
				w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
				if err != nil {
					b.Fatal(err)
				}
				return w
			}
			wd, wg := open(direct, names.PlatformLabel+"="+platform), open(gated, "")
			updateLatency(b, wd, wg, watchEvents, "node", func(i int, patch []byte) error {
				_, err := env.Client.CoreV1().Nodes().Patch(ctx, fmt.Sprintf("bench-%05d", i%nodes), types.MergePatchType, patch, metav1.PatchOptions{})
				return err
			})
		}
	})
}

// BenchmarkRSS reports the gate's anonymous memory after the list and watch
// benchmarks (run it with them: the peak is over the whole run).
func BenchmarkRSS(b *testing.B) {
	f := setup(b)
	for range b.N {
		reportMemory(b, f.gate, fmt.Sprintf("%d nodes in its cache", nodes))
	}
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// watches samples each gate's anonymous memory from its start (watchMemory).
var watches sync.Map // *gatetest.Gate -> *benchproc.Watch

// watchMemory starts sampling g's anonymous memory.
func watchMemory(g *gatetest.Gate) {
	watches.Store(g, benchproc.WatchMemory(g.Cmd.Process.Pid, nil))
}

// forgetMemory stops sampling g's memory.
func forgetMemory(g *gatetest.Gate) {
	if w, ok := watches.LoadAndDelete(g); ok {
		w.(*benchproc.Watch).Stop()
	}
}

// reportMemory reports a gate's peak anonymous memory since it started (heap,
// stacks: what its container is sized by; not the executable's clean pages)
// and its current one.
func reportMemory(b *testing.B, g *gatetest.Gate, what string) {
	b.Helper()
	w, ok := watches.Load(g)
	if !ok {
		b.Fatalf("ccm-gate (%s): its memory was not watched from its start", what)
	}
	peak, now := w.(*benchproc.Watch).Peak().Anon, benchproc.MiB(g.Cmd.Process.Pid, "RssAnon")
	b.ReportMetric(peak, "gate-anon-peak-MiB")
	b.ReportMetric(now, "gate-anon-MiB")
	b.Logf("ccm-gate (%s): anonymous memory peak %.1f MiB, now %.1f MiB", what, peak, now)
}

// updateLatency measures, for n updates made by update(i, patch) (a merge
// patch setting the annotation bench-seq to i), how long each takes to arrive
// as a MODIFIED event on the direct watch wd and on the gated watch wg, and
// reports the p50 and p99 of both. It stops both watches.
func updateLatency(b *testing.B, wd, wg watch.Interface, n int, what string, update func(i int, patch []byte) error) {
	b.Helper()
	sent := make([]time.Time, n)
	var mu sync.Mutex
	receive := func(w watch.Interface, out []time.Duration, done chan<- struct{}) {
		defer close(done)
		got := 0
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(metav1.Object)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			i, err := strconv.Atoi(o.GetAnnotations()["bench-seq"])
			if err != nil || i < 0 || i >= n || out[i] != 0 {
				continue
			}
			mu.Lock()
			out[i] = time.Since(sent[i])
			mu.Unlock()
			if got++; got == n {
				return
			}
		}
	}
	latD, latG := make([]time.Duration, n), make([]time.Duration, n)
	doneD, doneG := make(chan struct{}), make(chan struct{})
	go receive(wd, latD, doneD)
	go receive(wg, latG, doneG)
	b.ResetTimer()
	for i := range n {
		patch := []byte(`{"metadata":{"annotations":{"bench-seq":"` + strconv.Itoa(i) + `"}}}`)
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		if err := update(i, patch); err != nil {
			b.Fatal(err)
		}
	}
	for _, done := range []chan struct{}{doneD, doneG} {
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			b.Fatalf("%s watch events missing", what)
		}
	}
	b.StopTimer()
	wd.Stop()
	wg.Stop()
	pd, pg := percentile(latD, 50), percentile(latG, 50)
	qd, qg := percentile(latD, 99), percentile(latG, 99)
	b.ReportMetric(ms(pd), "direct-p50-ms")
	b.ReportMetric(ms(pg), "gate-p50-ms")
	b.ReportMetric(ms(qd), "direct-p99-ms")
	b.ReportMetric(ms(qg), "gate-p99-ms")
	b.Logf("%d %s updates streamed: latency p50 direct %.2f ms, through ccm-gate %.2f ms; p99 direct %.2f ms, through ccm-gate %.2f ms",
		n, what, ms(pd), ms(pg), ms(qd), ms(qg))
}

package cloudnode_test

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloudnode"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e }))
}

// heldSource answers every lookup once release is closed, and counts the
// lookups waiting at once.
type heldSource struct {
	release          chan struct{}
	waiting, maxWait atomic.Int32
}

func (s *heldSource) Facts(ctx context.Context, node *corev1.Node) (*facts.Facts, error) {
	n := s.waiting.Add(1)
	for m := s.maxWait.Load(); n > m && !s.maxWait.CompareAndSwap(m, n); m = s.maxWait.Load() {
	}
	defer s.waiting.Add(-1)
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	ip := node.Status.Addresses[0].Address
	return &facts.Facts{
		Platform:   "metal",
		ProviderID: "talos://metal/" + ip,
		Labels:     map[string]string{names.PlatformLabel: "metal"},
		Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}},
		ReadAt:     time.Now(),
	}, nil
}

// writeCounter is a transport counting the node writes in flight at once;
// each write is held a moment so that writes allowed to overlap do.
type writeCounter struct {
	next             http.RoundTripper
	inFlight, maxObs atomic.Int32
	writes           atomic.Int32
}

func (w *writeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPut && r.Method != http.MethodPatch {
		return w.next.RoundTrip(r)
	}
	w.writes.Add(1)
	n := w.inFlight.Add(1)
	for m := w.maxObs.Load(); n > m && !w.maxObs.CompareAndSwap(m, n); m = w.maxObs.Load() {
	}
	defer w.inFlight.Add(-1)
	time.Sleep(100 * time.Millisecond)
	return w.next.RoundTrip(r)
}

// run starts cloud-node looking nodes up in src, with opts.Workers writers
// writing through client; the function it returns stops it and waits for its
// workers.
func run(t *testing.T, client kubernetes.Interface, src cloudnode.FactSource, opts cloudnode.Options) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactory(env.Client, 0)
	c, err := cloudnode.New(client, factory.Core().V1().Nodes(), src, record.NewFakeRecorder(100), opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	return func() { cancel(); wg.Wait() }
}

// TestLookupsOverlapWrites: with Workers writers, twice as many nodes are
// looked up at once, and never more than Workers nodes are written at once.
// Every node ends initialized: providerID, platform label, addresses, and no
// uninitialized taint.
func TestLookupsOverlapWrites(t *testing.T) {
	const workers, nodes = 2, 6
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	counter := &writeCounter{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter }
	client := kubernetes.NewForConfigOrDie(cfg)

	for i := range nodes {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "pipeline-" + strconv.Itoa(i)},
			Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: names.UninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
		}
		created, err := env.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2." + strconv.Itoa(10+i)}}
		if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	src := &heldSource{release: make(chan struct{})}
	defer run(t, client, src, cloudnode.Options{Workers: workers})()

	// every worker is in a lookup before any node is written
	for deadline := time.Now().Add(30 * time.Second); src.waiting.Load() < 2*workers; {
		if time.Now().After(deadline) {
			t.Fatalf("%d lookups at once, want %d (twice the %d writers)", src.waiting.Load(), 2*workers, workers)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(src.release)

	for deadline := time.Now().Add(60 * time.Second); ; {
		list, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, n := range list.Items {
			if !strings.HasPrefix(n.Name, "pipeline-") {
				continue // another test's node
			}
			if n.Spec.ProviderID != "" && n.Labels[names.PlatformLabel] == "metal" && len(n.Status.Addresses) == 1 && !names.Uninitialized(n.Spec.Taints) {
				done++
			}
		}
		if done == nodes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d nodes initialized", done, nodes)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := src.maxWait.Load(); got != 2*workers {
		t.Errorf("at most %d lookups at once, want %d", got, 2*workers)
	}
	if got := counter.maxObs.Load(); got != workers {
		t.Errorf("at most %d node writes at once, want %d (Options.Workers)", got, workers)
	}
	if counter.writes.Load() < nodes {
		t.Errorf("%d node writes for %d nodes", counter.writes.Load(), nodes)
	}
}

package cloudnode_test

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloudnode"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// statusCounter counts the API server's answers to node updates (PUT) by
// status code.
type statusCounter struct {
	next http.RoundTripper
	mu   sync.Mutex
	puts map[int]int
}

func (s *statusCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(r)
	if err == nil && r.Method == http.MethodPut {
		s.mu.Lock()
		s.puts[resp.StatusCode]++
		s.mu.Unlock()
	}
	return resp, err
}

func (s *statusCounter) count(code int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts[code]
}

// TestUpdateConflictKeepsTheOtherWrite: the kubelet writes the Node between
// talos-ccm's read of it (the informer's copy the lookup started from) and
// talos-ccm's update. The API server refuses that update (409, a stale
// resourceVersion) and cloud-node writes its facts onto the Node as it now is:
// the node ends initialized and keeps what the kubelet wrote. An update sent
// without the resourceVersion it was read at would have erased the kubelet's
// label instead. The facts come from a real Talos API (talosnode: mTLS, the
// COSI state server) through talos-ccm's own facts source; the node's Talos
// API holds the lookup while the kubelet writes.
func TestUpdateConflictKeepsTheOtherWrite(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	const name, ip = "conflict-0", "192.0.2.40"
	ep := talosnode.StartFor(t)
	machine := metalNode(t, ctx, ep, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: names.UninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}, ip)
	machine.Hold()
	defer machine.Release()

	counter := &statusCounter{puts: map[int]int{}}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter }
	src := facts.NewSource(ep.ClientFor(t), cloud.NewInterpreter(nil), facts.Options{})
	defer run(t, kubernetes.NewForConfigOrDie(cfg), src, cloudnode.Options{Workers: 1})()

	writtenDuringLookup(t, ctx, machine, name)

	want := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	var got *corev1.Node
	var err error
	for deadline := time.Now().Add(60 * time.Second); ; {
		got, err = env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// initialized: the taint is gone and the addresses from Talos are written
		if !names.Uninitialized(got.Spec.Taints) && slices.Equal(got.Status.Addresses, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not initialized: taints %v, addresses %v", got.Spec.Taints, got.Status.Addresses)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got.Labels["example.com/written-by-kubelet"] != "yes" {
		t.Errorf("the kubelet's label was lost: labels %v", got.Labels)
	}
	if got.Spec.ProviderID != "talos://metal/"+ip || got.Labels[names.PlatformLabel] != "metal" {
		t.Errorf("providerID %q, platform label %q: the facts were not written", got.Spec.ProviderID, got.Labels[names.PlatformLabel])
	}
	if conflicts, ok := counter.count(http.StatusConflict), counter.count(http.StatusOK); conflicts != 1 || ok != 1 {
		t.Errorf("node updates answered 409: %d, 200: %d; want one refused for its stale resourceVersion, then one written", conflicts, ok)
	}
}

// metalNode adds a metal machine at ip to the Talos API ep and registers
// node for it, with ip as its InternalIP, as its kubelet would; the Node is
// deleted when the test ends.
func metalNode(t *testing.T, ctx context.Context, ep *talosnode.Endpoint, node *corev1.Node, ip string) *talosnode.Node {
	t.Helper()
	machine, err := ep.AddNode(node.Name, []string{ip}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: node.Name},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	created, err := env.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})
	})
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return machine
}

// writtenDuringLookup waits until cloud-node's lookup of node name is held by
// its machine (Hold), writes the label example.com/written-by-kubelet=yes on
// the Node meanwhile, as its kubelet may, and releases the lookup: what
// cloud-node then writes was computed from the Node as it was before.
func writtenDuringLookup(t *testing.T, ctx context.Context, machine *talosnode.Node, name string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); machine.Held() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("cloud-node never looked the node up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	patch := []byte(`{"metadata":{"labels":{"example.com/written-by-kubelet":"yes"}}}`)
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	machine.Release()
}

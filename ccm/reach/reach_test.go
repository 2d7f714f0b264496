package reach_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloudnode"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/reach"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e }))
}

// metric reads a talos_ccm_talos_api_* series of the registry talos-ccm
// serves on /metrics (0 when it has no such series).
func metric(t *testing.T, name, hop, cause string) float64 {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["hop"] == hop && l["cause"] == cause {
				if m.GetGauge() != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

const (
	unreachableNodes   = "talos_ccm_talos_api_unreachable_nodes"
	unreachableLookups = "talos_ccm_talos_api_unreachable_lookups_total"
)

// recorder records to the test API server as talos-ccm does.
func recorder(t *testing.T) record.EventRecorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events("")})
	t.Cleanup(b.Shutdown)
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: reach.Component})
}

// reportedSource is a facts source reading ep (300 ms per request, a second
// per lookup) whose lookups a Reporter observes, recording to the test API
// server, and that Reporter.
func reportedSource(t *testing.T, ep *talosnode.Endpoint) (*facts.Source, *reach.Reporter) {
	t.Helper()
	tc, err := ep.NewClient(t.TempDir(), talos.Options{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.Close() })
	rep := reach.New(reach.Options{Repeat: time.Hour})
	rep.SetRecorder(recorder(t))
	return facts.NewSource(tc, cloud.NewInterpreter(nil), facts.Options{LookupTimeout: time.Second, Observer: rep}), rep
}

// register creates node name as a kubelet registers it (uninitialized,
// reached at ip).
func register(t *testing.T, name, ip string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: names.UninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}}}
	n, err := env.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if n, err = env.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return n
}

// events lists the node's events of reason.
func events(t *testing.T, node, reason string) []corev1.Event {
	t.Helper()
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node, "reason": reason}.AsSelector().String()
	l, err := env.Client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// waitEvent waits for an event of reason on node that match accepts.
func waitEvent(t *testing.T, node, reason string, match func(corev1.Event) bool) corev1.Event {
	t.Helper()
	var got corev1.Event
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, e := range events(t, node, reason) {
			if match(e) {
				got = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("node %s: no %s event as wanted; it has %+v", node, reason, events(t, node, reason))
	}
	return got
}

func annotated(cause talos.Cause, hop talos.Hop) func(corev1.Event) bool {
	return func(e corev1.Event) bool {
		return e.Annotations[names.TalosAPICauseAnnotation] == string(cause) && e.Annotations[names.TalosAPIHopAnnotation] == string(hop)
	}
}

// TestUnreachableNodeIsReported runs cloud-node as talos-ccm does (its facts
// source reading the simulated Talos API through the real machinery client,
// the Reporter observing it, events to the API server) for a node whose
// Talos API the endpoint cannot forward to: the node gets one Warning naming
// the address, the endpoint and the cause, however often cloud-node retries;
// another one when the cause changes (refused, then no answer in time); the
// gauge counts it under its cause; and once it answers, it is initialized
// and gets a Normal event, and the gauge lets go of it.
func TestUnreachableNodeIsReported(t *testing.T) {
	const name, ip = "far-1", "10.77.0.1"
	ep := talosnode.StartFor(t)
	src, rep := reportedSource(t, ep)

	refusedBefore := metric(t, unreachableNodes, "node", "refused")
	timeoutBefore := metric(t, unreachableNodes, "node", "timeout")
	lookupsBefore := metric(t, unreachableLookups, "node", "refused")

	register(t, name, ip)
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactory(env.Client, 0)
	c, err := cloudnode.New(env.Client, factory.Core().V1().Nodes(), src, record.NewFakeRecorder(100), cloudnode.Options{Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	// no machine at the address: apid answers "connection refused"
	ev := waitEvent(t, name, reach.ReasonUnavailable, annotated(talos.CauseRefused, talos.HopNode))
	if ev.Type != corev1.EventTypeWarning || ev.Source.Component != reach.Component ||
		ev.Annotations[names.TalosAPIAddressAnnotation] != ip || ev.Annotations[names.TalosAPIEndpointAnnotation] != ep.Addr() {
		t.Errorf("event %s/%s from %s, annotations %v: want a Warning from %s naming address %s and endpoint %s",
			ev.Type, ev.Reason, ev.Source.Component, ev.Annotations, reach.Component, ip, ep.Addr())
	}
	t.Logf("%s %s %v: %s", ev.Type, ev.Reason, ev.Annotations, ev.Message)
	for _, s := range []string{ip + ":50000", ep.Addr(), "could not forward", "connection refused", "KubeSpan or routing", "docs/troubleshooting.md"} {
		if !strings.Contains(ev.Message, s) {
			t.Errorf("event message lacks %q: %s", s, ev.Message)
		}
	}
	if v := metric(t, unreachableNodes, "node", "refused"); v != refusedBefore+1 {
		t.Errorf("%s{hop=node,cause=refused} = %v, want %v", unreachableNodes, v, refusedBefore+1)
	}
	// cloud-node retries (0.5 s, 1 s, 2 s ...); the Warning is not repeated
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return metric(t, unreachableLookups, "node", "refused") >= lookupsBefore+3, nil
	}); err != nil {
		t.Fatalf("cloud-node did not retry the unreachable node 3 times")
	}
	if evs := events(t, name, reach.ReasonUnavailable); len(evs) != 1 || evs[0].Count != 1 {
		t.Errorf("after %v lookups: %d events, first counted %d; want one, recorded once", metric(t, unreachableLookups, "node", "refused")-lookupsBefore, len(evs), evs[0].Count)
	}

	// a machine at the address that does not answer: another cause, another Warning
	machine, err := ep.AddNode(name, []string{ip}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	machine.SetUnreachable(true, true)
	poke(t, name) // a Node update: cloud-node looks it up at once
	ev = waitEvent(t, name, reach.ReasonUnavailable, annotated(talos.CauseTimeout, talos.HopNode))
	if !strings.Contains(ev.Message, "no answer came from "+ip+":50000") {
		t.Errorf("timeout event message: %s", ev.Message)
	}
	if r, to := metric(t, unreachableNodes, "node", "refused"), metric(t, unreachableNodes, "node", "timeout"); r != refusedBefore || to != timeoutBefore+1 {
		t.Errorf("gauge refused %v (want %v), timeout %v (want %v)", r, refusedBefore, to, timeoutBefore+1)
	}

	// it answers: initialized, a Normal event, no longer counted
	machine.SetUnreachable(false, false)
	poke(t, name)
	ev = waitEvent(t, name, reach.ReasonAvailable, func(corev1.Event) bool { return true })
	t.Logf("%s %s %v: %s", ev.Type, ev.Reason, ev.Annotations, ev.Message)
	if ev.Type != corev1.EventTypeNormal || !strings.Contains(ev.Message, "timeout") || ev.Annotations[names.TalosAPIAddressAnnotation] != ip {
		t.Errorf("recovery event %s: %s %v", ev.Type, ev.Message, ev.Annotations)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && !names.Uninitialized(n.Spec.Taints), nil
	}); err != nil {
		t.Errorf("node not initialized once its Talos API answers")
	}
	if to := metric(t, unreachableNodes, "node", "timeout"); to != timeoutBefore {
		t.Errorf("gauge timeout %v after recovery, want %v", to, timeoutBefore)
	}
	if len(rep.Nodes()) != 0 {
		t.Errorf("still unreachable: %v", rep.Nodes())
	}
}

// poke updates the Node (a label): its informer event makes cloud-node sync
// it without waiting for its back-off.
func poke(t *testing.T, name string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"reach.test/poke":"%d"}}}`, time.Now().UnixNano())
	if _, err := env.Client.CoreV1().Nodes().Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestEndpointFailures: when talos-ccm gets no connection to the endpoint
// (nothing listens, a certificate of another cluster) or the endpoint
// refuses talos-ccm's role, the event says so: hop endpoint, the cause, and
// the endpoint only when one took the request. A repetition within Repeat
// is not recorded again; after it, it is (the same event, counted twice).
func TestEndpointFailures(t *testing.T) {
	ep := talosnode.StartFor(t)
	other := talosnode.StartFor(t) // another cluster's CA
	if _, err := ep.AddNode("ep-node", []string{"10.78.0.1"}, talosnode.Spec{
		Metadata: &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "ep-node"}}); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	_ = lis.Close()

	cases := []struct {
		name     string
		config   func(path string) error
		cause    talos.Cause
		endpoint string // annotation: "" when no connection was made
		words    string
	}{
		{"refused", func(p string) error { return ep.WriteClientConfig(p, "os:reader", closed) }, talos.CauseRefused, "", "could not connect to the Talos API endpoint"},
		{"tls", func(p string) error { return other.WriteClientConfig(p, "os:reader", ep.Addr()) }, talos.CauseTLS, "", "a certificate was not accepted"},
		{"role", func(p string) error { return ep.WriteClientConfig(p, "os:etcd:backup") }, talos.CausePermissionDenied, ep.Addr(), "permission denied for the role"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			var mu sync.Mutex
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			path := filepath.Join(t.TempDir(), "talosconfig")
			if err := tc.config(path); err != nil {
				t.Fatal(err)
			}
			client, err := talos.New(context.Background(), talos.Options{ConfigPath: path, Timeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = client.Close() })
			rep := reach.New(reach.Options{Repeat: time.Minute, Now: clock})
			rep.SetRecorder(recorder(t))
			src := facts.NewSource(client, cloud.NewInterpreter(nil), facts.Options{LookupTimeout: time.Second, Observer: rep})
			before := metric(t, unreachableNodes, "endpoint", string(tc.cause))

			name := fmt.Sprintf("ep-%d", i)
			node := register(t, name, "10.78.0.1")
			lookup := func() {
				if _, err := src.Facts(context.Background(), node); err == nil {
					t.Fatal("the lookup succeeded")
				}
			}
			lookup()
			ev := waitEvent(t, name, reach.ReasonUnavailable, annotated(tc.cause, talos.HopEndpoint))
			t.Logf("%s %s %v: %s", ev.Type, ev.Reason, ev.Annotations, ev.Message)
			if got := ev.Annotations[names.TalosAPIEndpointAnnotation]; got != tc.endpoint {
				t.Errorf("endpoint annotation %q, want %q", got, tc.endpoint)
			}
			if !strings.Contains(ev.Message, tc.words) || !strings.Contains(ev.Message, "10.78.0.1:50000") {
				t.Errorf("message lacks %q or the address: %s", tc.words, ev.Message)
			}
			if v := metric(t, unreachableNodes, "endpoint", string(tc.cause)); v != before+1 {
				t.Errorf("gauge %v, want %v", v, before+1)
			}
			// again within Repeat: not recorded; after it: the same event, counted
			lookup()
			mu.Lock()
			now = now.Add(2 * time.Minute)
			mu.Unlock()
			lookup()
			waitEvent(t, name, reach.ReasonUnavailable, func(e corev1.Event) bool { return e.Count == 2 })
			time.Sleep(200 * time.Millisecond) // a third write would land meanwhile
			if evs := events(t, name, reach.ReasonUnavailable); len(evs) != 1 || evs[0].Count != 2 {
				t.Errorf("3 lookups, one after Repeat: want one event counted twice, got %d (%+v)", len(evs), evs)
			}
			// the node is deleted: no longer counted
			src.Deleted(name)
			if v := metric(t, unreachableNodes, "endpoint", string(tc.cause)); v != before {
				t.Errorf("gauge %v after the node was deleted, want %v", v, before)
			}
		})
	}
}

// TestDeletedNodeForgottenWithoutCloudNode: talos-ccm with cloud-node
// disabled (--controllers=node-csr-approval, say) still forgets a deleted
// node. The facts source, registered on the shared node informer
// (ForgetDeleted, as every controller of talos-ccm does), lets go of an
// unreachable node in the gauge and of a node's remembered address, which
// then counts as departed, not current, for the CSR approver.
func TestDeletedNodeForgottenWithoutCloudNode(t *testing.T) {
	const far, farIP, near, nearIP = "gone-far", "10.79.0.1", "gone-near", "10.79.0.2"
	ep := talosnode.StartFor(t)
	if _, err := ep.AddNode(near, []string{nearIP}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: near},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: nearIP + "/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	src, _ := reportedSource(t, ep)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	factory := informers.NewSharedInformerFactory(env.Client, 0)
	nodes := factory.Core().V1().Nodes().Informer()
	for range 2 { // every controller of talos-ccm calls it; a second call is harmless
		if err := src.ForgetDeleted(nodes); err != nil {
			t.Fatal(err)
		}
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	before := metric(t, unreachableNodes, "node", "refused")
	farNode, nearNode := register(t, far, farIP), register(t, near, nearIP)
	if _, err := src.Facts(ctx, farNode); err == nil {
		t.Fatalf("node %s answered: no machine is at %s", far, farIP)
	}
	if _, err := src.Facts(ctx, nearNode); err != nil {
		t.Fatal(err)
	}
	if v := metric(t, unreachableNodes, "node", "refused"); v != before+1 {
		t.Fatalf("gauge %v with %s unreachable, want %v", v, far, before+1)
	}
	if current, _ := src.Holders(nearIP); len(current) != 1 || current[0] != near {
		t.Fatalf("holders of %s: %v, want %s", nearIP, current, near)
	}

	for _, name := range []string{far, near} {
		if err := env.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		current, departed := src.Holders(nearIP)
		return metric(t, unreachableNodes, "node", "refused") == before && len(current) == 0 && len(departed) == 1, nil
	}); err != nil {
		current, departed := src.Holders(nearIP)
		t.Fatalf("after both Nodes were deleted: gauge %v (want %v); holders of %s current %v, departed %v (want none, [%s])",
			metric(t, unreachableNodes, "node", "refused"), before, nearIP, current, departed, near)
	}
	if _, ok := src.Remembered(near); ok {
		t.Errorf("the facts of deleted node %s are still remembered", near)
	}
}

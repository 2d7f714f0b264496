package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/ipam"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/reach"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e }))
}

// controllerUser is the identity the controller runs as, with exactly the RBAC
// documented in ccm/ipam/doc.go.
const controllerUser = "talos-ccm-ipam"

var (
	rbacOnce sync.Once
	rbacErr  error
	ipamCS   kubernetes.Interface
)

// controllerClient returns the controller's restricted client, installing its
// RBAC once.
func controllerClient(t testing.TB) kubernetes.Interface {
	t.Helper()
	rbacOnce.Do(func() { ipamCS, rbacErr = installRBAC(context.Background()) })
	if rbacErr != nil {
		t.Fatalf("RBAC: %v", rbacErr)
	}
	return ipamCS
}

func installRBAC(ctx context.Context) (kubernetes.Interface, error) {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "test:talos-ccm-ipam"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test:talos-ccm-ipam"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: controllerUser}},
	}
	if _, err := env.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	cfg, err := env.AddUser(controllerUser)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = -1, -1
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// the authorizer caches: wait until the rules are in effect
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	return cs, err
}

// running is a started controller.
type running struct {
	c    *ipam.Controller
	stop func()
}

// startController runs a controller with its own informer (like a fresh
// talos-ccm process) until stop is called or the test ends. It returns once
// the controller has rebuilt its ledger.
func startController(t *testing.T, cfg ipam.Config, tc *talos.Client) *running {
	t.Helper()
	r := startControllerWith(t, cfg, tc, nil)
	r.waitReady(t)
	return r
}

// startControllerNoWait returns as soon as the controller runs.
func startControllerNoWait(t *testing.T, cfg ipam.Config, tc *talos.Client) *running {
	t.Helper()
	return startControllerWith(t, cfg, tc, nil)
}

func (r *running) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-r.c.Ready():
	case <-time.After(60 * time.Second):
		t.Fatal("controller not ready within 60s")
	}
}

// startControllerWith runs the controller on custom, an informer the test
// built (to give the controller a stale view), if not nil. With a Talos
// client it learns about nodes as talos-ccm does: from a facts source (the
// talos cloud provider's interpretation, no rules) reading through tc.
func startControllerWith(t *testing.T, cfg ipam.Config, tc *talos.Client, custom coreinformers.NodeInformer) *running {
	t.Helper()
	cs := controllerClient(t)
	factory := informers.NewSharedInformerFactory(cs, 0)
	var inf coreinformers.NodeInformer = factory.Core().V1().Nodes()
	if custom != nil {
		inf = custom
	}
	if cfg.Workers == 0 {
		cfg.Workers = 8
	}
	var (
		nodeFacts ipam.NodeFacts
		network   ipam.ClusterNetworkReader
	)
	if tc != nil {
		// as talos-ccm: an unreachable Talos API is reported by ccm/reach
		rep := reach.New(reach.Options{})
		b := record.NewBroadcaster()
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
		t.Cleanup(b.Shutdown)
		rep.SetRecorder(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: reach.Component}))
		nodeFacts, network = facts.NewSource(tc, cloud.NewInterpreter(nil), facts.Options{Observer: rep}), tc
	}
	c, err := ipam.NewController(cs, inf, nodeFacts, network, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	if custom != nil {
		go custom.Informer().Run(ctx.Done())
	}
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	var once sync.Once
	r := &running{c: c, stop: func() {
		once.Do(func() {
			cancel()
			<-done
			factory.Shutdown()
		})
	}}
	t.Cleanup(r.stop)
	return r
}

// node is a Node as a kubelet registers it.
func node(name string, ips ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"ipam.test": "1"}, Annotations: map[string]string{}}}
	if len(ips) > 0 {
		n.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr] = strings.Join(ips, ",")
	}
	return n
}

func createNode(t testing.TB, n *corev1.Node) {
	t.Helper()
	if _, err := env.Client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", n.Name, err)
	}
}

func deleteNode(t testing.TB, name string) {
	t.Helper()
	if err := env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete node %s: %v", name, err)
	}
}

// cleanNodes deletes every node when the test ends (controllers of later tests
// must not see them) and waits until they are gone.
func cleanNodes(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.Client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			l, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			return err == nil && len(l.Items) == 0, nil
		})
	})
}

// listNodes returns every node.
func listNodes(t testing.TB) []corev1.Node {
	t.Helper()
	l, err := env.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// waitAllocated waits until every node named in names has podCIDRs.
func waitAllocated(t testing.TB, timeout time.Duration, names ...string) map[string][]netip.Prefix {
	t.Helper()
	var out map[string][]netip.Prefix
	var missing []string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		out = map[string][]netip.Prefix{}
		for _, n := range listNodes(t) {
			out[n.Name] = cidrsOf(t, &n)
		}
		missing = missing[:0]
		for _, name := range names {
			if len(out[name]) == 0 {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Fatalf("nodes without podCIDRs after %s: %v", timeout, head(missing, 10))
	}
	return out
}

func head(s []string, n int) []string {
	if len(s) > n {
		return append(slices.Clone(s[:n]), fmt.Sprintf("… (%d in all)", len(s)))
	}
	return s
}

// cidrsOf parses and checks the node's podCIDR/podCIDRs fields.
func cidrsOf(t testing.TB, n *corev1.Node) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, s := range n.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			t.Fatalf("node %s: podCIDRs %q: %v", n.Name, s, err)
		}
		out = append(out, p)
	}
	if len(out) > 0 && n.Spec.PodCIDR != n.Spec.PodCIDRs[0] {
		t.Fatalf("node %s: podCIDR %q != podCIDRs[0] %q", n.Name, n.Spec.PodCIDR, n.Spec.PodCIDRs[0])
	}
	return out
}

// assertNoOverlap fails if two nodes' CIDRs overlap.
func assertNoOverlap(t testing.TB, byNode map[string][]netip.Prefix) {
	t.Helper()
	type entry struct {
		p    netip.Prefix
		node string
	}
	var all []entry
	for n, ps := range byNode {
		for _, p := range ps {
			all = append(all, entry{p, n})
		}
	}
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[i].p.Overlaps(all[j].p) {
				t.Fatalf("overlap: %s has %s, %s has %s", all[i].node, all[i].p, all[j].node, all[j].p)
			}
		}
	}
}

// eventsFor lists events with reason on the node (its current incarnation,
// when it exists: names repeat across test runs against one API server).
func eventsFor(t testing.TB, nodeName, reason string) []corev1.Event {
	t.Helper()
	ctx := context.Background()
	l, err := env.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + nodeName + ",reason=" + reason,
	})
	if err != nil {
		t.Fatal(err)
	}
	n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return l.Items
	}
	var out []corev1.Event
	for _, e := range l.Items {
		if e.InvolvedObject.UID == n.UID {
			out = append(out, e)
		}
	}
	return out
}

func waitEvent(t testing.TB, nodeName, reason string, timeout time.Duration) corev1.Event {
	t.Helper()
	var ev []corev1.Event
	_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ev = eventsFor(t, nodeName, reason)
		return len(ev) > 0, nil
	})
	if len(ev) == 0 {
		t.Fatalf("no %s event on node %s within %s", reason, nodeName, timeout)
	}
	return ev[0]
}

// metric reads a gauge or counter from the legacy registry (0 if absent).
func metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
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

// waitMetric waits until the metric has the value.
func waitMetric(t testing.TB, name string, labels map[string]string, want float64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return metric(t, name, labels) == want, nil
	})
	if err != nil {
		t.Fatalf("%s%v = %v, want %v", name, labels, metric(t, name, labels), want)
	}
}

// talosEndpoint starts simulated Talos nodes and returns a real client for them.
func talosEndpoint(t *testing.T) (*talosnode.Endpoint, *talos.Client) {
	t.Helper()
	ep := talosnode.StartFor(t)
	c := ep.ClientFor(t)
	return ep, c
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

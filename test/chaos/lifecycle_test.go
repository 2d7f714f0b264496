package chaos

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/cloud-provider/controllers/nodelifecycle"
	controllersmetrics "k8s.io/component-base/metrics/prometheus/controllers"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

const (
	ccmNamespace = "kube-system"
	ccmName      = "native-ccm-hcloud"
	// monitorPeriod is cloud-node-lifecycle's --node-monitor-period here (5 s upstream).
	monitorPeriod = 100 * time.Millisecond
	// settlePasses are the monitor passes the controller gets after the expected
	// deletions, to make wrong ones that would follow visible.
	settlePasses = 5
)

var (
	env *testenv.Env
	// gateBin is the ccm-gate binary, built once for the package.
	gateBin string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hybrid-ccm-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if gateBin, err = gatetest.BuildGate(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// No skipping: without KUBEBUILDER_ASSETS testenv.Run fails the package.
	code := testenv.Run(m, testenv.Options{CRDDirectoryPaths: []string{gatetest.CRDs()}}, func(e *testenv.Env) { env = e })
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// inProcessGate serves the hcloud view of upstream from the proxy package on
// loopback and returns the config a CCM uses to reach it (bearer: the token it
// sends, "" for none). The server is closed when the test ends; call it before
// starting the controller, so that its cleanup runs after the controller's (a
// live informer would reconnect and keep Close waiting).
func inProcessGate(t *testing.T, ctx context.Context, upstream *rest.Config, creds proxy.CredentialMode, bearer string) *rest.Config {
	t.Helper()
	p, err := proxy.New(proxy.Config{Upstream: upstream, Platform: "hcloud", Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL, BearerToken: bearer, QPS: -1, Burst: -1}
}

// cluster is the scenario's cluster: four platforms and uninitialized nodes,
// ten each, 30% of each NotReady.
func cluster() []gatetest.NodeSpec {
	var specs []gatetest.NodeSpec
	for _, p := range []struct{ platform, id string }{
		{"hcloud", "hcloud://%d"},
		{"aws", "aws:///eu-central-1a/i-%08d"},
		{"gcp", "gce://project/europe-west3-a/gcp-%d"},
		{"metal", "talos://metal/10.0.0.%d"},
		{"", ""}, // uninitialized: no platform label, empty providerID
	} {
		prefix := p.platform
		if prefix == "" {
			prefix = "uninit"
		}
		for i := range 10 {
			s := gatetest.NodeSpec{Name: fmt.Sprintf("%s-%d", prefix, i), Platform: p.platform, Ready: i >= 3}
			if p.id != "" {
				s.ProviderID = fmt.Sprintf(p.id, i)
			}
			specs = append(specs, s)
		}
	}
	return specs
}

func notReady(platform string) func(gatetest.NodeSpec) bool {
	return func(s gatetest.NodeSpec) bool { return !s.Ready && (platform == "*" || s.Platform == platform) }
}

// TestLifecycleChaos runs the unmodified cloud-node-lifecycle controller of
// k8s.io/cloud-provider with a cloud that says no instance exists, as the
// hcloud NativeCCM's ServiceAccount, against a real API server.
func TestLifecycleChaos(t *testing.T) {
	scenarios := []struct {
		name string
		// view puts ccm-gate between the controller and the API server.
		view bool
		// credentials of the gate (view only): own (client certificate identity)
		// or forward (a real ServiceAccount token, as in the pod).
		credentials proxy.CredentialMode
		// fence installs the admission policy.
		fence bool
		// wantDeleted are the nodes that must be gone; every other must remain.
		wantDeleted func(gatetest.NodeSpec) bool
		// foreignSeen: the cloud is asked about nodes of other platforms.
		foreignSeen bool
		// watchList turns on client-go's WatchListClient (as current CCMs run).
		watchList bool
		// binary runs the real ccm-gate binary (HTTPS on loopback, forwarded
		// token) instead of the proxy in-process.
		binary bool
	}{
		{name: "ungated deletes foreign nodes", wantDeleted: notReady("*"), foreignSeen: true},
		{name: "gate (view + fence)", view: true, credentials: proxy.OwnCredentials, fence: true, wantDeleted: notReady("hcloud")},
		{name: "gate with forwarded ServiceAccount token", view: true, credentials: proxy.ForwardCredentials, fence: true, wantDeleted: notReady("hcloud")},
		{name: "gate with a WatchList client", view: true, credentials: proxy.ForwardCredentials, fence: true, wantDeleted: notReady("hcloud"), watchList: true},
		{name: "ccm-gate binary as the sidecar, WatchList client", view: true, credentials: proxy.ForwardCredentials, fence: true, wantDeleted: notReady("hcloud"), watchList: true, binary: true},
		{name: "ungated WatchList client deletes foreign nodes", wantDeleted: notReady("*"), foreignSeen: true, watchList: true},
		{name: "fence alone (view bypassed)", fence: true, wantDeleted: notReady("hcloud"), foreignSeen: true},
		{name: "view alone (no fence)", view: true, credentials: proxy.OwnCredentials, wantDeleted: notReady("hcloud")},
	}
	ctx := context.Background()
	admin := env.Client
	// Exactly the RBAC the coordinator grants (no update of nodes, nothing on
	// nodes/status): the unmodified controller must work with it.
	if err := gatetest.GrantLifecycle(ctx, admin, ccmNamespace, ccmName); err != nil {
		t.Fatal(err)
	}
	ccmCert, err := gatetest.ServiceAccountUser(env, ccmNamespace, ccmName)
	if err != nil {
		t.Fatal(err)
	}
	token, err := gatetest.ServiceAccountToken(ctx, admin, ccmNamespace, ccmName)
	if err != nil {
		t.Fatal(err)
	}
	ccmToken := &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: token, QPS: -1, Burst: -1}
	crc, err := gatetest.Client(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	// NativeCCM hcloud and its grant for native-ccm-hcloud, as an admin
	// leaves them (the fence knows hcloud's prefixes from the built-in
	// profile).
	fence := gate.Fence{Namespace: ccmNamespace}
	remove, err := gatetest.Confine(ctx, crc, fence, "hcloud", "hcloud")
	if remove != nil {
		t.Cleanup(remove)
	}
	if err != nil {
		t.Fatal(err)
	}

	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			specs := cluster()
			if err := gatetest.DeleteAllNodes(ctx, admin); err != nil {
				t.Fatal(err)
			}
			if err := gatetest.CreateNodes(ctx, admin, specs...); err != nil {
				t.Fatal(err)
			}
			direct := kubernetes.NewForConfigOrDie(ccmCert)
			if sc.fence {
				if _, err := gate.EnsureFence(ctx, crc, fence); err != nil {
					t.Fatal(err)
				}
			} else if err := gate.DeleteFence(ctx, crc, fence); err != nil {
				t.Fatal(err)
			}
			if err := gatetest.WaitFence(ctx, direct, "aws-0", sc.fence); err != nil {
				t.Fatalf("fence active=%v never reached: %v", sc.fence, err)
			}

			// The CCM's API server: ccm-gate on loopback, or the real one.
			ccm := ccmCert
			if sc.credentials == proxy.ForwardCredentials {
				ccm = ccmToken
			}
			if sc.view && sc.binary {
				g, err := gatetest.StartGate(gateBin, t.TempDir(), "hcloud", ccmToken, token)
				if err != nil {
					t.Fatal(err)
				}
				// Registered before the controller's cleanup, so it runs after it.
				t.Cleanup(func() {
					g.Stop()
					if t.Failed() {
						out, _ := os.ReadFile(g.Log)
						t.Logf("ccm-gate log:\n%s", out)
					}
				})
				ccm = g.Config
			} else if sc.view {
				bearer := ""
				if sc.credentials == proxy.ForwardCredentials {
					bearer = token
				}
				ccm = inProcessGate(t, ctx, ccm, sc.credentials, bearer)
			}

			if sc.watchList {
				prev := clientfeatures.FeatureGates()
				clientfeatures.ReplaceFeatureGates(watchListGates{Gates: prev})
				defer clientfeatures.ReplaceFeatureGates(prev)
			}
			cloud := newDangerousCloud()
			passes := runLifecycle(t, ctx, ccm, cloud)

			// Wait for the expected deletions, then give the controller more
			// passes in which any wrong deletion would happen.
			want := map[string]bool{}
			for _, s := range specs {
				if sc.wantDeleted(s) {
					want[s.Name] = true
				}
			}
			err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				l, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
				if err != nil {
					return false, err
				}
				for _, n := range l.Items {
					if want[n.Name] {
						return false, nil
					}
				}
				return true, nil
			})
			if err != nil {
				t.Fatalf("expected deletions did not happen: %v", err)
			}
			start := passes.count()
			if err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
				return passes.count() >= start+settlePasses, nil
			}); err != nil {
				t.Fatal(err)
			}

			l, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var deleted, kept []string
			present := map[string]bool{}
			for _, n := range l.Items {
				present[n.Name] = true
			}
			for _, s := range specs {
				switch {
				case !present[s.Name] && !want[s.Name]:
					t.Errorf("node %s (platform %q, providerID %q, ready %v) was deleted", s.Name, s.Platform, s.ProviderID, s.Ready)
				case present[s.Name] && want[s.Name]:
					t.Errorf("node %s should have been deleted", s.Name)
				case !present[s.Name]:
					deleted = append(deleted, s.Name)
				default:
					kept = append(kept, s.Name)
				}
			}
			t.Logf("deleted %d: %v; kept %d", len(deleted), deleted, len(kept))

			seen := cloud.seen()
			foreign := slices.ContainsFunc(seen, func(n string) bool { return !strings.HasPrefix(n, "hcloud-") })
			if foreign != sc.foreignSeen {
				t.Errorf("cloud asked about %v; foreign nodes seen = %v, want %v", seen, foreign, sc.foreignSeen)
			}

			if sc.fence && !sc.view {
				// The controller tried and the API server refused, naming the CCM
				// and the node; its Warning events carry the denial.
				checkDenialEvents(t, ctx, l.Items, specs)
			}
		})
	}
	_ = gate.DeleteFence(ctx, crc, fence)
}

// runLifecycle starts the unmodified cloud-node-lifecycle controller with its
// own informer and client from cfg, until the test ends.
func runLifecycle(t *testing.T, ctx context.Context, cfg *rest.Config, cloud *dangerousCloud) *countingNodeInformer {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cfg)
	factory := informers.NewSharedInformerFactory(cs, 0)
	nodes := &countingNodeInformer{NodeInformer: factory.Core().V1().Nodes()}
	ctrl, err := nodelifecycle.NewCloudNodeLifecycleController(nodes, cs, cloud, monitorPeriod, 1)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	runCtx, cancel := context.WithCancel(ctx)
	factory.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		t.Fatal("node informer never synced")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctrl.Run(runCtx, controllersmetrics.NewControllerManagerMetrics("chaos"))
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		close(stop)
		factory.Shutdown()
	})
	return nodes
}

// checkDenialEvents waits for a DeletingNodeFailed event per foreign NotReady
// node whose message names the NativeCCM and the node.
func checkDenialEvents(t *testing.T, ctx context.Context, nodes []corev1.Node, specs []gatetest.NodeSpec) {
	t.Helper()
	uids := map[string]string{}
	for _, n := range nodes {
		uids[n.Name] = string(n.UID)
	}
	for _, s := range specs {
		if s.Ready || s.Platform == "hcloud" {
			continue
		}
		sel := fields.Set{"involvedObject.name": s.Name, "involvedObject.uid": uids[s.Name], "reason": "DeletingNodeFailed"}.AsSelector().String()
		var msg string
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			l, err := env.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil && !apierrors.IsNotFound(err) {
				return false, err
			}
			if len(l.Items) == 0 {
				return false, nil
			}
			msg = l.Items[0].Message
			return true, nil
		})
		if err != nil {
			t.Errorf("no DeletingNodeFailed event for %s: %v", s.Name, err)
			continue
		}
		for _, want := range []string{"hybrid-ccm gate", "NativeCCM hcloud", "node " + s.Name} {
			if !strings.Contains(msg, want) {
				t.Errorf("event for %s: %q does not mention %q", s.Name, msg, want)
			}
		}
	}
}

// watchListGates turns client-go's WatchListClient feature on.
type watchListGates struct{ clientfeatures.Gates }

func (g watchListGates) Enabled(f clientfeatures.Feature) bool {
	return f == clientfeatures.WatchListClient || g.Gates.Enabled(f)
}

// TestLifecycleShutdownTaintWithCoordinatorRBAC: the other write of
// cloud-node-lifecycle. With a cloud that says every instance exists but is
// shut down, the unmodified controller, as the hcloud NativeCCM's
// ServiceAccount with exactly the coordinator's RBAC (nodes
// get/list/watch/patch/delete, no update), through ccm-gate and the fence,
// taints its NotReady nodes and untaints its Ready one, and touches no other
// platform's node. The taint writes are GET + strategic-merge PATCH: if the
// controller needed update, they would be refused and no taint would change.
func TestLifecycleShutdownTaintWithCoordinatorRBAC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := env.Client
	if err := gatetest.GrantLifecycle(ctx, admin, ccmNamespace, ccmName); err != nil {
		t.Fatal(err)
	}
	token, err := gatetest.ServiceAccountToken(ctx, admin, ccmNamespace, ccmName)
	if err != nil {
		t.Fatal(err)
	}
	crc, err := gatetest.Client(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	fence := gate.Fence{Namespace: ccmNamespace}
	if _, err := gate.EnsureFence(ctx, crc, fence); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteFence(context.Background(), crc, fence) })
	remove, err := gatetest.Confine(ctx, crc, fence, "hcloud", "hcloud")
	if remove != nil {
		t.Cleanup(remove)
	}
	if err != nil {
		t.Fatal(err)
	}

	specs := cluster()
	if err := gatetest.DeleteAllNodes(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := gatetest.CreateNodes(ctx, admin, specs...); err != nil {
		t.Fatal(err)
	}
	// A Ready hcloud node and a Ready aws node that still carry the shutdown
	// taint: the controller removes it from its own node only.
	// Both also carry an admin's NoExecute taint, which the fence lets no
	// native CCM change: the controller's patches must leave it alone.
	adminTaint := corev1.Taint{Key: "example.com/maintenance", Value: "admin", Effect: corev1.TaintEffectNoExecute}
	shutdownTaint := `{"spec":{"taints":[{"key":"` + cloudproviderapi.TaintNodeShutdown + `","effect":"NoSchedule"},{"key":"example.com/maintenance","value":"admin","effect":"NoExecute"}]}}`
	for _, n := range []string{"hcloud-9", "aws-9"} {
		if _, err := admin.CoreV1().Nodes().Patch(ctx, n, types.StrategicMergePatchType, []byte(shutdownTaint), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ccmCert, err := gatetest.ServiceAccountUser(env, ccmNamespace, ccmName)
	if err != nil {
		t.Fatal(err)
	}
	if err := gatetest.WaitFence(ctx, kubernetes.NewForConfigOrDie(ccmCert), "aws-0", true); err != nil {
		t.Fatal(err)
	}

	upstream := &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: token, QPS: -1, Burst: -1}
	passes := runLifecycle(t, ctx, inProcessGate(t, ctx, upstream, proxy.ForwardCredentials, token), newShutdownCloud())

	tainted := func(n *corev1.Node) bool {
		return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cloudproviderapi.TaintNodeShutdown })
	}
	// want: NotReady hcloud nodes tainted, hcloud-9 untainted, everything else as created.
	want := func(s gatetest.NodeSpec) bool {
		switch {
		case s.Name == "aws-9":
			return true
		case s.Platform == "hcloud":
			return !s.Ready
		}
		return false
	}
	check := func() []string {
		var wrong []string
		for _, s := range specs {
			n, err := admin.CoreV1().Nodes().Get(ctx, s.Name, metav1.GetOptions{})
			if err != nil {
				wrong = append(wrong, s.Name+": "+err.Error())
				continue
			}
			if tainted(n) != want(s) {
				wrong = append(wrong, fmt.Sprintf("%s tainted=%v", s.Name, tainted(n)))
			}
			if (s.Name == "hcloud-9" || s.Name == "aws-9") && !slices.Contains(n.Spec.Taints, adminTaint) {
				wrong = append(wrong, s.Name+": the admin's taint is gone")
			}
		}
		return wrong
	}
	var wrong []string
	if err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		wrong = check()
		return len(wrong) == 0, nil
	}); err != nil {
		t.Fatalf("shutdown taints never as expected: %v", wrong)
	}
	// More passes: nothing else changes (and nothing is deleted).
	start := passes.count()
	if err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		return passes.count() >= start+settlePasses, nil
	}); err != nil {
		t.Fatal(err)
	}
	if wrong := check(); len(wrong) > 0 {
		t.Errorf("after %d more passes: %v", settlePasses, wrong)
	}
}

// Package install proves the install docs/install.md describes: the umbrella
// chart installed with Helm into a real API server, its talos-ccm and
// ccm-coordinator pods run by the pod runner from the images the repository
// builds, with exactly the RBAC, flags and volumes the charts render; the
// native CCM pods the coordinator then installs (ccm-gate sidecar and CCM) run
// the same way. Only its tests hold code.
package install

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
	"github.com/hybrid-ccm/hybrid-ccm/test/podrunner"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const namespace = "kube-system"

// coordinatorNamespace is the coordinator's own (the chart's default): it
// runs there with the native CCMs, their releases, credentials and leases.
const coordinatorNamespace = "hybrid-ccm-system"

// node is a simulated Talos machine and the Node its kubelet registers.
type node struct {
	name, platform, ip, providerID string
	// ready is the kubelet's Ready condition; a NotReady node's machine is
	// down (and, for gone, deleted in its cloud).
	ready, gone bool
}

var nodes = []node{
	{name: "aws-1", platform: "aws", ip: "10.10.0.1", providerID: "aws:///eu-central-1a/i-0aa1", ready: true},
	{name: "hcloud-1", platform: "hcloud", ip: "10.10.0.2", providerID: "hcloud://1001", ready: true},
	{name: "gcp-1", platform: "gcp", ip: "10.10.0.3", providerID: "gce://prod/europe-west3-a/gcp-1", ready: true},
	{name: "metal-1", platform: "metal", ip: "10.10.0.4", ready: true},
	// a deleted hcloud server: the hcloud CCM must delete its node
	{name: "hcloud-gone", platform: "hcloud", ip: "10.10.0.5", providerID: "hcloud://1002", gone: true},
	// a powered-off bare-metal machine: no cloud CCM may touch it
	{name: "metal-down", platform: "metal", ip: "10.10.0.6"},
}

// TestInstallAsDocumented installs the umbrella chart with a multi-cloud
// values file, runs every pod the charts and the coordinator render, and
// follows the life of the nodes: initialized, pod CIDRs, serving CSRs
// approved, native CCMs installed, running, Ready and gated; the gone hcloud
// server's node deleted by the hcloud CCM, nothing else touched or asked
// about; no pod with an admin credential.
func TestInstallAsDocumented(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// The Talos machines, and the fake cloud every native CCM asks.
	ep := talosnode.StartFor(t)
	for _, n := range nodes {
		md := runtime.PlatformMetadataSpec{Platform: n.platform, Hostname: n.name, Region: "eu", Zone: "eu-a", InstanceType: "m1"}
		if n.providerID != "" {
			md.ProviderID = n.providerID
			md.InstanceID = n.providerID[strings.LastIndex(n.providerID, "/")+1:]
		}
		if _, err := ep.AddNode(n.name, []string{n.ip}, talosnode.Spec{Metadata: &md,
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: n.ip + "/24"}}}); err != nil {
			t.Fatal(err)
		}
	}
	cloud := newFakeCloud()
	srv := httptest.NewServer(cloud)
	t.Cleanup(srv.Close)

	// helm install hybrid-ccm charts/hybrid-ccm -n kube-system -f multi-cloud.yaml
	values := installValues(t, srv.URL)
	chartstest.InstallUmbrella(t, ctx, env.KubeconfigPath, namespace, "hybrid-ccm", values)

	// Then the clouds' credentials, in the coordinator's namespace the chart
	// created (docs/profiles.md names the keys); the coordinator waits for them.
	for name, data := range map[string]map[string]string{
		"hcloud":  {"token": "test-token"},
		"aws-ccm": {"access-key-id": "AKIATEST", "secret-access-key": "secret", "cloud.conf": "[Global]\nRegion = eu-central-1\n"},
		"gcp-ccm": {"credentials.json": "{}", "gce.conf": "[global]\nproject-id = prod\n"},
	} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: coordinatorNamespace}, StringData: data}
		if _, err := env.Client.CoreV1().Secrets(coordinatorNamespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Talos answers the chart's talos.dev ServiceAccount with a Secret of the
	// same name holding a talosconfig for its roles.
	answerTalosServiceAccounts(t, ctx, ep)

	// The kubelet and the controllers: every Deployment of the namespace,
	// including the native CCMs the coordinator installs later.
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	var upstream []string
	for _, name := range set.Names() {
		p, _ := set.Get(name)
		upstream = append(upstream, p.CCM.Image.Reference())
	}
	logs := &testenv.Buffer{}
	runner := podrunner.New(t, podrunner.Options{Config: env.Config, Images: images(t, upstream), NodeName: "cp-1", Log: logs})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pod logs (tail):\n%s", tail(logs.String(), 20000))
		}
	})
	for _, ns := range []string{namespace, coordinatorNamespace} {
		if err := runner.Manage(ctx, ns, ""); err != nil {
			t.Fatal(err)
		}
	}

	// The kubelets register.
	for _, n := range nodes {
		register(t, ctx, n)
	}

	// talos-ccm initializes every node and gives it pod CIDRs.
	for _, n := range nodes {
		if n.gone {
			continue // may be deleted as soon as it is initialized
		}
		got := waitNode(t, n.name, func(o *corev1.Node) bool { return initialized(o) && len(o.Spec.PodCIDRs) > 0 })
		if got.Labels[names.PlatformLabel] != n.platform {
			t.Errorf("node %s: platform label %q, want %q", n.name, got.Labels[names.PlatformLabel], n.platform)
		}
		if n.providerID != "" && got.Spec.ProviderID != n.providerID {
			t.Errorf("node %s: providerID %q, want %q", n.name, got.Spec.ProviderID, n.providerID)
		}
	}

	// Their kubelets ask for serving certificates; talos-ccm approves them.
	for _, n := range nodes {
		if n.ready {
			approved(t, ctx, n)
		}
	}

	// The coordinator installs each cloud's CCM; each becomes Ready: its
	// release is deployed and one of its pods holds its lease.
	for _, name := range []string{"aws", "hcloud", "gcp"} {
		waitReady(t, ctx, name)
	}
	if o := chartstest.NativeCCM(t, ctx, env.Config, "digital-ocean"); o.Status.Release != nil {
		t.Errorf("suspended NativeCCM digital-ocean has release %+v", o.Status.Release)
	}

	// The gone server's node is deleted by the hcloud CCM, through its gate.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := env.Client.CoreV1().Nodes().Get(ctx, "hcloud-gone", metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Errorf("node hcloud-gone was not deleted; the fake cloud was asked %v", cloud.asked())
	}

	// The CCMs stay up: every native CCM renews its lease several times while
	// no container restarts.
	renewals(t, ctx, []string{"native-ccm-aws", "native-ccm-hcloud", "native-ccm-gcp"}, 3)
	pods, err := env.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own, err := env.Client.CoreV1().Pods(coordinatorNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods.Items = append(pods.Items, own.Items...)
	var running []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		running = append(running, p.Labels["app.kubernetes.io/name"]+"/"+p.Spec.ServiceAccountName)
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			if cs.RestartCount != 0 || !cs.Ready {
				t.Errorf("pod %s container %s: ready %v, %d restarts, last state %+v", p.Name, cs.Name, cs.Ready, cs.RestartCount, cs.LastTerminationState.Terminated)
			}
		}
	}
	slices.Sort(running)
	t.Logf("pods running: %v", running)
	if len(running) != 5 {
		t.Errorf("running pods %v, want talos-ccm, ccm-coordinator and three native CCMs", running)
	}

	// Nothing else was touched or asked about: the metal node is still
	// there, and each CCM asked its cloud only about its own nodes.
	if _, err := env.Client.CoreV1().Nodes().Get(ctx, "metal-down", metav1.GetOptions{}); err != nil {
		t.Errorf("NotReady metal node: %v", err)
	}
	for _, a := range cloud.asked() {
		if a != "hcloud/hcloud-gone" {
			t.Errorf("a native CCM asked its cloud about %s", a)
		}
	}

	noAdminCredentials(t, ctx, pods.Items)

	// LoadBalancer Services: each of the hcloud and aws CCMs (their service
	// controllers behind their gates) serves its own class, aws also those
	// without a class; each load balancer targets only its cloud's nodes.
	t.Run("LoadBalancers", func(t *testing.T) { loadBalancers(t, ctx, cloud) })

	// The view is a boundary: the CCM that just worked through its gate holds
	// nothing the API server accepts.
	t.Run("CCMHoldsNoAPICredential", func(t *testing.T) {
		for _, name := range []string{"aws", "hcloud", "gcp"} {
			ccmHoldsNoAPICredential(t, ctx, runner, name)
		}
	})

	// NativeCCM Ready follows the native CCM's pods and lease, not Helm.
	t.Run("LeaderPodDeleted", func(t *testing.T) {
		old := chartstest.NativeCCM(t, ctx, env.Config, "hcloud").Status.Leader.Pod
		deletePod(t, ctx, old)
		o := waitNativeCCM(t, ctx, "hcloud", "the leader's pod is gone", func(o *v1.NativeCCM) bool { return isFalse(o, "Ready") })
		t.Logf("leader pod %s deleted: Ready=False %s", old, reason(o, "Ready"))
		o = waitNativeCCM(t, ctx, "hcloud", "a new pod leads", func(o *v1.NativeCCM) bool {
			return isTrue(o, "Ready") && isTrue(o, v1.HealthyCondition) && o.Status.Leader != nil && o.Status.Leader.Pod != old
		})
		t.Logf("new leader %s: Ready=True %s", o.Status.Leader.Pod, reason(o, "Ready"))
	})
	t.Run("AuthenticationRBACMissing", func(t *testing.T) {
		// The bug this install first had: without the delegated-authentication
		// binding the CCM exits at start. The gate now holds the CCM container
		// back until its identity may read the client CA (issue 22 item 8: the
		// binding of a fresh release may not be in effect yet), and says so in
		// its log; the CCM never runs, so it never crash-loops.
		const binding = "native-ccm-hcloud:extension-apiserver-authentication-reader"
		waiting := func() int {
			n := 0
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "waiting for the CCM's permissions before it starts") && strings.Contains(line, `platform="hcloud"`) &&
					strings.Contains(line, "get configmaps kube-system/extension-apiserver-authentication") {
					n++
				}
			}
			return n
		}
		before := waiting()
		rb, err := env.Client.RbacV1().RoleBindings(namespace).Get(ctx, binding, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the release's binding: %v", err)
		}
		if err := env.Client.RbacV1().RoleBindings(namespace).Delete(ctx, binding, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		deletePod(t, ctx, chartstest.NativeCCM(t, ctx, env.Config, "hcloud").Status.Leader.Pod)
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			return waiting() > before, nil
		}); err != nil {
			t.Fatalf("the new pod's gate never said it waits to read the client CA: %v", err)
		}
		o := waitNativeCCM(t, ctx, "hcloud", "without a running pod", func(o *v1.NativeCCM) bool {
			return isFalse(o, "Ready") && reason(o, "Ready") == "NoRunningPods"
		})
		if r := reason(o, v1.HealthyCondition); r == "CrashLooping" {
			t.Errorf("the CCM started and crash-loops although the gate holds it back: %s", message(o, v1.HealthyCondition))
		}
		// Fixed: the gate lets the CCM start; it takes the lease, Ready again.
		rb.ResourceVersion, rb.UID = "", ""
		if _, err := env.Client.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitNativeCCM(t, ctx, "hcloud", "running again", func(o *v1.NativeCCM) bool {
			return isTrue(o, "Ready") && isTrue(o, v1.HealthyCondition) && o.Status.Leader != nil
		})
	})
}

// ccmHoldsNoAPICredential looks at the running leader pod of a NativeCCM from
// inside: every file the CCM container has beyond its image (its volumes,
// /tmp, ...) and every value of its environment is tried as a bearer token
// for GET /api/v1/nodes at the in-cluster address its environment names, and
// so is no credential at all. The API server must refuse each (401 or 403).
// The same probe of the gate container must find the ServiceAccount token
// projected there: the probe can find a credential where there is one.
func ccmHoldsNoAPICredential(t *testing.T, ctx context.Context, runner *podrunner.Runner, name string) {
	t.Helper()
	o := chartstest.NativeCCM(t, ctx, env.Config, name)
	if o.Status.Leader == nil {
		t.Fatalf("NativeCCM %s has no leader", name)
	}
	obj, err := env.Client.CoreV1().Pods(coordinatorNamespace).Get(ctx, o.Status.Leader.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The Pod the API server holds: no automatic token.
	if a := obj.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("pod %s: automountServiceAccountToken %v, want false", obj.Name, ptr.Deref(a, true))
	}
	var pod *podrunner.Pod
	deps, err := env.Client.AppsV1().Deployments(coordinatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: "hybridccm.io/native-ccm=native-ccm-" + name})
	if err != nil || len(deps.Items) != 1 {
		t.Fatalf("deployment of native-ccm-%s: %v %v", name, deps, err)
	}
	if d := runner.Deployment(coordinatorNamespace, deps.Items[0].Name); d != nil {
		for _, p := range d.Pods() {
			if p.Name() == obj.Name {
				pod = p
			}
		}
	}
	if pod == nil {
		t.Fatalf("the pod runner does not run pod %s", obj.Name)
	}
	ccmContainer := obj.Spec.Containers[0].Name
	ccm, err := pod.View(ccmContainer)
	if err != nil {
		t.Fatal(err)
	}
	gateView, err := pod.View(gate.SidecarName)
	if err != nil {
		t.Fatal(err)
	}

	ccmTried, ccmAccepted := tryCredentials(t, ctx, ccm)
	if len(ccmAccepted) > 0 {
		t.Errorf("pod %s container %s: the API server accepts %v from its environment, bypassing the view", obj.Name, ccmContainer, ccmAccepted)
	}
	// The file its kubeconfig names was among those tried.
	if !slices.Contains(ccmTried, "file "+gate.ClientTokenPath) {
		t.Errorf("pod %s container %s: the gate's client token was not found among %v", obj.Name, ccmContainer, ccmTried)
	}
	_, gateAccepted := tryCredentials(t, ctx, gateView)
	if !slices.Contains(gateAccepted, "file "+gate.ServiceAccountTokenPath) {
		t.Errorf("pod %s container %s: its ServiceAccount token was not found or not accepted (accepted: %v)", obj.Name, gate.SidecarName, gateAccepted)
	}
	t.Logf("%s: %d candidate credentials of the CCM container tried; the gate's accepted: %v", obj.Name, len(ccmTried), gateAccepted)
}

// tryCredentials sends GET /api/v1/nodes to the API server at the address in
// the container's KUBERNETES_SERVICE_HOST/PORT, once without credentials and
// once with each candidate token: the content of every small file the
// container has mounted and every value of its environment. It returns the
// candidates tried and those the API server did not refuse with 401 or 403.
func tryCredentials(t *testing.T, ctx context.Context, v podrunner.ContainerView) (tried, accepted []string) {
	t.Helper()
	envMap := map[string]string{}
	for _, kv := range v.Env {
		k, val, _ := strings.Cut(kv, "=")
		envMap[k] = val
	}
	host, port := envMap["KUBERNETES_SERVICE_HOST"], envMap["KUBERNETES_SERVICE_PORT"]
	if host == "" || port == "" {
		t.Fatalf("container environment has no in-cluster address: %v", v.Env)
	}
	candidates := map[string]string{"no credential": ""}
	for k, val := range envMap {
		if val != "" {
			candidates["env "+k] = val
		}
	}
	for _, m := range v.Mounts {
		_ = filepath.WalkDir(m.Source, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			info, err := d.Info()
			if err != nil || !info.Mode().IsRegular() || info.Size() == 0 || info.Size() > 64<<10 {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			rel, _ := filepath.Rel(m.Source, p)
			if tok := strings.TrimSpace(string(b)); tok != "" && !strings.ContainsAny(tok, " \t\n") {
				candidates["file "+filepath.Join(m.Target, rel)] = tok
			}
			return nil
		})
	}
	// The caller's view: whatever a process there could do, TLS trust included.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // probing credentials, not the server
	for what, tok := range candidates {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(host, port)+"/api/v1/nodes?limit=1", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("the in-cluster address %s:%s: %v", host, port, err)
		}
		_ = resp.Body.Close()
		tried = append(tried, what)
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
			accepted = append(accepted, what)
		}
	}
	slices.Sort(tried)
	slices.Sort(accepted)
	return tried, accepted
}

func deletePod(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if err := env.Client.CoreV1().Pods(coordinatorNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s: %v", name, err)
	}
}

// waitNativeCCM polls the NativeCCM until cond holds.
func waitNativeCCM(t *testing.T, ctx context.Context, name, what string, cond func(*v1.NativeCCM) bool) *v1.NativeCCM {
	t.Helper()
	var last *v1.NativeCCM
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		last = chartstest.NativeCCM(t, ctx, env.Config, name)
		return cond(last), nil
	}); err != nil {
		t.Fatalf("NativeCCM %s: not %s: %+v", name, what, last.Status)
	}
	return last
}

func condition(o *v1.NativeCCM, ctype string) *metav1.Condition {
	for i := range o.Status.Conditions {
		if o.Status.Conditions[i].Type == ctype {
			return &o.Status.Conditions[i]
		}
	}
	return nil
}

func isFalse(o *v1.NativeCCM, ctype string) bool {
	c := condition(o, ctype)
	return c != nil && c.Status == metav1.ConditionFalse
}

func reason(o *v1.NativeCCM, ctype string) string {
	if c := condition(o, ctype); c != nil {
		return c.Reason
	}
	return ""
}

func message(o *v1.NativeCCM, ctype string) string {
	if c := condition(o, ctype); c != nil {
		return c.Message
	}
	return ""
}

// installValues reads testdata/multi-cloud.yaml and points every enabled
// cloud's stand-in CCM at the fake cloud.
func installValues(t *testing.T, cloudURL string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "multi-cloud.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	for _, c := range values["clouds"].(map[string]any) {
		c.(map[string]any)["overrides"] = map[string]any{"env": []any{map[string]any{"name": "TESTCCM_CLOUD_URL", "value": cloudURL}}}
	}
	return values
}

// answerTalosServiceAccounts does what Talos does for every
// talos.dev/v1alpha1 ServiceAccount: a Secret of the same name with a
// talosconfig (key "config") for the requested roles.
func answerTalosServiceAccounts(t *testing.T, ctx context.Context, ep *talosnode.Endpoint) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	list, err := dyn.Resource(schema.GroupVersionResource{Group: "talos.dev", Version: "v1alpha1", Resource: "serviceaccounts"}).
		Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("talos.dev ServiceAccounts: %d, want the chart's one", len(list.Items))
	}
	sa := list.Items[0]
	roles, _, _ := unstructured.NestedStringSlice(sa.Object, "spec", "roles")
	if len(roles) != 1 {
		t.Fatalf("talos.dev ServiceAccount %s roles %v", sa.GetName(), roles)
	}
	path := filepath.Join(t.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(path, roles[0]); err != nil {
		t.Fatal(err)
	}
	config, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: sa.GetName(), Namespace: namespace}, Data: map[string][]byte{"config": config}}
	if _, err := env.Client.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// register creates the Node as its kubelet would (tainted, provided IP) and
// sets its Ready condition.
func register(t *testing.T, ctx context.Context, n node) {
	t.Helper()
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name,
			Labels:      map[string]string{corev1.LabelHostname: n.name, corev1.LabelOSStable: "linux"},
			Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: n.ip}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}
	created, err := env.Client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{}) })
	status := corev1.ConditionTrue
	if !n.ready {
		status = corev1.ConditionFalse
	}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.ip}, {Type: corev1.NodeHostName, Address: n.name}}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func initialized(n *corev1.Node) bool {
	return !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cloudproviderapi.TaintExternalCloudProvider })
}

func waitNode(t *testing.T, name string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var last *corev1.Node
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return cond(n), nil
	}); err != nil {
		t.Fatalf("node %s: condition not met; last seen %+v", name, last)
	}
	return last
}

// approved submits the node's serving CSR as its kubelet and waits until it
// is approved.
func approved(t *testing.T, ctx context.Context, n node) {
	t.Helper()
	user := "system:node:" + n.name
	cfg, err := env.AddUser(user, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	// The test API server runs RBAC without the Node authorizer: bind the
	// node to the role that lets nodes create CSRs.
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test:" + n.name + ":csr"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := csrtest.Request{NodeName: n.name, DNSNames: []string{n.name}, IPs: csrtest.Addrs(n.ip)}
	var csr *certificatesv1.CertificateSigningRequest
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		csr, err = cs.CertificatesV1().CertificateSigningRequests().Create(ctx, csrtest.Object("serving-"+n.name, req.MustPEM()), metav1.CreateOptions{})
		return err == nil, nil // until the binding reaches the authorizer
	}); err != nil {
		t.Fatalf("node %s cannot create its CSR: %v", n.name, err)
	}
	var conds []certificatesv1.CertificateSigningRequestCondition
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds = got.Status.Conditions
		return len(conds) > 0, nil
	}); err != nil {
		t.Fatalf("serving CSR of %s not decided", n.name)
	}
	if conds[0].Type != certificatesv1.CertificateApproved {
		t.Errorf("serving CSR of %s: %+v, want Approved", n.name, conds)
	}
}

// waitReady waits until the NativeCCM runs (Ready, Gated, Healthy), led by a
// pod of its release.
func waitReady(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	o := chartstest.WaitNativeCCMRunning(t, ctx, env.Config, name)
	if !strings.HasPrefix(o.Status.Leader.Pod, "native-ccm-"+name) {
		t.Errorf("NativeCCM %s: leader %+v, want a pod of native-ccm-%s", name, o.Status.Leader, name)
	}
}

func isTrue(o *v1.NativeCCM, ctype string) bool {
	c := condition(o, ctype)
	return c != nil && c.Status == metav1.ConditionTrue
}

// renewals waits until every lease was renewed n more times.
func renewals(t *testing.T, ctx context.Context, leases []string, n int) {
	t.Helper()
	seen := map[string][]time.Time{}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		done := true
		for _, name := range leases {
			l, err := env.Client.CoordinationV1().Leases(coordinatorNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil || l.Spec.RenewTime == nil {
				return false, nil
			}
			ts := seen[name]
			if len(ts) == 0 || !ts[len(ts)-1].Equal(l.Spec.RenewTime.Time) {
				seen[name] = append(ts, l.Spec.RenewTime.Time)
			}
			done = done && len(seen[name]) > n
		}
		return done, nil
	}); err != nil {
		t.Errorf("leases not renewed %d times: %v", n, seen)
	}
}

// noAdminCredentials: no pod mounts a host path or another identity's
// token, and no pod's ServiceAccount holds cluster-admin, admin or edit.
func noAdminCredentials(t *testing.T, ctx context.Context, pods []corev1.Pod) {
	t.Helper()
	crbs, err := env.Client.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	powerful := map[string]bool{"cluster-admin": true, "admin": true, "edit": true, "system:controller:clusterrole-aggregation-controller": true}
	for _, p := range pods {
		sa := p.Spec.ServiceAccountName
		if sa == "" || sa == "default" {
			t.Errorf("pod %s runs as ServiceAccount %q: every component has its own", p.Name, sa)
		}
		for _, v := range p.Spec.Volumes {
			if v.HostPath != nil {
				t.Errorf("pod %s mounts host path %s", p.Name, v.HostPath.Path)
			}
			if v.Secret != nil && strings.Contains(v.Secret.SecretName, "token") {
				t.Errorf("pod %s mounts Secret %s", p.Name, v.Secret.SecretName)
			}
		}
		for _, b := range crbs.Items {
			for _, s := range b.Subjects {
				if s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == p.Namespace && powerful[b.RoleRef.Name] {
					t.Errorf("pod %s: ServiceAccount %s is bound to %s by %s", p.Name, sa, b.RoleRef.Name, b.Name)
				}
			}
		}
	}
}

// fakeCloud answers test/testccm's instance questions: every instance
// exists, except the deleted hcloud server; it records who asked about what.
type fakeCloud struct {
	mu  sync.Mutex
	log map[string]int
	// lbs are the clouds' load balancers (test/testccm builds them there).
	lbs *fakelb.Cloud
}

func newFakeCloud() *fakeCloud { return &fakeCloud{log: map[string]int{}, lbs: fakelb.New()} }

func (c *fakeCloud) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, fakelb.Prefix) {
		c.lbs.ServeHTTP(w, r)
		return
	}
	provider, nodeName := r.URL.Query().Get("provider"), r.URL.Query().Get("node")
	c.mu.Lock()
	c.log[provider+"/"+nodeName]++
	c.mu.Unlock()
	_ = json.NewEncoder(w).Encode(map[string]bool{"exists": nodeName != "hcloud-gone", "shutdown": false})
}

func (c *fakeCloud) asked() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k := range c.log {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func loadBalancers(t *testing.T, ctx context.Context, cloud *fakeCloud) {
	const ns = "shop"
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	services := []struct {
		name  string
		class *string
		// cloud is the provider that must serve it; "" none
		cloud string
		nodes []string
	}{
		{"web-hcloud", ptr.To("hybridccm.io/hcloud"), "hcloud", []string{"hcloud-1"}},
		{"web-aws", ptr.To("hybridccm.io/aws"), "aws", []string{"aws-1"}},
		{"web-default", nil, "aws", []string{"aws-1"}},
		// gcp's NativeCCM has no load balancers: nobody serves its class
		{"web-gcp", ptr.To("hybridccm.io/gcp"), "", nil},
	}
	for _, s := range services {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: s.class,
				Selector: map[string]string{"app": s.name}, Ports: []corev1.ServicePort{{Port: 80}}}}
		if _, err := env.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range services {
		if s.cloud == "" {
			continue
		}
		var got *corev1.Service
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			var err error
			got, err = env.Client.CoreV1().Services(ns).Get(ctx, s.name, metav1.GetOptions{})
			return err == nil && len(got.Status.LoadBalancer.Ingress) > 0, nil
		}); err != nil {
			t.Fatalf("Service %s got no address; load balancers %+v", s.name, cloud.lbs.LoadBalancers())
		}
		lb, ok := cloud.lbs.Get(s.cloud, ns+"/"+s.name)
		if !ok || got.Status.LoadBalancer.Ingress[0].IP != lb.IP || !slices.Equal(lb.Nodes, s.nodes) {
			t.Errorf("Service %s: address %v, %s load balancer %+v (found %v), want targets %v", s.name, got.Status.LoadBalancer.Ingress, s.cloud, lb, ok, s.nodes)
		}
		if !slices.Contains(got.Finalizers, gate.LoadBalancerCleanupFinalizer) {
			t.Errorf("Service %s finalizers %v", s.name, got.Finalizers)
		}
		if s.class != nil && (got.Spec.LoadBalancerClass == nil || *got.Spec.LoadBalancerClass != *s.class) {
			t.Errorf("Service %s lost its class through the gate: %v", s.name, got.Spec.LoadBalancerClass)
		}
	}
	// Each Service has exactly one load balancer, in its own cloud.
	if lbs := cloud.lbs.LoadBalancers(); len(lbs) != 3 {
		t.Errorf("load balancers %+v, want one per served Service", lbs)
	}
	if g, err := env.Client.CoreV1().Services(ns).Get(ctx, "web-gcp", metav1.GetOptions{}); err != nil || len(g.Status.LoadBalancer.Ingress) > 0 || len(g.Finalizers) > 0 {
		t.Errorf("Service web-gcp of a class nobody serves was changed: %+v %v", g.Status, err)
	}

	// Deleting a Service removes its load balancer, then the finalizer.
	if err := env.Client.CoreV1().Services(ns).Delete(ctx, "web-hcloud", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := env.Client.CoreV1().Services(ns).Get(ctx, "web-hcloud", metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Fatalf("Service web-hcloud not gone; deleted load balancers %v", cloud.lbs.Deleted())
	}
	if d := cloud.lbs.Deleted(); !slices.Equal(d, []string{"hcloud/shop/web-hcloud"}) {
		t.Errorf("deleted load balancers %v, want hcloud's for web-hcloud", d)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

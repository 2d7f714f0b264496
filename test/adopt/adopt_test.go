package adopt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/publish"
	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleethelm"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

const (
	// release and namespace are what docs/install.md installs the umbrella
	// as, and what the static manifests' ownership metadata names.
	release   = publish.StaticRelease
	namespace = publish.StaticNamespace
	// ccmNamespace is the coordinator's own (the chart's default).
	ccmNamespace = "hybrid-ccm-system"
)

// nativeCCMs are the NativeCCMs of testdata/values.yaml.
var nativeCCMs = []string{"aws", "hcloud"}

// TestBootstrapThenHelm is docs/install.md's path for a new Talos cluster:
//
//  1. the static manifests of docs/deploy, applied as they are, the way Talos
//     applies cluster.externalCloudProvider.manifests (server-side apply),
//     with the images of this tree's release under their published names,
//     together with Talos' own cluster DNS (CoreDNS) as Talos deploys it; on
//     machines that are all uninitialized, the machines are initialized
//     (talos-ccm finds the Talos API through the API server, whether or not
//     cluster DNS answers yet: which one came first is recorded), and then
//     cluster DNS answers a pod for the Talos Service;
//  2. `helm install hybrid-ccm oci://…/charts/hybrid-ccm -n kube-system` with
//     the platform team's values (a talos-ccm standby, two clouds) while three
//     more machines join — what the Flux layout's HelmRelease does with the
//     same release name and namespace.
//
// Helm adopts every object the static manifests made (same UID: none
// deleted and created again, no second talos-ccm or coordinator), and from
// then on owns them; throughout, no node is deleted or loses its
// initialization, no CSR is denied, no lease is taken from a live holder.
// Then the way back: the static manifests applied over the Helm release as
// `kubectl apply --server-side` does are refused, naming Helm and the field.
func TestBootstrapThenHelm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	root := testenv.RepoRoot()
	version, err := ship.DefaultVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	// The release under its published names: the static manifests name
	// ghcr.io/hybrid-ccm/<image>:<version>, and so does the chart.
	if err := f.ReleaseAs(ctx, ship.DefaultRegistry, version); err != nil {
		t.Fatal(err)
	}
	chartRef, err := f.ChartRefAs(ship.DefaultRegistry, "hybrid-ccm")
	if err != nil {
		t.Fatal(err)
	}
	clouds, err := f.StartClouds(fleet.CloudOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = clouds.Close() })

	// Cold: no node is initialized before talos-ccm runs, and nothing but
	// the API server tells talos-ccm where the Talos API is.
	nodes, err := f.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if fleetcheck.Initialized(&n) {
			t.Fatalf("node %s is initialized before talos-ccm was deployed", n.Name)
		}
	}
	first := recordFirstInitialized(t, ctx)

	// 1. Bootstrap, as Talos does it in one pass: its own bootstrap
	// manifests (here: cluster DNS, CoreDNS behind kube-dns) and the static
	// manifests of cluster.externalCloudProvider.manifests.
	if err := f.DeployClusterDNS(ctx); err != nil {
		t.Fatal(err)
	}
	var static []*unstructured.Unstructured
	for _, m := range publish.StaticManifests {
		data, err := os.ReadFile(filepath.Join(root, "docs", "deploy", m.File()))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := fleet.DecodeManifests(data)
		if err != nil {
			t.Fatalf("docs/deploy/%s: %v", m.File(), err)
		}
		if err := f.ApplyManifests(ctx, objs); err != nil {
			t.Fatalf("docs/deploy/%s: %v", m.File(), err)
		}
		static = append(static, objs...)
	}
	if err := f.AnswerTalosServiceAccount(ctx, namespace, "talos-ccm-talos"); err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		fleetcheck.WaitNode(t, ctx, f, m, "initialized and Ready", func(n *corev1.Node) bool { return fleetcheck.Initialized(n) && fleetcheck.Ready(n) })
	}
	fleetcheck.WaitRolledOut(t, ctx, f, namespace, "talos-ccm", version)
	fleetcheck.WaitRolledOut(t, ctx, f, ccmNamespace, release, version)
	objects := newObjects(t)
	before := objects.uids(t, ctx, static)
	for id, uid := range before {
		if uid == "" {
			t.Fatalf("%s: in docs/deploy, not in the cluster after applying it", id)
		}
	}
	t.Logf("bootstrapped from docs/deploy: %d objects, %d nodes initialized", len(before), len(machines))
	// No address was given to talos-ccm by hand: its talosconfig names only
	// the Talos Service (talos.default), which talos-ccm resolves through
	// the API server (the Service's EndpointSlices), not cluster DNS, and
	// every other machine's facts came through a control plane's apid.
	forwarded := fleetcheck.ControlPlaneForwards(f, machines)
	if forwarded == 0 {
		t.Fatal("no request reached a machine through a control plane's apid")
	}
	t.Logf("the control planes' apids forwarded %d requests", forwarded)

	// Cluster DNS came up as on Talos, beside talos-ccm: whether it answered
	// before the first node was initialized is a race of the two (CoreDNS
	// needs a node with a pod network; here kube-controller-manager gives
	// the pod CIDRs, so it may win). What held this time is recorded;
	// talos-ccm needed no DNS either way (test/oncluster runs without any).
	rec := first.get()
	if rec.node == "" {
		t.Fatal("no node was seen being initialized")
	}
	when := "only after it"
	if len(rec.dnsReady) > 0 {
		when = "before it"
	}
	t.Logf("first node initialized: %s at %s; kube-dns then had %d ready endpoints %v: cluster DNS answered %s",
		rec.node, rec.at.Format("15:04:05.000"), len(rec.dnsReady), rec.dnsReady, when)
	dns := fleetcheck.WaitClusterDNS(t, ctx, f)
	t.Logf("kube-dns ready endpoints after the bootstrap: %v", dns)
	// A pod (on a worker, through the kubelet's clusterDNS and kube-proxy)
	// resolves the Talos Service, and that name leads to a control plane's
	// apid: DNS is really there, now.
	talosIP, controlPlanes := fleetcheck.TalosAPI(t, ctx, f, machines)
	fleetcheck.WaitServingCSR(t, ctx, f, "aws-1")
	probe := fleetcheck.StartProbe(t, ctx, f, "dns-probe", "aws-1")
	name := talos.ServiceName + "." + talos.ServiceNamespace + ".svc." + cluster.ClusterDomain
	if got, err := fleetcheck.Probe(ctx, f, probe, "lookup", name); err != nil || !slices.Equal(got, []string{talosIP}) {
		t.Errorf("a pod resolves %s to %v (%v), want the Service's ClusterIP %s", name, got, err, talosIP)
	}
	if ips, err := fleetcheck.Probe(ctx, f, probe, "cert", fmt.Sprintf("%s:%d", name, fleet.TalosPort)); err != nil || len(ips) == 0 || !slices.Contains(controlPlanes, ips[0]) {
		t.Errorf("%s:%d from a pod presents a certificate for %v (%v), want a control plane's apid (%v)", name, fleet.TalosPort, ips, err, controlPlanes)
	}

	if err := fleetcheck.CredentialsSecrets(ctx, f, clouds, ccmNamespace, false); err != nil {
		t.Fatal(err)
	}

	// Another release name is refused before Helm changes anything, naming
	// the object and what its ownership metadata says.
	err = fleethelm.Install(ctx, f, namespace, "platform-ccm", chartRef, version, values(t, clouds.TestCCMURL()))
	if err == nil || !strings.Contains(err.Error(), "exists and cannot be imported into the current release: invalid ownership metadata") ||
		!strings.Contains(err.Error(), `key "meta.helm.sh/release-name" must equal "platform-ccm": current value is "hybrid-ccm"`) {
		t.Fatalf("helm install platform-ccm over the static manifests: %v, want a refusal naming the release annotation", err)
	}
	t.Logf("helm install under another name: %v", err)

	// 2. Helm takes over while machines join.
	w := fleetcheck.StartWatch(t, ctx, f, nativeCCMs)
	joined := fleetcheck.Join(ctx, f, joining)
	if err := fleethelm.Install(ctx, f, namespace, release, chartRef, version, values(t, clouds.TestCCMURL())); err != nil {
		t.Fatal(err)
	}
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	fleetcheck.WaitRolledOut(t, ctx, f, namespace, "talos-ccm", version)
	fleetcheck.WaitRolledOut(t, ctx, f, ccmNamespace, release, version)

	// Adopted, not replaced: every object of the static manifests is the
	// same object (UID), now in Helm's release.
	after := objects.uids(t, ctx, static)
	for id, uid := range before {
		if after[id] != uid {
			t.Errorf("%s: UID %s before helm install, %q after: deleted and created again", id, uid, after[id])
		}
	}
	rel, err := fleethelm.Status(f, namespace, release)
	if err != nil {
		t.Fatal(err)
	}
	if rel.Info.Status != "deployed" {
		t.Errorf("release %s: %s (%s)", release, rel.Info.Status, rel.Info.Description)
	}
	inRelease, err := fleet.DecodeManifests([]byte(rel.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	owned := map[string]bool{}
	for _, o := range inRelease {
		owned[objectID(o)] = true
	}
	for id := range before {
		if !owned[id] && !strings.HasPrefix(id, "CustomResourceDefinition ") {
			t.Errorf("%s: from the static manifests, not in Helm's release %s", id, release)
		}
	}
	// One talos-ccm and one coordinator in the whole cluster.
	for component, want := range map[string]string{"talos-ccm": "kube-system/talos-ccm", "ccm-coordinator": ccmNamespace + "/" + release} {
		list, err := f.Client.AppsV1().Deployments("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + component})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range list.Items {
			got = append(got, d.Namespace+"/"+d.Name)
		}
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s Deployments: %v, want only %s", component, got, want)
		}
	}
	d, err := f.Client.AppsV1().Deployments(namespace).Get(ctx, "talos-ccm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("talos-ccm: %v replicas after helm install, want the values' 2", d.Spec.Replicas)
	}

	for _, name := range nativeCCMs {
		chartstest.WaitNativeCCMRunning(t, ctx, f.Config, name)
	}
	for _, m := range append(slices.Clone(machines), joining...) {
		n := fleetcheck.WaitNode(t, ctx, f, m, "initialized and Ready", func(n *corev1.Node) bool { return fleetcheck.Initialized(n) && fleetcheck.Ready(n) })
		if n.Labels[names.PlatformLabel] != m.Platform || (m.ProviderID != "" && n.Spec.ProviderID != m.ProviderID) {
			t.Errorf("node %s: platform %q providerID %q, want %q %q", m.Name, n.Labels[names.PlatformLabel], n.Spec.ProviderID, m.Platform, m.ProviderID)
		}
	}
	for _, m := range joining {
		fleetcheck.WaitServingCSR(t, ctx, f, m.Name)
	}
	w.Stop()
	for _, e := range w.Errors() {
		t.Error(e)
	}
	for _, q := range clouds.Questions() {
		if q.Foreign {
			t.Errorf("the %s cloud was asked about %s, a machine of another platform (%d times)", q.Provider, q.About, q.Times)
		}
	}

	// The way back is refused: the static manifests applied over the release
	// as `kubectl apply --server-side` does (no --force-conflicts) stop at the
	// first field Helm set otherwise, and say so; nothing changes.
	var conflicts []string
	for _, o := range static {
		err := objects.apply(ctx, o, "kubectl")
		switch {
		case err == nil:
		case apierrors.IsConflict(err):
			conflicts = append(conflicts, objectID(o)+": "+err.Error())
		default:
			t.Errorf("kubectl apply --server-side %s: %v", objectID(o), err)
		}
	}
	t.Logf("static manifests over the Helm release: %d conflicts:\n%s", len(conflicts), strings.Join(conflicts, "\n"))
	if !slices.ContainsFunc(conflicts, func(c string) bool {
		return strings.HasPrefix(c, "Deployment kube-system/talos-ccm: ") && strings.Contains(c, `with "`+fleethelm.FieldManager+`"`) && strings.Contains(c, ".spec.replicas")
	}) {
		t.Errorf("applying docs/deploy over the Helm release was not refused on talos-ccm's replicas, naming Helm: %v", conflicts)
	}
	if d, err := f.Client.AppsV1().Deployments(namespace).Get(ctx, "talos-ccm", metav1.GetOptions{}); err != nil || d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("talos-ccm after the refused apply: %v %v, want Helm's 2 replicas", err, d.Spec.Replicas)
	}
}

// values are testdata/values.yaml with the stand-in hcloud CCM pointed at
// its fake cloud.
// initRecord is what recordFirstInitialized saw.
type initRecord struct {
	node     string
	at       time.Time
	dnsReady []string // kube-dns's ready endpoints then
}

// firstInitialized records the first node that becomes initialized.
type firstInitialized struct {
	mu  sync.Mutex
	rec initRecord
}

func (r *firstInitialized) get() initRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec
}

// recordFirstInitialized watches Nodes and kube-dns's EndpointSlices until
// the test ends and records, when it sees the first node initialized,
// which ready endpoints kube-dns had in its view of them at that moment.
func recordFirstInitialized(t *testing.T, ctx context.Context) *firstInitialized {
	t.Helper()
	r := &firstInitialized{}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	nodes := informers.NewSharedInformerFactory(f.Client, 0)
	dns := informers.NewSharedInformerFactoryWithOptions(f.Client, 0, informers.WithNamespace(fleet.DNSNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = discoveryv1.LabelServiceName + "=" + fleet.DNSService }))
	dnsSlices := dns.Discovery().V1().EndpointSlices()
	seen := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok || !fleetcheck.Initialized(n) {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.rec.node != "" {
			return
		}
		var current []discoveryv1.EndpointSlice
		for _, o := range dnsSlices.Informer().GetStore().List() {
			current = append(current, *o.(*discoveryv1.EndpointSlice))
		}
		r.rec = initRecord{node: n.Name, at: time.Now(), dnsReady: fleet.ReadyAddresses(current)}
	}
	dnsSlices.Informer() // registered before Start
	if _, err := nodes.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) },
	}); err != nil {
		t.Fatal(err)
	}
	dns.Start(stop)
	dns.WaitForCacheSync(stop)
	nodes.Start(stop)
	nodes.WaitForCacheSync(stop)
	return r
}

func values(t *testing.T, cloudURL string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	hcloud := v["clouds"].(map[string]any)["hcloud"].(map[string]any)
	hcloud["overrides"] = map[string]any{"env": []any{map[string]any{"name": "TESTCCM_CLOUD_URL", "value": cloudURL}}}
	return v
}

func objectID(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + strings.TrimPrefix(o.GetNamespace()+"/", "/") + o.GetName()
}

// objectsClient reads and applies objects of any kind, as kubectl does.
type objectsClient struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newObjects(t *testing.T) *objectsClient {
	t.Helper()
	dyn, err := dynamic.NewForConfig(f.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &objectsClient{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(f.Client.Discovery()))}
}

func (c *objectsClient) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return c.dyn.Resource(m.Resource), nil
}

// uids are the UIDs of objs in the cluster, by objectID; "" for one that
// is not there.
func (c *objectsClient) uids(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) map[string]types.UID {
	t.Helper()
	out := map[string]types.UID{}
	for _, o := range objs {
		ri, err := c.resource(o)
		if err != nil {
			t.Fatalf("%s: %v", objectID(o), err)
		}
		got, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("%s: %v", objectID(o), err)
		}
		uid := types.UID("") // not there
		if err == nil {
			uid = got.GetUID()
		}
		out[objectID(o)] = uid
	}
	return out
}

// apply is server-side apply of o with manager, without forcing conflicts.
func (c *objectsClient) apply(ctx context.Context, o *unstructured.Unstructured, manager string) error {
	ri, err := c.resource(o)
	if err != nil {
		return err
	}
	if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: manager}); err != nil {
		return err
	}
	return nil
}

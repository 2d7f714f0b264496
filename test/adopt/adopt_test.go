package adopt

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/publish"
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
//     with the images of this tree's release under their published names;
//     the machines join under them and are initialized;
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

	// 1. Bootstrap: the static manifests as Talos applies them.
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
	// the Talos Service (talos.default), the cluster runs no DNS server, and
	// every other machine's facts came through a control plane's apid.
	var forwarded int64
	for _, m := range machines {
		if m.ControlPlane {
			forwarded += f.Talos.Forwarded(m.Name)
		}
	}
	if forwarded == 0 {
		t.Fatal("no request reached a machine through a control plane's apid")
	}
	t.Logf("the control planes' apids forwarded %d requests", forwarded)

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

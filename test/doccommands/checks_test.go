package doccommands

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

var ctx = context.Background()

// The fixtures: a node as talos-ccm leaves it, a Warning event about it, a
// kubelet-serving CSR of it.
const (
	fixtureNode        = "web-1"
	fixtureEventReason = "TalosAPIUnavailable"
	fixtureCSR         = "csr-web-1"
)

func fixtures(t *testing.T, w *world) {
	t.Helper()
	if _, err := w.kube.CoreV1().Nodes().Get(ctx, fixtureNode, metav1.GetOptions{}); err == nil {
		return
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: fixtureNode, Labels: map[string]string{
			names.PlatformLabel:             "hcloud",
			"topology.kubernetes.io/region": "fsn1",
			"topology.kubernetes.io/zone":   "fsn1-dc14",
		}},
		Spec: corev1.NodeSpec{ProviderID: "hcloud://4711"},
	}
	if _, err := w.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fixtureNode + ".doc", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: fixtureNode, APIVersion: "v1"},
		Type:           corev1.EventTypeWarning,
		Reason:         fixtureEventReason,
		Message:        "dial tcp 10.0.0.5:50000: connection refused",
		Source:         corev1.EventSource{Component: "talos-ccm"},
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
	}
	if _, err := w.kube.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "system:node:" + fixtureNode, Organization: []string{"system:nodes"}},
		DNSNames: []string{fixtureNode},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: fixtureCSR},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeletServingSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		},
	}
	if _, err := w.kube.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deployments are the Deployments of a Helm release in ns.
func deployments(t *testing.T, w *world, ns, release string) []string {
	t.Helper()
	list, err := w.kube.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range list.Items {
		names = append(names, d.Name)
	}
	return names
}

func wantRelease(t *testing.T, w *world, name, ns string, revision int) *helmRelease {
	t.Helper()
	r := w.release(t, name, ns)
	if r == nil {
		t.Fatalf("no release %s in %s", name, ns)
	}
	if r.Status != "deployed" || r.Revision != strconv.Itoa(revision) {
		t.Fatalf("release %s: status %s revision %s, want deployed revision %d", name, r.Status, r.Revision, revision)
	}
	return r
}

func subchartsPackaged(t *testing.T, w *world, _, _ string) {
	for _, sub := range []string{"talos-ccm", "ccm-coordinator"} {
		m, _ := filepath.Glob(filepath.Join(w.work, "charts", "hybrid-ccm", "charts", sub+"-*.tgz"))
		if len(m) != 1 {
			t.Errorf("charts/hybrid-ccm/charts: %d packages of %s (%v), want 1", len(m), sub, m)
		}
	}
}

var talosServiceAccounts = schema.GroupVersionResource{Group: "talos.dev", Version: "v1alpha1", Resource: "serviceaccounts"}

func umbrellaInstalled(t *testing.T, w *world, _, _ string) {
	r := wantRelease(t, w, "hybrid-ccm", "kube-system", 1)
	if !strings.HasPrefix(r.Chart, "hybrid-ccm-") {
		t.Errorf("release hybrid-ccm is chart %s", r.Chart)
	}
	if d := deployments(t, w, "kube-system", "hybrid-ccm"); len(d) != 1 {
		t.Errorf("kube-system: Deployments %v of the release, want talos-ccm's", d)
	}
	if d := deployments(t, w, "hybrid-ccm-system", "hybrid-ccm"); len(d) != 1 {
		t.Errorf("hybrid-ccm-system: Deployments %v of the release, want ccm-coordinator's", d)
	}
	if _, err := w.dyn.Resource(nativeCCMs).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the NativeCCM CRD: %v", err)
	}
	tsa, err := w.dyn.Resource(talosServiceAccounts).Namespace("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil || len(tsa.Items) != 1 {
		t.Errorf("kube-system: Talos ServiceAccounts %v, %v; want talos-ccm's", tsa, err)
	}
}

func noPods(t *testing.T, _ *world, line, out string) {
	if !strings.Contains(out, "No resources found in kube-system namespace") {
		t.Errorf("%s: %s", line, out)
	}
}

// row returns the fields of the output line whose first field is first.
func row(out, first string) []string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == first {
			return f
		}
	}
	return nil
}

func nodeColumns(t *testing.T, _ *world, line, out string) {
	header := row(out, "NAME")
	for _, c := range []string{"PLATFORM", "REGION", "ZONE"} {
		if !slices.Contains(header, c) {
			t.Errorf("%s: no column %s:\n%s", line, c, out)
		}
	}
	r := row(out, fixtureNode)
	for _, v := range []string{"hcloud", "fsn1", "fsn1-dc14"} {
		if !slices.Contains(r, v) {
			t.Errorf("%s: node %s does not show %s:\n%s", line, fixtureNode, v, out)
		}
	}
}

func csrListed(t *testing.T, _ *world, line, out string) {
	r := row(out, fixtureCSR)
	if !slices.Contains(r, certificatesv1.KubeletServingSignerName) || !slices.Contains(r, "Pending") {
		t.Errorf("%s: want %s, kubelet-serving, Pending:\n%s", line, fixtureCSR, out)
	}
}

func hcloudSecret(t *testing.T, w *world, _, _ string) {
	s, err := w.kube.CoreV1().Secrets("hybrid-ccm-system").Get(ctx, "hcloud", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(s.Data["token"]); got != hcloudToken {
		t.Errorf("Secret hcloud: token %q, want $HCLOUD_TOKEN %q", got, hcloudToken)
	}
}

// awsSecret: the aws-ccm Secret holds the keys profiles/aws.yaml reads, the
// access key from the environment and cloud.conf as docs/install.md shows it,
// whose [Global] section sets what the AWS CCM needs off EC2.
func awsSecret(t *testing.T, w *world, line, _ string) {
	s, err := w.kube.CoreV1().Secrets("hybrid-ccm-system").Get(ctx, "aws-ccm", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	want := map[string]string{"access-key-id": awsAccessKey, "secret-access-key": awsSecretKey, "cloud.conf": w.named["cloud.conf"]}
	if len(s.Data) != len(want) {
		t.Errorf("Secret aws-ccm has keys %v, want %v", slices.Sorted(maps.Keys(s.Data)), slices.Sorted(maps.Keys(want)))
	}
	for k, v := range want {
		if got := string(s.Data[k]); got != v {
			t.Errorf("Secret aws-ccm: %s %q, want %q", k, got, v)
		}
	}
	global := iniSection(string(s.Data["cloud.conf"]), "Global")
	for _, k := range []string{"Region", "VPC", "SubnetID", "KubernetesClusterID"} {
		if global[k] == "" {
			t.Errorf("Secret aws-ccm: cloud.conf [Global] sets no %s (docs/install.md: the CCM exits at start without it)", k)
		}
	}
}

// iniSection returns the settings of one section of an INI file the way
// gcfg, which the AWS CCM reads cloud.conf with, sees it: `#` and `;` lines
// are comments and section names compare case-insensitively; keys are
// returned as written.
func iniSection(file, section string) map[string]string {
	out := map[string]string{}
	in := false
	for _, l := range strings.Split(file, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "["):
			in = strings.EqualFold(strings.Trim(l, "[]"), section)
		case in:
			if k, v, ok := strings.Cut(l, "="); ok {
				out[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
	}
	return out
}

// nativeCCM returns the NativeCCM name, or nil when there is none.
func (w *world) nativeCCM(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	n, err := w.dyn.Resource(nativeCCMs).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func field(t *testing.T, u *unstructured.Unstructured, path ...string) string {
	t.Helper()
	v, _, err := unstructured.NestedFieldNoCopy(u.Object, path...)
	if err != nil {
		t.Fatal(err)
	}
	if v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := yaml.Marshal(v)
	return strings.TrimSpace(string(b))
}

func hcloudEnabled(t *testing.T, w *world, _, _ string) {
	wantRelease(t, w, "hybrid-ccm", "kube-system", 2)
	n := w.nativeCCM(t, "hcloud")
	if n == nil {
		t.Fatal("no NativeCCM hcloud")
	}
	if p := field(t, n, "spec", "platform"); p != "hcloud" {
		t.Errorf("NativeCCM hcloud: platform %q", p)
	}
}

func cloudsYAMLApplied(t *testing.T, w *world, _, _ string) {
	wantRelease(t, w, "hybrid-ccm", "kube-system", 3)
	h, a := w.nativeCCM(t, "hcloud"), w.nativeCCM(t, "aws")
	if h == nil || a == nil {
		t.Fatalf("NativeCCMs hcloud %v, aws %v: want both", h != nil, a != nil)
	}
	for _, c := range []struct {
		obj  *unstructured.Unstructured
		path []string
		want string
	}{
		{h, []string{"spec", "overrides", "image", "tag"}, "v1.35.0"},
		{h, []string{"spec", "credentials", "secretRef", "name"}, "hcloud"},
		{a, []string{"spec", "install"}, "Always"},
		{a, []string{"spec", "uninstallGracePeriod"}, "1h"},
	} {
		if got := field(t, c.obj, c.path...); got != c.want {
			t.Errorf("NativeCCM %s: %s = %q, want %q (clouds.yaml)", c.obj.GetName(), strings.Join(c.path, "."), got, c.want)
		}
	}
}

func nativeCCMsListed(t *testing.T, _ *world, line, out string) {
	// The columns docs/operations.md lists (-o wide adds CHART, CONFLICT).
	want := []string{"NAME", "PLATFORM", "INSTALL", "NODES", "REVISION", "LEADER", "RENEWED", "READY", "STATUS", "AGE"}
	if h := row(out, "NAME"); !slices.Equal(h, want) {
		t.Errorf("%s: columns %v, want %v", line, h, want)
	}
	for _, n := range []string{"hcloud", "aws"} {
		if r := row(out, n); len(r) < 3 || r[1] != n {
			t.Errorf("%s: no row for %s:\n%s", line, n, out)
		}
	}
}

func nativeCCMDescribed(t *testing.T, _ *world, line, out string) {
	for _, want := range []string{"Name:", "hcloud", "NativeCCM", "Platform:"} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: no %q in\n%s", line, want, out)
		}
	}
}

func reconcileRequested(t *testing.T, w *world, line, _ string) {
	n := w.nativeCCM(t, "hcloud")
	v := n.GetAnnotations()["reconcile.fluxcd.io/requestedAt"]
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 10*time.Minute {
		t.Errorf("%s: annotation %q, want the time in seconds", line, v)
	}
}

func nodeYAML(t *testing.T, _ *world, line, out string) {
	for _, want := range []string{"providerID: hcloud://4711", "node.cloudprovider.kubernetes.io/platform: hcloud"} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: no %q in\n%s", line, want, out)
		}
	}
}

func nodeEventListed(t *testing.T, _ *world, line, out string) {
	if !strings.Contains(out, fixtureEventReason) || !strings.Contains(out, "node/"+fixtureNode) {
		t.Errorf("%s: the Warning event about node %s is not listed:\n%s", line, fixtureNode, out)
	}
}

func hcloudDisabled(t *testing.T, w *world, _, _ string) {
	wantRelease(t, w, "hybrid-ccm", "kube-system", 4)
	// Nothing holds a finalizer here (no coordinator runs): Helm's delete
	// removes it.
	if w.nativeCCM(t, "hcloud") != nil {
		t.Error("NativeCCM hcloud is still there")
	}
	if w.nativeCCM(t, "aws") == nil {
		t.Error("NativeCCM aws is gone, but only hcloud was disabled")
	}
}

func umbrellaUninstalled(t *testing.T, w *world, _, _ string) {
	if r := w.release(t, "hybrid-ccm", "kube-system"); r != nil {
		t.Errorf("release hybrid-ccm is still there: %s", r.Status)
	}
	for _, ns := range []string{"kube-system", "hybrid-ccm-system"} {
		if d := deployments(t, w, ns, "hybrid-ccm"); len(d) > 0 {
			t.Errorf("%s: Deployments %v are still there", ns, d)
		}
	}
	// What docs/install.md says stays: the CRD, the namespace and its
	// credentials Secrets.
	if _, err := w.dyn.Resource(nativeCCMs).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the NativeCCM CRD is gone: %v", err)
	}
	ns, err := w.kube.CoreV1().Namespaces().Get(ctx, "hybrid-ccm-system", metav1.GetOptions{})
	if err != nil || ns.DeletionTimestamp != nil {
		t.Errorf("namespace hybrid-ccm-system: %v (deleting: %v)", err, ns != nil && ns.DeletionTimestamp != nil)
	}
	if _, err := w.kube.CoreV1().Secrets("hybrid-ccm-system").Get(ctx, "hcloud", metav1.GetOptions{}); err != nil {
		t.Errorf("Secret hcloud: %v", err)
	}
}

// upstreamReleaseStandIn installs, as release talos-cloud-controller-manager,
// a chart of one ConfigMap: what the doc's `helm uninstall` removes.
func upstreamReleaseStandIn(t *testing.T, w *world) {
	dir := filepath.Join(t.TempDir(), "standin")
	writeFile(t, filepath.Join(dir, "Chart.yaml"), "apiVersion: v2\nname: talos-cloud-controller-manager\nversion: 0.0.1\n")
	writeFile(t, filepath.Join(dir, "templates", "configmap.yaml"),
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n  stand-in: upstream Talos CCM\n")
	w.sh(t, w.work, "helm install talos-cloud-controller-manager "+dir+" -n kube-system")
	wantRelease(t, w, "talos-cloud-controller-manager", "kube-system", 1)
}

func upstreamReleaseGone(t *testing.T, w *world, _, _ string) {
	if r := w.release(t, "talos-cloud-controller-manager", "kube-system"); r != nil {
		t.Errorf("release talos-cloud-controller-manager is still there: %s", r.Status)
	}
	_, err := w.kube.CoreV1().ConfigMaps("kube-system").Get(ctx, "talos-cloud-controller-manager", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("its ConfigMap: %v, want gone", err)
	}
}

// docFile (re)writes the file a yaml block of the docs names into the
// working directory, for a step that reads it after another step wrote a
// file of that name.
func docFile(name string) func(t *testing.T, w *world) {
	return func(t *testing.T, w *world) {
		t.Helper()
		content, ok := w.named[name]
		if !ok {
			t.Fatalf("no yaml block of the docs starts with the line \"# %s\"", name)
		}
		writeFile(t, filepath.Join(w.work, name), content)
	}
}

// migratedValues writes values.yaml: upstream's replicaCount: 2,
// logVerbosityLevel: 4 and a cluster name, as the doc's table translates them.
func migratedValues(t *testing.T, w *world) {
	writeFile(t, filepath.Join(w.work, "values.yaml"), "replicas: 2\nlogVerbosity: 4\ntransformations:\n  clusterName: prod\n")
}

func talosCCMFromMigratedValues(t *testing.T, w *world, _, _ string) {
	wantRelease(t, w, "talos-ccm", "kube-system", 1)
	list, err := w.kube.AppsV1().Deployments("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=talos-ccm"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("Deployments of release talos-ccm: %v, %v", list, err)
	}
	d := list.Items[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("Deployment %s: replicas %v, want 2 (values.yaml)", d.Name, d.Spec.Replicas)
	}
	if args := d.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--v=4") {
		t.Errorf("Deployment %s: args %v lack --v=4 (values.yaml)", d.Name, args)
	}
	// Out of the way of the releases that follow.
	w.sh(t, w.work, "helm uninstall talos-ccm -n kube-system --wait")
}

// layoutIndexes returns bin/images' image indexes by reference.
func layoutIndexes(t *testing.T, w *world) map[string]v1.ImageIndex {
	t.Helper()
	p, err := layout.FromPath(filepath.Join(w.repo, "bin", "images"))
	if err != nil {
		t.Fatal(err)
	}
	root, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1.ImageIndex{}
	for _, m := range im.Manifests {
		idx, err := root.ImageIndex(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		out[m.Annotations[ship.AnnotationRefName]] = idx
	}
	return out
}

func platforms(t *testing.T, idx v1.ImageIndex) []string {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var ps []string
	for _, m := range im.Manifests {
		if m.Platform != nil {
			ps = append(ps, m.Platform.OS+"/"+m.Platform.Architecture)
		}
	}
	slices.Sort(ps)
	return ps
}

func wantPlatforms() []string {
	p := slices.Clone(ship.DefaultPlatforms)
	slices.Sort(p)
	return p
}

func imagesBuilt(t *testing.T, w *world, _, _ string) {
	version, err := ship.DefaultVersion(w.repo)
	if err != nil {
		t.Fatal(err)
	}
	idx := layoutIndexes(t, w)
	if len(idx) != len(ship.Images) {
		t.Errorf("bin/images holds %d images, want %d", len(idx), len(ship.Images))
	}
	for _, img := range ship.Images {
		ref := ship.ImageRef(ship.DefaultRegistry, img, version)
		i, ok := idx[ref]
		if !ok {
			t.Errorf("bin/images has no %s", ref)
			continue
		}
		if p := platforms(t, i); !slices.Equal(p, wantPlatforms()) {
			t.Errorf("%s: platforms %v, want %v", ref, p, wantPlatforms())
		}
	}
}

func (w *world) remote() remote.Option { return remote.WithTransport(w.reg.HTTPClient().Transport) }

// imageCopied checks the copy (the index from bin/images, digest and both
// platforms), then what docs/install.md says of a copy without --all: one
// platform arrives.
func imageCopied(t *testing.T, w *world, line, _ string) {
	f := strings.Fields(line)
	src := strings.TrimPrefix(f[len(f)-2], "oci:bin/images:")
	dst := strings.TrimPrefix(f[len(f)-1], "docker://")
	local, ok := layoutIndexes(t, w)[src]
	if !ok {
		t.Fatalf("bin/images has no %s", src)
	}
	want, _ := local.Digest()
	ref, err := name.ParseReference(dst)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref, w.remote())
	if err != nil {
		t.Fatalf("%s: %v", dst, err)
	}
	if got, _ := idx.Digest(); got != want {
		t.Errorf("%s is %s, bin/images has %s", dst, got, want)
	}
	if p := platforms(t, idx); !slices.Equal(p, wantPlatforms()) {
		t.Errorf("%s: platforms %v, want %v", dst, p, wantPlatforms())
	}

	one := ref.Context().Tag("one-platform").String()
	without := strings.Replace(strings.Replace(line, "--all ", "", 1), "docker://"+dst, "docker://"+one, 1)
	t.Logf("$ %s", without)
	w.sh(t, w.repo, without)
	d, err := remote.Get(ref.Context().Tag("one-platform"), w.remote())
	if err != nil {
		t.Fatal(err)
	}
	if d.MediaType.IsIndex() {
		t.Errorf("without --all skopeo copied the index (%s): docs/install.md says it keeps one platform", d.MediaType)
	}
}

// released checks that make release pushed every image (both platforms)
// and every chart at VERSION under REGISTRY.
func released(t *testing.T, w *world, line, _ string) {
	var reg, version string
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "REGISTRY="); ok {
			reg = v
		}
		if v, ok := strings.CutPrefix(f, "VERSION="); ok {
			version = v
		}
	}
	for _, img := range ship.Images {
		ref, err := name.ParseReference(ship.ImageRef(reg, img, version))
		if err != nil {
			t.Fatal(err)
		}
		idx, err := remote.Index(ref, w.remote())
		if err != nil {
			t.Errorf("%s: %v", ref, err)
			continue
		}
		if p := platforms(t, idx); !slices.Equal(p, wantPlatforms()) {
			t.Errorf("%s: platforms %v, want %v", ref, p, wantPlatforms())
		}
	}
	for _, ch := range ship.Charts {
		ref, err := name.ParseReference(ship.ChartRef(reg, ch, version))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := remote.Head(ref, w.remote()); err != nil {
			t.Errorf("chart %s: %v", ref, err)
		}
	}
}

// installedFromRelease checks a release installed from the registry: the
// chart at --version, every image it runs pushed under the chart's registry
// at that version. It uninstalls it then, for the lines that follow.
func installedFromRelease(t *testing.T, w *world, line, _ string) {
	f := strings.Fields(line)
	var chartRef, version string
	for i, a := range f {
		if strings.HasPrefix(a, "oci://") {
			chartRef = strings.TrimPrefix(a, "oci://")
		}
		if a == "--version" && i+1 < len(f) {
			version = f[i+1]
		}
	}
	reg, _, _ := strings.Cut(chartRef, "/charts/")
	r := wantRelease(t, w, "hybrid-ccm", "kube-system", 1)
	if r.Chart != "hybrid-ccm-"+version {
		t.Errorf("release hybrid-ccm: chart %s, want hybrid-ccm-%s", r.Chart, version)
	}
	n := 0
	for _, ns := range []string{"kube-system", "hybrid-ccm-system"} {
		list, err := w.kube.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=hybrid-ccm"})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range list.Items {
			for _, c := range d.Spec.Template.Spec.Containers {
				n++
				if !strings.HasPrefix(c.Image, reg+"/") || !strings.HasSuffix(c.Image, ":"+version) {
					t.Errorf("Deployment %s/%s runs %s, want an image of %s at %s", ns, d.Name, c.Image, reg, version)
					continue
				}
				ref, err := name.ParseReference(c.Image)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := remote.Head(ref, w.remote()); err != nil {
					t.Errorf("Deployment %s/%s runs %s: %v", ns, d.Name, c.Image, err)
				}
			}
		}
	}
	if n < 2 {
		t.Errorf("the release runs %d containers, want talos-ccm's and ccm-coordinator's", n)
	}
	w.sh(t, w.work, "helm uninstall hybrid-ccm -n kube-system --wait")
}

func secretWrittenInClear(t *testing.T, w *world, line, _ string) {
	b, err := os.ReadFile(filepath.Join(w.work, "clusters", "prod", "secrets", "hcloud.sops.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, b)
	}
	if s.Kind != "Secret" || s.Name != "hcloud" || s.Namespace != "hybrid-ccm-system" || string(s.Data["token"]) != hcloudToken {
		t.Errorf("%s wrote\n%s", line, b)
	}
}

// ageKeyStandIn writes prod.agekey in age-keygen's format (not a key anyone
// uses) and the namespace Flux would have made.
func ageKeyStandIn(t *testing.T, w *world) {
	writeFile(t, filepath.Join(w.work, "prod.agekey"), "# created: 2026-01-01T00:00:00Z\n# public key: age1docstandin\nAGE-SECRET-KEY-1DOCSTANDIN\n")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flux-system"}}
	if _, err := w.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func ageKeySecret(t *testing.T, w *world, _, _ string) {
	s, err := w.kube.CoreV1().Secrets("flux-system").Get(ctx, "sops-age", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(w.work, "prod.agekey"))
	if string(s.Data["age.agekey"]) != string(want) {
		t.Errorf("Secret sops-age: age.agekey %q, want prod.agekey's %q", s.Data["age.agekey"], want)
	}
}

func staticManifestsApplied(t *testing.T, w *world, _, _ string) {
	for _, d := range []struct{ ns, name string }{{"kube-system", "talos-ccm"}, {"hybrid-ccm-system", "hybrid-ccm"}} {
		dep, err := w.kube.AppsV1().Deployments(d.ns).Get(ctx, d.name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("Deployment %s/%s: %v", d.ns, d.name, err)
			continue
		}
		applied := false
		for _, m := range dep.ManagedFields {
			applied = applied || (m.Manager == "kubectl" && m.Operation == metav1.ManagedFieldsOperationApply)
		}
		if !applied {
			t.Errorf("Deployment %s/%s: not applied server-side by kubectl", d.ns, d.name)
		}
	}
	if _, err := w.dyn.Resource(nativeCCMs).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the NativeCCM CRD: %v", err)
	}
}

func explainInputs(t *testing.T, w *world) {
	testdata := filepath.Join(w.repo, "cmd", "hybridctl", "internal", "cli", "testdata")
	for from, to := range map[string]string{"rules.yaml": "rules.yaml", "web-1.talosctl.yaml": "node.yaml"} {
		b, err := os.ReadFile(filepath.Join(testdata, from))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(w.work, to), string(b))
	}
}

// explainAsDocumented compares the output with the example output
// docs/transformations.md shows for these inputs.
func explainAsDocumented(t *testing.T, w *world, line, out string) {
	b, err := os.ReadFile(filepath.Join(w.repo, "docs", "transformations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "Example output")
	_, after, ok2 := strings.Cut(after, "```\n")
	example, _, ok3 := strings.Cut(after, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/transformations.md: no example output block after \"Example output\"")
	}
	got := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i, l := range strings.Split(strings.TrimRight(example, "\n"), "\n") {
		if i >= len(got) || strings.TrimRight(got[i], " ") != strings.TrimRight(l, " ") {
			t.Errorf("%s: line %d differs from docs/transformations.md's example:\n got %q\nwant %q\n%s", line, i+1, at(got, i), l, out)
			return
		}
	}
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "(none)"
}

// emptyValues writes an empty values.yaml: the chart's defaults.
func emptyValues(t *testing.T, w *world) {
	writeFile(t, filepath.Join(w.work, "values.yaml"), "{}\n")
}

// regcredSecret: the pull Secret regcred in ns, of the type the kubelet
// reads, for the registry the docs name.
func regcredSecret(ns string) func(t *testing.T, w *world, line, out string) {
	return func(t *testing.T, w *world, line, _ string) {
		s, err := w.kube.CoreV1().Secrets(ns).Get(ctx, "regcred", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if s.Type != corev1.SecretTypeDockerConfigJson || !strings.Contains(string(s.Data[corev1.DockerConfigJsonKey]), `"registry.example.com"`) {
			t.Errorf("%s: Secret %s/regcred of type %s: %s", line, ns, s.Type, s.Data[corev1.DockerConfigJsonKey])
		}
	}
}

// metricsReaderBound: the binding gives monitoring/prometheus talos-ccm's
// metrics-reader role.
func metricsReaderBound(t *testing.T, w *world, line, _ string) {
	b, err := w.kube.RbacV1().ClusterRoleBindings().Get(ctx, "prometheus:talos-ccm-metrics", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	if b.RoleRef.Name != "talos-ccm:metrics-reader" || len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" ||
		b.Subjects[0].Namespace != "monitoring" || b.Subjects[0].Name != "prometheus" {
		t.Errorf("%s: binding %+v", line, b)
	}
}

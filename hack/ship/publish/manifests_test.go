package publish

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestStaticManifestsCurrent fails when docs/deploy is not what the charts
// render now, or holds a file make manifests does not write.
func TestStaticManifestsCurrent(t *testing.T) {
	root := testenv.RepoRoot()
	dir := filepath.Join(root, "docs", "deploy")
	var files []string
	for _, m := range StaticManifests {
		files = append(files, m.File())
		want, err := m.Render(root)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, m.File()))
		if err != nil || string(got) != string(want) {
			t.Errorf("docs/deploy/%s is not what charts/%s renders (%v): run make manifests", m.File(), m.Chart, err)
		}
	}
	monitoring, err := MonitoringFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range monitoring {
		got, err := os.ReadFile(filepath.Join(dir, MonitoringDir, name))
		if err != nil || string(got) != string(want) {
			t.Errorf("docs/deploy/%s/%s is not what the charts' files make (%v): run make manifests", MonitoringDir, name, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if filepath.Ext(e.Name()) == ".yaml" && !slices.Contains(files, e.Name()) {
			t.Errorf("docs/deploy/%s is not written by make manifests: remove it or add it to StaticManifests", e.Name())
		}
	}
}

// TestStaticManifestsApply creates the objects of docs/deploy on a real API
// server with server-side apply (what `kubectl apply --server-side` does) and
// finds every one of them there. The API server has the CRD Talos installs
// for its talos.dev ServiceAccount, as a Talos cluster with Kubernetes Talos
// API access has; the NativeCCM CRD comes from docs/deploy itself.
func TestStaticManifestsApply(t *testing.T) {
	root := testenv.RepoRoot()
	env, err := testenv.Start(testenv.Options{CRDDirectoryPaths: []string{filepath.Join(root, "charts", "test", "testdata", "crds")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.Client.Discovery()))

	for _, m := range StaticManifests {
		data, err := os.ReadFile(filepath.Join(root, "docs", "deploy", m.File()))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := chartstest.Parse(string(data))
		if err != nil {
			t.Fatalf("%s: %v", m.File(), err)
		}
		if len(objs) == 0 {
			t.Fatalf("%s holds no objects", m.File())
		}
		for _, obj := range objs {
			gvk := obj.GroupVersionKind()
			mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %s %s: %v", m.File(), gvk.Kind, obj.GetName(), err)
			}
			ri := dynamic.ResourceInterface(dyn.Resource(mapping.Resource))
			if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
				if obj.GetNamespace() == "" {
					t.Errorf("%s: %s %s has no namespace (kubectl apply would put it in the current one)", m.File(), gvk.Kind, obj.GetName())
					continue
				}
				ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
			}
			if _, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "kubectl"}); err != nil {
				t.Errorf("%s: apply %s %s: %v", m.File(), gvk.Kind, obj.GetName(), err)
				continue
			}
			got, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Errorf("%s: %s %s not there after apply: %v", m.File(), gvk.Kind, obj.GetName(), err)
				continue
			}
			if got.GetUID() == "" {
				t.Errorf("%s: %s %s has no UID", m.File(), gvk.Kind, obj.GetName())
			}
			t.Logf("%s: %s %s/%s", m.File(), gvk.Kind, got.GetNamespace(), got.GetName())
		}
	}
	// The workloads are there with the images a default build makes.
	version, err := ship.DefaultVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	// (the coordinator in its own namespace, named after the release as the
	// umbrella names it)
	for _, w := range []struct{ ns, name, image string }{
		{"kube-system", "talos-ccm", "talos-ccm"},
		{"hybrid-ccm-system", StaticRelease, "ccm-coordinator"},
	} {
		d, err := env.Client.AppsV1().Deployments(w.ns).Get(ctx, w.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if img := d.Spec.Template.Spec.Containers[0].Image; img != ship.ImageRef(ship.DefaultRegistry, w.image, version) {
			t.Errorf("deployment %s/%s runs %s", w.ns, w.name, img)
		}
	}
}

// TestStaticManifestsAdoptable: every object of docs/deploy carries Helm's
// ownership metadata for the release docs/install.md and the Flux layout
// install (hybrid-ccm in kube-system), and the umbrella's default render
// holds exactly these objects, so `helm install` adopts every one of them
// and creates nothing twice.
func TestStaticManifestsAdoptable(t *testing.T) {
	root := testenv.RepoRoot()
	static := map[string]bool{}
	for _, m := range StaticManifests {
		data, err := os.ReadFile(filepath.Join(root, "docs", "deploy", m.File()))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := chartstest.Parse(string(data))
		if err != nil {
			t.Fatalf("%s: %v", m.File(), err)
		}
		for _, o := range objs {
			id := o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
			static[id] = true
			if o.GetKind() == "CustomResourceDefinition" {
				continue // Helm installs crds/ once and never adopts or updates them
			}
			if got := o.GetLabels()["app.kubernetes.io/managed-by"]; got != "Helm" {
				t.Errorf("%s: %s: label app.kubernetes.io/managed-by=%q, Helm adopts only Helm", m.File(), id, got)
			}
			a := o.GetAnnotations()
			if a["meta.helm.sh/release-name"] != StaticRelease || a["meta.helm.sh/release-namespace"] != StaticNamespace {
				t.Errorf("%s: %s: ownership annotations %q/%q, want release %s in %s", m.File(), id,
					a["meta.helm.sh/release-name"], a["meta.helm.sh/release-namespace"], StaticRelease, StaticNamespace)
			}
		}
	}
	ch, err := loadUmbrella(root)
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.ReleaseName, in.Namespace = StaticRelease, StaticNamespace
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.KubeVersion = manifestKubeVersion
	rel, err := in.Run(ch, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := chartstest.Parse(rel.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		t.Fatal("the umbrella renders nothing")
	}
	for _, o := range objs {
		id := o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
		if !static[id] {
			t.Errorf("helm install %s would create %s, which docs/deploy lacks", StaticRelease, id)
		}
		delete(static, id)
	}
	for id := range static {
		if !strings.HasPrefix(id, "CustomResourceDefinition ") {
			t.Errorf("docs/deploy has %s, which the umbrella chart does not render: Helm would leave it behind", id)
		}
	}
}

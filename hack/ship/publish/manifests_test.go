package publish

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

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
	// (the coordinator in its own namespace)
	for name, ns := range map[string]string{"talos-ccm": "kube-system", "ccm-coordinator": "hybrid-ccm-system"} {
		d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if img := d.Spec.Template.Spec.Containers[0].Image; img != ship.ImageRef(ship.DefaultRegistry, name, version) {
			t.Errorf("deployment %s runs %s", name, img)
		}
	}
}

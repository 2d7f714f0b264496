package publish

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestRepositoryDefaultsAgree fails when the charts in the repository and the
// release tool's defaults drift apart: every chart is at the one version, a
// release with the default registry and version changes no chart value, the
// charts render exactly the images a default build makes, and
// ccm-coordinator's --gate-image default is the ccm-gate image of that build.
func TestRepositoryDefaultsAgree(t *testing.T) {
	root := testenv.RepoRoot()
	version, err := ship.DefaultVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	released, err := ReleaseCharts(root, ship.DefaultRegistry, version)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range released {
		t.Run(rc.Name(), func(t *testing.T) {
			ch, err := loader.LoadDir(filepath.Join(root, "charts", rc.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if ch.Metadata.Version != version || ch.Metadata.AppVersion != version {
				t.Errorf("charts/%s: version %s appVersion %s, want both %s (appVersion of charts/%s)", rc.Name(), ch.Metadata.Version, ch.Metadata.AppVersion, version, ship.VersionChart)
			}
			if !reflect.DeepEqual(ch.Values, rc.Values) {
				t.Errorf("charts/%s/values.yaml does not default to the images of a release to %s:\nrepository: %v\nrelease:    %v", rc.Name(), ship.DefaultRegistry, ch.Values, rc.Values)
			}
			for _, d := range ch.Metadata.Dependencies {
				if !chartutil.IsCompatibleRange(d.Version, version) {
					t.Errorf("charts/%s: dependency %s %q does not accept %s", rc.Name(), d.Name, d.Version, version)
				}
			}
		})
	}

	var want []string
	for _, name := range ship.Images {
		want = append(want, ship.ImageRef(ship.DefaultRegistry, name, version))
	}
	var got []string
	for _, name := range []string{"talos-ccm", "ccm-coordinator"} {
		ch, err := loader.LoadDir(filepath.Join(root, "charts", name))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, renderedImages(t, ch)...)
	}
	for _, img := range got {
		if !slices.Contains(want, img) {
			t.Errorf("the charts' defaults name %s, not an image a default build makes (%v)", img, want)
		}
	}
	if slices.Sort(got); !slices.Equal(slices.Compact(slices.Clone(got)), slices.Sorted(slices.Values(want))) || len(got) != 5 {
		t.Errorf("the charts' defaults name %v, want talos-ccm, ccm-coordinator, ccm-gate and hybridctl (each chart's helm test)", got)
	}

	if gate, want := gateImageDefault(t, root), ship.ImageRef(ship.DefaultRegistry, "ccm-gate", version); gate != want {
		t.Errorf("cmd/ccm-coordinator: --gate-image defaults to %s, want %s", gate, want)
	}
}

// gateImageDefault reads the value of defaultGateImage in
// cmd/ccm-coordinator/main.go (what the binary has unless an image build sets
// it).
func gateImageDefault(t *testing.T, root string) string {
	t.Helper()
	p := filepath.Join(root, "cmd", "ccm-coordinator", "main.go")
	f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	sym := strings.TrimPrefix(ship.GateImageSymbol, "main.")
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if n.Name != sym || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s: %s is not a string literal (-X cannot set it)", p, sym)
				}
				s, _ := strconv.Unquote(lit.Value)
				return s
			}
		}
	}
	t.Fatalf("%s: no package-level var %s", p, sym)
	return ""
}

// renderedImages renders ch with its default values (as `helm template` in
// kube-system) and returns every image its workloads name: container images,
// ccm-coordinator's --gate-image, and the images of its helm test pods.
func renderedImages(t *testing.T, ch *chart.Chart) []string {
	t.Helper()
	if ch.Name() == "native-ccm" {
		// it renders only for a platform the coordinator gives it, with the
		// upstream CCM's image from the profile: no image of this product
		return nil
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.ReleaseName, in.Namespace = ch.Name(), "kube-system"
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.KubeVersion = &chartutil.KubeVersion{Version: "v1.36.0", Major: "1", Minor: "36"}
	rel, err := in.Run(ch, map[string]any{})
	if err != nil {
		t.Fatalf("render %s: %v", ch.Name(), err)
	}
	objs, err := chartstest.Parse(rel.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range rel.Hooks {
		hooks, err := chartstest.Parse(h.Manifest)
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range hooks {
			cs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "containers")
			for _, c := range cs {
				if img, _ := c.(map[string]any)["image"].(string); img != "" {
					out = append(out, img)
				}
			}
		}
	}
	for _, obj := range objs {
		if obj.GetKind() != "Deployment" {
			continue
		}
		for _, field := range []string{"initContainers", "containers"} {
			cs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", field)
			for _, c := range cs {
				cm, _ := c.(map[string]any)
				if img, _ := cm["image"].(string); img != "" {
					out = append(out, img)
				}
				args, _ := cm["args"].([]any)
				for _, a := range args {
					if s, _ := a.(string); strings.HasPrefix(s, "--gate-image=") {
						out = append(out, strings.TrimPrefix(s, "--gate-image="))
					}
				}
			}
		}
	}
	return out
}

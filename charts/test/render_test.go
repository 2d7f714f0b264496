// Package charts_test checks the charts the way users meet them: `helm lint`
// and `helm template` through the Helm SDK for every chart (golden files for
// the default and a multi-cloud values file), the objects, arguments and RBAC
// rules talos-ccm and the umbrella render, and the charts applied to a real API
// server with server-side dry-run.
//
// The umbrella's file:// dependencies are built with the SDK's dependency
// manager (what `helm dependency update` does) into a temporary copy of the
// charts, so the repository holds no packaged subcharts that could go stale.
package charts_test

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/downloader"
	"helm.sh/helm/v3/pkg/getter"
	helmrelease "helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// The namespace the documentation installs into (Talos API access is allowed
// there by default).
const releaseNamespace = "kube-system"

// kubeVersion is what `helm template` assumes the cluster runs.
var kubeVersion = &chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}

// chart names a chart of this repository as a test sees it.
type chart string

const (
	talosCCM       chart = "talos-ccm"
	ccmCoordinator chart = "ccm-coordinator"
	nativeCCM      chart = "native-ccm"
	hybridCCM      chart = "hybrid-ccm"
)

// allCharts are the charts under charts/.
var allCharts = []chart{talosCCM, ccmCoordinator, nativeCCM, hybridCCM}

// releaseName is the release the documentation installs the chart as.
func (c chart) releaseName() string { return string(c) }

// path is the directory to lint and render: the chart itself, or for the
// umbrella the copy whose charts/ the SDK has filled.
func (c chart) path(t *testing.T) string {
	t.Helper()
	if c == hybridCCM {
		return umbrellaWithDependencies(t)
	}
	return filepath.Join(testenv.RepoRoot(), "charts", string(c))
}

// ciValues reads charts/<chart>/ci/<name>-values.yaml.
func (c chart) ciValues(t *testing.T, name string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(filepath.Join(testenv.RepoRoot(), "charts", string(c), "ci", name+"-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

var (
	umbrellaOnce sync.Once
	umbrellaDir  string
	umbrellaErr  error
	tempRoot     string
)

// umbrellaWithDependencies copies charts/{hybrid-ccm,talos-ccm,ccm-coordinator}
// into a temporary directory (same relative layout, so file://../talos-ccm
// resolves) and runs the dependency manager on the copy.
func umbrellaWithDependencies(t *testing.T) string {
	t.Helper()
	umbrellaOnce.Do(func() {
		if tempRoot, umbrellaErr = os.MkdirTemp("", "hybrid-ccm-charts-"); umbrellaErr != nil {
			return
		}
		src := filepath.Join(testenv.RepoRoot(), "charts")
		for _, name := range []string{"hybrid-ccm", "talos-ccm", "ccm-coordinator"} {
			if umbrellaErr = copyChart(filepath.Join(src, name), filepath.Join(tempRoot, name)); umbrellaErr != nil {
				return
			}
		}
		umbrellaDir = filepath.Join(tempRoot, "hybrid-ccm")
		settings := cli.New()
		m := &downloader.Manager{
			Out:              io.Discard,
			ChartPath:        umbrellaDir,
			SkipUpdate:       true,
			Getters:          getter.All(settings),
			RepositoryConfig: filepath.Join(tempRoot, "repositories.yaml"),
			RepositoryCache:  filepath.Join(tempRoot, "cache"),
		}
		if err := m.Update(); err != nil {
			umbrellaErr = fmt.Errorf("helm dependency update %s: %w", umbrellaDir, err)
		}
	})
	if umbrellaErr != nil {
		t.Fatal(umbrellaErr)
	}
	return umbrellaDir
}

// copyChart copies a chart directory, leaving out what `helm dependency build`
// leaves behind in a working tree (charts/, Chart.lock).
func copyChart(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if rel == "charts" || rel == "Chart.lock" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}

// render is `helm template <release> <chart> -n kube-system -f values`
// through the SDK (install, dry-run, client only). Values are validated
// against the charts' schemas on the way.
// apis are API versions (group/version/Kind) the cluster serves beyond the
// built-in ones (.Capabilities.APIVersions).
func render(t *testing.T, c chart, values map[string]any, apis ...string) (string, error) {
	t.Helper()
	rel, err := dryInstall(t, c, values, apis...)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// dryInstall is `helm install --dry-run` of the chart as release
// c.releaseName() in releaseNamespace, with the extra API versions.
func dryInstall(t *testing.T, c chart, values map[string]any, apis ...string) (*helmrelease.Release, error) {
	t.Helper()
	ch, err := loader.Load(c.path(t))
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.ReleaseName, in.Namespace = c.releaseName(), releaseNamespace
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.KubeVersion = kubeVersion
	in.APIVersions = append(chartutil.VersionSet{}, apis...)
	return in.Run(ch, values)
}

// mustRender renders or fails the test.
func mustRender(t *testing.T, c chart, values map[string]any) manifests {
	t.Helper()
	out, err := render(t, c, values)
	if err != nil {
		t.Fatalf("render %s: %v", c, err)
	}
	m, err := parse(out)
	if err != nil {
		t.Fatalf("rendered %s does not parse: %v", c, err)
	}
	return m
}

// manifests are rendered objects in rendering order.
type manifests []*unstructured.Unstructured

func parse(out string) (manifests, error) {
	m, err := chartstest.Parse(out)
	return manifests(m), err
}

// find returns the objects of a kind (and apiVersion when given as "group/version Kind").
func (m manifests) find(kind string) []*unstructured.Unstructured {
	apiVersion := ""
	if i := strings.LastIndex(kind, " "); i > 0 {
		apiVersion, kind = kind[:i], kind[i+1:]
	}
	var out []*unstructured.Unstructured
	for _, o := range m {
		if o.GetKind() == kind && (apiVersion == "" || o.GetAPIVersion() == apiVersion) {
			out = append(out, o)
		}
	}
	return out
}

// one returns the single object of a kind with that name, converted into out.
func (m manifests) one(t *testing.T, kind, name string, out any) {
	t.Helper()
	for _, o := range m.find(kind) {
		if o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s %q rendered (have %v)", kind, name, m.names())
}

func (m manifests) names() []string {
	var s []string
	for _, o := range m {
		s = append(s, o.GetKind()+"/"+o.GetName())
	}
	return s
}

// values parses YAML into a values map (test tables read better in YAML).
func values(t *testing.T, s string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// compareGolden compares got with testdata/golden/<name>, or rewrites it with -update.
func compareGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test ./charts/test -run Golden -update` to create it)", err)
	}
	if !bytes.Equal(want, []byte(got)) {
		t.Errorf("%s differs from the rendered chart at %s\n(if the change is intended: go test ./charts/test -run Golden -update)", path, firstDifference(string(want), got))
	}
}

func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  golden:   %q\n  rendered: %q", i+1, wl, gl)
		}
	}
	return "(no line differs)"
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	stopControlPlane()
	for _, dir := range []string{tempRoot, binaryDir} {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

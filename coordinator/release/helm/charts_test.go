package helm

import (
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

func renderChartDir(t *testing.T, dir string, values map[string]any) (string, error) {
	t.Helper()
	ch, err := loader.LoadDir(filepath.Join(testenv.RepoRoot(), "charts", dir))
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.ReleaseName, in.Namespace = "x", "hybrid-ccm-system"
	in.DryRun, in.ClientOnly, in.Replace, in.IncludeCRDs = true, true, true, true
	in.KubeVersion = &chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}
	rel, err := in.Run(ch, values)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// TestCoordinatorChart: the CRD ships with the chart, profile overrides from
// values land in a ConfigMap the coordinator loads with the same loader, and the
// values schema rejects what the coordinator would not understand.
func TestCoordinatorChart(t *testing.T) {
	override := map[string]any{"name": "hcloud", "ccm": map[string]any{"image": map[string]any{"tag": "v1.35.1"}}}
	out, err := renderChartDir(t, "ccm-coordinator", map[string]any{"profileOverrides": map[string]any{"hcloud.yaml": override}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "kind: CustomResourceDefinition") || !strings.Contains(out, "name: nativeccms.hybridccm.io") {
		t.Error("CRD not in the chart")
	}
	if !strings.Contains(out, "--profile-overrides=/etc/hybrid-ccm/profiles") {
		t.Error("overrides not passed to the coordinator")
	}
	m, err := release.ParseManifests([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range m.Find("ConfigMap") {
		var cm corev1.ConfigMap
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cm); err != nil {
			t.Fatal(err)
		}
		for file, data := range cm.Data {
			if err := set.Override(file, []byte(data)); err != nil {
				t.Fatalf("override rendered by the chart does not load: %v", err)
			}
		}
	}
	if p, _ := set.Get("hcloud"); p.CCM.Image.Tag != "v1.35.1" {
		t.Errorf("override not applied: %s", p.CCM.Image.Tag)
	}

	for _, bad := range []map[string]any{
		{"coordinator": map[string]any{"uninstallGracePeriod": "ten minutes"}},
		{"profileOverrides": map[string]any{"hcloud": map[string]any{"name": "hcloud"}}},
		{"unknownKey": true},
	} {
		if _, err := renderChartDir(t, "ccm-coordinator", bad); err == nil || !strings.Contains(err.Error(), "schema") {
			b, _ := yaml.Marshal(bad)
			t.Errorf("values accepted:\n%s(err %v)", b, err)
		}
	}
}

// TestNativeCCMChartStandalone: used without the coordinator, the chart
// renders its own ServiceAccount and least-privilege RBAC once a platform is
// set (and refuses, saying so, without one), and the schema refuses
// enforced flags in args.
func TestNativeCCMChartStandalone(t *testing.T) {
	out, err := renderChartDir(t, "native-ccm", map[string]any{
		"image": map[string]any{"repository": "r", "tag": "t"}, "cloudProvider": "hcloud",
	})
	if err == nil || !strings.Contains(err.Error(), "native-ccm: platform is not set") {
		t.Errorf("without a platform: %v\n%s", err, out)
	}
	out, err = renderChartDir(t, "native-ccm", map[string]any{
		"platform": "hcloud", "image": map[string]any{"repository": "r", "tag": "t"}, "cloudProvider": "hcloud",
	})
	if err != nil {
		t.Fatal(err)
	}
	d := releasetest.Decode(t, out)
	if len(d.ServiceAccounts) != 1 || len(d.ClusterRoles) != 1 || len(d.Roles) != 1 || len(d.Roles[0].Rules) != 1 {
		t.Errorf("objects = %v, lease role %+v", d.Kinds, d.Roles)
	}
	releasetest.AssertDelegatedAuthn(t, d, "x", "hybrid-ccm-system")
	releasetest.AssertLifecycleOnly(t, out, release.Lifecycle{Release: "x", Namespace: "hybrid-ccm-system", LeaseName: "x", SecurePort: 10270})
	const want = `args[0] "--controllers=*": --controllers is not yours to set: the coordinator runs the CCM lifecycle-only`
	if _, err := renderChartDir(t, "native-ccm", map[string]any{"platform": "hcloud", "args": []any{"--controllers=*"}}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("--controllers in args: %v, want a refusal saying %q", err, want)
	}
}

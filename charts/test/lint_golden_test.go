package charts_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/lint/support"
	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// valueSets are the values every chart is linted and rendered with.
var valueSets = []struct {
	name string // golden file suffix, and ci/<name>-values.yaml when not "default"
}{
	{name: "default"},
	{name: "multi-cloud"},
}

func (c chart) valuesFor(t *testing.T, set string) map[string]any {
	t.Helper()
	if set == "default" {
		return map[string]any{}
	}
	return c.ciValues(t, set)
}

// refusal is the error a chart gives for a value set it must refuse to
// render ("" for the others): native-ccm without a platform.
func (c chart) refusal(set string) string {
	if c == nativeCCM && set == "default" {
		return "native-ccm: platform is not set"
	}
	return ""
}

// TestLint: `helm lint --strict` (warnings fail too) passes for every chart
// with every value set, schema validation included. (Lint renders in Helm's
// lint mode, where a template's fail is logged, not an error: native-ccm's
// refusal without a platform is TestGolden's to check.)
func TestLint(t *testing.T) {
	for _, c := range allCharts {
		for _, vs := range valueSets {
			t.Run(string(c)+"/"+vs.name, func(t *testing.T) {
				l := action.NewLint()
				l.Strict, l.Namespace, l.KubeVersion = true, releaseNamespace, kubeVersion
				res := l.Run([]string{c.path(t)}, c.valuesFor(t, vs.name))
				if res.TotalChartsLinted != 1 {
					t.Errorf("charts linted = %d, want 1", res.TotalChartsLinted)
				}
				for _, msg := range res.Messages {
					if msg.Severity > support.InfoSev {
						t.Errorf("lint: %s", msg)
					}
				}
				for _, err := range res.Errors {
					t.Errorf("lint error: %v", err)
				}
			})
		}
	}
}

// TestGolden: `helm template` output of every chart for each value set
// equals testdata/golden/<chart>/<set>.yaml (-update rewrites them).
func TestGolden(t *testing.T) {
	for _, c := range allCharts {
		for _, vs := range valueSets {
			t.Run(string(c)+"/"+vs.name, func(t *testing.T) {
				out, err := render(t, c, c.valuesFor(t, vs.name))
				if want := c.refusal(vs.name); want != "" {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("rendered (%d bytes, error %v), want the refusal %q", len(out), err, want)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				compareGolden(t, string(c)+"/"+vs.name+".yaml", out)
			})
		}
	}
}

// TestNativeCCMNeedsImageAndCloudProvider: without a platform the chart
// refuses to render (rather than install nothing, successfully); once a
// platform is set, a missing image or --cloud-provider name is a render error
// naming the value, never a Deployment with image ":".
func TestNativeCCMNeedsImageAndCloudProvider(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{"platform": "hcloud", "cloudProvider": "hcloud",
			"image": map[string]any{"repository": "docker.io/hetznercloud/hcloud-cloud-controller-manager", "tag": "v1.35.0"}}
	}
	if _, err := render(t, nativeCCM, base()); err != nil {
		t.Fatalf("complete values: %v", err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(map[string]any)
		wants []string
	}{
		{"no platform", func(v map[string]any) { delete(v, "platform") }, []string{"platform is not set", "--set platform=", "docs/profiles.md"}},
		{"no image repository", func(v map[string]any) { v["image"].(map[string]any)["repository"] = "" }, []string{`platform "hcloud"`, "image.repository"}},
		{"no image tag", func(v map[string]any) { v["image"].(map[string]any)["tag"] = "" }, []string{`platform "hcloud"`, "image.tag"}},
		{"no cloud provider", func(v map[string]any) { v["cloudProvider"] = "" }, []string{`platform "hcloud"`, "cloudProvider"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := base()
			tc.edit(v)
			_, err := render(t, nativeCCM, v)
			if err == nil {
				t.Fatal("rendered")
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
}

// TestSubchartSchemasAllowGlobal: every chart accepts the "global" value
// Helm passes to subcharts (a schema with additionalProperties=false must list
// it, or every install of the umbrella fails schema validation). Helm's own
// schema validation judges: each chart rendered on its own with global values,
// and the umbrella with them, which validates each subchart's schema against
// the values Helm hands it, global included. The other umbrella tests render
// the real subchart schemas too.
func TestSubchartSchemasAllowGlobal(t *testing.T) {
	for _, c := range allCharts {
		t.Run(string(c), func(t *testing.T) {
			v := c.valuesFor(t, "multi-cloud")
			v["global"] = map[string]any{"imageRegistry": "registry.example.com", "labels": map[string]any{"team": "platform"}}
			if _, err := render(t, c, v); err != nil {
				t.Errorf("charts/%s refuses Helm's \"global\" value: %v", c, err)
			}
		})
	}
}

// TestCoordinatorProfileOverridesLoad: the profile overrides of the
// ccm-coordinator chart's values files, as the rendered ConfigMap hands them to
// the coordinator, pass the coordinator's own profile loader (merged over the
// built-in profiles and validated as a set), so a values file the golden test
// freezes is one the coordinator starts with.
func TestCoordinatorProfileOverridesLoad(t *testing.T) {
	for _, tc := range []struct {
		chart  chart
		values map[string]any
		want   int // override files
	}{
		{ccmCoordinator, ccmCoordinator.ciValues(t, "multi-cloud"), 3},
		{hybridCCM, hybridCCM.ciValues(t, "multi-cloud"), 1},
	} {
		t.Run(string(tc.chart), func(t *testing.T) {
			var cm corev1.ConfigMap
			name := tc.chart.releaseName() + "-profiles"
			mustRender(t, tc.chart, tc.values).one(t, "v1 ConfigMap", name, &cm)
			if len(cm.Data) != tc.want {
				t.Fatalf("ConfigMap %s has %d files, want %d", name, len(cm.Data), tc.want)
			}
			set, err := profile.Builtin()
			if err != nil {
				t.Fatal(err)
			}
			for _, file := range slices.Sorted(maps.Keys(cm.Data)) { // the order OverrideDir reads them in
				if err := set.Override(file, []byte(cm.Data[file])); err != nil {
					t.Errorf("the coordinator refuses override %s: %v", file, err)
				}
			}
		})
	}
}

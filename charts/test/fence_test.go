package charts_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestFenceTemplateIsCurrent: the chart's fence.yaml is what gate.FenceTemplate
// generates (`make generate` rewrites it).
func TestFenceTemplateIsCurrent(t *testing.T) {
	want, err := gate.FenceTemplate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "templates", "fence.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("charts/ccm-coordinator/templates/fence.yaml is stale: run `make generate` (%s)", firstDifference(string(want), string(got)))
	}
}

// TestFenceRendersAsTheCoordinatorExpects: the chart renders exactly the fence
// the coordinator checks for (gate.CheckFence) in the namespace it runs in,
// for the default and a chosen release namespace, with the providerID
// prefixes of the profiles the coordinator loads (the built-in ones merged
// with the chart's profileOverrides by the coordinator's own loader); a
// namespace that is not a DNS label never reaches the fence's CEL.
func TestFenceRendersAsTheCoordinatorExpects(t *testing.T) {
	multi := ccmCoordinator.ciValues(t, "multi-cloud")
	// an override that changes a built-in profile's platforms and prefixes,
	// and one that adds a platform to the one hcloud routes
	withPrefixes := values(t, `
profileOverrides:
  a-gcp.yaml: {name: gcp, platforms: [gcp, gce], providerIDPrefixes: ["gce://my-project/"]}
  b-robot.yaml:
    apiVersion: hybridccm.io/v1alpha1
    kind: Profile
    name: robot
    platforms: [hcloud]
    providerIDPrefixes: ["hrobot://", "robot://"]
    ccm: {image: {repository: example.com/robot-ccm, tag: v1}, cloudProvider: hcloud, securePort: 10291}
    credentials: {none: true}
    chart: {source: builtin}
`)
	for _, tc := range []struct {
		name   string
		values map[string]any
		ns     string
	}{
		{"defaults", values(t, "{}"), "hybrid-ccm-system"},
		{"namespace", values(t, "releaseNamespace: ccm-elsewhere"), "ccm-elsewhere"},
		{"multi-cloud", multi, "cloud-controllers"},
		{"prefix overrides", withPrefixes, "hybrid-ccm-system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRender(t, ccmCoordinator, tc.values)
			var policy admissionregistrationv1.ValidatingAdmissionPolicy
			var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
			m.one(t, "ValidatingAdmissionPolicy", gate.DefaultFenceName, &policy)
			m.one(t, "ValidatingAdmissionPolicyBinding", gate.DefaultFenceName, &binding)
			set := coordinatorProfiles(t, m)
			wantPolicy, wantBinding, err := gate.Fence{Namespace: tc.ns, ProviderIDPrefixes: gate.SetPrefixTable(set)}.Objects()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				what      string
				got, want any
			}{
				{"policy spec", policy.Spec, wantPolicy.Spec},
				{"binding spec", binding.Spec, wantBinding.Spec},
				{"policy digest", policy.Annotations[gate.DigestAnnotation], gate.FenceDigest()},
				{"binding digest", binding.Annotations[gate.DigestAnnotation], gate.FenceDigest()},
			} {
				g, _ := json.Marshal(c.got)
				w, _ := json.Marshal(c.want)
				if string(g) != string(w) {
					t.Errorf("%s differs from the coordinator's: %s", c.what, firstDifference(string(w), string(g)))
				}
			}
			if tc.name == "prefix overrides" {
				table := gate.SetPrefixTable(set)
				if got := strings.Join(table["hcloud"], ","); got != "hcloud://,hrobot://,robot://" {
					t.Errorf("hcloud's prefixes with a second profile: %s", got)
				}
				if got := strings.Join(table["gce"], ","); got != "gce://my-project/" {
					t.Errorf("gce's prefixes: %s", got)
				}
			}
		})
	}
	for _, bad := range []string{`"x\")||true||(\""`, "Evil", "a b"} {
		if _, err := render(t, ccmCoordinator, values(t, "releaseNamespace: "+bad)); err == nil || !strings.Contains(err.Error(), "releaseNamespace") {
			t.Errorf("releaseNamespace %s: %v, want a schema error naming it", bad, err)
		}
	}
}

// coordinatorProfiles is the profile set the coordinator runs with for a
// rendering: the built-in profiles and the rendered overrides ConfigMap, in
// the order the coordinator reads its files.
func coordinatorProfiles(t *testing.T, m manifests) *profile.Set {
	t.Helper()
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range m.find("v1 ConfigMap") {
		if !strings.HasSuffix(cm.GetName(), "-profiles") {
			continue
		}
		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		for _, file := range slices.Sorted(maps.Keys(data)) {
			if err := set.Override(file, []byte(data[file])); err != nil {
				t.Fatalf("the coordinator refuses override %s: %v", file, err)
			}
		}
	}
	return set
}

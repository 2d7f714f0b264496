package charts_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
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
// for the default and a chosen release namespace; a namespace that is not a
// DNS label never reaches the fence's CEL.
func TestFenceRendersAsTheCoordinatorExpects(t *testing.T) {
	for _, tc := range []struct{ values, ns string }{
		{"{}", "hybrid-ccm-system"},
		{"releaseNamespace: ccm-elsewhere", "ccm-elsewhere"},
	} {
		m := mustRender(t, ccmCoordinator, values(t, tc.values))
		var policy admissionregistrationv1.ValidatingAdmissionPolicy
		var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
		m.one(t, "ValidatingAdmissionPolicy", gate.DefaultFenceName, &policy)
		m.one(t, "ValidatingAdmissionPolicyBinding", gate.DefaultFenceName, &binding)
		wantPolicy, wantBinding, err := gate.Fence{Namespace: tc.ns}.Objects()
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
				t.Errorf("%s: %s differs from the coordinator's:\n got %s\nwant %s", tc.values, c.what, g, w)
			}
		}
	}
	for _, bad := range []string{`"x\")||true||(\""`, "Evil", "a b"} {
		if _, err := render(t, ccmCoordinator, values(t, "releaseNamespace: "+bad)); err == nil || !strings.Contains(err.Error(), "releaseNamespace") {
			t.Errorf("releaseNamespace %s: %v, want a schema error naming it", bad, err)
		}
	}
}

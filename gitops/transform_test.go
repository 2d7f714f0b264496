package gitops_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
)

// TestTransformationsOutput: each environment's transformation rules, as the
// rendered chart hands them to talos-ccm (its ConfigMap), parse, and give the
// nodes the region the values' comments promise: prod's bare-metal machines
// "metal", or "<region>-metal" when their metadata names a region, never
// "-metal"; cloud nodes keep their own. Every region is a valid label value.
func TestTransformationsOutput(t *testing.T) {
	nodes := []struct {
		name string
		md   transform.Metadata
		want map[string]string // environment -> region
	}{
		{"metal, no region (Talos' metal platform)", transform.Metadata{Platform: "metal", Hostname: "bm-1"},
			map[string]string{"prod": "metal", "staging": ""}},
		{"metal with its provider's region", transform.Metadata{Platform: "metal", Hostname: "bm-2", Region: "fra"},
			map[string]string{"prod": "fra-metal", "staging": "fra"}},
		{"hcloud", transform.Metadata{Platform: "hcloud", Hostname: "web-1", Region: "fsn1", Zone: "fsn1-dc14", InstanceID: "91"},
			map[string]string{"prod": "fsn1", "staging": "fsn1"}},
	}
	for _, env := range environments(t) {
		t.Run(env, func(t *testing.T) {
			var rules *transform.Config
			for _, o := range renderRelease(t, loadEnvironment(t, env)) {
				data, _, _ := unstructured.NestedString(o.Object, "data", "transformations.yaml")
				if o.GetKind() != "ConfigMap" || data == "" {
					continue
				}
				var err error
				if rules, err = transform.Parse([]byte(data), env+": ConfigMap "+o.GetName()); err != nil {
					t.Fatalf("talos-ccm would not start: %v", err)
				}
			}
			if rules == nil {
				t.Fatal("no talos-ccm ConfigMap with transformations.yaml rendered")
			}
			for _, n := range nodes {
				want, ok := n.want[env]
				if !ok {
					t.Fatalf("no expectation for %s in %s", n.name, env)
				}
				res, err := rules.Apply(n.md)
				if err != nil {
					t.Errorf("%s: %v", n.name, err)
					continue
				}
				if got := res.Metadata.Region; got != want {
					t.Errorf("%s: region %q, want %q", n.name, got, want)
				}
				if errs := validation.IsValidLabelValue(res.Metadata.Region); len(errs) > 0 {
					t.Errorf("%s: region %q is no label value: %v", n.name, res.Metadata.Region, errs)
				}
			}
		})
	}
}

package demo

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// The demo turns node IPAM on in its copy of docs/deploy/talos-ccm.yaml, as
// docs/ipam.md tells a user to: the controller in --controllers, and patch on
// nodes in the ClusterRole (the default render grants cloud-node update only).
func TestEditTalosCCMGrantsWhatIPAMNeeds(t *testing.T) {
	objs, err := readManifest(testenv.RepoRoot(), talosCCMManifest)
	if err != nil {
		t.Fatal(err)
	}
	nodeVerbs := func() []string {
		for _, o := range objs {
			if o.GetKind() != "ClusterRole" || o.GetName() != talosCCMName {
				continue
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				rule, _ := r.(map[string]any)
				if res, _, _ := unstructured.NestedStringSlice(rule, "resources"); slices.Equal(res, []string{"nodes"}) {
					verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
					return verbs
				}
			}
		}
		return nil
	}
	if slices.Contains(nodeVerbs(), "patch") {
		t.Fatalf("the default render already grants patch on nodes (%v): the demo's edit proves nothing", nodeVerbs())
	}
	if err := editTalosCCM(objs); err != nil {
		t.Fatal(err)
	}
	if v := nodeVerbs(); !slices.Contains(v, "patch") || !slices.Contains(v, "update") {
		t.Fatalf("nodes verbs after the edit: %v; want update and patch", v)
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetName() != talosCCMName {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
		joined := strings.Join(args, " ")
		if !strings.Contains(joined, ",node-ipam-controller") || !strings.Contains(joined, "--allocate-node-cidrs") {
			t.Fatalf("talos-ccm args after the edit: %v", args)
		}
		return
	}
	t.Fatal("no talos-ccm Deployment in the manifest")
}

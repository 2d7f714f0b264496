package cloud_test

import (
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// The GCP rule of docs/profiles.md puts the label the GCP CCM leaves nodes
// alone by (the gcp profile's ccm.nodeFilter.foreignNodeLabels) on every
// node of another platform that talos-ccm initializes, and not on GCP nodes.
func TestGCPForeignNodeRuleOfTheDocs(t *testing.T) {
	rules, err := transform.Parse([]byte(docsBlock(t, "profiles.md", "<!-- gcp-foreign-rule")), "docs/profiles.md")
	if err != nil {
		t.Fatalf("the documented gcp rule is refused: %v", err)
	}
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	gcp, _ := set.Get("gcp")
	if gcp.CCM.NodeFilter == nil || len(gcp.CCM.NodeFilter.ForeignNodeLabels) != 1 {
		t.Fatalf("the gcp profile's node filter: %+v", gcp.CCM.NodeFilter)
	}
	ep := talosnode.StartFor(t)
	client := ep.ClientFor(t)
	src := facts.NewSource(client, cloud.NewInterpreter(rules), facts.Options{})

	for _, tc := range []struct {
		name     string                       // node name
		ip       string                       // its address
		metadata runtime.PlatformMetadataSpec // what Talos reports
		foreign  bool                         // the GCP CCM must leave it alone
	}{
		{name: "aws-1", ip: "10.120.0.1", foreign: true, metadata: runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "aws-1",
			Region: "eu-west-1", Zone: "eu-west-1a", InstanceID: "i-0123456789abcdef0", ProviderID: "aws:///eu-west-1a/i-0123456789abcdef0"}},
		{name: "metal-1", ip: "10.120.0.2", foreign: true, metadata: runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "metal-1"}},
		{name: "gce-1", ip: "10.120.0.3", metadata: runtime.PlatformMetadataSpec{Platform: "gcp", Hostname: "gce-1",
			Region: "europe-west1", Zone: "europe-west1-b", InstanceID: "1234567890", ProviderID: "gce://proj/europe-west1-b/gce-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := nodeFacts(t, ep, src, tc.name, tc.ip, tc.metadata)
			if err != nil {
				t.Fatal(err)
			}
			if f.Labels[names.PlatformLabel] != tc.metadata.Platform {
				t.Errorf("platform label %q, want %q", f.Labels[names.PlatformLabel], tc.metadata.Platform)
			}
			for k, v := range gcp.CCM.NodeFilter.ForeignNodeLabels {
				got, ok := f.Labels[k]
				if tc.foreign && got != v {
					t.Errorf("foreign node: label %s=%q, want %q (labels %v)", k, got, v, f.Labels)
				}
				if !tc.foreign && ok {
					t.Errorf("gcp node carries %s=%q: its own CCM would ignore it", k, got)
				}
			}
		})
	}
}

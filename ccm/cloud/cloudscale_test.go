package cloud_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// docsBlock returns the yaml block after marker in docs/<file>.
func docsBlock(t *testing.T, file, marker string) string {
	t.Helper()
	block, err := testenv.DocsYAML(file, marker)
	if err != nil {
		t.Fatal(err)
	}
	return block
}

// nodeFacts starts a Talos node name at ip reporting md on ep, and returns
// what talos-ccm's facts source src makes of the Node that registers there.
func nodeFacts(t *testing.T, ep *talosnode.Endpoint, src *facts.Source, name, ip string, md runtime.PlatformMetadataSpec) (*facts.Facts, error) {
	t.Helper()
	if _, err := ep.AddNode(name, []string{ip}, talosnode.Spec{Metadata: &md,
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}}}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: ip}}}
	return src.Facts(context.Background(), node)
}

// The cloudscale rule of docs/profiles.md is accepted and routes cloudscale
// servers (a Talos openstack or nocloud image) to the cloudscale profile:
// platform cloudscale, providerID cloudscale://<server UUID>. Other nodes keep
// their platform; an instance ID that is not a UUID gives no providerID.
func TestCloudscaleRuleOfTheDocs(t *testing.T) {
	const uuid = "5f0c7e1a-9b2d-4c3e-8f4a-1b2c3d4e5f60"
	rules, err := transform.Parse([]byte(docsBlock(t, "profiles.md", "<!-- cloudscale-rule")), "docs/profiles.md")
	if err != nil {
		t.Fatalf("the documented cloudscale rule is refused: %v", err)
	}
	ep := talosnode.StartFor(t)
	client := ep.ClientFor(t)
	p := facts.NewSource(client, cloud.NewInterpreter(rules), facts.Options{})

	for _, tc := range []struct {
		name       string                       // node name
		ip         string                       // its address
		metadata   runtime.PlatformMetadataSpec // what Talos reports
		platform   string                       // routing label; "" when the node is retried
		providerID string                       // providerID
	}{
		{name: "cs-web-1", ip: "10.110.0.1", platform: "cloudscale", providerID: "cloudscale://" + uuid,
			metadata: runtime.PlatformMetadataSpec{Platform: "openstack", Hostname: "cs-web-1", Region: "rma", Zone: "rma1",
				InstanceType: "flex-4-2", InstanceID: uuid, ProviderID: "openstack:///" + uuid}},
		{name: "cs-db-1", ip: "10.110.0.2", platform: "cloudscale", providerID: "cloudscale://" + uuid[:35] + "1",
			metadata: runtime.PlatformMetadataSpec{Platform: "nocloud", Hostname: "cs-db-1", InstanceID: strings.ToUpper(uuid[:35] + "1")}},
		{name: "cs-odd-1", ip: "10.110.0.3",
			metadata: runtime.PlatformMetadataSpec{Platform: "nocloud", Hostname: "cs-odd-1", InstanceID: "iid-cs-odd-1"}},
		{name: "os-1", ip: "10.110.0.4", platform: "openstack", providerID: "openstack:///" + uuid[:35] + "4",
			metadata: runtime.PlatformMetadataSpec{Platform: "openstack", Hostname: "os-1", InstanceID: uuid[:35] + "4", ProviderID: "openstack:///" + uuid[:35] + "4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := nodeFacts(t, ep, p, tc.name, tc.ip, tc.metadata)
			if tc.platform == "" {
				if !errors.Is(err, facts.ErrMetadataIncomplete) || !strings.Contains(err.Error(), "server's UUID") {
					t.Fatalf("want a retry saying the instance ID must be the server UUID, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.Labels[names.PlatformLabel] != tc.platform || f.ProviderID != tc.providerID {
				t.Errorf("platform %q providerID %q, want %q %q", f.Labels[names.PlatformLabel], f.ProviderID, tc.platform, tc.providerID)
			}
		})
	}
}

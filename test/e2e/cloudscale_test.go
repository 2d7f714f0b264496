package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// docsYAML returns the yaml block after marker in docs/<file>.
func docsYAML(t *testing.T, file, marker string) string {
	t.Helper()
	block, err := testenv.DocsYAML(file, marker)
	if err != nil {
		t.Fatal(err)
	}
	return block
}

// Talos has no cloudscale platform. With the rule of docs/profiles.md, talos-ccm
// routes a cloudscale server (a Talos openstack image) to the cloudscale
// profile: routing label cloudscale and the providerID the cloudscale CCM
// parses, cloudscale://<server UUID>. The fence the coordinator renders from
// profiles/cloudscale.yaml then lets the cloudscale CCM's identity delete that
// node, and not an OpenStack node beside it; its view selects only the former.
func TestCloudscaleNodesAreRoutedEndToEnd(t *testing.T) {
	ctx := context.Background()
	const csUUID, osUUID = "5f0c7e1a-9b2d-4c3e-8f4a-1b2c3d4e5f60", "0a1b2c3d-4e5f-4a6b-8c7d-8e9fa0b1c2d3"
	ep := startEndpoint(t)
	for _, n := range []struct {
		name, ip string
		md       runtime.PlatformMetadataSpec
	}{
		{"cs-web-1", "10.111.0.1", runtime.PlatformMetadataSpec{Platform: "openstack", Hostname: "cs-web-1", Region: "rma", Zone: "rma1",
			InstanceType: "flex-4-2", InstanceID: csUUID, ProviderID: "openstack:///" + csUUID}},
		{"os-web-1", "10.111.0.2", runtime.PlatformMetadataSpec{Platform: "openstack", Hostname: "os-web-1", Region: "RegionOne", Zone: "nova",
			InstanceID: osUUID, ProviderID: "openstack:///" + osUUID}},
	} {
		md := n.md
		if _, err := ep.AddNode(n.name, []string{n.ip}, talosnode.Spec{Metadata: &md,
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: n.ip + "/24"}}}); err != nil {
			t.Fatal(err)
		}
	}
	rules := writeRules(t, docsYAML(t, "profiles.md", "<!-- cloudscale-rule"))
	startTalosCCM(t, talosCCMArgs(t, ep, "--cloud-config="+rules))
	register(t, kubeletNode("cs-web-1", "10.111.0.1"), "10.111.0.1")
	register(t, kubeletNode("os-web-1", "10.111.0.2"), "10.111.0.2")

	cs := waitNode(t, "cs-web-1", 30*time.Second, initialized)
	if cs.Labels[names.PlatformLabel] != "cloudscale" || cs.Spec.ProviderID != "cloudscale://"+csUUID {
		t.Fatalf("cloudscale server: platform %q providerID %q, want cloudscale and cloudscale://%s", cs.Labels[names.PlatformLabel], cs.Spec.ProviderID, csUUID)
	}
	if cs.Labels[corev1.LabelTopologyZone] != "rma1" || cs.Labels[corev1.LabelInstanceTypeStable] != "flex-4-2" {
		t.Errorf("cloudscale server: topology and instance type from the metadata, got %v", cs.Labels)
	}
	osn := waitNode(t, "os-web-1", 30*time.Second, initialized)
	if osn.Labels[names.PlatformLabel] != "openstack" || osn.Spec.ProviderID != "openstack:///"+osUUID {
		t.Fatalf("openstack server: platform %q providerID %q", osn.Labels[names.PlatformLabel], osn.Spec.ProviderID)
	}

	// The cloudscale NativeCCM's fence and view, from the built-in profile: the
	// fence as the coordinator chart ships it, the NativeCCM as the
	// coordinator leaves it (spec.platform, status.gate's prefixes).
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, ok := set.Get("cloudscale")
	if !ok {
		t.Fatal("no built-in cloudscale profile")
	}
	c, err := gatetest.Client(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	fence := gate.Fence{Name: "cloudscale-e2e.hybridccm.io", Namespace: "kube-system"}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteFence(context.Background(), c, fence) })
	remove, err := gatetest.Confine(ctx, c, fence, "cloudscale", p.Platforms[0], p.ProviderIDPrefixes...)
	if remove != nil {
		t.Cleanup(remove)
	}
	if err != nil {
		t.Fatal(err)
	}
	const sa = "native-ccm-cloudscale"
	if err := gatetest.GrantNativeCCM(ctx, env.Client, fence.Namespace, sa); err != nil {
		t.Fatal(err)
	}
	cfg, err := gatetest.ServiceAccountUser(env, fence.Namespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	ccm := kubernetes.NewForConfigOrDie(cfg)
	if err := gatetest.WaitFence(ctx, ccm, "os-web-1", true); err != nil {
		t.Fatalf("fence never became active: %v", err)
	}
	dryDelete := func(node string) error {
		return ccm.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
	if err := dryDelete("cs-web-1"); err != nil {
		t.Errorf("the cloudscale CCM may not delete its own node: %v", err)
	}
	if err := dryDelete("os-web-1"); !apierrors.IsForbidden(err) {
		t.Errorf("the cloudscale CCM deleting an OpenStack node: %v, want a fence denial", err)
	}
	view, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: names.PlatformLabel + "=" + p.Platforms[0]})
	if err != nil {
		t.Fatal(err)
	}
	if len(view.Items) != 1 || view.Items[0].Name != "cs-web-1" {
		t.Errorf("the cloudscale view selects %d nodes, want cs-web-1 only", len(view.Items))
	}
}

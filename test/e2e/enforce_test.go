package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const enforceRulesA = `global:
  enforce: true
transformations:
  - name: web
    nodeSelector:
      - matchExpressions:
          - key: platform
            operator: In
            values: [metal]
    labels:
      example.com/role: web
      example.com/tier: "{{ .Region }}"
    annotations:
      example.com/owner: team-a
    taints:
      - key: example.com/dedicated
        value: web
        effect: NoSchedule
`

const enforceRulesB = `global:
  enforce: true
transformations:
  - name: web
    nodeSelector:
      - matchExpressions:
          - key: platform
            operator: In
            values: [metal]
    labels:
      example.com/role: db
`

func hasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

// Enforce mode keeps rule output reconciled and removes what rules no longer
// produce — and nothing else.
func TestEnforceModeReconcilesRuleOutput(t *testing.T) {
	ctx := context.Background()
	ep := startEndpoint(t)
	if _, err := ep.AddNode("enforce-1", []string{"10.50.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "enforce-1", Region: "dc1"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.50.0.1/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	ccm := startTalosCCM(t, talosCCMArgs(t, ep, "--cloud-config="+writeRules(t, enforceRulesA), "--node-status-update-frequency=1s"))
	register(t, kubeletNode("enforce-1", "10.50.0.1"))
	n := waitNode(t, "enforce-1", 30*time.Second, initialized)
	if n.Labels["example.com/role"] != "web" || n.Labels["example.com/tier"] != "dc1" || n.Annotations["example.com/owner"] != "team-a" || !hasTaint(n, "example.com/dedicated") {
		t.Fatalf("rule output missing after initialization: labels=%v annotations=%v taints=%v", n.Labels, n.Annotations, n.Spec.Taints)
	}
	owned, err := transform.DecodeOwnedKeys(n.Annotations[transform.OwnedKeysAnnotation])
	if err != nil || !slices.Contains(owned.Labels, "example.com/role") {
		t.Fatalf("owned keys not recorded: %q (%v)", n.Annotations[transform.OwnedKeysAnnotation], err)
	}

	// someone removes a rule label and adds their own: the rule label comes back,
	// theirs stays
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{"example.com/role": nil, "user.example.com/keep": "yes"}}})
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, "enforce-1", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNode(t, "enforce-1", 30*time.Second, func(n *corev1.Node) bool {
		return n.Labels["example.com/role"] == "web" && n.Labels["user.example.com/keep"] == "yes"
	})

	// new rules: what rule A produced and B does not is removed, B's output set,
	// the user's label untouched. A taint is the exception: the ownership record
	// lives on the node (which a kubelet may edit), so a taint the current rules
	// cannot produce is never lifted on its account (docs/transformations.md).
	_ = ccm.cmd.Process.Kill()
	<-ccm.done
	startTalosCCM(t, talosCCMArgs(t, ep, "--cloud-config="+writeRules(t, enforceRulesB), "--node-status-update-frequency=1s"))
	n = waitNode(t, "enforce-1", 30*time.Second, func(n *corev1.Node) bool {
		_, tier := n.Labels["example.com/tier"]
		_, owner := n.Annotations["example.com/owner"]
		return n.Labels["example.com/role"] == "db" && !tier && !owner
	})
	if !hasTaint(n, "example.com/dedicated") {
		t.Errorf("a taint the rules can no longer produce was lifted: %v", n.Spec.Taints)
	}
	if n.Labels["user.example.com/keep"] != "yes" || n.Labels[names.PlatformLabel] != "metal" {
		t.Fatalf("enforce mode touched keys it does not own: %v", n.Labels)
	}
	waitEvent(t, "enforce-1", "TransformationsReconciled", 10*time.Second)
}

// enforceOverrides are rules whose platformMetadata overrides change between
// talos-ccm runs (%s: the overrides of the metal rule, then more rules).
const enforceOverrides = `global:
  enforce: true
transformations:
  - name: metal-site
    nodeSelector:
      - matchExpressions:
          - {key: platform, operator: In, values: [metal]}
%s`

// Enforce mode keeps what platformMetadata overrides give a node reconciled:
// the topology and lifecycle labels follow a changed override, fall back to
// the metadata (or go) when it is removed — and an initialized node is not
// moved to a platform its providerID does not belong to: it keeps its label,
// and a Warning says why.
func TestEnforceModeReconcilesMetadataOverrides(t *testing.T) {
	const uuid = "5f0c7e1a-9b2d-4c3e-8f4a-1b2c3d4e5f60"
	ep := startEndpoint(t)
	if _, err := ep.AddNode("enforce-md-1", []string{"10.51.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "enforce-md-1", Zone: "dc1-a"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.51.0.1/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := ep.AddNode("cs-enforce-1", []string{"10.51.0.2"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "openstack", Hostname: "cs-enforce-1", InstanceID: uuid, ProviderID: "openstack:///" + uuid},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.51.0.2/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	run := func(prev *process, metal, more string) *process {
		t.Helper()
		if prev != nil {
			_ = prev.cmd.Process.Kill()
			<-prev.done
		}
		rules := fmt.Sprintf(enforceOverrides, metal) + more
		return startTalosCCM(t, talosCCMArgs(t, ep, "--cloud-config="+writeRules(t, rules), "--node-status-update-frequency=1s"))
	}
	zone := func(n *corev1.Node) string { return n.Labels[corev1.LabelTopologyZone] }

	ccm := run(nil, "    platformMetadata: {zone: rack-1}\n", "")
	register(t, kubeletNode("enforce-md-1", "10.51.0.1"))
	register(t, kubeletNode("cs-enforce-1", "10.51.0.2"))
	if n := waitNode(t, "enforce-md-1", 30*time.Second, initialized); zone(n) != "rack-1" {
		t.Fatalf("zone %q after initialization, want the override rack-1", zone(n))
	}
	if n := waitNode(t, "cs-enforce-1", 30*time.Second, initialized); n.Labels[names.PlatformLabel] != "openstack" {
		t.Fatalf("openstack node: labels %v", n.Labels)
	}

	// the overrides change, and the cloudscale rule comes after the openstack
	// node was initialized
	ccm = run(ccm, "    platformMetadata: {zone: rack-2, spot: 'true'}\n", `  - name: cloudscale
    nodeSelector:
      - matchExpressions:
          - {key: hostname, operator: Regexp, values: ['^cs-']}
    platformMetadata: {platform: cloudscale}
`)
	waitNode(t, "enforce-md-1", 30*time.Second, func(n *corev1.Node) bool {
		return zone(n) == "rack-2" && n.Labels[corev1.LabelFailureDomainBetaZone] == "rack-2" &&
			n.Labels["node.cloudprovider.kubernetes.io/lifecycle"] == "spot"
	})
	ev := waitEvent(t, "cs-enforce-1", "PlatformLabelKept", 30*time.Second)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, `"cloudscale"`) || !strings.Contains(ev.Message, "openstack:///"+uuid) {
		t.Errorf("event %s %q should be a Warning naming the new platform and the providerID", ev.Type, ev.Message)
	}
	if n := waitNode(t, "cs-enforce-1", time.Second, func(*corev1.Node) bool { return true }); n.Labels[names.PlatformLabel] != "openstack" || n.Spec.ProviderID != "openstack:///"+uuid {
		t.Errorf("the openstack node was moved: platform %q providerID %q", n.Labels[names.PlatformLabel], n.Spec.ProviderID)
	}

	// the overrides are removed: the metadata's zone again, no lifecycle label
	run(ccm, "    labels: {example.com/site: metal}\n", "")
	n := waitNode(t, "enforce-md-1", 30*time.Second, func(n *corev1.Node) bool {
		_, spot := n.Labels["node.cloudprovider.kubernetes.io/lifecycle"]
		return zone(n) == "dc1-a" && !spot && n.Labels["example.com/site"] == "metal"
	})
	if n.Labels[names.PlatformLabel] != "metal" {
		t.Errorf("platform label %q", n.Labels[names.PlatformLabel])
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
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
	if n.Labels["user.example.com/keep"] != "yes" || n.Labels["node.cloudprovider.kubernetes.io/platform"] != "metal" {
		t.Fatalf("enforce mode touched keys it does not own: %v", n.Labels)
	}
	waitEvent(t, "enforce-1", "TransformationsReconciled", 10*time.Second)
}

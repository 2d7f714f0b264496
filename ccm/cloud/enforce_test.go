package cloud

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Enforce mode keeps what platformMetadata overrides give a node reconciled
// (the labels talos-ccm derives from the metadata), removes a derived label it
// wrote that has no value any more, leaves alone what it never wrote, and never
// moves an initialized node to a platform its providerID does not belong to.
func TestEnforcedDerivedLabels(t *testing.T) {
	const uuid = "5f0c7e1a-9b2d-4c3e-8f4a-1b2c3d4e5f60"
	owned := func(labels ...string) string { return transform.OwnedKeys{Labels: labels}.Encode() }
	cases := []struct {
		name    string            // case
		rules   string            // transformations (YAML list items)
		md      Metadata          // what Talos reports
		labels  map[string]string // on the node
		record  string            // the node's ownership annotation
		pid     string            // the node's providerID
		set     map[string]string // labels Plan sets
		removed []string          // labels Plan removes
		held    bool              // the platform label is held
	}{
		{
			name:   "a changed zone override is written",
			rules:  "  - platformMetadata: {zone: rack-2}\n",
			md:     Metadata{Platform: "metal", Zone: "dc1-a"},
			labels: map[string]string{names.PlatformLabel: "metal", corev1.LabelTopologyZone: "rack-1", corev1.LabelFailureDomainBetaZone: "rack-1"},
			record: owned(names.PlatformLabel, corev1.LabelTopologyZone, corev1.LabelFailureDomainBetaZone),
			pid:    "talos://metal/10.0.0.1",
			set:    map[string]string{corev1.LabelTopologyZone: "rack-2", corev1.LabelFailureDomainBetaZone: "rack-2"},
		},
		{
			name:   "a removed override falls back to the metadata",
			rules:  "  - labels: {example.com/a: b}\n",
			md:     Metadata{Platform: "metal", Zone: "dc1-a"},
			labels: map[string]string{names.PlatformLabel: "metal", corev1.LabelTopologyZone: "rack-1", corev1.LabelFailureDomainBetaZone: "rack-1"},
			record: owned(names.PlatformLabel, corev1.LabelTopologyZone, corev1.LabelFailureDomainBetaZone),
			pid:    "talos://metal/10.0.0.1",
			set:    map[string]string{corev1.LabelTopologyZone: "dc1-a", corev1.LabelFailureDomainBetaZone: "dc1-a", "example.com/a": "b"},
		},
		{
			name:    "a derived label it wrote without a value any more is removed",
			md:      Metadata{Platform: "metal"},
			labels:  map[string]string{names.PlatformLabel: "metal", corev1.LabelTopologyZone: "rack-1", LabelLifecycle: "spot"},
			record:  owned(names.PlatformLabel, corev1.LabelTopologyZone, LabelLifecycle),
			pid:     "talos://metal/10.0.0.1",
			removed: []string{LabelLifecycle, corev1.LabelTopologyZone},
		},
		{
			name:   "a zone an admin set, never written by talos-ccm, stays",
			md:     Metadata{Platform: "metal"},
			labels: map[string]string{names.PlatformLabel: "metal", corev1.LabelTopologyZone: "rack-1"},
			pid:    "talos://metal/10.0.0.1",
		},
		{
			name:   "an initialized node keeps the platform its providerID belongs to",
			rules:  "  - platformMetadata: {platform: cloudscale}\n",
			md:     Metadata{Platform: "openstack", InstanceID: uuid, ProviderID: "openstack:///" + uuid, Zone: "rma1"},
			labels: map[string]string{names.PlatformLabel: "openstack", corev1.LabelTopologyZone: "rma1", corev1.LabelFailureDomainBetaZone: "rma1"},
			pid:    "openstack:///" + uuid,
			held:   true,
		},
		{
			name:   "a platform change that agrees with the providerID is written",
			rules:  "  - platformMetadata: {platform: cloudscale}\n",
			md:     Metadata{Platform: "openstack", InstanceID: uuid, ProviderID: "openstack:///" + uuid},
			labels: map[string]string{names.PlatformLabel: "openstack"},
			pid:    "cloudscale://" + uuid,
			set:    map[string]string{names.PlatformLabel: "cloudscale"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := transform.Parse([]byte("transformations:\n"+c.rules), "rules.yaml")
			if err != nil {
				t.Fatal(err)
			}
			res, err := cfg.Apply(c.md)
			if err != nil {
				t.Fatal(err)
			}
			md := res.Metadata
			id, err := ProviderID(&md, "10.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			f := &facts.Facts{Platform: md.Platform, ProviderID: id, Labels: NodeLabels(&md, res.Labels, "")}
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: c.labels, Annotations: map[string]string{}},
				Spec: corev1.NodeSpec{ProviderID: c.pid}}
			if c.record != "" {
				node.Annotations[transform.OwnedKeysAnnotation] = c.record
			}
			r, held := enforced(node, res, f, "")
			if (held != "") != c.held {
				t.Fatalf("held %q, want held=%v", held, c.held)
			}
			if c.held && (!strings.Contains(held, `"cloudscale"`) || !strings.Contains(held, "openstack:///"+uuid)) {
				t.Errorf("held message %q should name the new platform and the node's providerID", held)
			}
			ch := transform.Plan(node, r)
			if len(ch.SetLabels)+len(c.set) > 0 && !reflect.DeepEqual(ch.SetLabels, c.set) {
				t.Errorf("set labels %v, want %v", ch.SetLabels, c.set)
			}
			if len(ch.RemoveLabels)+len(c.removed) > 0 && !reflect.DeepEqual(ch.RemoveLabels, c.removed) {
				t.Errorf("removed labels %v, want %v", ch.RemoveLabels, c.removed)
			}
			if res.Labels[names.PlatformLabel] != "" || len(res.Producible.Labels) > len(r.Producible.Labels) {
				t.Error("enforced changed the rule output it was given")
			}
		})
	}
}

package cloud_test

import (
	"context"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// withBeta adds the beta keys k8s.io/cloud-provider's node controller writes
// next to the stable topology and instance-type labels (so does talos-ccm).
func withBeta(labels map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		out[k] = v
		switch k {
		case corev1.LabelTopologyRegion:
			out[corev1.LabelFailureDomainBetaRegion] = v
		case corev1.LabelTopologyZone:
			out[corev1.LabelFailureDomainBetaZone] = v
		case corev1.LabelInstanceTypeStable:
			out[corev1.LabelInstanceType] = v
		}
	}
	return out
}

// The configuration examples the upstream Talos CCM documents and ships
// (testdata/upstream, copied with their source) are read unchanged, and give
// the node what upstream gives it: for the example of its docs/config.md, the
// Node that page shows.
func TestUpstreamConfigExamples(t *testing.T) {
	const uuid = "e8e8c388-5812-4db0-87e2-ad1fee51a1c1"
	cases := []struct {
		name        string                          // case
		config      string                          // file in testdata/upstream
		node        string                          // node name (and Talos k8s/Nodename)
		ip          string                          // provided-node-ip
		metadata    runtime.PlatformMetadataSpec    // what Talos reports
		system      *hardware.SystemInformationSpec // SystemInformation
		addresses   []talosnode.Address             // AddressStatus
		providerID  string                          // upstream's providerID
		labels      map[string]string               // every label upstream writes (stable keys; beta keys added)
		annotations map[string]string               // rule annotations
		taints      []corev1.Taint                  // rule taints
		addrs       []corev1.NodeAddress            // status.addresses, in order
	}{
		{
			name: "docs/config.md: the documented node web-1", config: "docs-config.yaml", node: "web-1", ip: "172.16.0.11",
			metadata: runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "web-1", Region: "us-west-1", InstanceID: uuid},
			system:   &hardware.SystemInformationSpec{UUID: uuid, SKUNumber: "t2.micro"},
			addresses: []talosnode.Address{{Link: "eth0", Prefix: "172.16.0.11/24"}, {Link: "eth0", Prefix: "1.2.3.4/32"},
				{Link: "eth0", Prefix: "2001:123:123:123::1/64"}},
			providerID: "someproviderID:///" + uuid,
			labels: withBeta(map[string]string{
				names.PlatformLabel:                     "metal",
				corev1.LabelInstanceTypeStable:          "t2.micro",
				corev1.LabelTopologyRegion:              "us-west-1-on-metal",
				corev1.LabelTopologyZone:                "us-west-1f",
				"node-role.kubernetes.io/web":           "",
				"node-role.kubernetes.io/capacity-type": "on-demand",
			}),
			annotations: map[string]string{"custom-annotation/instance-id": "id-" + uuid, "custom-annotation/cloud-id": ""},
			taints:      []corev1.Taint{{Key: "node.cloudprovider.kubernetes.io/storage-type", Value: "ceph", Effect: corev1.TaintEffectNoSchedule}},
			addrs: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.16.0.11"}, {Type: corev1.NodeExternalIP, Address: "1.2.3.4"},
				{Type: corev1.NodeExternalIP, Address: "2001:123:123:123::1"}, {Type: corev1.NodeHostName, Address: "web-1"}},
		},
		{
			name: "docs/config.md: a nocloud node", config: "docs-config.yaml", node: "pve-3", ip: "10.3.0.3",
			metadata:   runtime.PlatformMetadataSpec{Platform: "nocloud", Hostname: "pve-3.lan.example", InstanceType: "4c8g"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "10.3.0.3/24"}},
			providerID: "talos://nocloud/10.3.0.3",
			labels: withBeta(map[string]string{names.PlatformLabel: "nocloud", corev1.LabelInstanceTypeStable: "4c8g",
				"pvc-storage-class/name": "my-storage-class"}),
			addrs: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.3.0.3"}, {Type: corev1.NodeHostName, Address: "pve-3"},
				{Type: corev1.NodeInternalDNS, Address: "pve-3.lan.example"}},
		},
		{
			name: "hack/ccm-config.yaml: a Proxmox web node", config: "hack-ccm-config.yaml", node: "web-pve-1", ip: "10.4.0.1",
			metadata:   runtime.PlatformMetadataSpec{Platform: "nocloud", Hostname: "web-pve-1", InstanceID: "9001"},
			system:     &hardware.SystemInformationSpec{SerialNumber: "h=web-pve-1;i=101", SKUNumber: "pve-2c"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "10.4.0.1/24"}},
			providerID: "proxmox://region-1/101",
			labels: withBeta(map[string]string{names.PlatformLabel: "nocloud", corev1.LabelInstanceTypeStable: "pve-2c",
				"node-role.kubernetes.io/web": ""}),
			annotations: map[string]string{"talos.dev/instance-id": "id-9001"},
			taints:      []corev1.Taint{{Key: "node.cloudprovider.kubernetes.io/storage-type", Effect: corev1.TaintEffectNoSchedule}},
			addrs:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.4.0.1"}, {Type: corev1.NodeHostName, Address: "web-pve-1"}},
		},
		{
			name: "chart values example: a control-plane node", config: "chart-values-example.yaml", node: "control-1", ip: "10.5.0.1",
			metadata: runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "control-1", Region: "us-east-1", Zone: "us-east-1a",
				InstanceType: "m5.large", InstanceID: "i-0c1", ProviderID: "aws:///us-east-1a/i-0c1"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "10.5.0.1/24"}, {Link: "external", Prefix: "198.51.100.1/32"}},
			providerID: "aws:///us-east-1a/i-0c1",
			labels: withBeta(map[string]string{names.PlatformLabel: "aws", corev1.LabelInstanceTypeStable: "m5.large",
				corev1.LabelTopologyRegion: "us-west-2", corev1.LabelTopologyZone: "us-east-1a", "talos.dev/instance-spot": "false"}),
			annotations: map[string]string{"talos.dev/instance-id": "i-0c1"},
			addrs: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.5.0.1"}, {Type: corev1.NodeExternalIP, Address: "198.51.100.1"},
				{Type: corev1.NodeHostName, Address: "control-1"}},
		},
		{
			// upstream: the node name stands in for a hostname the platform does not report
			name: "chart values example: no hostname in the metadata", config: "chart-values-example.yaml", node: "control-2", ip: "10.5.0.2",
			metadata:   runtime.PlatformMetadataSpec{Platform: "metal"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "10.5.0.2/24"}},
			providerID: "talos://metal/10.5.0.2",
			labels: withBeta(map[string]string{names.PlatformLabel: "metal", corev1.LabelTopologyRegion: "us-west-2",
				"talos.dev/instance-spot": "false"}),
			annotations: map[string]string{"talos.dev/instance-id": ""},
			addrs:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.5.0.2"}, {Type: corev1.NodeHostName, Address: "control-2"}},
		},
	}

	ep := talosnode.StartFor(t)
	for _, c := range cases {
		md := c.metadata
		if _, err := ep.AddNode(c.node, []string{c.ip}, talosnode.Spec{Metadata: &md, System: c.system, Addresses: c.addresses}); err != nil {
			t.Fatal(err)
		}
	}
	client := ep.ClientFor(t)

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rules, err := transform.Load(filepath.Join("testdata", "upstream", c.config))
			if err != nil {
				t.Fatalf("the upstream example is refused: %v", err)
			}
			p := facts.NewSource(client, cloud.NewInterpreter(rules), facts.Options{})
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.node,
				Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: c.ip}}}
			f, err := p.Facts(context.Background(), node)
			if err != nil {
				t.Fatal(err)
			}
			if f.ProviderID != c.providerID {
				t.Errorf("providerID %q, want %q", f.ProviderID, c.providerID)
			}
			if !reflect.DeepEqual(f.Labels, c.labels) {
				t.Errorf("labels\n got %v\nwant %v", f.Labels, c.labels)
			}
			if len(f.Annotations)+len(c.annotations) > 0 && !reflect.DeepEqual(f.Annotations, c.annotations) {
				t.Errorf("annotations\n got %v\nwant %v", f.Annotations, c.annotations)
			}
			if len(f.Taints)+len(c.taints) > 0 && !reflect.DeepEqual(f.Taints, c.taints) {
				t.Errorf("taints\n got %v\nwant %v", f.Taints, c.taints)
			}
			if !reflect.DeepEqual(f.Addresses, c.addrs) {
				t.Errorf("addresses\n got %v\nwant %v", f.Addresses, c.addrs)
			}
		})
	}
}

// talos-ccm also reports the metadata's internalDNS and externalDNS, which
// upstream ignores; one rule without a selector clears them, and the
// addresses are exactly upstream's (the FQDN host name stays InternalDNS, as
// upstream has it).
func TestUpstreamAddressesWithoutMetadataDNS(t *testing.T) {
	ep := talosnode.StartFor(t)
	if _, err := ep.AddNode("aws-7", []string{"10.0.1.7"}, talosnode.Spec{
		Metadata: &runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "ip-10-0-1-7.ec2.internal", Zone: "us-east-1a", InstanceID: "i-7",
			ProviderID: "aws:///us-east-1a/i-7", InternalDNS: "ip-10-0-1-7.ec2.internal", ExternalDNS: "ec2-198-51-100-7.compute-1.amazonaws.com"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.0.1.7/24"}, {Link: "external", Prefix: "198.51.100.7/32"}},
	}); err != nil {
		t.Fatal(err)
	}
	client := ep.ClientFor(t)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "aws-7",
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.0.1.7"}}}
	upstream := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1.7"}, {Type: corev1.NodeExternalIP, Address: "198.51.100.7"},
		{Type: corev1.NodeHostName, Address: "aws-7"}, {Type: corev1.NodeInternalDNS, Address: "ip-10-0-1-7.ec2.internal"}}

	for _, tc := range []struct {
		name  string               // case
		rules string               // configuration
		want  []corev1.NodeAddress // addresses
	}{
		{name: "default: the metadata's DNS names too", rules: "",
			want: append(slices.Clone(upstream), corev1.NodeAddress{Type: corev1.NodeExternalDNS, Address: "ec2-198-51-100-7.compute-1.amazonaws.com"})},
		{name: "cleared by a rule: upstream's addresses", rules: "transformations:\n  - platformMetadata: {internalDNS: '', externalDNS: ''}\n",
			want: upstream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := transform.Parse([]byte(tc.rules), "rules.yaml")
			if err != nil {
				t.Fatal(err)
			}
			f, err := facts.NewSource(client, cloud.NewInterpreter(rules), facts.Options{}).Facts(context.Background(), node)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(f.Addresses, tc.want) {
				t.Errorf("addresses\n got %v\nwant %v", f.Addresses, tc.want)
			}
		})
	}
}

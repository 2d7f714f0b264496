package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const rulesYAML = `global:
  clusterName: hybrid
transformations:
  - name: web-on-metal
    nodeSelector:
      - matchExpressions:
          - key: platform
            operator: In
            values: [metal]
          - key: hostname
            operator: Regexp
            values: ['^web-\w+$']
    labels:
      node-role.kubernetes.io/web: ""
    annotations:
      example.com/instance: "id-{{ .Hostname }}"
    taints:
      - key: example.com/dedicated
        value: "{{ .Platform }}"
        effect: NoSchedule
    platformMetadata:
      Region: "{{ .Region }}-on-metal"
      Zone: rack-1
  - name: nocloud-storage
    nodeSelector:
      - matchExpressions:
          - key: platform
            operator: In
            values: [nocloud]
    labels:
      pvc-storage-class/name: local-nvme
  - name: hetzner-hardware
    nodeSelector:
      - matchExpressions:
          - key: manufacturer
            operator: In
            values: [Hetzner]
    labels:
      example.com/vendor: "{{ lower .Manufacturer }}"
`

// platformCase is one simulated node and the Node talos-ccm must produce.
type platformCase struct {
	name        string                          // node name
	ips         []string                        // provided-node-ip (kubelet --node-ip)
	metadata    runtime.PlatformMetadataSpec    // what Talos reports
	addresses   []talosnode.Address             // AddressStatus resources
	system      *hardware.SystemInformationSpec // SystemInformation (nil: absent)
	providerID  string                          // expected spec.providerID
	labels      map[string]string               // expected labels added by talos-ccm
	annotations map[string]string               // expected rule annotations
	taints      []corev1.Taint                  // expected taints after initialization
	addrs       []corev1.NodeAddress            // expected status.addresses, in order
}

func topo(region, zone, itype string) map[string]string {
	m := map[string]string{}
	if region != "" {
		m[corev1.LabelTopologyRegion], m[corev1.LabelFailureDomainBetaRegion] = region, region
	}
	if zone != "" {
		m[corev1.LabelTopologyZone], m[corev1.LabelFailureDomainBetaZone] = zone, zone
	}
	if itype != "" {
		m[corev1.LabelInstanceTypeStable], m[corev1.LabelInstanceType] = itype, itype
	}
	return m
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func addr(t corev1.NodeAddressType, a string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: t, Address: a}
}

func platformCases() []platformCase {
	const (
		pl = names.PlatformLabel
		cn = "node.cloudprovider.kubernetes.io/clustername"
		lc = "node.cloudprovider.kubernetes.io/lifecycle"
	)
	return []platformCase{
		{
			name: "aws-1", ips: []string{"10.0.1.10"},
			metadata: runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "ip-10-0-1-10.ec2.internal", Region: "us-east-1",
				Zone: "us-east-1a", InstanceType: "t3.medium", InstanceID: "i-0aws", ProviderID: "aws:///us-east-1a/i-0aws",
				Spot: true, InternalDNS: "ip-10-0-1-10.ec2.internal", ExternalDNS: "ec2-198-51-100-10.compute-1.amazonaws.com"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "10.0.1.10/24"}, {Link: "external", Prefix: "198.51.100.10/32"}},
			providerID: "aws:///us-east-1a/i-0aws",
			labels:     merge(topo("us-east-1", "us-east-1a", "t3.medium"), map[string]string{pl: "aws", cn: "hybrid", lc: "spot"}),
			addrs: []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.0.1.10"), addr(corev1.NodeExternalIP, "198.51.100.10"),
				addr(corev1.NodeHostName, "aws-1"), addr(corev1.NodeInternalDNS, "ip-10-0-1-10.ec2.internal"),
				addr(corev1.NodeExternalDNS, "ec2-198-51-100-10.compute-1.amazonaws.com")},
		},
		{
			name: "gcp-1", ips: []string{"10.0.2.10", "fd00:2::10"},
			metadata: runtime.PlatformMetadataSpec{Platform: "gcp", Hostname: "gcp-1", Region: "us-central1", Zone: "us-central1-a",
				InstanceType: "e2-small", InstanceID: "1234", ProviderID: "gce://proj/us-central1-a/gcp-1"},
			addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.0.2.10/32"}, {Link: "eth0", Prefix: "fd00:2::10/128"},
				{Link: "external", Prefix: "34.1.2.3/32"}},
			providerID: "gce://proj/us-central1-a/gcp-1",
			labels:     merge(topo("us-central1", "us-central1-a", "e2-small"), map[string]string{pl: "gcp", cn: "hybrid"}),
			addrs: []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.0.2.10"), addr(corev1.NodeInternalIP, "fd00:2::10"),
				addr(corev1.NodeExternalIP, "34.1.2.3"), addr(corev1.NodeHostName, "gcp-1")},
		},
		{
			name: "azure-1", ips: []string{"10.0.7.10"},
			metadata: runtime.PlatformMetadataSpec{Platform: "azure", Hostname: "azure-1", Region: "westeurope", Zone: "westeurope-1",
				InstanceType: "Standard_B2s", InstanceID: "azure-1",
				ProviderID: "azure:///subscriptions/sub-1/resourceGroups/MyRG/providers/Microsoft.Compute/virtualMachines/azure-1"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "10.0.7.10/24"}},
			providerID: "azure:///subscriptions/sub-1/resourceGroups/myrg/providers/Microsoft.Compute/virtualMachines/azure-1",
			labels:     merge(topo("westeurope", "westeurope-1", "Standard_B2s"), map[string]string{pl: "azure", cn: "hybrid"}),
			addrs:      []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.0.7.10"), addr(corev1.NodeHostName, "azure-1")},
		},
		{
			name: "hcloud-1", ips: []string{"10.0.3.10"},
			metadata: runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "hcloud-1", Region: "fsn1", Zone: "fsn1-dc14",
				InstanceType: "cx22", InstanceID: "4711"},
			addresses:  []talosnode.Address{{Link: "ens10", Prefix: "10.0.3.10/32"}, {Link: "external", Prefix: "95.216.1.2/32"}},
			system:     &hardware.SystemInformationSpec{Manufacturer: "Hetzner", ProductName: "vServer"},
			providerID: "hcloud://4711",
			labels:     merge(topo("fsn1", "fsn1-dc14", "cx22"), map[string]string{pl: "hcloud", cn: "hybrid", "example.com/vendor": "hetzner"}),
			addrs: []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.0.3.10"), addr(corev1.NodeExternalIP, "95.216.1.2"),
				addr(corev1.NodeHostName, "hcloud-1")},
		},
		{
			name: "openstack-1", ips: []string{"10.0.4.10"},
			metadata: runtime.PlatformMetadataSpec{Platform: "openstack", Hostname: "openstack-1", Region: "RegionOne", Zone: "nova",
				InstanceType: "m1.small", InstanceID: "5f0c7e1a", ProviderID: "openstack:///5f0c7e1a"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "10.0.4.10/24"}, {Link: "eth0", Prefix: "2001:db8:4::10/64"}},
			providerID: "openstack:///5f0c7e1a",
			labels:     merge(topo("RegionOne", "nova", "m1.small"), map[string]string{pl: "openstack", cn: "hybrid"}),
			addrs: []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.0.4.10"), addr(corev1.NodeExternalIP, "2001:db8:4::10"),
				addr(corev1.NodeHostName, "openstack-1")},
		},
		{
			name: "web-metal1", ips: []string{"192.168.5.10"},
			metadata:   runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "web-metal1", Region: "eu-dc1"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "192.168.5.10/24"}, {Link: "eth0", Prefix: "2001:db8:5::10/64"}},
			providerID: "talos://metal/192.168.5.10",
			labels: merge(topo("eu-dc1-on-metal", "rack-1", ""), map[string]string{pl: "metal", cn: "hybrid",
				"node-role.kubernetes.io/web": ""}),
			annotations: map[string]string{"example.com/instance": "id-web-metal1"},
			taints:      []corev1.Taint{{Key: "example.com/dedicated", Value: "metal", Effect: corev1.TaintEffectNoSchedule}},
			addrs: []corev1.NodeAddress{addr(corev1.NodeInternalIP, "192.168.5.10"), addr(corev1.NodeExternalIP, "2001:db8:5::10"),
				addr(corev1.NodeHostName, "web-metal1")},
		},
		{
			name: "nocloud-1", ips: []string{"10.0.6.10"},
			metadata:   runtime.PlatformMetadataSpec{Platform: "nocloud", Hostname: "nocloud-1", InstanceType: "pve-4c"},
			addresses:  []talosnode.Address{{Link: "eth0", Prefix: "10.0.6.10/24"}},
			providerID: "talos://nocloud/10.0.6.10",
			labels:     merge(topo("", "", "pve-4c"), map[string]string{pl: "nocloud", cn: "hybrid", "pvc-storage-class/name": "local-nvme"}),
			addrs:      []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.0.6.10"), addr(corev1.NodeHostName, "nocloud-1")},
		},
	}
}

func writeRules(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "transformations.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func startEndpoint(t *testing.T) *talosnode.Endpoint {
	t.Helper()
	ep := talosnode.StartFor(t)
	return ep
}

func TestInitializesNodesOfEveryPlatform(t *testing.T) {
	ep := startEndpoint(t)
	cases := platformCases()
	for _, c := range cases {
		md := c.metadata
		if _, err := ep.AddNode(c.name, c.ips, talosnode.Spec{Metadata: &md, Addresses: c.addresses, System: c.system}); err != nil {
			t.Fatal(err)
		}
	}
	startTalosCCM(t, talosCCMArgs(t, ep, "--cloud-config="+writeRules(t, rulesYAML), "--node-initialized-events"))
	for _, c := range cases {
		register(t, kubeletNode(c.name, c.ips...), c.ips...)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := waitNode(t, c.name, 30*time.Second, func(n *corev1.Node) bool { return initialized(n) && len(n.Status.Addresses) == len(c.addrs) })
			if n.Spec.ProviderID != c.providerID {
				t.Errorf("providerID = %q, want %q", n.Spec.ProviderID, c.providerID)
			}
			wantLabels := merge(map[string]string{corev1.LabelHostname: c.name, corev1.LabelOSStable: "linux"}, c.labels)
			if !reflect.DeepEqual(n.Labels, wantLabels) {
				t.Errorf("labels:\n got %v\nwant %v", n.Labels, wantLabels)
			}
			for k, v := range c.annotations {
				if n.Annotations[k] != v {
					t.Errorf("annotation %s = %q, want %q", k, n.Annotations[k], v)
				}
			}
			if len(n.Annotations) != 1+len(c.annotations) {
				t.Errorf("annotations = %v, want only provided-node-ip + %v", n.Annotations, c.annotations)
			}
			// the API server's TaintNodesByCondition admission adds not-ready to every new node
			taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(x corev1.Taint) bool { return x.Key == corev1.TaintNodeNotReady })
			if !reflect.DeepEqual(taints, c.taints) && !(len(taints) == 0 && len(c.taints) == 0) {
				t.Errorf("taints = %v, want %v", taints, c.taints)
			}
			if !reflect.DeepEqual(n.Status.Addresses, c.addrs) {
				t.Errorf("addresses:\n got %v\nwant %v", n.Status.Addresses, c.addrs)
			}
			ev := waitEvent(t, c.name, "Initialized", 10*time.Second)
			if !strings.Contains(ev.Message, c.providerID) {
				t.Errorf("Initialized event %q does not name providerID %s", ev.Message, c.providerID)
			}
		})
	}
}

// Nodes whose Talos API hangs or is unreachable must not hold up the others,
// and are initialized once they answer. No clock is asserted: the hung nodes'
// requests are held in flight by the simulated endpoint for as long as the
// test wants (the request timeout is far longer than the test), so "not
// delayed" means every healthy node is fully initialized while those requests
// are provably still in flight. A controller that let a hung node block
// anything beyond its own worker (one worker, a shared lock around Talos calls,
// a queue that waits for earlier items) never gets there and fails.
func TestUnreachableAndSlowNodesDoNotDelayOthers(t *testing.T) {
	ep := startEndpoint(t)
	md := func(h string) *runtime.PlatformMetadataSpec {
		return &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: h}
	}
	const (
		workers = 6
		hungN   = workers - 2 // fewer than --concurrent-node-syncs
		// Facts reads PlatformMetadata, AddressStatus and Nodename concurrently
		perSync = 3
	)
	var hung []*talosnode.Node
	for i := range hungN {
		name, ip := "hung-"+itoa(i), "10.20.0."+itoa(10+i)
		n, err := ep.AddNode(name, []string{ip}, talosnode.Spec{Metadata: md(name), Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}}})
		if err != nil {
			t.Fatal(err)
		}
		n.Hold()
		hung = append(hung, n)
	}
	t.Cleanup(func() {
		for _, n := range hung {
			n.Release()
		}
	})
	gone, err := ep.AddNode("gone-1", []string{"10.20.0.2"}, talosnode.Spec{Metadata: md("gone-1"), Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.20.0.2/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	gone.SetUnreachable(true, false)
	var healthy []string
	for i := range 20 {
		name := "ok-" + string(rune('a'+i))
		ip := "10.20.1." + itoa(i+1)
		n, err := ep.AddNode(name, []string{ip}, talosnode.Spec{Metadata: md(name), Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}}})
		if err != nil {
			t.Fatal(err)
		}
		n.SetLatency(50 * time.Millisecond)
		healthy = append(healthy, name)
	}
	startTalosCCM(t, talosCCMArgs(t, ep, "--concurrent-node-syncs="+itoa(workers), "--talos-timeout=10m"))

	// The hung nodes come first and take their workers: wait until every one of
	// their syncs is in flight at the endpoint.
	for i, n := range hung {
		register(t, kubeletNode(n.Name, "10.20.0."+itoa(10+i)))
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		for _, n := range hung {
			if n.Held() < perSync {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		for _, n := range hung {
			t.Logf("%s: %d requests held", n.Name, n.Held())
		}
		t.Fatalf("the hung nodes' Talos requests never all reached the endpoint: %v", err)
	}

	register(t, kubeletNode("gone-1", "10.20.0.2"))
	for i, name := range healthy {
		register(t, kubeletNode(name, "10.20.1."+itoa(i+1)))
	}
	for _, name := range healthy {
		n := waitNode(t, name, 60*time.Second, func(n *corev1.Node) bool { return initialized(n) && len(n.Status.Addresses) == 2 })
		if n.Spec.ProviderID == "" || n.Labels[names.PlatformLabel] != "metal" {
			t.Fatalf("%s: initialized without its facts: providerID %q labels %v", name, n.Spec.ProviderID, n.Labels)
		}
	}
	// ... while every hung request is still in flight and no hung node moved
	for _, n := range hung {
		if held := n.Held(); held < perSync {
			t.Fatalf("%s: only %d requests still held; the healthy nodes must finish while all are in flight", n.Name, held)
		}
		if node := waitNode(t, n.Name, time.Second, func(*corev1.Node) bool { return true }); initialized(node) || node.Spec.ProviderID != "" {
			t.Fatalf("%s initialized without an answer from its Talos API", n.Name)
		}
	}
	ev := waitEvent(t, "gone-1", "TalosAPIUnavailable", 10*time.Second)
	if !strings.Contains(ev.Message, "10.20.0.2") {
		t.Errorf("event should name the address it tried: %q", ev.Message)
	}
	if n := waitNode(t, "gone-1", time.Second, func(*corev1.Node) bool { return true }); initialized(n) || n.Spec.ProviderID != "" {
		t.Fatalf("unreachable node must stay uninitialized without providerID: %+v", n.Spec)
	}

	// Once they answer, they are initialized too.
	gone.SetUnreachable(false, false)
	for _, n := range hung {
		n.Release()
	}
	for i, n := range hung {
		if node := waitNode(t, n.Name, 60*time.Second, initialized); node.Spec.ProviderID != "talos://metal/10.20.0."+itoa(10+i) {
			t.Fatalf("%s: providerID %q", n.Name, node.Spec.ProviderID)
		}
	}
	n := waitNode(t, "gone-1", 60*time.Second, initialized)
	if n.Spec.ProviderID != "talos://metal/10.20.0.2" {
		t.Fatalf("providerID = %q", n.Spec.ProviderID)
	}
}

// Metadata that cannot produce a correct providerID yet is retried, never
// replaced by a placeholder; a node without metadata waits for it.
func TestIncompleteMetadataIsRetriedNotGuessed(t *testing.T) {
	ctx := context.Background()
	ep := startEndpoint(t)
	late, err := ep.AddNode("hcloud-late", []string{"10.30.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "hcloud-late"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.30.0.1/32"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	bare, err := ep.AddNode("no-metadata", []string{"10.30.0.2"}, talosnode.Spec{
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.30.0.2/24"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	startTalosCCM(t, talosCCMArgs(t, ep))
	register(t, kubeletNode("hcloud-late", "10.30.0.1"))
	register(t, kubeletNode("no-metadata", "10.30.0.2"))

	ev := waitEvent(t, "hcloud-late", "MetadataIncomplete", 20*time.Second)
	if !strings.Contains(ev.Message, "hcloud") {
		t.Errorf("event should name the platform: %q", ev.Message)
	}
	waitEvent(t, "no-metadata", "MetadataIncomplete", 20*time.Second)
	for _, name := range []string{"hcloud-late", "no-metadata"} {
		if n := waitNode(t, name, time.Second, func(*corev1.Node) bool { return true }); initialized(n) || n.Spec.ProviderID != "" {
			t.Fatalf("%s: must stay uninitialized without providerID, got %q", name, n.Spec.ProviderID)
		}
	}
	if err := late.SetMetadata(ctx, runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "hcloud-late", InstanceID: "99", Region: "nbg1"}); err != nil {
		t.Fatal(err)
	}
	if err := bare.SetMetadata(ctx, runtime.PlatformMetadataSpec{Platform: "nocloud", Hostname: "no-metadata"}); err != nil {
		t.Fatal(err)
	}
	if n := waitNode(t, "hcloud-late", 90*time.Second, initialized); n.Spec.ProviderID != "hcloud://99" || n.Labels[names.PlatformLabel] != "hcloud" {
		t.Fatalf("hcloud-late: providerID %q labels %v", n.Spec.ProviderID, n.Labels)
	}
	if n := waitNode(t, "no-metadata", 90*time.Second, initialized); n.Spec.ProviderID != "talos://nocloud/10.30.0.2" {
		t.Fatalf("no-metadata: providerID %q", n.Spec.ProviderID)
	}
}

// Without the provided-node-ip annotation the kubelet's InternalIP is used; with
// neither, the node is reported and left alone.
func TestNodeWithoutProvidedIP(t *testing.T) {
	ep := startEndpoint(t)
	for _, n := range []struct{ name, ip string }{{"no-annotation", "10.40.0.1"}, {"no-address", "10.40.0.2"}} {
		if _, err := ep.AddNode(n.name, []string{n.ip}, talosnode.Spec{
			Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: n.name},
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: n.ip + "/24"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	startTalosCCM(t, talosCCMArgs(t, ep))
	register(t, kubeletNode("no-annotation"), "10.40.0.1")
	register(t, kubeletNode("no-address"))
	n := waitNode(t, "no-annotation", 30*time.Second, initialized)
	if n.Spec.ProviderID != "talos://metal/10.40.0.1" {
		t.Fatalf("providerID %q", n.Spec.ProviderID)
	}
	ev := waitEvent(t, "no-address", "NoNodeIP", 20*time.Second)
	if !strings.Contains(ev.Message, "provided-node-ip") {
		t.Errorf("event should say what is missing: %q", ev.Message)
	}
}

// A broken rules file stops talos-ccm before it touches anything, with a
// message naming the file, the rule and the field.
func TestInvalidTransformationsExitNonZero(t *testing.T) {
	ep := startEndpoint(t)
	bad := writeRules(t, `transformations:
  - name: broken-regexp
    nodeSelector:
      - matchExpressions:
          - key: hostname
            operator: Regexp
            values: ["web-(["]
`)
	cmd := exec.Command(filepath.Join(binaries, "talos-ccm"), talosCCMArgs(t, ep, "--cloud-config="+bad)...)
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if err == nil || !asExit(err, &exitErr) || exitErr.ExitCode() == 0 {
		t.Fatalf("want non-zero exit, got %v\n%s", err, out)
	}
	for _, want := range []string{filepath.Base(bad), "broken-regexp", "values[0]"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("error output does not mention %q:\n%s", want, tail(string(out), 2000))
		}
	}
}

func asExit(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*target = e
	}
	return ok
}

func itoa(i int) string { return strconv.Itoa(i) }

// The kubelet writes provided-node-ip itself. A node whose annotation points at
// another machine's Talos API must not inherit that machine's identity: the
// answering machine's k8s/Nodename has to be the Node's name.
func TestImpostorNodeIsNotInitializedFromAnotherMachine(t *testing.T) {
	ep := startEndpoint(t)
	if _, err := ep.AddNode("victim-1", []string{"10.60.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "victim-1", InstanceID: "i-victim", ProviderID: "aws:///us-east-1a/i-victim", Zone: "us-east-1a"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.60.0.1/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	startTalosCCM(t, talosCCMArgs(t, ep))
	register(t, kubeletNode("impostor-1", "10.60.0.1")) // claims the victim's address
	ev := waitEvent(t, "impostor-1", "NodeIdentityMismatch", 20*time.Second)
	if !strings.Contains(ev.Message, `"victim-1"`) {
		t.Errorf("event should name the machine that answered: %q", ev.Message)
	}
	if n := waitNode(t, "impostor-1", time.Second, func(*corev1.Node) bool { return true }); initialized(n) || n.Spec.ProviderID != "" {
		t.Fatalf("impostor initialized with %q", n.Spec.ProviderID)
	}
}

// The kubelet writes provided-node-ip itself; only one entry has to reach the
// node's Talos API. An entry the Talos API does not report as an address of
// the node (here a second family) is not taken as the node's InternalIP: the
// node is reported and left uninitialized until the annotation is right.
func TestProvidedIPNotOnTheNodeIsNotTaken(t *testing.T) {
	ep := startEndpoint(t)
	if _, err := ep.AddNode("extra-ip-1", []string{"10.50.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "extra-ip-1"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.50.0.1/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	startTalosCCM(t, talosCCMArgs(t, ep))
	register(t, kubeletNode("extra-ip-1", "10.50.0.1", "fd00:50::99"), "10.50.0.1", "fd00:50::99")
	ev := waitEvent(t, "extra-ip-1", "ProvidedNodeIPNotFound", 20*time.Second)
	if !strings.Contains(ev.Message, "fd00:50::99") {
		t.Errorf("event should name the address: %q", ev.Message)
	}
	if n := waitNode(t, "extra-ip-1", time.Second, func(*corev1.Node) bool { return true }); initialized(n) || n.Spec.ProviderID != "" {
		t.Fatalf("initialized with an address its Talos API does not report: %q %v", n.Spec.ProviderID, n.Status.Addresses)
	}
	n := waitNode(t, "extra-ip-1", time.Second, func(*corev1.Node) bool { return true })
	n.Annotations["alpha.kubernetes.io/provided-node-ip"] = "10.50.0.1"
	if _, err := env.Client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n = waitNode(t, "extra-ip-1", 60*time.Second, initialized)
	if n.Spec.ProviderID != "talos://metal/10.50.0.1" {
		t.Fatalf("providerID %q", n.Spec.ProviderID)
	}
}

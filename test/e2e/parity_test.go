package e2e

import (
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// talosconfigForCluster writes an os:reader talosconfig of ep whose context
// names cluster (the `cluster` field of a talosconfig context).
func talosconfigForCluster(t *testing.T, ep *talosnode.Endpoint, cluster string) string {
	t.Helper()
	cfg, err := ep.ClientConfig("os:reader")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts[cfg.Context].Cluster = cluster
	path := filepath.Join(t.TempDir(), "talosconfig-"+cluster)
	if err := cfg.Save(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// A user coming from the upstream Talos CCM keeps the configuration file and the
// talosconfig: talos-ccm, given the example of upstream's docs/config.md
// (ccm/cloud/testdata/upstream), writes the Node that page shows — on the real
// API server — and, as upstream, takes the clustername label from the
// talosconfig context when the configuration names no cluster
// (global.clusterName, when set, wins).
func TestUpstreamConfigGivesTheDocumentedNode(t *testing.T) {
	const uuid = "e8e8c388-5812-4db0-87e2-ad1fee51a1c1"
	ep := startEndpoint(t)
	for _, name := range []string{"web-1", "web-2"} {
		ip := map[string]string{"web-1": "172.16.0.11", "web-2": "172.16.0.12"}[name]
		if _, err := ep.AddNode(name, []string{ip}, talosnode.Spec{
			Metadata: &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name, Region: "us-west-1", InstanceID: uuid},
			System:   &hardware.SystemInformationSpec{UUID: uuid, SKUNumber: "t2.micro"},
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}, {Link: "eth0", Prefix: "1.2.3.4/32"},
				{Link: "eth0", Prefix: "2001:123:123:123::1/64"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	config := filepath.Join(testenv.RepoRoot(), "ccm", "cloud", "testdata", "upstream", "docs-config.yaml")
	ccm := startTalosCCM(t, append(talosCCMArgs(t, ep, "--cloud-config="+config), "--talosconfig="+talosconfigForCluster(t, ep, "talos-default")))
	register(t, kubeletNode("web-1", "172.16.0.11"), "172.16.0.11")
	n := waitNode(t, "web-1", 30*time.Second, func(n *corev1.Node) bool { return initialized(n) && len(n.Status.Addresses) == 4 })

	// docs/config.md, "Result of kubernetes node object after Talos CCM initialization"
	if n.Spec.ProviderID != "someproviderID:///"+uuid {
		t.Errorf("providerID %q", n.Spec.ProviderID)
	}
	wantLabels := merge(map[string]string{corev1.LabelHostname: "web-1", corev1.LabelOSStable: "linux"},
		topo("us-west-1-on-metal", "us-west-1f", "t2.micro"), map[string]string{
			names.PlatformLabel:                            "metal",
			"node.cloudprovider.kubernetes.io/clustername": "talos-default",
			"node-role.kubernetes.io/web":                  "",
			"node-role.kubernetes.io/capacity-type":        "on-demand",
		})
	if !reflect.DeepEqual(n.Labels, wantLabels) {
		t.Errorf("labels\n got %v\nwant %v", n.Labels, wantLabels)
	}
	if n.Annotations["custom-annotation/instance-id"] != "id-"+uuid {
		t.Errorf("annotations %v", n.Annotations)
	}
	taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(x corev1.Taint) bool { return x.Key == corev1.TaintNodeNotReady })
	if want := []corev1.Taint{{Key: "node.cloudprovider.kubernetes.io/storage-type", Value: "ceph", Effect: corev1.TaintEffectNoSchedule}}; !reflect.DeepEqual(taints, want) {
		t.Errorf("taints %v, want %v", taints, want)
	}
	wantAddrs := []corev1.NodeAddress{addr(corev1.NodeInternalIP, "172.16.0.11"), addr(corev1.NodeExternalIP, "1.2.3.4"),
		addr(corev1.NodeExternalIP, "2001:123:123:123::1"), addr(corev1.NodeHostName, "web-1")}
	if !reflect.DeepEqual(n.Status.Addresses, wantAddrs) {
		t.Errorf("addresses\n got %v\nwant %v", n.Status.Addresses, wantAddrs)
	}

	// global.clusterName wins over the talosconfig context
	_ = ccm.cmd.Process.Kill()
	<-ccm.done
	startTalosCCM(t, append(talosCCMArgs(t, ep, "--cloud-config="+writeRules(t, "global:\n  clusterName: from-config\n")),
		"--talosconfig="+talosconfigForCluster(t, ep, "talos-default")))
	register(t, kubeletNode("web-2", "172.16.0.12"), "172.16.0.12")
	n = waitNode(t, "web-2", 30*time.Second, initialized)
	if got := n.Labels["node.cloudprovider.kubernetes.io/clustername"]; got != "from-config" {
		t.Errorf("clustername %q, want global.clusterName from-config", got)
	}
}

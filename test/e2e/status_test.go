package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// talos-ccm keeps only the addresses of a Node's status in its cache. What it
// writes of the status (the addresses, at initialization and when the Talos
// API reports new ones) must leave everything the kubelet reports as it was:
// conditions, images, node info, capacity.
func TestAddressesLeaveTheKubeletsStatus(t *testing.T) {
	ctx := context.Background()
	ep := startEndpoint(t)
	const name = "status-1"
	node, err := ep.AddNode(name, []string{"10.51.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.51.0.1/24"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	register(t, kubeletNode(name, "10.51.0.1"))
	// what a kubelet reports besides the addresses
	n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.example/app@sha256:" + sha}, SizeBytes: 12345678}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.36.3", OSImage: "Talos (v1.12.0)", ContainerRuntimeVersion: "containerd://2.1.0"}
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourcePods: resource.MustParse("110")}
	kubelet, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keptAsIs := func(got *corev1.Node) bool {
		return slices.EqualFunc(got.Status.Conditions, kubelet.Status.Conditions, func(a, b corev1.NodeCondition) bool {
			return a.Type == b.Type && a.Status == b.Status && a.Reason == b.Reason
		}) && len(got.Status.Images) == 1 && got.Status.Images[0].Names[0] == kubelet.Status.Images[0].Names[0] &&
			got.Status.NodeInfo == kubelet.Status.NodeInfo && got.Status.Capacity.Cpu().Equal(resource.MustParse("4"))
	}

	// a short refresh period: the addresses are re-read every second
	startTalosCCM(t, talosCCMArgs(t, ep, "--node-status-update-frequency=1s"))
	got := waitNode(t, name, 30*time.Second, func(n *corev1.Node) bool {
		return initialized(n) && slices.Contains(addressesOf(n), corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.51.0.1"})
	})
	if !keptAsIs(got) {
		t.Fatalf("initialization changed the kubelet's status:\nconditions %+v\nimages %+v\nnode info %+v\ncapacity %v", got.Status.Conditions, got.Status.Images, got.Status.NodeInfo, got.Status.Capacity)
	}

	// the machine gets a public address (Talos' "external" link): the refresh
	// writes it, and nothing else
	if err := node.AddAddress(ctx, talosnode.Address{Link: "external", Prefix: "198.51.100.51/32"}); err != nil {
		t.Fatal(err)
	}
	got = waitNode(t, name, 30*time.Second, func(n *corev1.Node) bool {
		return slices.Contains(addressesOf(n), corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.51"})
	})
	if !keptAsIs(got) {
		t.Fatalf("the address refresh changed the kubelet's status:\nconditions %+v\nimages %+v\nnode info %+v\ncapacity %v", got.Status.Conditions, got.Status.Images, got.Status.NodeInfo, got.Status.Capacity)
	}
}

const sha = "2f8e1b7c1c4d1b5a0f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a"

package cloudnode_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloudnode"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// TestFirstRefreshRetried: enforce mode, a node another CCM initialized (no
// uninitialized taint, no routing label), and its Talos API does not answer
// when talos-ccm first looks. Once it answers, the node gets its routing
// label without anything else happening to the Node: the failed first read
// is retried with back-off, not left to the informer's resync
// (StatusUpdateFrequency, five minutes here as in talos-ccm's default),
// during which the gate would not route the node to its native CCM.
func TestFirstRefreshRetried(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	const name, ip = "refresh-0", "192.0.2.41"
	ep := talosnode.StartFor(t)
	machine, err := ep.AddNode(name, []string{ip}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	machine.SetUnreachable(true, false)
	created, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{ProviderID: "talos://metal/" + ip},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	src := facts.NewSource(ep.ClientFor(t), cloud.NewInterpreter(nil), facts.Options{})
	defer run(t, env.Client, src, cloudnode.Options{Workers: 1, Enforce: true, StatusUpdateFrequency: 5 * time.Minute})()

	// the first lookup has ended (failed: the node's Talos API refuses)
	for deadline := time.Now().Add(30 * time.Second); !src.Looked(name); {
		if time.Now().After(deadline) {
			t.Fatal("the first lookup never ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
	got, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels[names.PlatformLabel] != "" {
		t.Fatalf("node labelled %q while its Talos API did not answer", got.Labels[names.PlatformLabel])
	}
	machine.SetUnreachable(false, false)

	for deadline := time.Now().Add(time.Minute); ; {
		got, err = env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Labels[names.PlatformLabel] == "metal" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node not routed after its Talos API answered again: labels %v (a failed first refresh waits for the informer's resync)", got.Labels)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package cloud_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// TestIdentityChangeRevokesProof: the addresses established for a node are the
// CSR approver's proof. When the node's address later leads to another machine's
// Talos API (the machine was replaced, or the address reassigned), the remembered
// addresses must stop being proof at once, not when the node is deleted.
func TestIdentityChangeRevokesProof(t *testing.T) {
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Stop)
	addMachine := func(name string) {
		t.Helper()
		if _, err := ep.AddNode(name, []string{"10.90.0.1"}, talosnode.Spec{
			Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name},
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.90.0.1/24"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	addMachine("web-1")
	client, err := ep.NewClient(t.TempDir(), talos.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	p := cloud.New(client, nil, cloud.Options{})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "web-1",
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.90.0.1"}}}
	ctx := context.Background()

	addrs, err := p.EstablishedAddresses(ctx, node)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("honest node: addresses %v, error %v", addrs, err)
	}

	// The address now answers as another machine.
	ep.RemoveNode("web-1")
	addMachine("db-1")
	if _, err := p.Facts(ctx, node); !errors.Is(err, cloud.ErrIdentity) {
		t.Fatalf("re-read after the machine changed: error %v, want ErrIdentity", err)
	}
	addrs, err = p.EstablishedAddresses(ctx, node)
	if !errors.Is(err, csr.ErrNotThisNode) {
		t.Fatalf("after the identity changed: addresses %v, error %v; want no addresses and csr.ErrNotThisNode", addrs, err)
	}
}

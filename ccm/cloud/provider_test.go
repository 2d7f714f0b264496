package cloud_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
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

// TestOneLookupPerNodeInFlight: every caller asking for a node's facts while a
// lookup of it is in flight (cloud-node, node-csr-approval) shares that lookup:
// a node whose Talos API hangs is dialled once, not once per caller. A caller
// that gives up does not end the lookup for the others, and the lookup ends at
// its own deadline whatever the callers' contexts.
func TestOneLookupPerNodeInFlight(t *testing.T) {
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Stop)
	hung, err := ep.AddNode("hung-1", []string{"10.91.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "hung-1"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.91.0.1/24"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	hung.Hold()
	t.Cleanup(hung.Release)
	// requests and lookups outlive the test unless released
	client, err := ep.NewClient(t.TempDir(), talos.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	p := cloud.New(client, nil, cloud.Options{LookupTimeout: time.Hour})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hung-1",
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.91.0.1"}}}

	const (
		callers = 8
		perRead = 3 // PlatformMetadata, AddressStatus, Nodename
	)
	type result struct {
		f   *cloud.Facts
		err error
	}
	results := make(chan result, callers)
	for range callers {
		go func() {
			f, err := p.Facts(context.Background(), node)
			results <- result{f, err}
		}()
	}
	// one caller gives up early; the others keep waiting
	quitter, quit := context.WithCancel(context.Background())
	quitErr := make(chan error, 1)
	go func() { _, err := p.Facts(quitter, node); quitErr <- err }()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return hung.Held() >= perRead, nil
	}); err != nil {
		t.Fatalf("the lookup never reached the node: %d requests held", hung.Held())
	}
	quit()
	if err := <-quitErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller that gave up: %v, want context.Canceled", err)
	}
	if held, calls := hung.Held(), hung.Calls(); held != perRead || calls != perRead {
		t.Fatalf("%d callers: %d requests held, %d made; want one lookup (%d)", callers+1, held, calls, perRead)
	}
	hung.Release()
	for range callers {
		r := <-results
		if r.err != nil || r.f.ProviderID != "talos://metal/10.91.0.1" {
			t.Fatalf("shared lookup: %+v, %v", r.f, r.err)
		}
	}
	if calls := hung.Calls(); calls != perRead {
		t.Fatalf("%d requests made to the node, want %d (one lookup)", calls, perRead)
	}

	// The lookup's own deadline ends a hung lookup, whoever waits for it.
	p = cloud.New(client, nil, cloud.Options{LookupTimeout: 200 * time.Millisecond})
	hung.Hold()
	if _, err := p.Facts(context.Background(), node); !errors.Is(err, cloud.ErrTalosAPI) || !strings.Contains(err.Error(), "DeadlineExceeded") {
		t.Fatalf("hung lookup past its deadline: %v, want ErrTalosAPI (DeadlineExceeded)", err)
	}
}

// TestProviderIDMismatchEstablishesNothing: a kubelet registers its Node with
// any providerID it likes. For an uninitialized node that disagrees with the
// Talos API nothing is established (no facts, no addresses for the CSR
// approver), and the error names both values; InstanceMetadata fails the same
// way, which makes k8s.io/cloud-provider's node controller keep the taint and
// retry. Once initialized, providerID is write-once and no longer compared.
func TestProviderIDMismatchEstablishesNothing(t *testing.T) {
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Stop)
	if _, err := ep.AddNode("web-1", []string{"10.92.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "web-1", InstanceID: "42"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.92.0.1/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	client, err := ep.NewClient(t.TempDir(), talos.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	p := cloud.New(client, nil, cloud.Options{})
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.92.0.1"}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/i-chosen-by-kubelet",
			Taints: []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}
	ctx := context.Background()
	var mismatch *cloud.ProviderIDMismatchError
	if _, err := p.Facts(ctx, node); !errors.As(err, &mismatch) || mismatch.Registered != node.Spec.ProviderID || mismatch.Established != "hcloud://42" {
		t.Fatalf("Facts: %v, want a ProviderIDMismatchError naming both values", err)
	}
	if md, err := p.InstanceMetadata(ctx, node); !errors.Is(err, cloud.ErrProviderIDMismatch) || md != nil {
		t.Fatalf("InstanceMetadata: %+v, %v; want ErrProviderIDMismatch", md, err)
	}
	if addrs, err := p.EstablishedAddresses(ctx, node); err == nil || len(addrs) > 0 {
		t.Fatalf("EstablishedAddresses of a mismatched node: %v, %v; want an error", addrs, err)
	}
	for _, s := range []string{"aws:///us-east-1a/i-chosen-by-kubelet", "hcloud://42"} {
		if _, err := p.Facts(ctx, node); !strings.Contains(err.Error(), strconv.Quote(s)) {
			t.Fatalf("error %q does not name %s", err, s)
		}
	}
	// an initialized node's providerID is write-once and not compared again
	initialized := node.DeepCopy()
	initialized.Spec.Taints = nil
	if f, err := p.Facts(ctx, initialized); err != nil || f.ProviderID != "hcloud://42" {
		t.Fatalf("initialized node: %+v, %v", f, err)
	}
	// the matching providerID (registered by the kubelet or not) is fine
	node.Spec.ProviderID = "hcloud://42"
	if f, err := p.Facts(ctx, node); err != nil || f.ProviderID != "hcloud://42" {
		t.Fatalf("matching providerID: %+v, %v", f, err)
	}
}

package facts_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// newSource is the facts source talos-ccm runs: the real Talos client and the
// talos cloud provider's interpretation without rules.
func newSource(client *talos.Client, opts facts.Options) *facts.Source {
	return facts.NewSource(client, cloud.NewInterpreter(nil), opts)
}

// TestIdentityChangeRevokesProof: the addresses established for a node are the
// CSR approver's proof. When the node's address later leads to another machine's
// Talos API (the machine was replaced, or the address reassigned), the remembered
// addresses must stop being proof at once, not when the node is deleted.
func TestIdentityChangeRevokesProof(t *testing.T) {
	ep := talosnode.StartFor(t)
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
	client := ep.ClientFor(t)
	p := newSource(client, facts.Options{})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "web-1",
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.90.0.1"}}}
	ctx := context.Background()

	f, err := p.Established(ctx, node)
	if err != nil || len(f.Addresses) == 0 {
		t.Fatalf("honest node: facts %+v, error %v", f, err)
	}

	// The address now answers as another machine.
	ep.RemoveNode("web-1")
	addMachine("db-1")
	if _, err := p.Facts(ctx, node); !errors.Is(err, facts.ErrIdentity) {
		t.Fatalf("re-read after the machine changed: error %v, want ErrIdentity", err)
	}
	f, err = p.Established(ctx, node)
	if !errors.Is(err, facts.ErrIdentity) || f != nil {
		t.Fatalf("after the identity changed: facts %+v, error %v; want none and ErrIdentity", f, err)
	}
	if got := facts.Reason(err); got != facts.ReasonIdentityMismatch {
		t.Fatalf("reason %q, want %s", got, facts.ReasonIdentityMismatch)
	}
}

// TestOneLookupPerNodeInFlight: every caller asking for a node's facts while a
// lookup of it is in flight (cloud-node, node-csr-approval, node IPAM) shares that lookup:
// a node whose Talos API hangs is dialled once, not once per caller. A caller
// that gives up does not end the lookup for the others, and the lookup ends at
// its own deadline whatever the callers' contexts.
func TestOneLookupPerNodeInFlight(t *testing.T) {
	ep := talosnode.StartFor(t)
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
	p := newSource(client, facts.Options{LookupTimeout: time.Hour})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hung-1",
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.91.0.1"}}}

	const (
		callers = 8
		perRead = 3 // PlatformMetadata, AddressStatus, Nodename
	)
	type result struct {
		f   *facts.Facts
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
	p = newSource(client, facts.Options{LookupTimeout: 200 * time.Millisecond})
	hung.Hold()
	if _, err := p.Facts(context.Background(), node); !errors.Is(err, facts.ErrTalosAPI) || !strings.Contains(err.Error(), "DeadlineExceeded") {
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
	ep := talosnode.StartFor(t)
	if _, err := ep.AddNode("web-1", []string{"10.92.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "web-1", InstanceID: "42"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.92.0.1/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	client := ep.ClientFor(t)
	p := newSource(client, facts.Options{})
	provider := cloud.New(p)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.92.0.1"}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/i-chosen-by-kubelet",
			Taints: []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}
	ctx := context.Background()
	var mismatch *facts.ProviderIDMismatchError
	if _, err := p.Facts(ctx, node); !errors.As(err, &mismatch) || mismatch.Registered != node.Spec.ProviderID || mismatch.Established != "hcloud://42" {
		t.Fatalf("Facts: %v, want a ProviderIDMismatchError naming both values", err)
	}
	if md, err := provider.InstanceMetadata(ctx, node); !errors.Is(err, facts.ErrProviderIDMismatch) || md != nil {
		t.Fatalf("InstanceMetadata: %+v, %v; want ErrProviderIDMismatch", md, err)
	}
	if f, err := p.Established(ctx, node); err == nil || f != nil {
		t.Fatalf("Established of a mismatched node: %+v, %v; want an error", f, err)
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

// recorder is an Interpreter around the talos provider's that keeps every
// reading it was given (or fails with err).
type recorder struct {
	facts.Interpreter
	mu       sync.Mutex
	readings []facts.Reading
	err      error
}

func (r *recorder) Interpret(node *corev1.Node, rd *facts.Reading) (*facts.Facts, error) {
	r.mu.Lock()
	r.readings = append(r.readings, *rd)
	err := r.err
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return r.Interpreter.Interpret(node, rd)
}

// TestEstablishedIsRemembered: Established answers from what was established
// (no Talos request) and looks the node up only when nothing is remembered:
// at first, after Forget, and never for a failed lookup. Facts always reads
// afresh. The reading the Interpreter gets names the node IPs in dial order
// and the one that answered; the facts carry the node's Talos addresses.
func TestEstablishedIsRemembered(t *testing.T) {
	ep := talosnode.StartFor(t)
	machine, err := ep.AddNode("rem-1", []string{"fd00:93::1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "rem-1"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "fd00:93::1/64"}, {Link: "eth0", Prefix: "2001:db8:93::1/64"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	client := ep.ClientFor(t)
	interp := &recorder{Interpreter: cloud.NewInterpreter(nil)}
	p := facts.NewSource(client, interp, facts.Options{})
	// the kubelet names an IPv4 address no machine answers on, and the real IPv6 one
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rem-1",
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "fd00:93::1,10.93.9.9"}}}
	ctx := context.Background()
	// PlatformMetadata, AddressStatus, Nodename, and LinkStatus: the node has
	// a public address, judged by the link that holds it
	const perLookup = 4

	f, err := p.Established(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if got := machine.Calls(); got != perLookup {
		t.Fatalf("first Established: %d requests to the machine, want %d", got, perLookup)
	}
	if len(interp.readings) != 1 {
		t.Fatalf("%d readings interpreted, want 1", len(interp.readings))
	}
	r := interp.readings[0]
	if got := fmt.Sprint(r.NodeIPs); got != "[10.93.9.9 fd00:93::1]" || r.Answered.String() != "fd00:93::1" || r.System != nil {
		t.Fatalf("reading: node IPs %s, answered %s, system %+v; want IPv4 first, the IPv6 address answering, no system information", got, r.Answered, r.System)
	}
	if got := fmt.Sprint(f.TalosAddresses); !strings.Contains(got, "2001:db8:93::1/64") || f.ReadAt.IsZero() {
		t.Fatalf("facts carry Talos addresses %s, read at %v", got, f.ReadAt)
	}

	again, err := p.Established(ctx, node)
	if err != nil || machine.Calls() != perLookup {
		t.Fatalf("second Established: %v, %d requests; want the remembered facts, no request", err, machine.Calls())
	}
	// what is remembered is the node's identity and addresses, nothing more
	want := &facts.Facts{Platform: f.Platform, ProviderID: f.ProviderID, Addresses: f.Addresses, TalosAddresses: f.TalosAddresses, ReadAt: f.ReadAt}
	if !reflect.DeepEqual(again, want) || len(f.Labels) == 0 {
		t.Fatalf("second Established: %+v; want the first lookup's identity and addresses only: %+v (the lookup's labels: %v)", again, want, f.Labels)
	}
	if _, err := p.Facts(ctx, node); err != nil || machine.Calls() != 2*perLookup {
		t.Fatalf("Facts: %v, %d requests; want a fresh lookup", err, machine.Calls())
	}
	p.Forget(node.Name)
	if _, err := p.Established(ctx, node); err != nil || machine.Calls() != 3*perLookup {
		t.Fatalf("Established after Forget: %v, %d requests; want a fresh lookup", err, machine.Calls())
	}

	// A lookup the Interpreter refuses establishes nothing.
	other := node.DeepCopy()
	other.Name = "rem-2"
	if _, err := ep.AddNode("rem-2", []string{"10.93.0.2"}, talosnode.Spec{
		Metadata: &runtime.PlatformMetadataSpec{Platform: "metal"}, Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.93.0.2/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	other.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr] = "10.93.0.2"
	interp.mu.Lock()
	interp.err = fmt.Errorf("%w: rule \"web\": template failed", facts.ErrRules)
	interp.mu.Unlock()
	if f, err := p.Established(ctx, other); !errors.Is(err, facts.ErrRules) || f != nil || !strings.Contains(err.Error(), "rem-2") {
		t.Fatalf("refused reading: %+v, %v; want ErrRules naming the node", f, err)
	}
	interp.mu.Lock()
	interp.err = nil
	interp.mu.Unlock()
	if f, err := p.Established(ctx, other); err != nil || f.Platform != "metal" {
		t.Fatalf("after the rules were fixed: %+v, %v; want a fresh lookup", f, err)
	}
}

// TestNodeIPsAreCheckedBeforeDialling: a node without an address, or whose
// kubelet lists more than one per family, gets an error that says so and
// costs no Talos request.
func TestNodeIPsAreCheckedBeforeDialling(t *testing.T) {
	ep := talosnode.StartFor(t)
	client := ep.ClientFor(t)
	p := newSource(client, facts.Options{})
	for _, tt := range []struct {
		ann  string // provided-node-ip
		want error  // sentinel
	}{
		{ann: "", want: facts.ErrNoNodeIP},
		{ann: "10.94.0.1,10.94.0.2", want: facts.ErrProvidedNodeIP},
		{ann: "not-an-ip", want: facts.ErrProvidedNodeIP},
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "nodial-1",
			Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: tt.ann}}}
		if _, err := p.Established(context.Background(), node); !errors.Is(err, tt.want) {
			t.Errorf("provided-node-ip %q: %v, want %v", tt.ann, err, tt.want)
		}
	}
	if n := ep.Requests(); n != 0 {
		t.Fatalf("%d Talos requests, want none", n)
	}
}

func TestReason(t *testing.T) {
	for _, tt := range []struct {
		err  error  // an error of a lookup, wrapped as the Source wraps it
		want string // event reason
	}{
		{fmt.Errorf("facts/Source.Facts: node a: %w at 10.0.0.1: refused", facts.ErrTalosAPI), facts.ReasonTalosAPIUnavailable},
		{fmt.Errorf("x: %w", facts.ErrMetadataIncomplete), facts.ReasonMetadataIncomplete},
		{fmt.Errorf("x: %w", facts.ErrNoNodeIP), facts.ReasonNoNodeIP},
		{fmt.Errorf("x: %w", facts.ErrRules), facts.ReasonTransformFailed},
		{fmt.Errorf("x: %w", facts.ErrIdentity), facts.ReasonIdentityMismatch},
		{fmt.Errorf("x: %w", facts.ErrProvidedNodeIP), facts.ReasonProvidedIPInvalid},
		{fmt.Errorf("x: %w", &facts.ProviderIDMismatchError{Registered: "a", Established: "b"}), facts.ReasonProviderIDMismatch},
		{context.Canceled, ""},
		{nil, ""},
	} {
		if got := facts.Reason(tt.err); got != tt.want {
			t.Errorf("Reason(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

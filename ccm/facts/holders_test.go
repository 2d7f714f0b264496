package facts_test

import (
	"context"
	"slices"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// TestHolders (security round three, hole 1): which nodes talos-ccm
// established an address for, as node-csr-approval asks it: the node while
// its facts are remembered, then, once forgotten (deleted), as departed for
// the hold; a name is compared in lower case, an IP in canonical form.
func TestHolders(t *testing.T) {
	ep := talosnode.StartFor(t)
	if _, err := ep.AddNode("hold-1", []string{"10.93.1.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "hold-1.example.com"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.93.1.1/24"}, {Link: "eth0", Prefix: "2001:db8:93::1/64"}},
	}); err != nil {
		t.Fatal(err)
	}
	src := facts.NewSource(ep.ClientFor(t), cloud.NewInterpreter(nil), facts.Options{})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hold-1",
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.93.1.1"}}}
	if src.Looked("hold-1") {
		t.Fatal("looked before any lookup")
	}
	if _, err := src.Established(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	if !src.Looked("hold-1") {
		t.Fatal("not looked after a lookup")
	}
	for _, addr := range []string{"10.93.1.1", "::ffff:10.93.1.1", "2001:DB8:93::1", "hold-1", "HOLD-1.example.com."} {
		if cur, dep := src.Holders(addr); !slices.Equal(cur, []string{"hold-1"}) || len(dep) > 0 {
			t.Errorf("%s: current %v, departed %v", addr, cur, dep)
		}
	}
	if cur, dep := src.Holders("10.93.1.2"); len(cur)+len(dep) > 0 {
		t.Errorf("an address of nobody: current %v, departed %v", cur, dep)
	}
	src.Forget("hold-1")
	if cur, dep := src.Holders("2001:db8:93::1"); len(cur) > 0 || !slices.Equal(dep, []string{"hold-1"}) {
		t.Errorf("forgotten: current %v, departed %v", cur, dep)
	}
	if src.Looked("hold-1") {
		t.Error("looked after it was forgotten")
	}
}

package talosnode

import (
	"context"
	"strings"
	"testing"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// listed collects what the COSI state server sends for a List.
type listed struct {
	grpc.ServerStream
	ctx  context.Context
	sent []*cosiv1alpha1.ListResponse
}

func (l *listed) Context() context.Context { return l.ctx }

func (l *listed) Send(m *cosiv1alpha1.ListResponse) error {
	l.sent = append(l.sent, m)
	return nil
}

// A node's resources are stored already encoded (create): the state server
// must answer exactly what it answers for the typed resource Talos holds,
// YAML spec included.
func TestStoredAnswersAreWhatTheServerEncodes(t *testing.T) {
	ctx := context.Background()
	md := runtime.NewPlatformMetadataSpec(runtime.NamespaceName, runtime.PlatformMetadataID)
	*md.TypedSpec() = runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "web-1", Region: "us-east-1", Zone: "us-east-1a",
		InstanceType: "m5.large", InstanceID: "i-1", ProviderID: "aws:///us-east-1a/i-1", Spot: true, Tags: map[string]string{"team": "a"}}
	addr, err := addressStatus(1, Address{Link: "eth0", Prefix: "10.0.0.5/24"})
	if err != nil {
		t.Fatal(err)
	}
	typed := state.WrapCore(namespaced.NewState(inmem.Build))
	stored := state.WrapCore(namespaced.NewState(inmem.Build))
	for _, r := range []resource.Resource{md, addr} {
		if err := typed.Create(ctx, r.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		if err := create(ctx, stored, r.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := stored.Get(ctx, md.Metadata()); err != nil {
		t.Fatal(err)
	} else if _, encoded := r.(*protobuf.Resource); !encoded {
		t.Fatalf("stored as %T, not encoded: the server would encode it on every request", r)
	}
	want, got := server.NewState(typed), server.NewState(stored)

	req := &cosiv1alpha1.GetRequest{Namespace: runtime.NamespaceName, Type: runtime.PlatformMetadataType, Id: runtime.PlatformMetadataID}
	w, err := want.Get(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	g, err := got.Get(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if w.Resource.GetSpec().GetYamlSpec() == "" || len(w.Resource.GetSpec().GetProtoSpec()) == 0 {
		t.Fatalf("the typed answer has no YAML or no protobuf spec: %v", w)
	}
	// the state stamps the creation time itself: the only field that differs
	w.Resource.Metadata.Created, g.Resource.Metadata.Created = nil, nil
	if !proto.Equal(w, g) {
		t.Errorf("Get: stored answer differs:\n got %v\nwant %v", g, w)
	}

	list := &cosiv1alpha1.ListRequest{Namespace: network.NamespaceName, Type: network.AddressStatusType}
	wl, gl := &listed{ctx: ctx}, &listed{ctx: ctx}
	if err := want.List(list, wl); err != nil {
		t.Fatal(err)
	}
	if err := got.List(list, gl); err != nil {
		t.Fatal(err)
	}
	for _, l := range append(wl.sent, gl.sent...) {
		l.Resource.Metadata.Created = nil
	}
	if len(wl.sent) != 1 || len(gl.sent) != len(wl.sent) || !proto.Equal(wl.sent[0], gl.sent[0]) {
		t.Errorf("List: stored answers differ:\n got %v\nwant %v", gl.sent, wl.sent)
	}
}

// SetMetadata replaces the node's PlatformMetadata, stored encoded too: the
// server answers the new spec.
func TestSetMetadataStoresEncoded(t *testing.T) {
	ctx := context.Background()
	n := &Node{Name: "web-1", state: state.WrapCore(namespaced.NewState(inmem.Build))}
	n.rpc = server.NewState(n.state)
	for _, host := range []string{"first", "second"} { // created, then updated
		if err := n.SetMetadata(ctx, runtime.PlatformMetadataSpec{Platform: "metal", Hostname: host}); err != nil {
			t.Fatal(err)
		}
		r, err := n.state.Get(ctx, runtime.NewPlatformMetadataSpec(runtime.NamespaceName, runtime.PlatformMetadataID).Metadata())
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := r.(*protobuf.Resource); !ok {
			t.Fatalf("stored as %T, not encoded", r)
		}
		a, err := n.rpc.Get(ctx, &cosiv1alpha1.GetRequest{Namespace: runtime.NamespaceName, Type: runtime.PlatformMetadataType, Id: runtime.PlatformMetadataID})
		if err != nil {
			t.Fatal(err)
		}
		if y := a.Resource.GetSpec().GetYamlSpec(); !strings.Contains(y, "hostname: "+host) {
			t.Errorf("after setting hostname %q the server answers %q", host, y)
		}
	}
}

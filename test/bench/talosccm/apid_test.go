package talosccm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hybrid-ccm/hybrid-ccm/test/benchproc"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// wire is one gRPC message as its bytes: the test compares answers byte for
// byte, never decoding them.
type wire struct{ b []byte }

type wireCodec struct{}

func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*wire).b)}, nil
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*wire).b = data.Materialize()
	return nil
}

// answer is what a caller gets back: the frames and the status.
type answer struct {
	frames  [][]byte
	code    codes.Code
	message string
}

func (a answer) equal(o answer) bool {
	if a.code != o.code || a.message != o.message || len(a.frames) != len(o.frames) {
		return false
	}
	for i := range a.frames {
		if !bytes.Equal(a.frames[i], o.frames[i]) {
			return false
		}
	}
	return true
}

// openRaw sends req to method for node over conn.
func openRaw(ctx context.Context, conn *grpc.ClientConn, method, node string, req proto.Message) (grpc.ClientStream, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	cs, err := conn.NewStream(metadata.NewOutgoingContext(ctx, metadata.Pairs("node", node)),
		&grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodecV2(wireCodec{}))
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(&wire{b}); err != nil {
		return nil, err
	}
	return cs, cs.CloseSend()
}

// readRaw reads cs until the call ends, or until until (given the last
// frame) says it has what it waits for.
func readRaw(cs grpc.ClientStream, until func(last []byte) bool) answer {
	var a answer
	for {
		var w wire
		if err := cs.RecvMsg(&w); err != nil {
			if !errors.Is(err, io.EOF) {
				st := status.Convert(err)
				a.code, a.message = st.Code(), st.Message()
			}
			return a
		}
		a.frames = append(a.frames, w.b)
		if until != nil && until(w.b) {
			return a
		}
	}
}

// TestApidProcessPassesThrough: the control planes' apid of the benchmark
// (apid/main.go, a process of its own) passes each request to the machine
// it names: what talos-ccm reads of a machine (Get, List) and a Watch
// stream come back as the machine answers them directly, byte for byte;
// the machines see every request through it as from an apid
// (os:impersonator); a caller without a Talos role is refused before
// anything is forwarded.
func TestApidProcessPassesThrough(t *testing.T) {
	bin := apid
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "apid")
		if err := benchproc.Build(testenv.RepoRoot(), bin, "./test/bench/talosccm/apid"); err != nil {
			t.Fatal(err)
		}
	}
	ep := talosnode.StartFor(t)
	for k := range 2 {
		if _, err := ep.AddNode(nodeName(0, k), []string{ipOf(k)}, machineSpec(nodeName(0, k), k)); err != nil {
			t.Fatal(err)
		}
	}
	creds, err := ep.ApidCredentials(net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	credsPath := filepath.Join(t.TempDir(), "apid-credentials.json")
	if err := creds.WriteFile(credsPath); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(t.TempDir(), "apid.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = log.Close() }()
	cp := startApid(t, bin, credsPath, ep.Addr(), []string{"127.0.0.1:0"}, log, "")
	stopped := false
	defer func() {
		if !stopped {
			cp.stop()
		}
	}()
	dial := func(role, addr string) *grpc.ClientConn {
		cfg, err := ep.ClientTLS(role)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	direct, hop := dial("os:reader", ep.Addr()), dial("os:reader", cp.addrs[0].String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	both := func(what, method, node string, req proto.Message) {
		t.Helper()
		var got [2]answer
		for i, conn := range []*grpc.ClientConn{direct, hop} {
			cs, err := openRaw(ctx, conn, method, node, req)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = readRaw(cs, nil)
		}
		if len(got[0].frames) == 0 && got[0].code == codes.OK {
			t.Fatalf("%s: the machine answered nothing", what)
		}
		if !got[1].equal(got[0]) {
			t.Fatalf("%s through the apid:\n%+v\nthe machine's own answer:\n%+v", what, got[1], got[0])
		}
	}
	node := nodeName(0, 1)
	both("Get PlatformMetadata", cosiv1alpha1.State_Get_FullMethodName, node, &cosiv1alpha1.GetRequest{Namespace: runtime.NamespaceName,
		Type: runtime.PlatformMetadataType, Id: runtime.PlatformMetadataID, Options: &cosiv1alpha1.GetOptions{}})
	both("Get SystemInformation (absent)", cosiv1alpha1.State_Get_FullMethodName, node, &cosiv1alpha1.GetRequest{Namespace: hardware.NamespaceName,
		Type: hardware.SystemInformationType, Id: hardware.SystemInformationID, Options: &cosiv1alpha1.GetOptions{}})
	both("List AddressStatuses", cosiv1alpha1.State_List_FullMethodName, node, &cosiv1alpha1.ListRequest{Namespace: network.NamespaceName,
		Type: network.AddressStatusType, Options: &cosiv1alpha1.ListOptions{}})
	both("List LinkStatuses", cosiv1alpha1.State_List_FullMethodName, node, &cosiv1alpha1.ListRequest{Namespace: network.NamespaceName,
		Type: network.LinkStatusType, Options: &cosiv1alpha1.ListOptions{}})
	both("Get of a machine nobody serves", cosiv1alpha1.State_Get_FullMethodName, "gone", &cosiv1alpha1.GetRequest{Namespace: runtime.NamespaceName,
		Type: runtime.PlatformMetadataType, Id: runtime.PlatformMetadataID, Options: &cosiv1alpha1.GetOptions{}})

	// A Watch directly and through the apid at once: the bootstrap (but its
	// end marker, which the machine dates when each watch starts), then an
	// address created on the machine.
	watch := &cosiv1alpha1.WatchRequest{Namespace: network.NamespaceName, Type: network.AddressStatusType, ApiVersion: 1,
		Options: &cosiv1alpha1.WatchOptions{BootstrapContents: true}}
	is := func(et cosiv1alpha1.EventType) func([]byte) bool {
		return func(last []byte) bool {
			var r cosiv1alpha1.WatchResponse
			if err := proto.Unmarshal(last, &r); err != nil {
				t.Error(err)
				return true
			}
			return len(r.Event) > 0 && r.Event[len(r.Event)-1].EventType == et
		}
	}
	var streams [2]grpc.ClientStream
	var bootstrapped, created [2]answer
	for i, conn := range []*grpc.ClientConn{direct, hop} {
		if streams[i], err = openRaw(ctx, conn, cosiv1alpha1.State_Watch_FullMethodName, node, watch); err != nil {
			t.Fatal(err)
		}
		bootstrapped[i] = readRaw(streams[i], is(cosiv1alpha1.EventType_BOOTSTRAPPED))
		if n := len(bootstrapped[i].frames); n < 3 {
			t.Fatalf("the watch's bootstrap is %d frames (%v %q), want the machine's addresses and the end", n, bootstrapped[i].code, bootstrapped[i].message)
		}
		bootstrapped[i].frames = bootstrapped[i].frames[:len(bootstrapped[i].frames)-1]
	}
	if !bootstrapped[1].equal(bootstrapped[0]) {
		t.Fatalf("a Watch's bootstrap through the apid:\n%+v\nthe machine's own:\n%+v", bootstrapped[1], bootstrapped[0])
	}
	as := network.NewAddressStatus(network.NamespaceName, network.AddressID("eth1", netip.MustParsePrefix("10.9.0.1/24")))
	as.TypedSpec().Address, as.TypedSpec().LinkName = netip.MustParsePrefix("10.9.0.1/24"), "eth1"
	if err := ep.Node(node).State().Create(ctx, as); err != nil {
		t.Fatal(err)
	}
	for i := range streams {
		created[i] = readRaw(streams[i], is(cosiv1alpha1.EventType_CREATED))
	}
	if len(created[0].frames) != 1 || !created[1].equal(created[0]) {
		t.Fatalf("a Watch's event through the apid:\n%+v\nthe machine's own:\n%+v", created[1], created[0])
	}
	const forwarded = 6 // five calls and the watch
	if got, all := ep.ViaApid(), ep.Requests(); got != forwarded || all != 2*forwarded {
		t.Fatalf("the machines received %d requests, %d from an apid (os:impersonator); want %d, %d", all, got, 2*forwarded, forwarded)
	}

	// Refused by the apid: the machines hear nothing of it.
	cs, err := openRaw(ctx, dial("os:nobody", cp.addrs[0].String()), cosiv1alpha1.State_Get_FullMethodName, node,
		&cosiv1alpha1.GetRequest{Namespace: runtime.NamespaceName, Type: runtime.PlatformMetadataType, Id: runtime.PlatformMetadataID})
	if err != nil {
		t.Fatal(err)
	}
	if a := readRaw(cs, nil); a.code != codes.PermissionDenied || len(a.frames) != 0 {
		t.Fatalf("a certificate without a Talos role: %v %q, %d frames; want PermissionDenied", a.code, a.message, len(a.frames))
	}
	if all := ep.Requests(); all != 2*forwarded {
		t.Fatalf("the machines received %d requests after a refused one, want %d", all, 2*forwarded)
	}
	cancel() // ends the watches
	stopped = true
	counts := cp.stop()
	if want := map[string]int64{cp.addrs[0].String(): forwarded}; !reflect.DeepEqual(counts, want) {
		t.Fatalf("the apid says it forwarded %v, want %v", counts, want)
	}
}

package talosccm

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/hybrid-ccm/hybrid-ccm/test/benchproc"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// sameAnswer is whether a and o are the same frames, byte for byte, and
// the same status (the headers are not compared: the apid process is
// another gRPC server than the endpoint).
func sameAnswer(a, o talosnode.RawAnswer) bool {
	return a.Code == o.Code && a.Message == o.Message && slices.EqualFunc(a.Frames, o.Frames, bytes.Equal)
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
	direct, hop := ep.DialFor(t, "os:reader", ep.Addr()), ep.DialFor(t, "os:reader", cp.addrs[0].String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	both := func(what, method, node string, req proto.Message) {
		t.Helper()
		var got [2]talosnode.RawAnswer
		for i, conn := range []*grpc.ClientConn{direct, hop} {
			cs, err := talosnode.RawCall{Conn: conn, Method: method, Node: node, Req: [][]byte{talosnode.Marshal(t, req)}}.Open(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = talosnode.ReadRaw(cs, nil)
		}
		if len(got[0].Frames) == 0 && got[0].Code == codes.OK {
			t.Fatalf("%s: the machine answered nothing", what)
		}
		if !sameAnswer(got[1], got[0]) {
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
	watch := talosnode.Marshal(t, &cosiv1alpha1.WatchRequest{Namespace: network.NamespaceName, Type: network.AddressStatusType, ApiVersion: 1,
		Options: &cosiv1alpha1.WatchOptions{BootstrapContents: true}})
	var streams [2]grpc.ClientStream
	var bootstrapped, created [2]talosnode.RawAnswer
	for i, conn := range []*grpc.ClientConn{direct, hop} {
		if streams[i], err = (talosnode.RawCall{Conn: conn, Method: cosiv1alpha1.State_Watch_FullMethodName, Node: node, Req: [][]byte{watch}}).Open(ctx); err != nil {
			t.Fatal(err)
		}
		bootstrapped[i] = talosnode.ReadRaw(streams[i], talosnode.LastEventIs(t, cosiv1alpha1.EventType_BOOTSTRAPPED))
		if n := len(bootstrapped[i].Frames); n < 3 {
			t.Fatalf("the watch's bootstrap is %d frames (%v %q), want the machine's addresses and the end", n, bootstrapped[i].Code, bootstrapped[i].Message)
		}
		bootstrapped[i].Frames = bootstrapped[i].Frames[:len(bootstrapped[i].Frames)-1]
	}
	if !sameAnswer(bootstrapped[1], bootstrapped[0]) {
		t.Fatalf("a Watch's bootstrap through the apid:\n%+v\nthe machine's own:\n%+v", bootstrapped[1], bootstrapped[0])
	}
	if err := ep.Node(node).CreateAddress(ctx, "eth1", netip.MustParsePrefix("10.9.0.1/24")); err != nil {
		t.Fatal(err)
	}
	for i := range streams {
		created[i] = talosnode.ReadRaw(streams[i], talosnode.LastEventIs(t, cosiv1alpha1.EventType_CREATED))
	}
	if len(created[0].Frames) != 1 || !sameAnswer(created[1], created[0]) {
		t.Fatalf("a Watch's event through the apid:\n%+v\nthe machine's own:\n%+v", created[1], created[0])
	}
	const forwarded = 6 // five calls and the watch
	if got, all := ep.ViaApid(), ep.Requests(); got != forwarded || all != 2*forwarded {
		t.Fatalf("the machines received %d requests, %d from an apid (os:impersonator); want %d, %d", all, got, 2*forwarded, forwarded)
	}

	// Refused by the apid: the machines hear nothing of it.
	cs, err := talosnode.RawCall{Conn: ep.DialFor(t, "os:nobody", cp.addrs[0].String()), Method: cosiv1alpha1.State_Get_FullMethodName, Node: node,
		Req: [][]byte{talosnode.Marshal(t, &cosiv1alpha1.GetRequest{Namespace: runtime.NamespaceName, Type: runtime.PlatformMetadataType, Id: runtime.PlatformMetadataID})}}.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a := talosnode.ReadRaw(cs, nil); a.Code != codes.PermissionDenied || len(a.Frames) != 0 {
		t.Fatalf("a certificate without a Talos role: %v %q, %d frames; want PermissionDenied", a.Code, a.Message, len(a.Frames))
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

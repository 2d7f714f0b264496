package talosnode_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// hops starts two machines, cp-1 and w-1, each its own apid (ServeMachine),
// and a control plane's apid of its own (Forwarder) in front of the
// endpoint; it returns the endpoint and where each path to w-1 starts.
func hops(t *testing.T) (ep *talosnode.Endpoint, paths map[string]string, f *talosnode.Forwarder) {
	ep = talosnode.StartFor(t)
	paths = map[string]string{"the endpoint": ep.Addr()}
	for i, name := range []string{"cp-1", "w-1"} {
		ip := "10.3.0." + string(rune('1'+i))
		md := runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name}
		if _, err := ep.AddNode(name, []string{ip}, talosnode.Spec{Metadata: &md,
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}, {Link: "external", Prefix: "198.51.100." + string(rune('1'+i)) + "/32"}}}); err != nil {
			t.Fatal(err)
		}
		paths[name+"'s apid"] = serveMachine(t, ep, name)
	}
	f, paths["a control plane's apid (Forwarder)"] = serveForwarder(t, apidCredentials(t, ep), ep.Addr())
	return ep, paths, f
}

// TestForwardedAnswerIsTheMachines: a request for w-1 answered by the
// endpoint itself, by w-1's own apid, passed through cp-1's apid, or passed
// through a control plane's apid of its own (Forwarder) gets the same
// answer, byte for byte: Get (found and not found), List, and a Watch
// stream with an event after it was bootstrapped.
func TestForwardedAnswerIsTheMachines(t *testing.T) {
	ep, paths, f := hops(t)
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range paths {
			if !yield(k) {
				return
			}
		}
	})
	conns := map[string]*grpc.ClientConn{}
	for _, p := range names {
		conns[p] = ep.DialFor(t, "os:reader", paths[p])
	}
	same := func(what string, answers map[string]talosnode.RawAnswer) {
		t.Helper()
		want := answers["the endpoint"]
		if len(want.Frames) == 0 && want.Code == codes.OK {
			t.Fatalf("%s: the endpoint answered nothing", what)
		}
		for _, p := range names {
			if got := answers[p]; !reflect.DeepEqual(got, want) {
				t.Errorf("%s through %s:\n%+v\nthe endpoint's own answer:\n%+v", what, p, got, want)
			}
		}
	}

	for _, c := range []struct {
		what, method string
		req          proto.Message
	}{
		{"Get PlatformMetadata", cosiv1alpha1.State_Get_FullMethodName, &cosiv1alpha1.GetRequest{Namespace: runtime.NamespaceName,
			Type: runtime.PlatformMetadataType, Id: runtime.PlatformMetadataID, Options: &cosiv1alpha1.GetOptions{}}},
		{"Get of a resource the machine does not have", cosiv1alpha1.State_Get_FullMethodName, &cosiv1alpha1.GetRequest{Namespace: runtime.NamespaceName,
			Type: runtime.PlatformMetadataType, Id: "nope", Options: &cosiv1alpha1.GetOptions{}}},
		{"List AddressStatuses", cosiv1alpha1.State_List_FullMethodName, &cosiv1alpha1.ListRequest{Namespace: network.NamespaceName,
			Type: network.AddressStatusType, Options: &cosiv1alpha1.ListOptions{}}},
	} {
		answers := map[string]talosnode.RawAnswer{}
		for _, p := range names {
			answers[p] = talosnode.RawCall{Conn: conns[p], Method: c.method, Node: "w-1", Req: [][]byte{talosnode.Marshal(t, c.req)}}.Do(t)
		}
		same(c.what, answers)
	}
	if got := ep.Node("w-1").Calls(); got != 3*int64(len(names)) {
		t.Fatalf("w-1's node served %d requests, want %d (each path, each request)", got, 3*len(names))
	}

	// A Watch on every path at once: the bootstrap, then one event.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watch := talosnode.Marshal(t, &cosiv1alpha1.WatchRequest{Namespace: network.NamespaceName, Type: network.AddressStatusType, ApiVersion: 1,
		Options: &cosiv1alpha1.WatchOptions{BootstrapContents: true}})
	streams := map[string]grpc.ClientStream{}
	for _, p := range names {
		cs, err := talosnode.RawCall{Conn: conns[p], Method: cosiv1alpha1.State_Watch_FullMethodName, Node: "w-1", Req: [][]byte{watch}}.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		streams[p] = cs
	}
	bootstrapped, created := map[string]talosnode.RawAnswer{}, map[string]talosnode.RawAnswer{}
	for _, p := range names {
		a := talosnode.ReadRaw(streams[p], talosnode.LastEventIs(t, cosiv1alpha1.EventType_BOOTSTRAPPED))
		// The end of the bootstrap is a marker the machine makes when the
		// watch starts (its metadata carries that time): each watch's
		// differs. Every frame before it is compared byte for byte.
		if len(a.Frames) > 0 {
			a.Frames = a.Frames[:len(a.Frames)-1]
		}
		bootstrapped[p] = a
	}
	same("Watch AddressStatuses, bootstrapped", bootstrapped)
	if n := len(bootstrapped["the endpoint"].Frames); n < 2 {
		t.Fatalf("the bootstrap of w-1's addresses is %d frames, want each address and the end", n)
	}
	if err := ep.Node("w-1").CreateAddress(ctx, "eth1", netip.MustParsePrefix("10.9.0.1/24")); err != nil {
		t.Fatal(err)
	}
	for _, p := range names {
		created[p] = talosnode.ReadRaw(streams[p], talosnode.LastEventIs(t, cosiv1alpha1.EventType_CREATED))
	}
	same("Watch AddressStatuses, an address created", created)
	if n := len(created["the endpoint"].Frames); n != 1 {
		t.Fatalf("the creation is %d frames, want 1", n)
	}

	if got := ep.Forwarded("cp-1"); got != 4 {
		t.Fatalf("cp-1's apid forwarded %d requests, want 4", got)
	}
	if got := f.Forwarded(); got != 4 {
		t.Fatalf("the Forwarder forwarded %d requests, want 4", got)
	}
	if got := ep.ViaApid(); got != 8 {
		t.Fatalf("the machines received %d requests from an apid (os:impersonator), want 8", got)
	}
}

// machineSeen is what a stand-in machine received of one request.
type machineSeen struct {
	method string
	orgs   []string
	md     metadata.MD
	frames [][]byte
}

// standIn is a machine's apid that answers every method with frames that
// are no protobuf message at all, with its own headers, trailers and
// status, and records what it received: a hop that decoded anything would
// fail on them.
type standIn struct {
	mu   sync.Mutex
	seen []machineSeen
}

var (
	notProtobuf = [][]byte{{0xff, 0xff, 0xff, 0xff}, {}, bytes.Repeat([]byte{0x0a, 0xfe}, 70000)}
	standInMD   = metadata.Pairs("x-machine", "w-9")
	standInTail = metadata.Pairs("x-machine-done", "yes")
)

func (s *standIn) handle(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	md, _ := metadata.FromIncomingContext(ss.Context())
	seen := machineSeen{method: method, md: md}
	if p, ok := peer.FromContext(ss.Context()); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			seen.orgs = ti.State.VerifiedChains[0][0].Subject.Organization
		}
	}
	for {
		var f talosnode.RawFrame
		err := ss.RecvMsg(&f)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		seen.frames = append(seen.frames, f.Bytes)
	}
	s.mu.Lock()
	s.seen = append(s.seen, seen)
	s.mu.Unlock()
	if err := ss.SendHeader(standInMD); err != nil {
		return err
	}
	for _, b := range notProtobuf {
		if err := ss.SendMsg(&talosnode.RawFrame{Bytes: b}); err != nil {
			return err
		}
	}
	ss.SetTrailer(standInTail)
	return status.Error(codes.DataLoss, "w-9: done, and this status is the machine's")
}

func (s *standIn) requests() []machineSeen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

// TestForwarderPassesFramesThrough: a control plane's apid passes a
// request's frames to the machine and the machine's frames, headers,
// trailers and status back as they were, without decoding them (neither is
// protobuf here, and the method is none it knows); the machine sees apid's
// own certificate (os:impersonator), the node and the caller's roles, those
// of the caller's certificate, not what the caller put in its metadata. A
// caller without a Talos role is refused before anything is forwarded.
func TestForwarderPassesFramesThrough(t *testing.T) {
	ep := talosnode.StartFor(t)
	creds := apidCredentials(t, ep)
	// the stand-in machine: a server certificate of the cluster's CA
	serverCert, err := tls.X509KeyPair(creds.ServerCert, creds.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(creds.CA)
	machine := &standIn{}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots, MinVersion: tls.VersionTLS13})),
		grpc.ForceServerCodecV2(talosnode.RawCodec{}), grpc.UnknownServiceHandler(machine.handle))
	mlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(mlis) }()
	t.Cleanup(srv.Stop)

	f, addr := serveForwarder(t, creds, mlis.Addr().String())

	request := [][]byte{{0xff, 0x00, 0xfe}, {}, bytes.Repeat([]byte{0x12}, 100000)}
	for _, method := range []string{cosiv1alpha1.State_Get_FullMethodName, cosiv1alpha1.State_Watch_FullMethodName, "/machine.MachineService/Version"} {
		before := len(machine.requests())
		got := talosnode.RawCall{Conn: ep.DialFor(t, "os:operator", addr), Method: method, Node: "w-9", Req: request,
			MD: metadata.Pairs("talos-role", "os:admin")}.Do(t)
		want := talosnode.RawAnswer{Header: standInMD, Trailer: standInTail, Frames: notProtobuf, Code: codes.DataLoss, Message: "w-9: done, and this status is the machine's"}
		// what the caller's gRPC adds
		delete(got.Header, "content-type")
		if !reflect.DeepEqual(got.Header, want.Header) || !reflect.DeepEqual(got.Trailer, want.Trailer) || got.Code != want.Code || got.Message != want.Message {
			t.Fatalf("%s: the caller got header %v, trailer %v, status %v %q; the machine sent %v, %v, %v %q",
				method, got.Header, got.Trailer, got.Code, got.Message, want.Header, want.Trailer, want.Code, want.Message)
		}
		if !slices.EqualFunc(got.Frames, want.Frames, bytes.Equal) {
			t.Fatalf("%s: the caller got %d frames, not the machine's %d frames as they were", method, len(got.Frames), len(want.Frames))
		}
		seen := machine.requests()
		if len(seen) != before+1 {
			t.Fatalf("%s: the machine received %d requests, want 1", method, len(seen)-before)
		}
		s := seen[len(seen)-1]
		if s.method != method || !slices.EqualFunc(s.frames, request, bytes.Equal) {
			t.Fatalf("the machine received %s with %d frames, not %s with the caller's %d frames as they were", s.method, len(s.frames), method, len(request))
		}
		if !slices.Equal(s.orgs, []string{"os:impersonator"}) {
			t.Fatalf("the second hop's client certificate has roles %v, want os:impersonator (apid's own)", s.orgs)
		}
		if !slices.Equal(s.md.Get("node"), []string{"w-9"}) || !slices.Equal(s.md.Get("talos-role"), []string{"os:operator"}) {
			t.Fatalf("the machine got node %v and roles %v, want w-9 and the caller's certificate's os:operator", s.md.Get("node"), s.md.Get("talos-role"))
		}
	}
	if got := f.Forwarded(); got != 3 {
		t.Fatalf("forwarded %d requests, want 3", got)
	}

	// Refused before any forward.
	got := talosnode.RawCall{Conn: ep.DialFor(t, "os:nobody", addr), Method: cosiv1alpha1.State_Get_FullMethodName, Node: "w-9",
		Req: request, MD: metadata.Pairs("talos-role", "os:admin")}.Do(t)
	if got.Code != codes.PermissionDenied || len(got.Frames) != 0 {
		t.Fatalf("a certificate without a Talos role: %v %q, %d frames; want PermissionDenied", got.Code, got.Message, len(got.Frames))
	}
	if n, fwd := len(machine.requests()), f.Forwarded(); n != 3 || fwd != 3 {
		t.Fatalf("after a refused request the machine received %d requests and the apid forwarded %d; want 3 and 3", n, fwd)
	}
}

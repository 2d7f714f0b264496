package talosnode

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A test's own raw gRPC client (and the codec of a test's stand-in server):
// it sends and reads frames as their bytes, never decoding them, to compare
// what each path to a machine answers byte for byte. It is the test's side,
// kept apart from passCodec, the apid's codec it checks.

// RawFrame is one gRPC message as its bytes.
type RawFrame struct{ Bytes []byte }

// RawCodec takes and gives *RawFrame as the bytes on the wire. Its name is
// protobuf's, so the other end sees an ordinary request
// (application/grpc+proto).
type RawCodec struct{}

func (RawCodec) Name() string { return "proto" }

func (RawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*RawFrame).Bytes)}, nil
}

func (RawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*RawFrame).Bytes = data.Materialize()
	return nil
}

// RawAnswer is everything a caller gets back for one request: the headers
// and trailers (nil if none), the frames, and the status.
type RawAnswer struct {
	Header, Trailer metadata.MD
	Frames          [][]byte
	Code            codes.Code
	Message         string
}

// RawCall is one request of the frames Req to Method for Node over Conn, with
// MD beside the node.
type RawCall struct {
	Conn   *grpc.ClientConn
	Method string
	Node   string
	Req    [][]byte
	MD     metadata.MD
}

// Open sends the call's frames and closes its sending side; ReadRaw reads
// the answer.
func (c RawCall) Open(ctx context.Context) (grpc.ClientStream, error) {
	md := metadata.Join(metadata.Pairs("node", c.Node), c.MD)
	cs, err := c.Conn.NewStream(metadata.NewOutgoingContext(ctx, md), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		c.Method, grpc.ForceCodecV2(RawCodec{}))
	if err != nil {
		return nil, err
	}
	for _, b := range c.Req {
		if err := cs.SendMsg(&RawFrame{b}); err != nil {
			return nil, err
		}
	}
	return cs, cs.CloseSend()
}

// Do makes the call (10 s at the most) and reads its whole answer.
func (c RawCall) Do(t T) RawAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ReadRaw(cs, nil)
}

// ReadRaw reads cs until the call ends, or until done (given the frames so
// far) says it has what it waits for (then the answer has no status, and the
// call goes on until its context ends).
func ReadRaw(cs grpc.ClientStream, done func(frames [][]byte) bool) RawAnswer {
	var a RawAnswer
	for {
		var f RawFrame
		err := cs.RecvMsg(&f)
		if a.Header == nil {
			a.Header, _ = cs.Header()
		}
		if err != nil {
			a.Trailer = cs.Trailer()
			if !errors.Is(err, io.EOF) {
				st := status.Convert(err)
				a.Code, a.Message = st.Code(), st.Message()
			}
			break
		}
		a.Frames = append(a.Frames, f.Bytes)
		if done != nil && done(a.Frames) {
			break
		}
	}
	if len(a.Header) == 0 {
		a.Header = nil
	}
	if len(a.Trailer) == 0 {
		a.Trailer = nil
	}
	return a
}

// LastEventIs is a done for ReadRaw on a Watch: the last frame's last event
// is of type et. A frame that is no WatchResponse fails the test (and ends
// the read).
func LastEventIs(t T, et cosiv1alpha1.EventType) func(frames [][]byte) bool {
	return func(frames [][]byte) bool {
		var r cosiv1alpha1.WatchResponse
		if err := proto.Unmarshal(frames[len(frames)-1], &r); err != nil {
			t.Error(err)
			return true
		}
		return len(r.Event) > 0 && r.Event[len(r.Event)-1].EventType == et
	}
}

// Marshal is m's protobuf encoding, a frame of a RawCall.
func Marshal(t T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// DialFor connects to the Talos API at addr with a client certificate of
// role (ClientTLS), closed when the test ends.
func (e *Endpoint) DialFor(t T, role, addr string) *grpc.ClientConn {
	t.Helper()
	cfg, err := e.ClientTLS(role)
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

// CreateAddress creates the AddressStatus of prefix on link among the
// node's resources (what a Watch of AddressStatuses then reports).
func (n *Node) CreateAddress(ctx context.Context, link string, prefix netip.Prefix) error {
	as := network.NewAddressStatus(network.NamespaceName, network.AddressID(link, prefix))
	as.TypedSpec().Address, as.TypedSpec().LinkName = prefix, link
	return n.State().Create(ctx, as)
}

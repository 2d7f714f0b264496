package talosnode

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// frame is one gRPC message as the bytes on the wire: what apid relays
// without knowing its type.
type frame struct {
	b []byte
}

// passCodec is the codec of an apid's streams, on the server and on the
// client side of a forwarded request: a *frame is taken and given as the
// bytes the other end framed, never decoded; any other message (what a
// machine answers for itself) is protobuf, gRPC's default codec. Its name is
// protobuf's, so the machines see an ordinary request
// (application/grpc+proto).
type passCodec struct{}

var protoCodec = encoding.GetCodecV2(gproto.Name)

func (passCodec) Name() string { return gproto.Name }

func (passCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
	}
	return protoCodec.Marshal(v)
}

func (passCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		// gRPC frees data when this returns: the frame keeps a copy.
		f.b = data.Materialize()
		return nil
	}
	return protoCodec.Unmarshal(data, v)
}

// passThrough relays a forwarded request: the caller's frames (ss) to the
// machine (cs) until the caller has sent all, and the machine's headers,
// frames and trailers back to the caller until the machine ends the call,
// whose status it returns as the machine gave it. cancel ends cs (the
// caller's stream failing ends the call).
func passThrough(ss grpc.ServerStream, cs grpc.ClientStream, cancel context.CancelFunc) error {
	callerErr := make(chan error, 1)
	go func() {
		for {
			var f frame
			err := ss.RecvMsg(&f)
			if errors.Is(err, io.EOF) {
				_ = cs.CloseSend()
				return
			}
			if err != nil {
				callerErr <- err
				cancel()
				return
			}
			if err := cs.SendMsg(&f); err != nil {
				// The call ended: its status comes from cs.RecvMsg.
				return
			}
		}
	}()
	for first := true; ; first = false {
		var f frame
		err := cs.RecvMsg(&f)
		if first {
			// the machine's headers go first, as it sent them (none when
			// it answered with a status only)
			if md, herr := cs.Header(); herr == nil && len(md) > 0 {
				if err := ss.SendHeader(md); err != nil {
					return err
				}
			}
		}
		if err != nil {
			ss.SetTrailer(cs.Trailer())
			select {
			case cerr := <-callerErr:
				return cerr
			default:
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
	}
}

package talos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Cause is why a Talos API request failed, from a fixed set (a metric label),
// in the terms a person acts on.
type Cause string

// The causes, most specific first (Classify tries them in this order).
const (
	// CausePermissionDenied: the endpoint refused the request for the role of
	// talos-ccm's certificate (the allowed roles of
	// kubernetesTalosAPIAccess).
	CausePermissionDenied Cause = "permission-denied"
	// CauseTLS: a certificate was not accepted: apid's by talos-ccm (a
	// talosconfig of another cluster, an expired CA) or talos-ccm's by apid,
	// or, behind the endpoint, one machine's by another.
	CauseTLS Cause = "tls"
	// CauseRefused: the connection was refused: nothing listens on port 50000
	// at that address, or a firewall rejects it.
	CauseRefused Cause = "refused"
	// CauseNoRoute: no route to the address (no KubeSpan peer, no routing
	// between the networks).
	CauseNoRoute Cause = "no-route"
	// CauseTimeout: no answer in time: a firewall drops the packets, the
	// address is not routed back, or the machine is down.
	CauseTimeout Cause = "timeout"
	// CauseNoEndpoint: there was no endpoint to dial: the Talos Service has
	// no ready endpoint, or its name does not resolve.
	CauseNoEndpoint Cause = "no-endpoint"
	// CauseOther: any other failure (the event carries the error).
	CauseOther Cause = "other"
)

// Causes are every Cause.
var Causes = []Cause{CausePermissionDenied, CauseTLS, CauseRefused, CauseNoRoute, CauseTimeout, CauseNoEndpoint, CauseOther}

// Hop says where on its way a failed request stopped. talos-ccm sends every
// request to a Talos API endpoint (a control plane's apid, usually through
// the Service talos.default), which forwards it to the node it names.
type Hop string

const (
	// HopEndpoint: talos-ccm got no connection to an endpoint, or the
	// endpoint refused the request itself (permission).
	HopEndpoint Hop = "endpoint"
	// HopNode: an endpoint took the request, the node did not answer
	// through it (apid's forwarding to the node's port 50000 failed).
	HopNode Hop = "node"
)

// Hops are every Hop.
var Hops = []Hop{HopEndpoint, HopNode}

// Port is the Talos API port every machine's apid listens on.
const Port = "50000"

// Failure is a failed Talos API request, classified.
type Failure struct {
	// Node is the address the request named (the node's address).
	Node string
	// Endpoint is the endpoint (host:port) that took the request; empty when
	// talos-ccm got no connection to one.
	Endpoint string
	Hop      Hop
	Cause    Cause
	// Err is the request's error as the client returned it.
	Err error
}

// CallError is the error of a Client request: the operation, the node
// address it named and the endpoint that took it ("" when none did).
type CallError struct {
	Op, Node, Endpoint string
	Err                error
}

func (e *CallError) Error() string { return fmt.Sprintf("%s: node %s: %v", e.Op, e.Node, e.Err) }

func (e *CallError) Unwrap() error { return e.Err }

// Classify tells why a request of Client failed. ok is false for an error
// that says nothing about reaching the node: none, a resource the node does
// not have (ErrNotFound), a request given up by its caller (canceled), or an
// error of no Client request.
func Classify(err error) (f Failure, ok bool) {
	var ce *CallError
	if err == nil || !errors.As(err, &ce) || errors.Is(ce.Err, ErrNotFound) || errors.Is(ce.Err, context.Canceled) {
		return Failure{}, false
	}
	code := status.Code(ce.Err)
	if code == codes.Canceled || code == codes.NotFound {
		return Failure{}, false
	}
	f = Failure{Node: ce.Node, Endpoint: ce.Endpoint, Err: ce.Err, Cause: cause(code, ce.Err)}
	f.Hop = HopEndpoint
	if ce.Endpoint != "" && f.Cause != CausePermissionDenied {
		// a connection to the endpoint was made: what failed lies beyond it
		f.Hop = HopNode
	}
	return f, true
}

func cause(code codes.Code, err error) Cause {
	msg := strings.ToLower(err.Error())
	has := func(s ...string) bool {
		for _, x := range s {
			if strings.Contains(msg, x) {
				return true
			}
		}
		return false
	}
	switch {
	case code == codes.PermissionDenied:
		return CausePermissionDenied
	case code == codes.Unauthenticated, has("x509:", "tls:", "authentication handshake failed", "certificate"):
		return CauseTLS
	case has("connection refused"):
		return CauseRefused
	case has("no route to host", "network is unreachable", "host is unreachable"):
		return CauseNoRoute
	case code == codes.DeadlineExceeded, errors.Is(err, context.DeadlineExceeded), has("i/o timeout", "deadline exceeded"):
		return CauseTimeout
	case errors.Is(err, ErrNoServiceEndpoints), has(strings.ToLower(ErrNoServiceEndpoints.Error()), "no such host", "produced zero addresses"):
		return CauseNoEndpoint
	}
	return CauseOther
}

// Describe says in words what f means: which connection failed and what to
// look at.
func (f Failure) Describe() string {
	node := hostPort(f.Node)
	via := "the Talos API endpoint"
	if f.Endpoint != "" {
		via = "the Talos API endpoint " + f.Endpoint
	}
	switch f.Hop {
	case HopNode:
		switch f.Cause {
		case CauseRefused:
			return fmt.Sprintf("%s (apid) could not forward to %s: connection refused (nothing listens on the node's Talos API port, or a firewall rejects the control planes)", via, node)
		case CauseNoRoute:
			return fmt.Sprintf("%s (apid) could not forward to %s: no route to it (the control planes need a path to every node's Talos API: KubeSpan or routing)", via, node)
		case CauseTimeout:
			return fmt.Sprintf("%s (apid) took the request, no answer came from %s in time (packets dropped on the way between the control planes and the node: firewall, KubeSpan or routing; or the node is down)", via, node)
		case CauseTLS:
			return fmt.Sprintf("%s (apid) could not forward to %s: a certificate was not accepted (the machine at that address belongs to another Talos cluster, or its certificates are not of this cluster's CA)", via, node)
		}
		return fmt.Sprintf("%s (apid) could not get an answer from %s", via, node)
	default:
		switch f.Cause {
		case CausePermissionDenied:
			return fmt.Sprintf("%s refused the request for %s: permission denied for the role of talos-ccm's certificate (allow os:reader in kubernetesTalosAPIAccess for talos-ccm's namespace)", via, node)
		case CauseTLS:
			return fmt.Sprintf("talos-ccm could not connect to %s for %s: a certificate was not accepted (the talosconfig's CA or client certificate is not this cluster's, or expired)", via, node)
		case CauseRefused:
			return fmt.Sprintf("talos-ccm could not connect to %s for %s: connection refused", via, node)
		case CauseNoRoute:
			return fmt.Sprintf("talos-ccm could not connect to %s for %s: no route to it", via, node)
		case CauseTimeout:
			return fmt.Sprintf("talos-ccm got no connection to %s for %s in time", via, node)
		case CauseNoEndpoint:
			return fmt.Sprintf("talos-ccm has no Talos API endpoint to reach %s through (the Service default/talos has no ready endpoint, or the endpoint's name does not resolve)", node)
		}
		return fmt.Sprintf("talos-ccm could not reach %s through %s", node, via)
	}
}

func hostPort(addr string) string {
	if strings.Contains(addr, ":") {
		return "[" + addr + "]:" + Port
	}
	return addr + ":" + Port
}

// peerKey carries a *peerRecord in a request's context: the interceptors
// write the address of the endpoint that took the request into it.
type peerKey struct{}

type peerRecord struct {
	mu   sync.Mutex
	addr string
}

func (p *peerRecord) set(addr string) {
	p.mu.Lock()
	p.addr = addr
	p.mu.Unlock()
}

func (p *peerRecord) get() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

func withPeerRecord(ctx context.Context) (context.Context, *peerRecord) {
	p := &peerRecord{}
	return context.WithValue(ctx, peerKey{}, p), p
}

// peerInterceptors record which endpoint took each request (none when the
// client got no connection): what tells a failure between talos-ccm and the
// endpoint from one between the endpoint and the node.
func peerInterceptors() []grpc.DialOption {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		rec, ok := ctx.Value(peerKey{}).(*peerRecord)
		if !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		// a unary call sets it before the invoker returns
		var p peer.Peer
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
		if p.Addr != nil {
			rec.set(p.Addr.String())
		}
		return err
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if rec, ok := ctx.Value(peerKey{}).(*peerRecord); ok && err == nil {
			// a stream that was created has its transport (and its peer)
			if p, ok := peer.FromContext(cs.Context()); ok && p.Addr != nil {
				rec.set(p.Addr.String())
			}
		}
		return cs, err
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)}
}

package talosnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// apid is one machine's apid, as Talos runs it on every machine: it checks
// the caller's certificate, then answers a request for its own machine
// itself and forwards a request naming another machine to that machine's
// apid, over a mutual-TLS connection of its own (its own certificate, role
// os:impersonator; the caller's roles and the node in the metadata), one
// connection per machine, kept for the machine's next requests.
//
// A forwarded request is passed through as apid proxies one-to-one
// requests: every request and answer frame is relayed as the bytes the other
// end sent (passCodec), never decoded and encoded again, whatever the
// service and method; headers, trailers and the status come back as the
// machine sent them. The machines' apids (ServeMachine) and the control
// planes' apid of the benchmark (Forwarder) are both this.
type apid struct {
	grpc *grpc.Server
	// own is apid's own client certificate (os:impersonator), roots the CA
	// the machines' certificates are checked against.
	own   tls.Certificate
	roots *x509.CertPool
	// received, if set, sees every request before anything is checked.
	received func(ctx context.Context)
	// route says where an authorized request for target goes.
	route func(ctx context.Context, target string) (hop, error)
	// local serves a request route answers here (ServeMachine); nil if
	// route never does.
	local cosiv1alpha1.StateServer

	mu    sync.Mutex
	conns map[hop]*grpc.ClientConn

	forwarded atomic.Int64
}

// hop is where a request goes: the node this apid answers for itself
// (local), or the apid at addr of the machine named machine.
type hop struct {
	local   *Node
	machine string
	addr    string
}

// newApid makes an apid serving with server's TLS configuration (which
// requires and verifies a client certificate).
func newApid(server *tls.Config, own tls.Certificate, roots *x509.CertPool) *apid {
	a := &apid{own: own, roots: roots, conns: map[hop]*grpc.ClientConn{}}
	a.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(server)),
		grpc.ForceServerCodecV2(passCodec{}),
		// No service is registered: every method reaches handle.
		grpc.UnknownServiceHandler(a.handle),
	)
	return a
}

// stop stops serving and closes the connections to the other machines.
func (a *apid) stop() {
	a.grpc.Stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.conns {
		_ = c.Close()
	}
	clear(a.conns)
}

// handle is every request: authorized first, then answered here or
// forwarded to the machine it names.
func (a *apid) handle(_ any, ss grpc.ServerStream) error {
	ctx := ss.Context()
	if a.received != nil {
		a.received(ctx)
	}
	roles, err := authorize(ctx)
	if err != nil {
		return err
	}
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "talosnode: no method")
	}
	target, err := targetOf(ctx)
	if err != nil {
		return err
	}
	h, err := a.route(ctx, target)
	if err != nil {
		return err
	}
	if h.local != nil {
		if a.local == nil {
			return status.Error(codes.Internal, "talosnode: this apid answers for no machine")
		}
		return serveLocal(a.local, &cosiv1alpha1.State_ServiceDesc, method, &routedStream{ServerStream: ss, ctx: context.WithValue(ctx, nodeKey{}, h.local)})
	}
	if impersonated(ctx) {
		// Another apid forwards only to the machine a request names: a
		// forwarded request is never forwarded again.
		return status.Errorf(codes.Internal, "talosnode: a forwarded request for %s reached another machine's apid", target)
	}
	conn, err := a.conn(h)
	if err != nil {
		return status.Errorf(codes.Unavailable, "talosnode: forward to %s at %s: %v", h.machine, h.addr, err)
	}
	a.forwarded.Add(1)
	md := metadata.Pairs("node", target)
	for _, r := range roles {
		md.Append(roleMetadata, r)
	}
	fctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	defer cancel()
	cs, err := conn.NewStream(fctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodecV2(passCodec{}))
	if err != nil {
		return err
	}
	return passThrough(ss, cs, cancel)
}

// conn is the connection to the machine h names, made on its first
// request: mutual TLS with apid's own certificate, checking the machine's
// for the address dialled.
func (a *apid) conn(h hop) (*grpc.ClientConn, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.conns[h]; c != nil {
		return c, nil
	}
	host, _, err := net.SplitHostPort(h.addr)
	if err != nil {
		return nil, err
	}
	c, err := grpc.NewClient(h.addr, grpc.WithSharedWriteBuffer(true), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{a.own}, RootCAs: a.roots, ServerName: host, MinVersion: tls.VersionTLS13,
	})))
	if err != nil {
		return nil, err
	}
	a.conns[h] = c
	return c, nil
}

// serveLocal answers a request with srv, the implementation of the service
// desc describes (the request is decoded here: this machine is its
// destination).
func serveLocal(srv any, desc *grpc.ServiceDesc, method string, ss grpc.ServerStream) error {
	prefix := "/" + desc.ServiceName + "/"
	if len(method) > len(prefix) && method[:len(prefix)] == prefix {
		name := method[len(prefix):]
		for _, m := range desc.Methods {
			if m.MethodName == name {
				resp, err := m.Handler(srv, ss.Context(), ss.RecvMsg, nil)
				if err != nil {
					return err
				}
				return ss.SendMsg(resp)
			}
		}
		for _, s := range desc.Streams {
			if s.StreamName == name {
				return s.Handler(srv, ss)
			}
		}
	}
	return status.Errorf(codes.Unimplemented, "unknown method %s", method)
}

// machine is one machine's apid serving its own listener (ServeMachine).
type machine struct {
	name string
	addr string // where its apid listens (host:port)
	apid *apid
}

// ServeMachine answers the Talos API on lis as the apid of the machine whose
// node is name (AddNode first): a request naming the machine (by name or
// address) is served from its node; a request naming another machine that
// serves its own apid is passed through to it over a second mutual-TLS
// connection, with this apid's own certificate (role os:impersonator) and the
// caller's roles in the request's metadata, as apid does (see apid). It
// returns when lis is closed or the endpoint stops.
func (e *Endpoint) ServeMachine(lis net.Listener, name string) error {
	if e.lookup(name) == nil {
		return fmt.Errorf("talosnode: machine %s: no such node (AddNode first)", name)
	}
	crt, key, err := e.pki.issue("apid", []string{impersonator}, false, nil, nil)
	if err != nil {
		return err
	}
	own, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(e.pki.caCert)
	m := &machine{name: name, addr: lis.Addr().String(), apid: newApid(e.tls, own, roots)}
	m.apid.local = &router{e: e}
	m.apid.received = func(ctx context.Context) {
		e.requests.Add(1)
		if impersonated(ctx) {
			e.viaApid.Add(1)
		}
	}
	m.apid.route = func(ctx context.Context, target string) (hop, error) {
		n := e.lookup(target)
		if n == nil {
			return hop{}, unreachable(target, "no such host")
		}
		if n.Name == m.name {
			if err := n.faults(ctx, target); err != nil {
				return hop{}, err
			}
			return hop{local: n}, nil
		}
		e.machineMu.Lock()
		to := e.machines[n.Name]
		e.machineMu.Unlock()
		if to == nil {
			return hop{}, unreachable(target, "connection refused")
		}
		return hop{machine: n.Name, addr: to.addr}, nil
	}
	e.machineMu.Lock()
	e.machines[name] = m
	e.machineMu.Unlock()
	return m.apid.grpc.Serve(lis)
}

// Forwarded counts the requests machine name's apid forwarded to another
// machine.
func (e *Endpoint) Forwarded(name string) int64 {
	e.machineMu.Lock()
	defer e.machineMu.Unlock()
	if m := e.machines[name]; m != nil {
		return m.apid.forwarded.Load()
	}
	return 0
}

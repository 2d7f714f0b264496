package talosnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// machine is one machine's apid: it answers for its own node and forwards a
// request naming another machine to that machine's apid, as Talos' apid on a
// control plane does for a talosconfig whose endpoint is the control planes
// (the Service talos.default).
type machine struct {
	e    *Endpoint
	name string
	addr string // where its apid listens (host:port)
	grpc *grpc.Server

	forwarded atomic.Int64
}

// ServeMachine answers the Talos API on lis as the apid of the machine whose
// node is name (AddNode first): a request naming the machine (by name or
// address) is served from its node; a request naming another machine that
// serves its own apid is forwarded there over a second mutual-TLS
// connection, with this apid's own certificate (role os:impersonator) and the
// caller's roles in the request's metadata, as apid does. It returns when
// lis is closed or the endpoint stops.
func (e *Endpoint) ServeMachine(lis net.Listener, name string) error {
	if e.lookup(name) == nil {
		return fmt.Errorf("talosnode: machine %s: no such node (AddNode first)", name)
	}
	m := &machine{e: e, name: name, addr: lis.Addr().String()}
	m.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(e.tls)),
		grpc.UnaryInterceptor(m.unary),
		grpc.StreamInterceptor(m.stream),
	)
	cosiv1alpha1.RegisterStateServer(m.grpc, &machineRouter{m: m})
	e.machineMu.Lock()
	e.machines[name] = m
	e.machineMu.Unlock()
	return m.grpc.Serve(lis)
}

// Forwarded counts the requests machine name's apid forwarded to another
// machine.
func (e *Endpoint) Forwarded(name string) int64 {
	e.machineMu.Lock()
	defer e.machineMu.Unlock()
	if m := e.machines[name]; m != nil {
		return m.forwarded.Load()
	}
	return 0
}

// forwardKey marks a request this apid forwards: the target machine's apid
// and what the request carries there.
type forwardKey struct{}

type forward struct {
	conn *grpc.ClientConn
	ctx  context.Context // outgoing: the node and the caller's roles
}

// decide authorizes a request and either routes it to the machine's own node
// (ctx carries nodeKey) or marks it for forwarding (forwardKey).
func (m *machine) decide(ctx context.Context) (context.Context, error) {
	m.e.requests.Add(1)
	roles, err := authorize(ctx)
	if err != nil {
		return nil, err
	}
	target, err := targetOf(ctx)
	if err != nil {
		return nil, err
	}
	n := m.e.lookup(target)
	if n == nil {
		return nil, unreachable(target, "no such host")
	}
	if n.Name == m.name {
		if err := n.faults(ctx, target); err != nil {
			return nil, err
		}
		return context.WithValue(ctx, nodeKey{}, n), nil
	}
	m.e.machineMu.Lock()
	to := m.e.machines[n.Name]
	m.e.machineMu.Unlock()
	if to == nil {
		return nil, unreachable(target, "connection refused")
	}
	conn, err := m.e.forwardConn(to.addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "talosnode: forward to %s: %v", to.addr, err)
	}
	m.forwarded.Add(1)
	md := metadata.Pairs("node", target)
	for _, r := range roles {
		md.Append(roleMetadata, r)
	}
	return context.WithValue(ctx, forwardKey{}, &forward{conn: conn, ctx: metadata.NewOutgoingContext(ctx, md)}), nil
}

func (m *machine) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := m.decide(ctx)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (m *machine) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := m.decide(ss.Context())
	if err != nil {
		return err
	}
	return handler(srv, &routedStream{ServerStream: ss, ctx: ctx})
}

// forwardConn is the connection apid keeps to another machine's apid: mutual
// TLS with its own certificate, checking the other's for its address.
func (e *Endpoint) forwardConn(addr string) (*grpc.ClientConn, error) {
	e.machineMu.Lock()
	defer e.machineMu.Unlock()
	if c := e.forwards[addr]; c != nil {
		return c, nil
	}
	crt, key, err := e.pki.issue("apid", []string{impersonator}, false, nil, nil)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(e.pki.caCert)
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS13,
	})))
	if err != nil {
		return nil, err
	}
	e.forwards[addr] = c
	return c, nil
}

// machineRouter serves the COSI State service of a machine's apid: its own
// node's state, or the answer of the machine it forwards to.
type machineRouter struct {
	cosiv1alpha1.UnimplementedStateServer
	m *machine
}

func forwardOf(ctx context.Context) *forward {
	f, _ := ctx.Value(forwardKey{}).(*forward)
	return f
}

func (r *machineRouter) Get(ctx context.Context, req *cosiv1alpha1.GetRequest) (*cosiv1alpha1.GetResponse, error) {
	if f := forwardOf(ctx); f != nil {
		return cosiv1alpha1.NewStateClient(f.conn).Get(f.ctx, req)
	}
	return (&router{e: r.m.e}).Get(ctx, req)
}

func (r *machineRouter) List(req *cosiv1alpha1.ListRequest, srv grpc.ServerStreamingServer[cosiv1alpha1.ListResponse]) error {
	if f := forwardOf(srv.Context()); f != nil {
		up, err := cosiv1alpha1.NewStateClient(f.conn).List(f.ctx, req)
		if err != nil {
			return err
		}
		return relay(up, srv)
	}
	return (&router{e: r.m.e}).List(req, srv)
}

func (r *machineRouter) Watch(req *cosiv1alpha1.WatchRequest, srv grpc.ServerStreamingServer[cosiv1alpha1.WatchResponse]) error {
	if f := forwardOf(srv.Context()); f != nil {
		up, err := cosiv1alpha1.NewStateClient(f.conn).Watch(f.ctx, req)
		if err != nil {
			return err
		}
		return relay(up, srv)
	}
	return (&router{e: r.m.e}).Watch(req, srv)
}

func (r *machineRouter) Create(ctx context.Context, req *cosiv1alpha1.CreateRequest) (*cosiv1alpha1.CreateResponse, error) {
	return (&router{e: r.m.e}).Create(ctx, req)
}

func (r *machineRouter) Update(ctx context.Context, req *cosiv1alpha1.UpdateRequest) (*cosiv1alpha1.UpdateResponse, error) {
	return (&router{e: r.m.e}).Update(ctx, req)
}

func (r *machineRouter) Destroy(ctx context.Context, req *cosiv1alpha1.DestroyRequest) (*cosiv1alpha1.DestroyResponse, error) {
	return (&router{e: r.m.e}).Destroy(ctx, req)
}

// relay copies a forwarded stream's answers to the caller until it ends.
func relay[T any](up grpc.ServerStreamingClient[T], down grpc.ServerStreamingServer[T]) error {
	for {
		msg, err := up.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := down.Send(msg); err != nil {
			return err
		}
	}
}

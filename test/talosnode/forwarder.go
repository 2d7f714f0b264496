package talosnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ApidCredentials are what a control plane's apid holds to serve the Talos
// API and to forward requests to other machines: the cluster's CA (clients'
// and machines' certificates are checked against it), a server certificate
// for the Talos Service's names (talos.default) and the machine's addresses,
// and its own client certificate of role os:impersonator. A Forwarder in
// another process is started from them (WriteFile, ReadApidCredentials).
type ApidCredentials struct {
	CA         []byte `json:"ca"`
	ServerCert []byte `json:"serverCert"`
	ServerKey  []byte `json:"serverKey"`
	ClientCert []byte `json:"clientCert"`
	ClientKey  []byte `json:"clientKey"`
}

// ApidCredentials issues a control plane's apid credentials from the
// endpoint's CA, its server certificate valid for ips and the Talos
// Service's names.
func (e *Endpoint) ApidCredentials(ips ...net.IP) (*ApidCredentials, error) {
	sc, sk, err := e.pki.issue("talos-sim-apid", nil, true, ips, append([]string{"localhost"}, ServiceNames...))
	if err != nil {
		return nil, err
	}
	cc, ck, err := e.pki.issue("apid", []string{impersonator}, false, nil, nil)
	if err != nil {
		return nil, err
	}
	return &ApidCredentials{CA: e.pki.CAPEM, ServerCert: sc, ServerKey: sk, ClientCert: cc, ClientKey: ck}, nil
}

// WriteFile writes the credentials to path (mode 0600).
func (c *ApidCredentials) WriteFile(path string) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// ReadApidCredentials reads what WriteFile wrote.
func ReadApidCredentials(path string) (*ApidCredentials, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c ApidCredentials
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("talosnode: apid credentials %s: %w", path, err)
	}
	return &c, nil
}

// Forwarder is a control-plane machine's apid that forwards every request to
// the machine its "node" metadata names, as apid on a control plane does for
// a client whose talosconfig endpoint is the Talos Service (talos.default):
// it checks the caller's certificate (a Talos role), opens a mutual-TLS
// connection of its own to that machine's apid (os:impersonator, the
// caller's roles in the request's metadata) and keeps it for the machine's
// next requests, one connection per machine as apid keeps one backend per
// target. The machines' apids are the simulated endpoint's (Endpoint.Addr),
// which answers for every simulated node: each machine is still reached over
// a connection and a TLS handshake of its own. It does not need the Endpoint
// in its process (cmd-style use: test/bench/talosccm/apid).
type Forwarder struct {
	nodes  string // the machines' apid address (host:port)
	client credentials.TransportCredentials
	grpc   *grpc.Server

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // by the machine the request names

	forwarded atomic.Int64
}

// NewForwarder makes an apid with creds that forwards every request to the
// apid at nodes.
func NewForwarder(creds *ApidCredentials, nodes string) (*Forwarder, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(creds.CA) {
		return nil, fmt.Errorf("talosnode: forwarder: no CA certificate")
	}
	server, err := tls.X509KeyPair(creds.ServerCert, creds.ServerKey)
	if err != nil {
		return nil, fmt.Errorf("talosnode: forwarder: server certificate: %w", err)
	}
	client, err := tls.X509KeyPair(creds.ClientCert, creds.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("talosnode: forwarder: client certificate: %w", err)
	}
	host, _, err := net.SplitHostPort(nodes)
	if err != nil {
		return nil, fmt.Errorf("talosnode: forwarder: %w", err)
	}
	f := &Forwarder{nodes: nodes, conns: map[string]*grpc.ClientConn{},
		client: credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{client}, RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS13})}
	f.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs: pool, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}})),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			ctx, err := f.decide(ctx)
			if err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			ctx, err := f.decide(ss.Context())
			if err != nil {
				return err
			}
			return handler(srv, &routedStream{ServerStream: ss, ctx: ctx})
		}),
	)
	cosiv1alpha1.RegisterStateServer(f.grpc, &forwardingRouter{local: refuseLocal{}})
	return f, nil
}

// Serve answers on lis until it is closed or Stop.
func (f *Forwarder) Serve(lis net.Listener) error { return f.grpc.Serve(lis) }

// Forwarded counts the requests forwarded to a machine.
func (f *Forwarder) Forwarded() int64 { return f.forwarded.Load() }

// Stop stops serving and closes the connections to the machines.
func (f *Forwarder) Stop() {
	f.grpc.Stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
}

func (f *Forwarder) decide(ctx context.Context) (context.Context, error) {
	roles, err := authorize(ctx)
	if err != nil {
		return nil, err
	}
	target, err := targetOf(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := f.conn(target)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "talosnode: forward to %s: %v", target, err)
	}
	f.forwarded.Add(1)
	md := metadata.Pairs("node", target)
	for _, r := range roles {
		md.Append(roleMetadata, r)
	}
	return context.WithValue(ctx, forwardKey{}, &forward{conn: conn, ctx: metadata.NewOutgoingContext(ctx, md)}), nil
}

// conn is the connection to the machine target's apid, made on its first
// request.
func (f *Forwarder) conn(target string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.conns[target]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(f.nodes, grpc.WithTransportCredentials(f.client), grpc.WithSharedWriteBuffer(true))
	if err != nil {
		return nil, err
	}
	f.conns[target] = c
	return c, nil
}

// refuseLocal is a Forwarder's own state: it answers for no node itself.
type refuseLocal struct {
	cosiv1alpha1.UnimplementedStateServer
}

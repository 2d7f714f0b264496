// Package talosnode simulates Talos nodes for tests and the demo with the real
// protocol: one gRPC endpoint on loopback, protected by mutual TLS like apid,
// serving the COSI resource API (cosi-project runtime's state server over
// in-memory state). Like apid on a control-plane node it routes each request to
// the node named in the request's "node" metadata (what the machinery client's
// WithNode sets), so simulated nodes can have any IP address.
//
// Each node holds runtime/PlatformMetadata, network/AddressStatus and
// hardware/SystemInformation resources (and anything else a test adds through
// Node.State). Faults can be injected per node: latency, errors, unreachable,
// and requests held in flight until the test releases them. The resources it
// creates are stored encoded, so the state server sends the same bytes without
// encoding them on every request: the simulated nodes' own work stays off the
// cores a benchmark measures.
//
// This package never implements talos-ccm logic; it is the outside world.
package talosnode

import (
	"context"
	"crypto/tls"
	stdx509 "crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/crypto/x509"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

// Roles accepted in client certificates (Organization), as Talos RBAC does.
var allowedRoles = map[string]bool{"os:reader": true, "os:operator": true, "os:admin": true}

// Endpoint is one simulated apid endpoint in front of many simulated nodes.
type Endpoint struct {
	pki      *PKI
	tls      *tls.Config
	listener net.Listener
	grpc     *grpc.Server

	// machines: the apid of each machine that serves its own listener
	// (ServeMachine).
	machineMu sync.Mutex
	machines  map[string]*machine

	mu    sync.RWMutex
	nodes map[string]*Node // by every address and by name

	requests, viaApid atomic.Int64
}

// Node is one simulated Talos node.
type Node struct {
	Name  string
	IPs   []string
	state state.State
	rpc   *server.State

	mu          sync.Mutex
	latency     time.Duration
	err         error
	unreachable bool
	blackhole   bool
	gate        chan struct{} // non-nil while held

	calls atomic.Int64
	held  atomic.Int64
}

// Start starts an endpoint on 127.0.0.1 with a freshly generated CA.
func Start() (*Endpoint, error) {
	pki, err := newPKI()
	if err != nil {
		return nil, fmt.Errorf("talosnode: generate CA: %w", err)
	}
	tlsCfg, err := pki.serverTLS()
	if err != nil {
		return nil, fmt.Errorf("talosnode: server certificate: %w", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("talosnode: listen: %w", err)
	}
	e := &Endpoint{pki: pki, tls: tlsCfg, listener: lis, nodes: map[string]*Node{}, machines: map[string]*machine{}}
	e.grpc = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.UnaryInterceptor(e.unary),
		grpc.StreamInterceptor(e.stream),
	)
	cosiv1alpha1.RegisterStateServer(e.grpc, &router{e: e})
	go func() { _ = e.grpc.Serve(lis) }()
	return e, nil
}

// Serve answers on another listener too (a node's own address, port 50000,
// with a server certificate for that address), until Stop or until the
// listener is closed.
func (e *Endpoint) Serve(lis net.Listener) {
	_ = e.grpc.Serve(lis)
}

// Addr is the endpoint address (host:port), what a talosconfig lists as endpoint.
func (e *Endpoint) Addr() string { return e.listener.Addr().String() }

// Requests counts every request the endpoint received.
func (e *Endpoint) Requests() int64 { return e.requests.Load() }

// ViaApid counts the requests the endpoint received from another machine's
// apid forwarding them (a client certificate of role os:impersonator), on
// its own listener (Forwarder) or a machine's (ServeMachine).
func (e *Endpoint) ViaApid() int64 { return e.viaApid.Load() }

// Stop stops the endpoint and every machine's apid.
func (e *Endpoint) Stop() {
	e.grpc.Stop()
	e.machineMu.Lock()
	defer e.machineMu.Unlock()
	for _, m := range e.machines {
		m.apid.stop()
	}
}

// ClientConfig returns a talosconfig with a client certificate of the given role
// (os:reader if empty), pointing at this endpoint.
func (e *Endpoint) ClientConfig(role string) (*clientconfig.Config, error) {
	crt, key, err := e.clientCert(role)
	if err != nil {
		return nil, err
	}
	return clientconfig.NewConfig("sim", []string{e.Addr()}, e.pki.CAPEM,
		&x509.PEMEncodedCertificateAndKey{Crt: crt, Key: key}), nil
}

// clientCert issues a client certificate (PEM) of the given role (os:reader
// if empty).
func (e *Endpoint) clientCert(role string) (crt, key []byte, err error) {
	if role == "" {
		role = "os:reader"
	}
	return e.pki.issue("talos-ccm", []string{role}, false, nil, nil)
}

// ClientTLS is a client's TLS configuration with a certificate of the given
// role (os:reader if empty), trusting the endpoint's CA: for a test that
// dials the Talos API itself rather than through talos-ccm's client.
func (e *Endpoint) ClientTLS(role string) (*tls.Config, error) {
	crt, key, err := e.clientCert(role)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return nil, err
	}
	roots := stdx509.NewCertPool()
	roots.AddCert(e.pki.caCert)
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS13}, nil
}

// WriteClientConfig writes ClientConfig(role) to path; endpoints, when given,
// replace the endpoint's own address in the talosconfig's context.
func (e *Endpoint) WriteClientConfig(path, role string, endpoints ...string) error {
	cfg, err := e.ClientConfig(role)
	if err != nil {
		return err
	}
	if len(endpoints) > 0 {
		cfg.Contexts[cfg.Context].Endpoints = endpoints
	}
	b, err := cfg.Bytes()
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// NewClient writes an os:reader talosconfig into dir and returns talos-ccm's
// Talos client for it (opts.ConfigPath is set here). The caller closes it.
func (e *Endpoint) NewClient(dir string, opts talos.Options) (*talos.Client, error) {
	opts.ConfigPath = filepath.Join(dir, "talosconfig")
	if err := e.WriteClientConfig(opts.ConfigPath, "os:reader"); err != nil {
		return nil, err
	}
	return talos.New(context.Background(), opts)
}

// AddNode creates a simulated node reachable under its name and every IP in ips
// and fills its resources from spec.
func (e *Endpoint) AddNode(name string, ips []string, spec Spec) (*Node, error) {
	st := state.WrapCore(namespaced.NewState(inmem.Build))
	n := &Node{Name: name, IPs: ips, state: st, rpc: server.NewState(st)}
	if err := spec.apply(context.Background(), st, name); err != nil {
		return nil, fmt.Errorf("talosnode: node %s: %w", name, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range append([]string{name}, ips...) {
		if _, dup := e.nodes[k]; dup {
			return nil, fmt.Errorf("talosnode: %q already routes to a node", k)
		}
	}
	for _, k := range append([]string{name}, ips...) {
		e.nodes[k] = n
	}
	return n, nil
}

// RemoveNode makes the node unknown to the endpoint (requests fail like for a
// machine that is gone).
func (e *Endpoint) RemoveNode(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.nodes[name]
	if n == nil {
		return
	}
	for _, k := range append([]string{n.Name}, n.IPs...) {
		delete(e.nodes, k)
	}
}

// Node returns the node routed under key (name or IP).
func (e *Endpoint) Node(key string) *Node {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.nodes[key]
}

// State is the node's COSI state; tests may add or change any resource.
func (n *Node) State() state.State { return n.state }

// Calls counts requests routed to this node.
func (n *Node) Calls() int64 { return n.calls.Load() }

// SetLatency delays every request to this node.
func (n *Node) SetLatency(d time.Duration) { n.mu.Lock(); n.latency = d; n.mu.Unlock() }

// SetError makes every request to this node fail with err (a gRPC status error
// is passed through as is).
func (n *Node) SetError(err error) { n.mu.Lock(); n.err = err; n.mu.Unlock() }

// SetUnreachable makes requests fail as apid reports a node it cannot dial.
// With blackhole the request hangs until the caller's deadline instead.
func (n *Node) SetUnreachable(unreachable, blackhole bool) {
	n.mu.Lock()
	n.unreachable, n.blackhole = unreachable, blackhole
	n.mu.Unlock()
}

// Hold makes every request to this node wait, in flight, until Release (or the
// caller's deadline): a machine that accepted the connection and never answers,
// under the test's control. Held counts the requests waiting.
func (n *Node) Hold() {
	n.mu.Lock()
	if n.gate == nil {
		n.gate = make(chan struct{})
	}
	n.mu.Unlock()
}

// Release lets held requests (and later ones) through.
func (n *Node) Release() {
	n.mu.Lock()
	if n.gate != nil {
		close(n.gate)
		n.gate = nil
	}
	n.mu.Unlock()
}

// Held is the number of requests to this node currently waiting on Hold.
func (n *Node) Held() int64 { return n.held.Load() }

// route resolves the target node and applies its faults.
func (e *Endpoint) route(ctx context.Context) (*Node, error) {
	e.requests.Add(1)
	if _, err := authorize(ctx); err != nil {
		return nil, err
	}
	if impersonated(ctx) {
		e.viaApid.Add(1)
	}
	target, err := targetOf(ctx)
	if err != nil {
		return nil, err
	}
	n := e.lookup(target)
	if n == nil {
		return nil, unreachable(target, "connection refused")
	}
	return n, n.faults(ctx, target)
}

// targetOf is the one node a request names (the "node" metadata WithNode
// sets).
func targetOf(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get("nodes")) > 0 {
		return "", status.Error(codes.InvalidArgument, "talosnode: one-to-many requests (nodes metadata) are not supported by the COSI API")
	}
	targets := md.Get("node")
	if len(targets) != 1 {
		return "", status.Error(codes.InvalidArgument, "talosnode: request must name exactly one node (WithNode)")
	}
	return targets[0], nil
}

func (e *Endpoint) lookup(key string) *Node {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.nodes[key]
}

// unreachable is apid's answer for a node it cannot dial.
func unreachable(target, why string) error {
	return status.Errorf(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp %s: connect: %s\"", net.JoinHostPort(target, "50000"), why)
}

// faults counts the request and applies the node's injected faults.
func (n *Node) faults(ctx context.Context, target string) error {
	n.calls.Add(1)
	n.mu.Lock()
	latency, ferr, unreach, blackhole, gate := n.latency, n.err, n.unreachable, n.blackhole, n.gate
	n.mu.Unlock()
	if gate != nil {
		n.held.Add(1)
		select {
		case <-ctx.Done():
			n.held.Add(-1)
			return status.FromContextError(ctx.Err()).Err()
		case <-gate:
			n.held.Add(-1)
		}
	}
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
	switch {
	case blackhole:
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	case unreach:
		return unreachable(target, "no route to host")
	case ferr != nil:
		if _, ok := status.FromError(ferr); ok {
			return ferr
		}
		return status.Error(codes.Internal, ferr.Error())
	}
	return nil
}

// impersonator is the role of apid's own certificate when it forwards a
// request to another machine; the caller's roles travel in roleMetadata.
const (
	impersonator = "os:impersonator"
	roleMetadata = "talos-role"
)

// impersonated reports whether the (authorized) caller is an apid
// forwarding a request.
func impersonated(ctx context.Context) bool {
	p, _ := peer.FromContext(ctx)
	if p == nil {
		return false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	return ok && len(ti.State.VerifiedChains) > 0 && slices.Contains(ti.State.VerifiedChains[0][0].Subject.Organization, impersonator)
}

// authorize checks the verified client certificate carries a Talos role (or
// is an apid forwarding for a caller who has one) and returns the roles.
func authorize(ctx context.Context) ([]string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "talosnode: no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 {
		return nil, status.Error(codes.Unauthenticated, "talosnode: client certificate required")
	}
	roles := ti.State.VerifiedChains[0][0].Subject.Organization
	if slices.Contains(roles, impersonator) {
		md, _ := metadata.FromIncomingContext(ctx)
		roles = md.Get(roleMetadata)
	}
	for _, o := range roles {
		if allowedRoles[o] {
			return roles, nil
		}
	}
	return nil, status.Errorf(codes.PermissionDenied, "talosnode: certificate roles %v are not allowed", strings.Join(roles, ","))
}

type nodeKey struct{}

func (e *Endpoint) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	n, err := e.route(ctx)
	if err != nil {
		return nil, err
	}
	return handler(context.WithValue(ctx, nodeKey{}, n), req)
}

func (e *Endpoint) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	n, err := e.route(ss.Context())
	if err != nil {
		return err
	}
	return handler(srv, &routedStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), nodeKey{}, n)})
}

type routedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *routedStream) Context() context.Context { return s.ctx }

var errNoNode = errors.New("talosnode: request was not routed")

func nodeFrom(ctx context.Context) (*Node, error) {
	n, ok := ctx.Value(nodeKey{}).(*Node)
	if !ok {
		return nil, status.Error(codes.Internal, errNoNode.Error())
	}
	return n, nil
}

// router dispatches the COSI State service to the routed node's state server.
type router struct {
	cosiv1alpha1.UnimplementedStateServer
	e *Endpoint
}

func (r *router) Get(ctx context.Context, req *cosiv1alpha1.GetRequest) (*cosiv1alpha1.GetResponse, error) {
	n, err := nodeFrom(ctx)
	if err != nil {
		return nil, err
	}
	return n.rpc.Get(ctx, req)
}

func (r *router) List(req *cosiv1alpha1.ListRequest, srv grpc.ServerStreamingServer[cosiv1alpha1.ListResponse]) error {
	n, err := nodeFrom(srv.Context())
	if err != nil {
		return err
	}
	return n.rpc.List(req, srv)
}

func (r *router) Watch(req *cosiv1alpha1.WatchRequest, srv grpc.ServerStreamingServer[cosiv1alpha1.WatchResponse]) error {
	n, err := nodeFrom(srv.Context())
	if err != nil {
		return err
	}
	return n.rpc.Watch(req, srv)
}

// Create, Update and Destroy are refused: talos-ccm only reads, and an os:reader
// certificate could not write on a real node either.
func (r *router) Create(context.Context, *cosiv1alpha1.CreateRequest) (*cosiv1alpha1.CreateResponse, error) {
	return nil, status.Error(codes.PermissionDenied, "talosnode: resources are read-only through the API")
}

func (r *router) Update(context.Context, *cosiv1alpha1.UpdateRequest) (*cosiv1alpha1.UpdateResponse, error) {
	return nil, status.Error(codes.PermissionDenied, "talosnode: resources are read-only through the API")
}

func (r *router) Destroy(context.Context, *cosiv1alpha1.DestroyRequest) (*cosiv1alpha1.DestroyResponse, error) {
	return nil, status.Error(codes.PermissionDenied, "talosnode: resources are read-only through the API")
}

// T is what this package's helpers (StartFor, ClientFor, ...) need of a test
// (a *testing.T or B): this package is linked into the demo, which must not
// link package testing.
type T interface {
	Helper()
	Error(args ...any)
	Fatal(args ...any)
	Cleanup(func())
	TempDir() string
}

// StartFor starts an endpoint for a test and stops it when the test ends.
func StartFor(t T) *Endpoint {
	t.Helper()
	e, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

// ClientFor returns talos-ccm's Talos client of the endpoint (os:reader, 5 s
// timeout), closed when the test ends.
func (e *Endpoint) ClientFor(t T) *talos.Client {
	t.Helper()
	return e.ClientAs(t, "os:reader")
}

// ClientAs is ClientFor with a client certificate of role, its talosconfig
// naming endpoints in place of the endpoint's own address (WriteClientConfig).
func (e *Endpoint) ClientAs(t T, role string, endpoints ...string) *talos.Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "talosconfig")
	if err := e.WriteClientConfig(path, role, endpoints...); err != nil {
		t.Fatal(err)
	}
	c, err := talos.New(context.Background(), talos.Options{ConfigPath: path, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

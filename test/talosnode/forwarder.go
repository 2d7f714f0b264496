package talosnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
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
// the same apid as a machine's (ServeMachine; see apid), answering for no
// machine itself. It checks the caller's certificate (a Talos role), then
// passes the request through, frames undecoded, over a mutual-TLS connection
// of its own to that machine's apid (os:impersonator, the caller's roles in
// the request's metadata), kept for the machine's next requests: one
// connection per machine, as apid keeps one backend per target. The
// machines' apids are the simulated endpoint's (Endpoint.Addr), which
// answers for every simulated node: each machine is still reached over a
// connection and a TLS handshake of its own. It does not need the Endpoint
// in its process (cmd-style use: test/bench/talosccm/apid).
type Forwarder struct {
	apid *apid
}

// NewForwarder makes an apid with creds that forwards every request to the
// apid at nodes.
func NewForwarder(creds *ApidCredentials, nodes string) (*Forwarder, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(creds.CA) {
		return nil, fmt.Errorf("talosnode: forwarder: no CA certificate")
	}
	server, err := tls.X509KeyPair(creds.ServerCert, creds.ServerKey)
	if err != nil {
		return nil, fmt.Errorf("talosnode: forwarder: server certificate: %w", err)
	}
	own, err := tls.X509KeyPair(creds.ClientCert, creds.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("talosnode: forwarder: client certificate: %w", err)
	}
	if _, _, err := net.SplitHostPort(nodes); err != nil {
		return nil, fmt.Errorf("talosnode: forwarder: %w", err)
	}
	a := newApid(&tls.Config{Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: roots, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}, own, roots)
	// Every machine is behind the endpoint's address: a request for a
	// machine it does not know is answered there (connection refused).
	a.route = func(_ context.Context, target string) (hop, error) {
		return hop{machine: target, addr: nodes}, nil
	}
	return &Forwarder{apid: a}, nil
}

// Serve answers on lis until it is closed or Stop.
func (f *Forwarder) Serve(lis net.Listener) error { return f.apid.grpc.Serve(lis) }

// Forwarded counts the requests forwarded to a machine.
func (f *Forwarder) Forwarded() int64 { return f.apid.forwarded.Load() }

// Stop stops serving and closes the connections to the machines.
func (f *Forwarder) Stop() { f.apid.stop() }

// Package registry gives a real test cluster its images the way users get
// them: from an OCI distribution registry over HTTPS, pulled by containerd.
//
// It owns the registry a test (or `hybridctl demo`) runs in-process
// (go-containerregistry's pkg/registry, blobs on disk, a CA of its own, the
// OCI 1.1 referrers API: referrers), the
// mapping of upstream image names onto it (Mirror, and containerd's registry
// host configuration that makes containerd pull registry.k8s.io/..., docker.io/...
// from it: WriteHostsDir), the images the tests make from single static
// binaries (PushBinary: the pause image, the upstream AWS CCM, test/testccm
// standing in for the other clouds' CCMs), the pause program itself
// (test/registry/pause) and a release of this repository pushed to it with
// `make release` (Release).
//
// It is a library, not a test helper: it does not import "testing".
package registry

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
)

// Registry is an OCI distribution registry served over HTTPS on a listener
// of the caller's. Manifests are kept in memory, blobs on disk.
type Registry struct {
	host      string
	dir       string
	caFile    string
	transport *http.Transport
	srv       *http.Server
	served    chan error
	logFile   *os.File
	// auth guards the private repositories (RequireAuth); nil: none.
	auth *basicAuth
}

// Files under the directory given to Start.
const (
	// CAFileName is the CA certificate (PEM) that signed the server's
	// certificate.
	CAFileName = "ca.crt"
	// BlobsDirName holds the blobs, one file per digest.
	BlobsDirName = "blobs"
	// LogFileName records every request the registry served.
	LogFileName = "requests.log"
)

// Start serves a registry on lis over HTTPS until Close. It generates a CA
// and a server certificate valid for the listener's IP address, 127.0.0.1,
// ::1, localhost and this machine's hostname, writes the CA to
// dir/ca.crt, keeps blobs under dir/blobs and logs requests to
// dir/requests.log. lis must be bound to a specific address (not 0.0.0.0 or
// ::): that address is the registry's name (Host) in image references and in
// containerd's configuration. Start owns lis: Close closes it, and so does
// a Start that fails. The caller owns dir; Close leaves it. Options make
// repositories private (RequireAuth).
func Start(lis net.Listener, dir string, opts ...Option) (_ *Registry, err error) {
	defer func() {
		if err != nil {
			lis.Close()
		}
	}()
	tcp, ok := lis.Addr().(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("start registry: listener address %s is not TCP", lis.Addr())
	}
	if tcp.IP == nil || tcp.IP.IsUnspecified() {
		return nil, fmt.Errorf("start registry: listener on %s: want a specific address (it names the registry)", tcp)
	}
	// containerd reads the CA path in hosts.toml relative to that file.
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	blobs := filepath.Join(dir, BlobsDirName)
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	r := &Registry{host: tcp.String(), dir: dir, caFile: filepath.Join(dir, CAFileName), served: make(chan error, 1)}
	for _, o := range opts {
		if err := o(r); err != nil {
			return nil, fmt.Errorf("start registry: %w", err)
		}
	}

	ips := []net.IP{tcp.IP, net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	names := []string{"localhost"}
	if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
		names = append(names, h)
	}
	caPEM, cert, err := newCertificates(ips, names)
	if err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	if err := os.WriteFile(r.caFile, caPEM, 0o644); err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	// Straight to the registry, whatever HTTPS_PROXY says: it is local.
	r.transport = http.DefaultTransport.(*http.Transport).Clone()
	r.transport.Proxy = nil
	r.transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}

	if r.logFile, err = os.OpenFile(filepath.Join(dir, LogFileName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	logger := log.New(r.logFile, "", log.LstdFlags|log.Lmicroseconds)
	var handler http.Handler = referrers(ggcrregistry.New(
		ggcrregistry.Logger(logger),
		ggcrregistry.WithBlobHandler(ggcrregistry.NewDiskBlobHandler(blobs)),
		ggcrregistry.WithReferrersSupport(true),
	))
	if r.auth != nil {
		handler = r.auth.handler(handler)
	}
	r.srv = &http.Server{
		Handler:           handler,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          logger,
		Protocols:         http1Only(),
	}
	go func() { r.served <- r.srv.ServeTLS(lis, "", "") }()
	return r, nil
}

// http1Only is HTTP/1.1 alone. go-containerregistry's registry reads an
// upload's body while it holds a lock every other upload waits for; over
// HTTP/2, a client's uploads share one connection's flow-control window,
// the waiting ones' unread bodies fill it, and the upload holding the lock
// never gets the rest of its body: the push hangs (a two-platform
// `make release` did). Over HTTP/1.1 each upload has a connection of its own.
func http1Only() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	return p
}

// Host is the registry's address, host:port, as image references name it
// ("10.99.0.1:5000").
func (r *Registry) Host() string { return r.host }

// CAFile is the path of the CA certificate (PEM) the registry's certificate
// chains to: containerd's `ca`, Go's SSL_CERT_FILE, helm's --ca-file.
func (r *Registry) CAFile() string { return r.caFile }

// LogFile is the path of the request log.
func (r *Registry) LogFile() string { return filepath.Join(r.dir, LogFileName) }

// HTTPClient is a client that trusts the registry's CA (and nothing else)
// and never goes through a proxy. For go-containerregistry's remote:
// remote.WithTransport(r.HTTPClient().Transport).
func (r *Registry) HTTPClient() *http.Client { return &http.Client{Transport: r.transport} }

// Close stops serving, closing open connections, and waits until the server
// is done. The directory stays.
func (r *Registry) Close() error {
	// This process's own idle connections would keep Shutdown waiting.
	r.transport.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, r.srv.Close())
	}
	if serr := <-r.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	err = errors.Join(err, r.logFile.Close())
	if err != nil {
		return fmt.Errorf("close registry %s: %w", r.host, err)
	}
	return nil
}

// newCertificates generates a CA (ECDSA P-256) and a server certificate it
// signs for the given addresses and names. Both are valid from an hour ago
// for a year: the registry lives as long as a test or a demo.
func newCertificates(ips []net.IP, names []string) (caPEM []byte, server tls.Certificate, err error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, server, fmt.Errorf("generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{CommonName: "hybrid-ccm test registry CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(1, 0, 0),
		IsCA:                  true,
		MaxPathLenZero:        true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, server, fmt.Errorf("create CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, server, fmt.Errorf("parse CA certificate: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, server, fmt.Errorf("generate server key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(),
		Subject:      pkix.Name{CommonName: "hybrid-ccm test registry"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  ips,
		DNSNames:     names,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, server, fmt.Errorf("create server certificate: %w", err)
	}
	server = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), server, nil
}

func serialNumber() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

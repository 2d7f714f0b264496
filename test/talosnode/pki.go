package talosnode

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"
)

// PKI is the generated certificate authority of a simulated Talos cluster: the
// endpoint presents a server certificate signed by it and requires client
// certificates signed by it, like apid does with a talosconfig.
type PKI struct {
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	// CAPEM is the CA certificate (PEM).
	CAPEM []byte
}

func newPKI() (*PKI, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "talos-sim-ca", Organization: []string{"talos"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &PKI{caCert: cert, caKey: key, CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// issue signs a leaf certificate. Organizations carry Talos roles for clients.
func (p *PKI) issue(cn string, orgs []string, server bool, ips []net.IP, dns []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	usage := x509.ExtKeyUsageClientAuth
	if server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// ServiceNames are the names Talos adds to apid's certificate when
// Kubernetes Talos API access is on: the Service it keeps in default.
var ServiceNames = []string{"talos", "talos.default"}

func (p *PKI) serverTLS() (*tls.Config, error) {
	c, k, err := p.issue("talos-sim-apid", nil, true,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, append([]string{"localhost"}, ServiceNames...))
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		return nil, fmt.Errorf("server key pair: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.caCert)
	// A connection to another address than loopback (a node's own, when the
	// endpoint serves its listener: Endpoint.Serve) gets a certificate for
	// that address, issued once, as each Talos machine has its own.
	var mu sync.Mutex
	byIP := map[string]*tls.Certificate{}
	return &tls.Config{
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			addr, ok := hello.Conn.LocalAddr().(*net.TCPAddr)
			if !ok || addr.IP.IsLoopback() {
				return &pair, nil
			}
			mu.Lock()
			defer mu.Unlock()
			if c := byIP[addr.IP.String()]; c != nil {
				return c, nil
			}
			c, k, err := p.issue("talos-sim-apid", nil, true, []net.IP{addr.IP}, ServiceNames)
			if err != nil {
				return nil, err
			}
			cert, err := tls.X509KeyPair(c, k)
			if err != nil {
				return nil, err
			}
			byIP[addr.IP.String()] = &cert
			return &cert, nil
		},
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  pool,
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
	}, nil
}

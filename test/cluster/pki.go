package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's one certificate authority: it signs the API server's
// serving certificate, every component's client certificate, and (through
// kube-controller-manager's signer) the kubelets' serving certificates; plus
// the ServiceAccount token key pair.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  crypto.Signer
	serial int64
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "hybrid-ccm-test-cluster-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, ca: ca, caKey: key, serial: 1}
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writeKey(p.path("ca.key"), key); err != nil {
		return nil, err
	}
	// The ServiceAccount token signing pair.
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.pub"), "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	if err := writeKey(p.path("sa.key"), sa); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// CAFile is the CA certificate's path.
func (p *pki) CAFile() string { return p.path("ca.crt") }

// issue writes <name>.crt and <name>.key: a client certificate when server is
// false, a serving certificate for ips and dns otherwise.
func (p *pki) issue(name, cn string, orgs []string, server bool, ips []net.IP, dns []string) (crt, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, k.Public(), p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("issue %s: %w", name, err)
	}
	crt, key = p.path(name+".crt"), p.path(name+".key")
	if err := writePEM(crt, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return crt, key, writeKey(key, k)
}

// kubeconfig writes <name>.kubeconfig: a client certificate for cn/orgs and
// the API server at server.
func (p *pki) kubeconfig(name, server, cn string, orgs ...string) (string, error) {
	crt, key, err := p.issue(name, cn, orgs, false, nil, nil)
	if err != nil {
		return "", err
	}
	path := p.path(name + ".kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %q
    certificate-authority: %q
users:
- name: %q
  user:
    client-certificate: %q
    client-key: %q
contexts:
- name: test
  context: {cluster: test, user: %q}
current-context: test
`, server, p.CAFile(), cn, crt, key, cn)
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func writeKey(path string, k crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}

// adminTLS is the admin's client TLS configuration.
func (p *pki) adminTLS() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(p.path("admin.crt"), p.path("admin.key"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

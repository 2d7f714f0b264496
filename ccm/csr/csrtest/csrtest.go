// Package csrtest builds kubelet-serving certificate signing requests the way a
// kubelet does (crypto/x509, ECDSA P-256 or RSA keys), plus the variants an attacker
// would try, for the tests and benchmarks of node-csr-approval. It also offers
// fixed NodeFacts that stand for "what the Talos API reported" for each node.
//
// It owns no policy: it never decides whether a request is acceptable.
package csrtest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"sync"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
)

// KubeletServingSigner is the signer name kubelets use for their serving certificate.
const KubeletServingSigner = certificatesv1.KubeletServingSignerName

// Request describes one PKCS#10 request. The zero value plus NodeName is what a
// kubelet sends: CN=system:node:<NodeName>, O=system:nodes, a fresh ECDSA P-256 key.
type Request struct {
	// NodeName fills the default CommonName.
	NodeName string
	// CommonName overrides CN (default "system:node:<NodeName>").
	CommonName string
	// Organization overrides O (default ["system:nodes"]); set to a non-nil empty
	// slice for no O at all.
	Organization []string
	// ExtraSubjectNames are appended to the subject (e.g. a second CN).
	ExtraSubjectNames []pkix.AttributeTypeAndValue
	// DNSNames and IPs are the SANs a kubelet requests (its hostname and addresses).
	DNSNames []string
	IPs      []netip.Addr
	// Emails and URIs are SANs a kubelet never requests.
	Emails []string
	URIs   []*url.URL
	// ExtraExtensions are added verbatim (a raw subjectAltName here replaces the one
	// built from the fields above).
	ExtraExtensions []pkix.Extension
	// Key signs the request (default: a new ECDSA P-256 key).
	Key crypto.Signer
}

// NewECDSAKey returns a new ECDSA P-256 key, the kubelet's default.
func NewECDSAKey() crypto.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(fmt.Sprintf("csrtest: generate ECDSA key: %v", err))
	}
	return k
}

// NewRSAKey returns a new RSA key of the given size.
func NewRSAKey(bits int) crypto.Signer {
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		panic(fmt.Sprintf("csrtest: generate RSA-%d key: %v", bits, err))
	}
	return k
}

// DER returns the DER-encoded, signed request.
func (r Request) DER() ([]byte, error) {
	cn := r.CommonName
	if cn == "" {
		cn = "system:node:" + r.NodeName
	}
	org := r.Organization
	if org == nil {
		org = []string{"system:nodes"}
	}
	key := r.Key
	if key == nil {
		key = NewECDSAKey()
	}
	ips := make([]net.IP, 0, len(r.IPs))
	for _, ip := range r.IPs {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	tmpl := &x509.CertificateRequest{
		Subject:         pkix.Name{CommonName: cn, Organization: org, ExtraNames: r.ExtraSubjectNames},
		DNSNames:        r.DNSNames,
		IPAddresses:     ips,
		EmailAddresses:  r.Emails,
		URIs:            r.URIs,
		ExtraExtensions: r.ExtraExtensions,
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("csrtest: create request for %q: %w", cn, err)
	}
	return der, nil
}

// PEM returns the request as one "CERTIFICATE REQUEST" PEM block.
func (r Request) PEM() ([]byte, error) {
	der, err := r.DER()
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// MustPEM is PEM for tests that cannot continue without it.
func (r Request) MustPEM() []byte {
	b, err := r.PEM()
	if err != nil {
		panic(err)
	}
	return b
}

// KubeletUsages are the usages a kubelet requests for an RSA serving key (for ECDSA
// keys current kubelets omit key encipherment; both are acceptable).
func KubeletUsages() []certificatesv1.KeyUsage {
	return []certificatesv1.KeyUsage{
		certificatesv1.UsageDigitalSignature,
		certificatesv1.UsageKeyEncipherment,
		certificatesv1.UsageServerAuth,
	}
}

// Object wraps a PEM request into a CertificateSigningRequest object for the
// kubelet-serving signer with kubelet usages. The API server fills spec.username and
// spec.groups from the requester on create; for pure validation tests set them here.
func Object(name string, request []byte) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    request,
			SignerName: KubeletServingSigner,
			Usages:     KubeletUsages(),
		},
	}
}

// Addresses are fixed csr.NodeFacts: for each node name, the addresses the Talos
// API reported. It is safe for concurrent use and may be changed while in use.
type Addresses struct {
	mu    sync.RWMutex
	nodes map[string][]corev1.NodeAddress
	errs  map[string]error
}

// NewAddresses returns an empty Addresses.
func NewAddresses() *Addresses {
	return &Addresses{nodes: map[string][]corev1.NodeAddress{}, errs: map[string]error{}}
}

// Set records what the Talos API reported for node (replacing earlier addresses).
func (a *Addresses) Set(node string, addrs ...corev1.NodeAddress) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nodes[node] = addrs
	delete(a.errs, node)
}

// Fail makes lookups for node fail with err (an unreachable Talos API).
func (a *Addresses) Fail(node string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs[node] = err
}

// Established implements csr.NodeFacts: facts with only the node's addresses.
func (a *Addresses) Established(_ context.Context, node *corev1.Node) (*facts.Facts, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if err := a.errs[node.Name]; err != nil {
		return nil, err
	}
	return &facts.Facts{Addresses: append([]corev1.NodeAddress(nil), a.nodes[node.Name]...)}, nil
}

// Remembered implements csr's optional RememberedFacts: the facts are always
// at hand, unless lookups of the node fail.
func (a *Addresses) Remembered(node string) (*facts.Facts, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.errs[node] != nil {
		return nil, false
	}
	return &facts.Facts{Addresses: append([]corev1.NodeAddress(nil), a.nodes[node]...)}, true
}

// InternalIP, ExternalIP, Hostname, InternalDNS and ExternalDNS build NodeAddresses.
func InternalIP(s string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: s}
}

// ExternalIP builds an ExternalIP NodeAddress.
func ExternalIP(s string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: s}
}

// Hostname builds a Hostname NodeAddress.
func Hostname(s string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeHostName, Address: s}
}

// InternalDNS builds an InternalDNS NodeAddress.
func InternalDNS(s string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: s}
}

// ExternalDNS builds an ExternalDNS NodeAddress.
func ExternalDNS(s string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeExternalDNS, Address: s}
}

// Addrs parses IP literals for Request.IPs; it panics on a typo in a test.
func Addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

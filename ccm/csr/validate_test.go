package csr

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// talosReported is what the Talos API reported for web-1: the only addresses that
// count as proof. It deliberately differs from what the kubelet wrote on the node
// (see testNode).
func talosReported() []corev1.NodeAddress {
	return []corev1.NodeAddress{
		csrtest.InternalIP("10.0.0.11"),
		csrtest.InternalIP("2001:db8::11"),
		csrtest.ExternalIP("203.0.113.11"),
		csrtest.Hostname("web-1"),
		csrtest.InternalDNS("web-1.internal.example"),
		csrtest.ExternalDNS("web-1.example.com"),
	}
}

// testNode is web-1 as talos-ccm leaves it after initialization, except that the
// kubelet (or an attacker with its credentials) put extra addresses into the
// provided-node-ip annotation and status.addresses.
func testNode() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "web-1",
			Annotations: map[string]string{"alpha.kubernetes.io/provided-node-ip": "10.0.0.11,192.168.99.11"},
		},
		Spec: corev1.NodeSpec{ProviderID: "hcloud://11"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			csrtest.InternalIP("10.0.0.11"),
			csrtest.InternalIP("192.168.99.11"),
			csrtest.Hostname("web-1.kubelet-says.example"),
		}},
	}
}

func uninitialized(n *corev1.Node) *corev1.Node {
	n.Spec.Taints = []corev1.Taint{{Key: names.UninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	return n
}

// sanExt builds a raw subjectAltName extension from GeneralNames.
func sanExt(t testing.TB, names ...asn1.RawValue) pkix.Extension {
	t.Helper()
	var body []byte
	for _, n := range names {
		b, err := asn1.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		body = append(body, b...)
	}
	v, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: body})
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: oidExtensionSubjectAltName, Value: v}
}

func dnsGN(s string) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: sanTagDNS, Bytes: []byte(s)}
}

func otherNameGN(t testing.TB) asn1.RawValue {
	oid, _ := asn1.Marshal(asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 20, 2, 3}) // UPN
	val, _ := asn1.Marshal("admin@example.com")
	inner, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: val})
	if err != nil {
		t.Fatal(err)
	}
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: append(oid, inner...)}
}

func dirNameGN(t testing.TB) asn1.RawValue {
	name, err := asn1.Marshal(pkix.Name{CommonName: "system:node:web-2"}.ToRDNSequence())
	if err != nil {
		t.Fatal(err)
	}
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 4, IsCompound: true, Bytes: name}
}

func registeredIDGN() asn1.RawValue {
	oid, _ := asn1.Marshal(asn1.ObjectIdentifier{1, 2, 3, 4})
	// registeredID is IMPLICIT: the OID contents with tag [8].
	var raw asn1.RawValue
	_, _ = asn1.Unmarshal(oid, &raw)
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 8, Bytes: raw.Bytes}
}

// rsaKeyWithExponent builds a 2048-bit RSA key with a public exponent other than
// 65537 (crypto/rsa.GenerateKey always uses 65537).
func rsaKeyWithExponent(t testing.TB, e int) crypto.Signer {
	t.Helper()
	bigE := big.NewInt(int64(e))
	one := big.NewInt(1)
	for range 50 {
		p, err := rand.Prime(rand.Reader, 1024)
		if err != nil {
			t.Fatal(err)
		}
		q, err := rand.Prime(rand.Reader, 1024)
		if err != nil {
			t.Fatal(err)
		}
		phi := new(big.Int).Mul(new(big.Int).Sub(p, one), new(big.Int).Sub(q, one))
		d := new(big.Int).ModInverse(bigE, phi)
		n := new(big.Int).Mul(p, q)
		if d == nil || p.Cmp(q) == 0 || n.BitLen() != 2048 {
			continue
		}
		k := &rsa.PrivateKey{PublicKey: rsa.PublicKey{N: n, E: e}, D: d, Primes: []*big.Int{p, q}}
		k.Precompute()
		if err := k.Validate(); err != nil {
			continue
		}
		return k
	}
	t.Fatal("no RSA key with the requested exponent")
	return nil
}

func mustPEM(t testing.TB, r csrtest.Request) []byte {
	t.Helper()
	b, err := r.PEM()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestValidate(t *testing.T) {
	ecKey := csrtest.NewECDSAKey()
	rsaKey := csrtest.NewRSAKey(2048)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	rsa1024 := csrtest.NewRSAKey(1024)

	// web1 is the request a healthy kubelet on web-1 sends.
	web1 := csrtest.Request{NodeName: "web-1", DNSNames: []string{"web-1"}, IPs: csrtest.Addrs("10.0.0.11"), Key: ecKey}
	with := func(f func(r *csrtest.Request)) csrtest.Request {
		r := web1
		f(&r)
		return r
	}
	validPEM := mustPEM(t, web1)
	block, _ := pem.Decode(validPEM)
	badSig := append([]byte(nil), block.Bytes...)
	badSig[len(badSig)-5] ^= 0xff
	badSigPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: badSig})

	bigSANs := make([]string, 2000)
	for i := range bigSANs {
		bigSANs[i] = "web-1"
	}

	tests := []struct {
		name string
		// req is the PKCS#10 request (ignored when pem is set).
		req csrtest.Request
		// pem replaces the encoded request verbatim.
		pem []byte
		// edit changes the CSR object after the defaults (username system:node:web-1,
		// groups system:nodes, kubelet usages, kubelet-serving signer).
		edit func(*certificatesv1.CertificateSigningRequest)
		// node returns the Node passed to Validate (default testNode()).
		node func() *corev1.Node
		// established replaces talosReported() when non-nil.
		established []corev1.NodeAddress
		// opts changes NewOptions().
		opts func(*Options)
		// want is the expected action and reason.
		want   Action
		reason string
	}{
		// Approvals.
		{name: "kubelet ECDSA P-256, DNS+IP", req: web1, want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "kubelet RSA 2048", req: with(func(r *csrtest.Request) { r.Key = rsaKey }), want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "ECDSA P-384", req: with(func(r *csrtest.Request) { r.Key = p384 }), want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "Ed25519", req: with(func(r *csrtest.Request) { r.Key = edKey }), want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "IP-only request", req: with(func(r *csrtest.Request) { r.DNSNames = nil }), want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "every established address", req: with(func(r *csrtest.Request) {
			r.DNSNames = []string{"web-1", "web-1.internal.example", "web-1.example.com"}
			r.IPs = csrtest.Addrs("10.0.0.11", "2001:db8::11", "203.0.113.11")
		}), want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "IPv4-mapped IPv6 form of an established IPv4", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("::ffff:10.0.0.11") }), want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "ECDSA usages without key encipherment", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
		}, want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "expiration at the lower bound", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.ExpirationSeconds = ptr.To[int32](3600) }, want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "expiration at the upper bound", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.ExpirationSeconds = ptr.To[int32](367 * 86400)
		}, want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "PEM with surrounding whitespace", pem: append(append([]byte("\n  "), validPEM...), "\n\n"...), want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "uninitialized node, not waiting, established addresses", req: web1, node: func() *corev1.Node { return uninitialized(testNode()) },
			opts: func(o *Options) { o.WaitForInitialization = false }, want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "IP in an allowed range", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("172.16.5.5") }),
			opts: func(o *Options) { o.AllowedIPRanges = []netip.Prefix{netip.MustParsePrefix("172.16.0.0/16")} }, want: Approve, reason: ReasonNodeIdentityVerified},
		{name: "DNS name under an allowed suffix", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1.lb.example.org"} }),
			opts: func(o *Options) { o.AllowedDNSSuffixes = []string{"lb.example.org"} }, want: Approve, reason: ReasonNodeIdentityVerified},

		// Not ours.
		{name: "other signer", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
		}, want: Ignore, reason: ReasonNotKubeletServing},
		{name: "already approved", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
		}, want: Ignore, reason: ReasonAlreadyDecided},
		{name: "already denied", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue}}
		}, want: Ignore, reason: ReasonAlreadyDecided},
		{name: "failed", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue}}
		}, want: Ignore, reason: ReasonAlreadyDecided},

		// Requester identity.
		{name: "requester is not a node", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Username = "mallory" }, want: Deny, reason: ReasonUsernameNotNode},
		{name: "requester is a service account", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:serviceaccount:kube-system:web-1"
		}, want: Deny, reason: ReasonUsernameNotNode},
		{name: "empty node name", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Username = "system:node:" }, want: Deny, reason: ReasonUsernameNotNode},
		{name: "invalid node name", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Username = "system:node:../web-1" }, want: Deny, reason: ReasonUsernameNotNode},
		{name: "not in system:nodes", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Groups = []string{"system:authenticated"} }, want: Deny, reason: ReasonNotInNodesGroup},

		// The request itself.
		{name: "huge request", req: with(func(r *csrtest.Request) { r.DNSNames = bigSANs }), want: Deny, reason: ReasonRequestTooLarge},
		{name: "garbage", pem: []byte("hello, I am a certificate"), want: Deny, reason: ReasonInvalidPEM},
		{name: "empty", pem: []byte{}, want: Deny, reason: ReasonInvalidPEM},
		{name: "text before the block", pem: append([]byte("ignored by pem.Decode\n"), validPEM...), want: Deny, reason: ReasonInvalidPEM},
		{name: "text after the block", pem: append(append([]byte(nil), validPEM...), "trailing"...), want: Deny, reason: ReasonInvalidPEM},
		{name: "two PEM blocks", pem: append(append([]byte(nil), validPEM...), mustPEM(t, with(func(r *csrtest.Request) { r.DNSNames = []string{"web-2"} }))...), want: Deny, reason: ReasonInvalidPEM},
		{name: "wrong block type", pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}), want: Deny, reason: ReasonInvalidPEM},
		{name: "PEM headers", pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: block.Bytes}), want: Deny, reason: ReasonInvalidPEM},
		{name: "PEM around garbage DER", pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte("not DER")}), want: Deny, reason: ReasonInvalidRequest},
		{name: "bad signature", pem: badSigPEM, want: Deny, reason: ReasonInvalidSignature},
		{name: "RSA 1024", req: with(func(r *csrtest.Request) { r.Key = rsa1024 }), want: Deny, reason: ReasonUnsupportedKey},
		{name: "ECDSA P-224", req: with(func(r *csrtest.Request) { r.Key = p224 }), want: Deny, reason: ReasonUnsupportedKey},
		{name: "RSA exponent 3", req: with(func(r *csrtest.Request) { r.Key = rsaKeyWithExponent(t, 3) }), want: Deny, reason: ReasonUnsupportedKey},

		// Subject.
		{name: "no organization", req: with(func(r *csrtest.Request) { r.Organization = []string{} }), want: Deny, reason: ReasonOrganizationMismatch},
		{name: "organization system:masters", req: with(func(r *csrtest.Request) { r.Organization = []string{"system:masters"} }), want: Deny, reason: ReasonOrganizationMismatch},
		{name: "extra organization", req: with(func(r *csrtest.Request) { r.Organization = []string{"system:nodes", "system:masters"} }), want: Deny, reason: ReasonOrganizationMismatch},
		{name: "organization case", req: with(func(r *csrtest.Request) { r.Organization = []string{"System:Nodes"} }), want: Deny, reason: ReasonOrganizationMismatch},
		{name: "CN of another node", req: with(func(r *csrtest.Request) { r.CommonName = "system:node:web-2"; r.DNSNames = []string{"web-2"} }), want: Deny, reason: ReasonCommonNameMismatch},
		{name: "CN case", req: with(func(r *csrtest.Request) { r.CommonName = "system:node:WEB-1" }), want: Deny, reason: ReasonCommonNameMismatch},
		{name: "two CNs", req: with(func(r *csrtest.Request) {
			r.ExtraSubjectNames = []pkix.AttributeTypeAndValue{{Type: oidCommonName, Value: "system:node:web-2"}}
		}), want: Deny, reason: ReasonCommonNameMismatch},

		// Usages and lifetime.
		{name: "no server auth", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment}
		}, want: Deny, reason: ReasonMissingServerAuth},
		{name: "no usages", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Usages = nil }, want: Deny, reason: ReasonMissingServerAuth},
		{name: "extra client auth", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(csrtest.KubeletUsages(), certificatesv1.UsageClientAuth)
		}, want: Deny, reason: ReasonDisallowedUsage},
		{name: "cert sign", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(csrtest.KubeletUsages(), certificatesv1.UsageCertSign)
		}, want: Deny, reason: ReasonDisallowedUsage},
		{name: "expiration below minimum", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.ExpirationSeconds = ptr.To[int32](600) }, want: Deny, reason: ReasonExpirationOutOfBounds},
		{name: "expiration above maximum", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.ExpirationSeconds = ptr.To[int32](367*86400 + 1)
		}, want: Deny, reason: ReasonExpirationOutOfBounds},
		{name: "negative expiration", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.ExpirationSeconds = ptr.To[int32](-1) }, want: Deny, reason: ReasonExpirationOutOfBounds},
		{name: "expiration within custom bounds", req: web1, edit: func(c *certificatesv1.CertificateSigningRequest) { c.Spec.ExpirationSeconds = ptr.To[int32](1800) },
			opts: func(o *Options) { o.MinExpiration = 30 * time.Minute }, want: Approve, reason: ReasonNodeIdentityVerified},

		// Extensions and SAN forms.
		{name: "basicConstraints CA:TRUE", req: with(func(r *csrtest.Request) {
			v, _ := asn1.Marshal(struct{ CA bool }{true})
			r.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: v}}
		}), want: Deny, reason: ReasonUnexpectedExtension},
		{name: "otherName SAN (dropped by Go's parser)", req: with(func(r *csrtest.Request) {
			r.ExtraExtensions = []pkix.Extension{sanExt(t, dnsGN("web-1"), otherNameGN(t))}
		}), want: Deny, reason: ReasonUnsupportedSAN},
		{name: "directoryName SAN", req: with(func(r *csrtest.Request) {
			r.ExtraExtensions = []pkix.Extension{sanExt(t, dnsGN("web-1"), dirNameGN(t))}
		}), want: Deny, reason: ReasonUnsupportedSAN},
		{name: "registeredID SAN", req: with(func(r *csrtest.Request) {
			r.ExtraExtensions = []pkix.Extension{sanExt(t, dnsGN("web-1"), registeredIDGN())}
		}), want: Deny, reason: ReasonUnsupportedSAN},
		{name: "email SAN", req: with(func(r *csrtest.Request) { r.Emails = []string{"root@web-1"} }), want: Deny, reason: ReasonEmailSAN},
		{name: "URI SAN", req: with(func(r *csrtest.Request) {
			r.URIs = []*url.URL{{Scheme: "spiffe", Host: "cluster.local", Path: "/ns/kube-system/sa/admin"}}
		}), want: Deny, reason: ReasonURISAN},
		{name: "no SANs", req: with(func(r *csrtest.Request) { r.DNSNames = nil; r.IPs = nil }), want: Deny, reason: ReasonNoSubjectAltNames},
		{name: "wildcard DNS", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"*.example.com"} }), want: Deny, reason: ReasonWildcardDNSName},
		{name: "wildcard inside a label", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-*"} }), want: Deny, reason: ReasonWildcardDNSName},
		{name: "kubernetes", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"kubernetes"} }), want: Deny, reason: ReasonReservedDNSName},
		{name: "Kubernetes.Default.svc", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"Kubernetes.Default.svc"} }), want: Deny, reason: ReasonReservedDNSName},
		{name: "kubernetes.default.svc.cluster.local even if established", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"kubernetes.default.svc.cluster.local"} }),
			established: append(talosReported(), csrtest.InternalDNS("kubernetes.default.svc.cluster.local")), want: Deny, reason: ReasonReservedDNSName},

		// The node.
		{name: "node does not exist", req: web1, node: func() *corev1.Node { return nil }, want: Deny, reason: ReasonNodeNotFound},
		{name: "another node passed in", req: web1, node: func() *corev1.Node { n := testNode(); n.Name = "web-2"; return n }, want: Deny, reason: ReasonNodeNotFound},
		{name: "node not initialized", req: web1, node: func() *corev1.Node { return uninitialized(testNode()) }, want: Retry, reason: ReasonNodeNotInitialized},
		{name: "uninitialized node, not waiting, nothing established", req: web1, node: func() *corev1.Node { return uninitialized(testNode()) },
			established: []corev1.NodeAddress{}, opts: func(o *Options) { o.WaitForInitialization = false }, want: Deny, reason: ReasonIPAddressNotEstablished},

		// IP SANs: only what talos-ccm established counts.
		{name: "IP of another node", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("10.0.0.12") }), want: Deny, reason: ReasonIPAddressNotEstablished},
		{name: "IP-only request for another node's IP", req: with(func(r *csrtest.Request) { r.DNSNames = nil; r.IPs = csrtest.Addrs("10.0.0.12") }), want: Deny, reason: ReasonIPAddressNotEstablished},
		{name: "IP only in provided-node-ip and status.addresses", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("10.0.0.11", "192.168.99.11") }), want: Deny, reason: ReasonIPAddressNotEstablished},
		// security round three: never a node's, even when "established"
		// (an allowed range or the node's own word cannot make them so)
		{name: "loopback", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("127.0.0.1") }), want: Deny, reason: ReasonReservedIPAddress},
		{name: "link-local metadata address, established", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("169.254.169.254") }),
			established: append(talosReported(), csrtest.ExternalIP("169.254.169.254")), want: Deny, reason: ReasonReservedIPAddress},
		{name: "IPv6 link-local", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("fe80::1") }), want: Deny, reason: ReasonReservedIPAddress},
		{name: "unspecified", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("0.0.0.0") }), want: Deny, reason: ReasonReservedIPAddress},
		{name: "multicast in an allowed range", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("239.1.1.1") }),
			opts: func(o *Options) { o.AllowedIPRanges = []netip.Prefix{netip.MustParsePrefix("239.0.0.0/8")} }, want: Deny, reason: ReasonReservedIPAddress},
		{name: "Service CIDR, established", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("10.96.0.1") }),
			established: append(talosReported(), csrtest.ExternalIP("10.96.0.1")),
			opts:        func(o *Options) { o.ReservedIPRanges = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")} }, want: Deny, reason: ReasonReservedIPAddress},
		{name: "kubernetes-api name, established", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"kubernetes-api.corp.example"} }),
			established: append(talosReported(), csrtest.ExternalDNS("kubernetes-api.corp.example")), want: Deny, reason: ReasonReservedDNSName},
		{name: "svc name", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1.default.svc"} }), want: Deny, reason: ReasonReservedDNSName},
		{name: "cluster domain name", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1.pods.cluster.local"} }), want: Deny, reason: ReasonReservedDNSName},
		{name: "other cluster domain", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1.corp.k8s"} }),
			established: append(talosReported(), csrtest.InternalDNS("web-1.corp.k8s")),
			opts:        func(o *Options) { o.ClusterDomain = "corp.k8s" }, want: Deny, reason: ReasonReservedDNSName},
		{name: "localhost", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"localhost"} }), want: Deny, reason: ReasonReservedDNSName},
		{name: "IP established only as a hostname", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("10.9.9.9") }),
			established: append(talosReported(), csrtest.Hostname("10.9.9.9")), want: Deny, reason: ReasonIPAddressNotEstablished},
		{name: "nothing established", req: web1, established: []corev1.NodeAddress{}, want: Deny, reason: ReasonIPAddressNotEstablished},
		{name: "IP outside the allowed range", req: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("172.17.0.1") }),
			opts: func(o *Options) { o.AllowedIPRanges = []netip.Prefix{netip.MustParsePrefix("172.16.0.0/16")} }, want: Deny, reason: ReasonIPAddressNotEstablished},

		// DNS SANs: exactly the node name or an established name.
		{name: "DNS of another node", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1", "web-2"} }), want: Deny, reason: ReasonDNSNameNotEstablished},
		{name: "DNS only in status.addresses", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1.kubelet-says.example"} }), want: Deny, reason: ReasonDNSNameNotEstablished},
		{name: "trailing dot", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1."} }), want: Deny, reason: ReasonDNSNameNotEstablished},
		{name: "case differs", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"WEB-1"} }), want: Deny, reason: ReasonDNSNameNotEstablished},
		{name: "the allowed suffix itself", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"lb.example.org"} }),
			opts: func(o *Options) { o.AllowedDNSSuffixes = []string{"lb.example.org"} }, want: Deny, reason: ReasonDNSNameNotEstablished},
		{name: "suffix without label boundary", req: with(func(r *csrtest.Request) { r.DNSNames = []string{"evillb.example.org"} }),
			opts: func(o *Options) { o.AllowedDNSSuffixes = []string{"lb.example.org"} }, want: Deny, reason: ReasonDNSNameNotEstablished},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.pem
			if p == nil {
				p = mustPEM(t, tt.req)
			}
			c := csrtest.Object("csr-"+strings.ReplaceAll(tt.name, " ", "-"), p)
			c.Spec.Username = "system:node:web-1"
			c.Spec.Groups = []string{"system:nodes", "system:authenticated"}
			if tt.edit != nil {
				tt.edit(c)
			}
			node := testNode()
			if tt.node != nil {
				node = tt.node()
			}
			established := talosReported()
			if tt.established != nil {
				established = tt.established
			}
			opts := NewOptions()
			if tt.opts != nil {
				tt.opts(opts)
			}
			if err := opts.Validate(); err != nil {
				t.Fatalf("test options: %v", err)
			}
			got := Validate(c, node, established, opts)
			if got.Action != tt.want || got.Reason != tt.reason {
				t.Fatalf("Validate = %s/%s (%s), want %s/%s", got.Action, got.Reason, got.Message, tt.want, tt.reason)
			}
			if got.Message == "" {
				t.Errorf("decision has no message")
			}
		})
	}
}

func TestValidateNilInputs(t *testing.T) {
	if d := Validate(nil, nil, nil, nil); d.Action != Ignore {
		t.Fatalf("nil CSR: %s/%s", d.Action, d.Reason)
	}
	c := csrtest.Object("x", nil)
	c.Spec.Username, c.Spec.Groups = "system:node:web-1", []string{"system:nodes"}
	if d := Validate(c, nil, nil, nil); d.Action != Deny || d.Reason != ReasonInvalidPEM {
		t.Fatalf("nil request: %s/%s", d.Action, d.Reason)
	}
	var zero Decision
	if zero.Action != Ignore {
		t.Fatalf("zero Decision must not act, got %s", zero.Action)
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		// edit changes NewOptions().
		edit func(*Options)
		// wantErr is a substring of the expected error ("" = valid).
		wantErr string
	}{
		{name: "defaults", edit: func(*Options) {}},
		{name: "zero minimum", edit: func(o *Options) { o.MinExpiration = 0 }, wantErr: "--csr-min-expiration"},
		{name: "max below min", edit: func(o *Options) { o.MaxExpiration = time.Minute }, wantErr: "--csr-max-expiration"},
		{name: "no workers", edit: func(o *Options) { o.Workers = 0 }, wantErr: "--csr-workers"},
		{name: "/0 range", edit: func(o *Options) { o.AllowedIPRanges = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")} }, wantErr: "switch the IP check off"},
		{name: "host bits", edit: func(o *Options) { o.AllowedIPRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8")} }, wantErr: "host bits"},
		{name: "good range", edit: func(o *Options) { o.AllowedIPRanges = []netip.Prefix{netip.MustParsePrefix("fd00::/8")} }},
		{name: "wildcard suffix", edit: func(o *Options) { o.AllowedDNSSuffixes = []string{"*.example.com"} }, wantErr: "wildcards"},
		{name: "leading dot", edit: func(o *Options) { o.AllowedDNSSuffixes = []string{".example.com"} }, wantErr: "--csr-allowed-dns-suffixes"},
		{name: "TLD", edit: func(o *Options) { o.AllowedDNSSuffixes = []string{"com"} }, wantErr: "two labels"},
		{name: "reserved suffix", edit: func(o *Options) { o.AllowedDNSSuffixes = []string{"kubernetes.default.svc"} }, wantErr: "reserved"},
		{name: "good suffix", edit: func(o *Options) { o.AllowedDNSSuffixes = []string{"nodes.example.com"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOptions()
			tt.edit(o)
			err := o.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

package csr

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
)

// Node states the fuzzer chooses from.
const (
	fuzzNodeAbsent = iota
	fuzzNodeInitialized
	fuzzNodeUninitialized
)

// FuzzValidate feeds arbitrary requests, requesters, usages and lifetimes to
// Validate. Beyond "never panics", it re-derives every approval independently: an
// approved request must be a well-formed, self-signed kubelet request whose every
// SAN is established for the node.
//
//	go test -run '^$' -fuzz '^FuzzValidate$' -fuzztime 30s ./ccm/csr
func FuzzValidate(f *testing.F) {
	web1 := csrtest.Request{NodeName: "web-1", DNSNames: []string{"web-1"}, IPs: csrtest.Addrs("10.0.0.11")}
	seeds := []csrtest.Request{
		web1,
		{NodeName: "web-1", DNSNames: []string{"web-1", "web-1.example.com"}, IPs: csrtest.Addrs("10.0.0.11", "2001:db8::11"), Key: rsaKey(f)},
		{NodeName: "web-1", IPs: csrtest.Addrs("10.0.0.11")},                   // IP-only
		{NodeName: "web-1", IPs: csrtest.Addrs("10.0.0.12")},                   // IP-only, wrong node
		{NodeName: "web-1", DNSNames: []string{"web-2"}},                       // another node's name
		{NodeName: "web-2", DNSNames: []string{"web-2"}},                       // CN of another node
		{NodeName: "web-1", DNSNames: []string{"*.example.com", "kubernetes"}}, // wildcard, reserved
		{NodeName: "web-1", DNSNames: []string{"web-1"}, Emails: []string{"a@b"}, URIs: []*url.URL{{Scheme: "spiffe", Host: "x"}}},
		{NodeName: "web-1"}, // no SANs
		{NodeName: "web-1", DNSNames: []string{"web-1"}, ExtraExtensions: []pkix.Extension{sanExt(f, dnsGN("web-1"), otherNameGN(f))}},
	}
	kubelet := "digital signature,key encipherment,server auth"
	for _, r := range seeds {
		der, err := r.DER()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(der, true, "system:node:web-1", "system:nodes", kubelet, int32(0), uint8(fuzzNodeInitialized))
		f.Add(der, true, "system:node:web-1", "system:nodes", kubelet, int32(3600), uint8(fuzzNodeUninitialized))
	}
	valid, _ := web1.PEM()
	f.Add(valid, false, "system:node:web-1", "system:nodes", kubelet, int32(0), uint8(fuzzNodeInitialized))
	f.Add(append(slices.Clone(valid), valid...), false, "system:node:web-1", "system:nodes", kubelet, int32(0), uint8(fuzzNodeInitialized))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\n"), false, "system:node:web-1", "system:nodes", kubelet, int32(0), uint8(fuzzNodeInitialized))
	f.Add([]byte("\x30\x82\xff\xff"), true, "system:node:web-1", "system:nodes", "server auth", int32(0), uint8(fuzzNodeAbsent))
	f.Add([]byte{}, false, "", "", "", int32(-1), uint8(fuzzNodeAbsent))
	f.Add([]byte("garbage"), false, "system:node:web-1", "system:nodes,system:masters", "client auth", int32(600), uint8(fuzzNodeInitialized))

	f.Fuzz(func(t *testing.T, data []byte, wrapDER bool, username, groups, usages string, expiration int32, nodeState uint8) {
		request := data
		if wrapDER {
			request = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: data})
		}
		c := csrtest.Object("fuzz", request)
		c.Spec.Username = username
		c.Spec.Groups = strings.Split(groups, ",")
		c.Spec.Usages = nil
		for _, u := range strings.Split(usages, ",") {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.KeyUsage(u))
		}
		if expiration != 0 {
			c.Spec.ExpirationSeconds = &expiration
		}
		var node *corev1.Node
		switch nodeState % 3 {
		case fuzzNodeInitialized:
			node = testNode()
		case fuzzNodeUninitialized:
			node = uninitialized(testNode())
		}
		established := talosReported()
		opts := NewOptions()

		d := Validate(c, node, established, opts)

		if d.Reason == "" || d.Message == "" {
			t.Fatalf("decision without reason or message: %+v", d)
		}
		switch d.Action {
		case Retry:
			if d.Reason != ReasonNodeNotInitialized || node == nil || Initialized(node) {
				t.Fatalf("unexpected retry: %+v", d)
			}
		case Approve:
			mustBeProvable(t, c, node, established)
		}
	})
}

// mustBeProvable re-checks an approval without using the code under test.
func mustBeProvable(t *testing.T, c *certificatesv1.CertificateSigningRequest, node *corev1.Node, established []corev1.NodeAddress) {
	t.Helper()
	if node == nil || c.Spec.Username != "system:node:"+node.Name || !slices.Contains(c.Spec.Groups, "system:nodes") {
		t.Fatalf("approved for requester %q groups %q, node %v", c.Spec.Username, c.Spec.Groups, node)
	}
	block, rest := pem.Decode(c.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" || strings.TrimSpace(string(rest)) != "" {
		t.Fatalf("approved a request that is not one PEM block")
	}
	x, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || x.CheckSignature() != nil {
		t.Fatalf("approved an unparsable or badly signed request: %v", err)
	}
	if !slices.Equal(x.Subject.Organization, []string{"system:nodes"}) || x.Subject.CommonName != c.Spec.Username {
		t.Fatalf("approved subject %v", x.Subject)
	}
	if len(x.EmailAddresses)+len(x.URIs) > 0 || len(x.DNSNames)+len(x.IPAddresses) == 0 {
		t.Fatalf("approved SANs: email %q uri %v dns %q ip %v", x.EmailAddresses, x.URIs, x.DNSNames, x.IPAddresses)
	}
	for _, e := range x.Extensions {
		if !e.Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}) {
			t.Fatalf("approved extension %s", e.Id)
		}
	}
	if !slices.Contains(c.Spec.Usages, certificatesv1.UsageServerAuth) {
		t.Fatalf("approved without server auth: %q", c.Spec.Usages)
	}
	for _, u := range c.Spec.Usages {
		if u != certificatesv1.UsageServerAuth && u != certificatesv1.UsageDigitalSignature && u != certificatesv1.UsageKeyEncipherment {
			t.Fatalf("approved usage %q", u)
		}
	}
	var ips []netip.Addr
	names := []string{node.Name}
	for _, a := range established {
		switch a.Type {
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			ips = append(ips, netip.MustParseAddr(a.Address))
		default:
			names = append(names, a.Address)
		}
	}
	for _, raw := range x.IPAddresses {
		ip, _ := netip.AddrFromSlice(raw)
		if !slices.Contains(ips, ip.Unmap()) {
			t.Fatalf("approved IP SAN %s not established for %s", ip, node.Name)
		}
	}
	for _, n := range x.DNSNames {
		if !slices.Contains(names, n) || strings.Contains(n, "*") || strings.HasPrefix(strings.ToLower(n), "kubernetes") {
			t.Fatalf("approved DNS SAN %q not established for %s", n, node.Name)
		}
	}
}

// rsaKey is a fixed RSA-2048 test key (testdata/rsa-2048.pem, made with
// openssl for this test): generating one in every fuzz worker took seconds on
// a loaded machine, and a worker still starting when -fuzztime ends fails the
// run with "context deadline exceeded".
func rsaKey(f *testing.F) crypto.Signer {
	f.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "rsa-2048.pem"))
	if err != nil {
		f.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		f.Fatal("testdata/rsa-2048.pem: no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		f.Fatal(err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		f.Fatalf("testdata/rsa-2048.pem: %T is no signer", k)
	}
	return signer
}

package csr

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const (
	// MaxRequestBytes bounds spec.request. A kubelet request is below 2 KiB even
	// with an RSA-8192 key and a dozen addresses; anything far larger is an attempt
	// to make the approver (or the signer) do work.
	MaxRequestBytes = 16 << 10

	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
)

var (
	oidExtensionSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidCommonName              = asn1.ObjectIdentifier{2, 5, 4, 3}

	allowedUsages = map[certificatesv1.KeyUsage]bool{
		certificatesv1.UsageDigitalSignature: true,
		certificatesv1.UsageKeyEncipherment:  true,
		certificatesv1.UsageServerAuth:       true,
	}
)

// GeneralName tags (RFC 5280 4.2.1.6, context-specific).
const (
	sanTagEmail = 1
	sanTagDNS   = 2
	sanTagURI   = 6
	sanTagIP    = 7
)

// request is a kubelet-serving request that passed every check that needs neither
// the Node nor its addresses.
type request struct {
	nodeName string
	x509     *x509.CertificateRequest
}

// Validate decides one request. node is the Node named by spec.username (nil if it
// does not exist); established are the addresses talos-ccm itself established for
// that node (NodeFacts), the only source of proof for IP and DNS SANs besides
// the node name: the kubelet-written provided-node-ip annotation and the node's own
// status.addresses are never consulted. A nil opts means NewOptions().
//
// Validate is pure and total: it never panics and never approves unless every check
// passes. Checks run in a fixed order and the first failure decides; see
// docs/csr-approval.md.
func Validate(csr *certificatesv1.CertificateSigningRequest, node *corev1.Node, established []corev1.NodeAddress, opts *Options) Decision {
	if opts == nil {
		opts = NewOptions()
	}
	req, d, ok := checkRequest(csr, opts)
	if !ok {
		return d
	}
	return checkNode(req, node, established, opts)
}

// Pending reports whether csr is a kubelet-serving request that nobody has decided
// yet, i.e. one this controller acts on.
func Pending(csr *certificatesv1.CertificateSigningRequest) bool {
	return csr != nil && csr.Spec.SignerName == certificatesv1.KubeletServingSignerName && !decided(csr)
}

func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return true
		}
	}
	return false
}

// NodeName returns <name> of spec.username "system:node:<name>" if it is a valid
// node name.
func NodeName(username string) (string, bool) {
	name, ok := strings.CutPrefix(username, nodeUserPrefix)
	if !ok || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return "", false
	}
	return name, true
}

func deny(reason, format string, args ...any) Decision {
	return Decision{Action: Deny, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// checkRequest runs every check that depends on the request alone. ok=false means
// d is final.
func checkRequest(csr *certificatesv1.CertificateSigningRequest, opts *Options) (req *request, d Decision, ok bool) {
	if csr == nil || csr.Spec.SignerName != certificatesv1.KubeletServingSignerName {
		return nil, Decision{Action: Ignore, Reason: ReasonNotKubeletServing, Message: "not a kubelet serving certificate request"}, false
	}
	if decided(csr) {
		return nil, Decision{Action: Ignore, Reason: ReasonAlreadyDecided, Message: "request already has a decision"}, false
	}

	// Identity of the requester, as authenticated by the API server.
	nodeName, ok := NodeName(csr.Spec.Username)
	if !ok {
		return nil, deny(ReasonUsernameNotNode, "requester %q is not system:node:<node name>", clip(csr.Spec.Username)), false
	}
	if !slices.Contains(csr.Spec.Groups, nodesGroup) {
		return nil, deny(ReasonNotInNodesGroup, "requester %q is not in group %s", csr.Spec.Username, nodesGroup), false
	}

	// The PKCS#10 request itself.
	if len(csr.Spec.Request) > MaxRequestBytes {
		return nil, deny(ReasonRequestTooLarge, "request is %d bytes, more than %d", len(csr.Spec.Request), MaxRequestBytes), false
	}
	der, why := singlePEMBlock(csr.Spec.Request)
	if why != "" {
		return nil, deny(ReasonInvalidPEM, "request must be exactly one CERTIFICATE REQUEST PEM block: %s", why), false
	}
	x, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, deny(ReasonInvalidRequest, "request does not parse: %s", clip(err.Error())), false
	}
	// Key before signature: never spend a signature check on an oversized key.
	if why := checkKey(x.PublicKey); why != "" {
		return nil, deny(ReasonUnsupportedKey, "%s", why), false
	}
	if err := x.CheckSignature(); err != nil {
		return nil, deny(ReasonInvalidSignature, "request signature does not verify: %s", clip(err.Error())), false
	}

	// Subject: the identity the certificate will carry.
	if len(x.Subject.Organization) != 1 || x.Subject.Organization[0] != nodesGroup {
		return nil, deny(ReasonOrganizationMismatch, "subject organization is %q, must be exactly [%q]", clipAll(x.Subject.Organization), nodesGroup), false
	}
	if n := countAttr(x, oidCommonName); n != 1 {
		return nil, deny(ReasonCommonNameMismatch, "subject has %d common names, must have exactly one", n), false
	}
	if x.Subject.CommonName != csr.Spec.Username {
		return nil, deny(ReasonCommonNameMismatch, "subject common name %q differs from requester %q", clip(x.Subject.CommonName), csr.Spec.Username), false
	}

	// What the certificate may be used for, and for how long.
	if !slices.Contains(csr.Spec.Usages, certificatesv1.UsageServerAuth) {
		return nil, deny(ReasonMissingServerAuth, "usages %q do not include %q", csr.Spec.Usages, certificatesv1.UsageServerAuth), false
	}
	for _, u := range csr.Spec.Usages {
		if !allowedUsages[u] {
			return nil, deny(ReasonDisallowedUsage, "usage %q is not allowed for a kubelet serving certificate (only digital signature, key encipherment, server auth)", clip(string(u))), false
		}
	}
	if es := csr.Spec.ExpirationSeconds; es != nil {
		d := time.Duration(*es) * time.Second
		if *es <= 0 || d < opts.MinExpiration || d > opts.MaxExpiration {
			return nil, deny(ReasonExpirationOutOfBounds, "expirationSeconds %d is outside [%s, %s]", *es, opts.MinExpiration, opts.MaxExpiration), false
		}
	}

	// Extensions and the form of the SANs.
	if d, ok := checkExtensions(x); !ok {
		return nil, d, false
	}
	if len(x.EmailAddresses) > 0 {
		return nil, deny(ReasonEmailSAN, "email SANs are not allowed (%q)", clipAll(x.EmailAddresses)), false
	}
	if len(x.URIs) > 0 {
		return nil, deny(ReasonURISAN, "URI SANs are not allowed (%q)", clip(x.URIs[0].String())), false
	}
	if len(x.DNSNames) == 0 && len(x.IPAddresses) == 0 {
		return nil, deny(ReasonNoSubjectAltNames, "request has no DNS or IP SAN"), false
	}
	for _, n := range x.DNSNames {
		if strings.ContainsRune(n, '*') {
			return nil, deny(ReasonWildcardDNSName, "wildcard DNS SAN %q is not allowed", clip(n)), false
		}
		if why := reservedDNSName(n, opts.ClusterDomain); why != "" {
			return nil, deny(ReasonReservedDNSName, "DNS SAN %q is %s, never a node's", clip(n), why), false
		}
	}
	for _, raw := range x.IPAddresses {
		ip, ok := netip.AddrFromSlice(raw)
		if !ok {
			return nil, deny(ReasonIPAddressNotEstablished, "IP SAN %x is not an IP address", []byte(raw)), false
		}
		if why := reservedIP(ip.Unmap(), opts.ReservedIPRanges); why != "" {
			return nil, deny(ReasonReservedIPAddress, "IP SAN %s is %s, never a node's", ip.Unmap(), why), false
		}
	}
	return &request{nodeName: nodeName, x509: x}, Decision{}, true
}

// checkNode runs the checks that need the Node and the addresses talos-ccm
// established for it.
func checkNode(req *request, node *corev1.Node, established []corev1.NodeAddress, opts *Options) Decision {
	if node == nil || node.Name != req.nodeName {
		return deny(ReasonNodeNotFound, "node %q does not exist", req.nodeName)
	}
	if opts.WaitForInitialization && !Initialized(node) {
		return Decision{Action: Retry, Reason: ReasonNodeNotInitialized,
			Message: fmt.Sprintf("node %q is not initialized by talos-ccm yet", node.Name)}
	}

	ips := map[netip.Addr]bool{}
	dns := map[string]bool{node.Name: true}
	for _, a := range established {
		switch a.Type {
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ips[ip.WithZone("").Unmap()] = true
			}
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			if a.Address != "" {
				dns[a.Address] = true
			}
		}
	}
	for _, raw := range req.x509.IPAddresses {
		ip, ok := netip.AddrFromSlice(raw)
		if !ok {
			return deny(ReasonIPAddressNotEstablished, "IP SAN %x is not an IP address", []byte(raw))
		}
		ip = ip.Unmap()
		if !ips[ip] && !inRanges(ip, opts.AllowedIPRanges) {
			return deny(ReasonIPAddressNotEstablished, "IP SAN %s is not an address talos-ccm established for node %q", ip, node.Name)
		}
	}
	for _, n := range req.x509.DNSNames {
		if underSuffix(n, opts.AllowedDNSSuffixes) {
			continue
		}
		if !dns[n] {
			return deny(ReasonDNSNameNotEstablished, "DNS SAN %q is neither the node name nor a hostname or DNS name talos-ccm established for node %q", clip(n), node.Name)
		}
		// What a node's Talos API says its DNS names are comes from the node
		// (root there can make any platform's metadata say anything): a name
		// counts only as the node's own name, alone or with a domain, on
		// every platform. Others need --csr-allowed-dns-suffixes.
		if first, _, _ := strings.Cut(n, "."); !strings.EqualFold(first, node.Name) {
			return deny(ReasonDNSNameNotEstablished, "DNS SAN %q of node %q is not the node's own name with a domain: a DNS name from a node's metadata counts only as <node name>.<domain> (its Talos API may say anything); allow other domains with --csr-allowed-dns-suffixes", clip(n), node.Name)
		}
	}
	return Decision{Action: Approve, Reason: ReasonNodeIdentityVerified,
		Message: fmt.Sprintf("requested by node %q for %s", node.Name, sanSummary(req.x509))}
}

// Initialized reports whether talos-ccm has initialized node (the uninitialized
// taint is gone).
func Initialized(node *corev1.Node) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == names.UninitializedTaint {
			return false
		}
	}
	return true
}

// singlePEMBlock returns the DER of the only PEM block of b, or why b is not one
// headerless CERTIFICATE REQUEST block surrounded by nothing but whitespace.
// (pem.Decode alone silently skips text before the block and ignores what follows.)
func singlePEMBlock(b []byte) ([]byte, string) {
	trimmed := bytes.TrimSpace(b)
	if !bytes.HasPrefix(trimmed, []byte("-----BEGIN ")) {
		return nil, "does not start with a PEM block"
	}
	block, rest := pem.Decode(trimmed)
	switch {
	case block == nil:
		return nil, "no PEM block"
	case block.Type != "CERTIFICATE REQUEST":
		return nil, fmt.Sprintf("block type is %q", clip(block.Type))
	case len(block.Headers) > 0:
		return nil, "PEM headers are not allowed"
	case len(bytes.TrimSpace(rest)) > 0:
		return nil, "data after the first block"
	}
	return block.Bytes, ""
}

func checkKey(pub any) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return ""
		}
		return "ECDSA key on an unsupported curve"
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < 2048 || bits > 8192 {
			return fmt.Sprintf("RSA key of %d bits, must be 2048 to 8192", bits)
		}
		if k.E != 65537 {
			return fmt.Sprintf("RSA public exponent %d, must be 65537", k.E)
		}
		return ""
	case ed25519.PublicKey:
		return ""
	default:
		return fmt.Sprintf("unsupported public key type %T", pub)
	}
}

func countAttr(x *x509.CertificateRequest, oid asn1.ObjectIdentifier) int {
	n := 0
	for _, a := range x.Subject.Names {
		if a.Type.Equal(oid) {
			n++
		}
	}
	return n
}

// checkExtensions allows exactly one extension, subjectAltName, whose names are all
// of a type Go's parser understands (email, DNS, URI, IP). Go silently drops other
// GeneralName types, so they are found here on the raw extension.
func checkExtensions(x *x509.CertificateRequest) (Decision, bool) {
	sans := 0
	for _, ext := range x.Extensions {
		if !ext.Id.Equal(oidExtensionSubjectAltName) {
			return deny(ReasonUnexpectedExtension, "extension %s is not allowed (only subjectAltName)", ext.Id), false
		}
		if sans++; sans > 1 {
			return deny(ReasonUnexpectedExtension, "more than one subjectAltName extension"), false
		}
		var seq asn1.RawValue
		rest, err := asn1.Unmarshal(ext.Value, &seq)
		if err != nil || len(rest) > 0 || seq.Class != asn1.ClassUniversal || seq.Tag != asn1.TagSequence || !seq.IsCompound {
			return deny(ReasonInvalidRequest, "malformed subjectAltName extension"), false
		}
		for names := seq.Bytes; len(names) > 0; {
			var gn asn1.RawValue
			names, err = asn1.Unmarshal(names, &gn)
			if err != nil {
				return deny(ReasonInvalidRequest, "malformed subjectAltName extension"), false
			}
			if gn.Class != asn1.ClassContextSpecific {
				return deny(ReasonUnsupportedSAN, "SAN of class %d is not allowed", gn.Class), false
			}
			switch gn.Tag {
			case sanTagEmail, sanTagDNS, sanTagURI, sanTagIP:
			default:
				return deny(ReasonUnsupportedSAN, "SAN of type %d is not allowed (only DNS names and IP addresses)", gn.Tag), false
			}
		}
	}
	return Decision{}, true
}

func isReservedDNSName(n string) bool { return reservedDNSName(n, "") != "" }

// reservedDNSName says why n names the cluster rather than a node ("" if it
// does not): a name whose first label starts with "kubernetes" (kubernetes,
// kubernetes.default, kubernetes-api.example.com, ...), any name with a label
// starting with "svc" after the first (x.svc, x.ns.svc.cluster.local, ...),
// the cluster domain and every name below it, and localhost.
func reservedDNSName(n, clusterDomain string) string {
	n = strings.ToLower(strings.TrimSuffix(n, "."))
	labels := strings.Split(n, ".")
	switch {
	case strings.HasPrefix(labels[0], "kubernetes"):
		return "a name of the API server (kubernetes*)"
	case n == "localhost" || strings.HasSuffix(n, ".localhost"):
		return "a loopback name"
	}
	for _, l := range labels[1:] {
		if strings.HasPrefix(l, "svc") {
			return "a Service name (*.svc*)"
		}
	}
	if d := strings.ToLower(strings.Trim(clusterDomain, ".")); d != "" && (n == d || strings.HasSuffix(n, "."+d)) {
		return fmt.Sprintf("in the cluster domain %s", d)
	}
	return ""
}

// reservedIP says why ip is never a node's to have in a certificate ("" if
// it may be): loopback, link-local, unspecified, multicast and broadcast
// addresses, and the ranges the cluster reserves (Options.ReservedIPRanges:
// its Service and pod CIDRs).
func reservedIP(ip netip.Addr, reserved []netip.Prefix) string {
	switch {
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "a link-local address"
	case ip.IsUnspecified():
		return "the unspecified address"
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return "a multicast address"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	for _, p := range reserved {
		if p.Contains(ip) {
			return fmt.Sprintf("in the cluster's reserved range %s", p)
		}
	}
	return ""
}

func inRanges(ip netip.Addr, ranges []netip.Prefix) bool {
	for _, p := range ranges {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func underSuffix(name string, suffixes []string) bool {
	for _, s := range suffixes {
		if s != "" && strings.HasSuffix(name, "."+s) && len(name) > len(s)+1 {
			return true
		}
	}
	return false
}

func sanSummary(x *x509.CertificateRequest) string {
	parts := make([]string, 0, len(x.DNSNames)+len(x.IPAddresses))
	for _, n := range x.DNSNames {
		parts = append(parts, "DNS:"+n)
	}
	for _, ip := range x.IPAddresses {
		parts = append(parts, "IP:"+ip.String())
	}
	return clip(strings.Join(parts, ", "))
}

// clip shortens attacker-controlled text that ends up in conditions, events and logs.
func clip(s string) string {
	const max = 128
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}

// clipLong bounds an error chain (which names the machine that answered) in a
// message; it is longer than clip because the interesting part comes last.
func clipLong(s string) string {
	const max = 512
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}

func clipAll(ss []string) []string {
	if len(ss) > 4 {
		ss = append(ss[:4:4], fmt.Sprintf("… %d more", len(ss)-4))
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = clip(s)
	}
	return out
}

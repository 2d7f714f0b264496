package integration

import (
	"context"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	certsv1client "k8s.io/client-go/kubernetes/typed/certificates/v1"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// TestApprovesKubeletRequests: requests exactly like a kubelet's, for an initialized
// node, are approved; events land on the CSR and the Node; the metric counts them.
func TestApprovesKubeletRequests(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	okNode := createNode(t, nodeSpec{name: "ok-1", initialized: true, kubeletIPs: []string{"10.1.0.1"}, kubeletHostname: "ok-1"})
	addrs := csrtest.NewAddresses()
	addrs.Set("ok-1",
		csrtest.InternalIP("10.1.0.1"), csrtest.InternalIP("fd00:1::1"), csrtest.ExternalIP("198.51.100.1"),
		csrtest.Hostname("ok-1"), csrtest.InternalDNS("ok-1.nodes.internal"))
	before := decisions(t, "approve", csr.ReasonNodeIdentityVerified)
	startController(t, approver, nil, addrs)

	kubelet := nodeClient(t, "ok-1")
	ecdsaUsages := func(c *certificatesv1.CertificateSigningRequest) {
		c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	}
	tests := []struct {
		name string
		// req is the PKCS#10 request the kubelet generates.
		req csrtest.Request
		// edit changes the CSR object (usages, expirationSeconds).
		edit func(*certificatesv1.CertificateSigningRequest)
	}{
		{name: "ecdsa", req: csrtest.Request{NodeName: "ok-1", DNSNames: []string{"ok-1"}, IPs: csrtest.Addrs("10.1.0.1", "fd00:1::1")}, edit: ecdsaUsages},
		{name: "rsa", req: csrtest.Request{NodeName: "ok-1", DNSNames: []string{"ok-1", "ok-1.nodes.internal"}, IPs: csrtest.Addrs("10.1.0.1", "198.51.100.1"), Key: csrtest.NewRSAKey(2048)}},
		{name: "ip-only", req: csrtest.Request{NodeName: "ok-1", IPs: csrtest.Addrs("10.1.0.1")}, edit: ecdsaUsages},
		{name: "two-hours", req: csrtest.Request{NodeName: "ok-1", DNSNames: []string{"ok-1"}}, edit: func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.ExpirationSeconds = ptr.To[int32](7200)
		}},
	}
	for _, tt := range tests {
		submit(t, kubelet, "ok-1-"+tt.name, tt.req.MustPEM(), tt.edit)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := waitDecided(t, "ok-1-"+tt.name)
			if got.Spec.Username != "system:node:ok-1" {
				t.Fatalf("spec.username = %q: the API server should have set it from the requester", got.Spec.Username)
			}
			wantCondition(t, got, certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
			ev := waitEvent(t, "CertificateSigningRequest", got, csr.EventReasonApproved)
			if ev.Type != corev1.EventTypeNormal || !strings.Contains(ev.Message, "system:node:ok-1") {
				t.Errorf("CSR event %s %q", ev.Type, ev.Message)
			}
		})
	}
	ev := waitEvent(t, "Node", okNode, csr.EventReasonApproved)
	if ev.Source.Component != names.CSRApprovalController {
		t.Errorf("node event source %q", ev.Source.Component)
	}
	waitCounter(t, "approve", csr.ReasonNodeIdentityVerified, before+float64(len(tests)))
}

// TestDeniesForgedRequests: every forged variant is denied with its reason, and
// nothing else changes: CSRs of other signers, CSRs someone already decided and the
// Nodes keep their resourceVersion.
func TestDeniesForgedRequests(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	ctx := context.Background()
	// Talos reported 10.2.0.1 / fd00:2::1 for web-1 and 10.2.0.2 for web-2; the
	// kubelet of web-1 additionally claims 192.168.2.1 and hostname web-1.kubelet.example.
	web1 := createNode(t, nodeSpec{name: "web-1", initialized: true, kubeletIPs: []string{"10.2.0.1", "192.168.2.1"}, kubeletHostname: "web-1.kubelet.example"})
	web2 := createNode(t, nodeSpec{name: "web-2", initialized: true, kubeletIPs: []string{"10.2.0.2"}, kubeletHostname: "web-2"})
	addrs := csrtest.NewAddresses()
	addrs.Set("web-1", csrtest.InternalIP("10.2.0.1"), csrtest.InternalIP("fd00:2::1"), csrtest.Hostname("web-1"))
	addrs.Set("web-2", csrtest.InternalIP("10.2.0.2"), csrtest.Hostname("web-2"), csrtest.ExternalDNS("web-2.example.com"))

	kubelet1 := nodeClient(t, "web-1")
	ghost := nodeClient(t, "ghost-1")
	mallory, err := userClient("mallory", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	lone, err := userClient("system:node:lone-1") // a node identity outside system:nodes
	if err != nil {
		t.Fatal(err)
	}
	createNode(t, nodeSpec{name: "lone-1", initialized: true, kubeletIPs: []string{"10.2.0.9"}})
	addrs.Set("lone-1", csrtest.InternalIP("10.2.0.9"))

	// Objects that must stay exactly as they are.
	good := csrtest.Request{NodeName: "web-1", DNSNames: []string{"web-1"}, IPs: csrtest.Addrs("10.2.0.1")}
	forgedContent := csrtest.Request{NodeName: "web-2", DNSNames: []string{"web-2", "*.example.com"}, IPs: csrtest.Addrs("10.2.0.2")}
	untouched := []*certificatesv1.CertificateSigningRequest{
		submit(t, kubelet1, "keep-client-signer", csrtest.Request{NodeName: "web-1"}.MustPEM(), func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
		}),
		submit(t, kubelet1, "keep-custom-signer", forgedContent.MustPEM(), func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.SignerName = "example.com/serving"
		}),
	}
	// Someone (an admin) already approved a request that this policy would deny, and
	// denied one it would approve: both decisions stand.
	for name, typ := range map[string]certificatesv1.RequestConditionType{"keep-admin-approved": certificatesv1.CertificateApproved, "keep-admin-denied": certificatesv1.CertificateDenied} {
		r := good
		if typ == certificatesv1.CertificateApproved {
			r = forgedContent
		}
		c := submit(t, kubelet1, name, r.MustPEM(), nil)
		c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: typ, Status: corev1.ConditionTrue, Reason: "AdminDecision", Message: "decided by a human",
		})
		c, err := env.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		untouched = append(untouched, c)
	}

	twoBlocks := append(good.MustPEM(), csrtest.Request{NodeName: "web-1", DNSNames: []string{"web-2"}}.MustPEM()...)
	huge := good
	huge.DNSNames = slices.Repeat([]string{"web-1"}, 3000)
	basicCA, _ := asn1.Marshal(struct{ CA bool }{true})
	otherName := func() pkix.Extension {
		oid, _ := asn1.Marshal(asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 20, 2, 3})
		val, _ := asn1.Marshal("admin@example.com")
		inner, _ := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: val})
		gn, _ := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: append(oid, inner...)})
		dns, _ := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte("web-1")})
		seq, _ := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: append(dns, gn...)})
		return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: seq}
	}()
	with := func(f func(r *csrtest.Request)) []byte {
		r := good
		f(&r)
		return r.MustPEM()
	}
	usages := func(u ...certificatesv1.KeyUsage) func(*certificatesv1.CertificateSigningRequest) {
		return func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Usages = u }
	}
	expires := func(s int32) func(*certificatesv1.CertificateSigningRequest) {
		return func(c *certificatesv1.CertificateSigningRequest) { c.Spec.ExpirationSeconds = &s }
	}

	forged := []struct {
		name string
		// as is the identity that submits (default: web-1's kubelet).
		as kubernetes.Interface
		// request is the PEM spec.request.
		request []byte
		// edit changes the CSR object.
		edit func(*certificatesv1.CertificateSigningRequest)
		// reason is the expected Denied reason.
		reason string
	}{
		{name: "requester-not-a-node", as: mallory, request: good.MustPEM(), reason: csr.ReasonUsernameNotNode},
		{name: "node-outside-group", as: lone, request: csrtest.Request{NodeName: "lone-1", IPs: csrtest.Addrs("10.2.0.9")}.MustPEM(), reason: csr.ReasonNotInNodesGroup},
		{name: "huge-request", request: huge.MustPEM(), reason: csr.ReasonRequestTooLarge},
		{name: "two-pem-blocks", request: twoBlocks, reason: csr.ReasonInvalidPEM},
		{name: "text-around-pem", request: append([]byte("hello\n"), good.MustPEM()...), reason: csr.ReasonInvalidPEM},
		{name: "rsa-1024", request: with(func(r *csrtest.Request) { r.Key = csrtest.NewRSAKey(1024) }), reason: csr.ReasonUnsupportedKey},
		{name: "org-system-masters", request: with(func(r *csrtest.Request) { r.Organization = []string{"system:masters"} }), reason: csr.ReasonOrganizationMismatch},
		{name: "other-nodes-name", request: csrtest.Request{NodeName: "web-2", DNSNames: []string{"web-2"}, IPs: csrtest.Addrs("10.2.0.2")}.MustPEM(), reason: csr.ReasonCommonNameMismatch},
		{name: "cn-not-username", request: with(func(r *csrtest.Request) { r.CommonName = "admin" }), reason: csr.ReasonCommonNameMismatch},
		{name: "extra-client-auth", request: good.MustPEM(), edit: usages(certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth), reason: csr.ReasonDisallowedUsage},
		{name: "no-server-auth", request: good.MustPEM(), edit: usages(certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment), reason: csr.ReasonMissingServerAuth},
		{name: "ten-minutes", request: good.MustPEM(), edit: expires(600), reason: csr.ReasonExpirationOutOfBounds},
		{name: "four-hundred-days", request: good.MustPEM(), edit: expires(400 * 86400), reason: csr.ReasonExpirationOutOfBounds},
		{name: "basic-constraints-ca", request: with(func(r *csrtest.Request) {
			r.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: basicCA}}
		}), reason: csr.ReasonUnexpectedExtension},
		{name: "othername-san", request: with(func(r *csrtest.Request) { r.ExtraExtensions = []pkix.Extension{otherName} }), reason: csr.ReasonUnsupportedSAN},
		{name: "email-san", request: with(func(r *csrtest.Request) { r.Emails = []string{"root@web-1"} }), reason: csr.ReasonEmailSAN},
		{name: "uri-san", request: with(func(r *csrtest.Request) {
			r.URIs = []*url.URL{{Scheme: "spiffe", Host: "cluster.local", Path: "/admin"}}
		}), reason: csr.ReasonURISAN},
		{name: "no-sans", request: with(func(r *csrtest.Request) { r.DNSNames, r.IPs = nil, nil }), reason: csr.ReasonNoSubjectAltNames},
		{name: "wildcard", request: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1", "*.example.com"} }), reason: csr.ReasonWildcardDNSName},
		{name: "kubernetes-name", request: with(func(r *csrtest.Request) { r.DNSNames = []string{"Kubernetes.default.svc"} }), reason: csr.ReasonReservedDNSName},
		{name: "node-does-not-exist", as: ghost, request: csrtest.Request{NodeName: "ghost-1", DNSNames: []string{"ghost-1"}}.MustPEM(), reason: csr.ReasonNodeNotFound},
		{name: "ip-of-other-node", request: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("10.2.0.1", "10.2.0.2") }), reason: csr.ReasonIPAddressNotEstablished},
		{name: "ip-only-wrong-node", request: with(func(r *csrtest.Request) { r.DNSNames, r.IPs = nil, csrtest.Addrs("10.2.0.2") }), reason: csr.ReasonIPAddressNotEstablished},
		{name: "ip-only-kubelet-claimed", request: with(func(r *csrtest.Request) { r.IPs = csrtest.Addrs("192.168.2.1") }), reason: csr.ReasonIPAddressNotEstablished},
		{name: "dns-of-other-node", request: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1", "web-2.example.com"} }), reason: csr.ReasonDNSNameNotEstablished},
		{name: "dns-kubelet-claimed", request: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1.kubelet.example"} }), reason: csr.ReasonDNSNameNotEstablished},
		{name: "dns-trailing-dot", request: with(func(r *csrtest.Request) { r.DNSNames = []string{"web-1."} }), reason: csr.ReasonDNSNameNotEstablished},
	}

	before := map[string]float64{}
	for _, f := range forged {
		before[f.reason] = decisions(t, "deny", f.reason)
	}
	startController(t, approver, nil, addrs)
	for _, f := range forged {
		as := f.as
		if as == nil {
			as = kubelet1
		}
		submit(t, as, "forged-"+f.name, f.request, f.edit)
	}
	wantDenied := map[string]float64{}
	for _, f := range forged {
		t.Run(f.name, func(t *testing.T) {
			got := waitDecided(t, "forged-"+f.name)
			wantCondition(t, got, certificatesv1.CertificateDenied, f.reason)
			ev := waitEvent(t, "CertificateSigningRequest", got, csr.EventReasonDenied)
			if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, f.reason) {
				t.Errorf("event %s %q, want a Warning naming %s", ev.Type, ev.Message, f.reason)
			}
		})
		wantDenied[f.reason]++
	}
	for reason, n := range wantDenied {
		waitCounter(t, "deny", reason, before[reason]+n)
	}
	waitEvent(t, "Node", web1, csr.EventReasonDenied)

	// A request that is fine, submitted last, is still approved: the controller was not
	// disturbed by the forgeries, and by the time it is decided everything before it
	// has been looked at.
	submit(t, kubelet1, "web-1-genuine", good.MustPEM(), nil)
	wantCondition(t, waitDecided(t, "web-1-genuine"), certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)

	for _, want := range untouched {
		got, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.ResourceVersion != want.ResourceVersion || len(got.Status.Conditions) != len(want.Status.Conditions) {
			t.Errorf("CSR %s changed: conditions %+v", want.Name, got.Status.Conditions)
		}
	}
	for _, want := range []*corev1.Node{web1, web2} {
		got, err := env.Client.CoreV1().Nodes().Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.ResourceVersion != want.ResourceVersion {
			t.Errorf("node %s changed", want.Name)
		}
	}
}

// TestAPIServerRejectsUnparsableRequests documents the first line of defence: the
// API server itself refuses a spec.request that is not PEM, not PKCS#10 or not
// self-signed, so those never reach the controller (Validate still denies them; see
// TestValidate).
func TestAPIServerRejectsUnparsableRequests(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	kubelet := nodeClient(t, "web-1")
	good := csrtest.Request{NodeName: "web-1", DNSNames: []string{"web-1"}}.MustPEM()
	block, _ := pem.Decode(good)
	badSig := slices.Clone(block.Bytes)
	badSig[len(badSig)-3] ^= 0xff
	for name, request := range map[string][]byte{
		"garbage":       []byte("definitely not a certificate request"),
		"garbage-der":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte("garbage")}),
		"bad-signature": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: badSig}),
	} {
		obj := csrtest.Object("reject-"+name, request)
		obj.Labels = map[string]string{testLabel: caseLabel(t)}
		_, err := kubelet.CertificatesV1().CertificateSigningRequests().Create(context.Background(), obj, metav1.CreateOptions{})
		if !isInvalid(err) {
			t.Errorf("%s: create error %v, want Invalid", name, err)
		}
	}
}

// TestWaitsForInitialization: a request of a node that talos-ccm has not initialized
// yet stays pending (Retry), and is approved once the node is initialized.
func TestWaitsForInitialization(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	ctx := context.Background()
	createNode(t, nodeSpec{name: "late-1", kubeletIPs: []string{"10.3.0.1"}})
	addrs := csrtest.NewAddresses()
	addrs.Set("late-1", csrtest.InternalIP("10.3.0.1"))
	before := decisions(t, "retry", csr.ReasonNodeNotInitialized)
	startController(t, approver, nil, addrs)

	submit(t, nodeClient(t, "late-1"), "late-1-serving", csrtest.Request{NodeName: "late-1", DNSNames: []string{"late-1"}, IPs: csrtest.Addrs("10.3.0.1")}.MustPEM(), nil)
	waitCounter(t, "retry", csr.ReasonNodeNotInitialized, before+1)
	pending, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, "late-1-serving", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pending.Status.Conditions) != 0 {
		t.Fatalf("request of an uninitialized node was decided: %+v", pending.Status.Conditions)
	}

	// talos-ccm initializes the node: providerID, no taint.
	node, err := env.Client.CoreV1().Nodes().Get(ctx, "late-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Spec.ProviderID = "talos://metal/late-1"
	node.Spec.Taints = nil
	if _, err := env.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantCondition(t, waitDecided(t, "late-1-serving"), certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
}

// TestRetriesWhenTalosAPIUnavailable: when the addresses cannot be read the request
// stays pending; it is approved once they can.
func TestRetriesWhenTalosAPIUnavailable(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	createNode(t, nodeSpec{name: "flaky-1", initialized: true, kubeletIPs: []string{"10.4.0.1"}})
	addrs := csrtest.NewAddresses()
	addrs.Fail("flaky-1", errors.New("talos API: connection refused"))
	before := decisions(t, "retry", csr.ReasonAddressLookupFailed)
	startController(t, approver, nil, addrs)

	submit(t, nodeClient(t, "flaky-1"), "flaky-1-serving", csrtest.Request{NodeName: "flaky-1", IPs: csrtest.Addrs("10.4.0.1")}.MustPEM(), nil)
	waitCounter(t, "retry", csr.ReasonAddressLookupFailed, before+1)
	addrs.Set("flaky-1", csrtest.InternalIP("10.4.0.1"))
	wantCondition(t, waitDecided(t, "flaky-1-serving"), certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
}

// TestAllowLists: --csr-allowed-ip-ranges and --csr-allowed-dns-suffixes admit SANs
// that talos-ccm did not establish, and nothing beyond them.
func TestAllowLists(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	createNode(t, nodeSpec{name: "vip-1", initialized: true, kubeletIPs: []string{"10.5.0.1"}})
	addrs := csrtest.NewAddresses()
	addrs.Set("vip-1", csrtest.InternalIP("10.5.0.1"))
	opts := csr.NewOptions()
	if err := parseFlags(opts, "--csr-allowed-ip-ranges=172.20.0.0/16", "--csr-allowed-dns-suffixes=lb.example.org"); err != nil {
		t.Fatal(err)
	}
	startController(t, approver, opts, addrs)

	kubelet := nodeClient(t, "vip-1")
	submit(t, kubelet, "vip-1-allowed", csrtest.Request{NodeName: "vip-1", DNSNames: []string{"vip-1", "vip-1.lb.example.org"}, IPs: csrtest.Addrs("10.5.0.1", "172.20.3.4")}.MustPEM(), nil)
	submit(t, kubelet, "vip-1-outside-range", csrtest.Request{NodeName: "vip-1", IPs: csrtest.Addrs("172.21.0.1")}.MustPEM(), nil)
	submit(t, kubelet, "vip-1-outside-suffix", csrtest.Request{NodeName: "vip-1", DNSNames: []string{"vip-1.example.org"}}.MustPEM(), nil)
	wantCondition(t, waitDecided(t, "vip-1-allowed"), certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
	wantCondition(t, waitDecided(t, "vip-1-outside-range"), certificatesv1.CertificateDenied, csr.ReasonIPAddressNotEstablished)
	wantCondition(t, waitDecided(t, "vip-1-outside-suffix"), certificatesv1.CertificateDenied, csr.ReasonDNSNameNotEstablished)
}

// TestConcurrentWriters: the approval update conflicts with another writer. If that
// writer decided the request, its decision stands alone; if it changed something
// else, the controller re-reads and still records its own decision.
func TestConcurrentWriters(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	ctx := context.Background()
	createNode(t, nodeSpec{name: "race-1", initialized: true, kubeletIPs: []string{"10.6.0.1"}})
	addrs := csrtest.NewAddresses()
	addrs.Set("race-1", csrtest.InternalIP("10.6.0.1"))

	admin := env.Client.CertificatesV1().CertificateSigningRequests()
	// Just before the controller's first approval update of each CSR, another writer
	// changes it on the API server, so that the controller's update conflicts.
	racer := &racingCSRs{CertificateSigningRequestInterface: approver.CertificatesV1().CertificateSigningRequests(), calls: map[string]int{},
		before: func(name string) {
			c, err := admin.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			switch name {
			case "race-1-admin-denies":
				c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
					Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "AdminDecision", Message: "denied by a human"})
				_, err = admin.UpdateApproval(ctx, name, c, metav1.UpdateOptions{})
			case "race-1-relabelled":
				c.Labels["touched"] = "yes"
				_, err = admin.Update(ctx, c, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Error(err)
			}
		}}
	opts := csr.NewOptions()
	opts.Workers = 1
	startController(t, racingClient{Interface: approver, csrs: racer}, opts, addrs)

	kubelet := nodeClient(t, "race-1")
	good := csrtest.Request{NodeName: "race-1", IPs: csrtest.Addrs("10.6.0.1")}
	submit(t, kubelet, "race-1-admin-denies", good.MustPEM(), nil)
	submit(t, kubelet, "race-1-relabelled", good.MustPEM(), nil)

	relabelled := waitDecided(t, "race-1-relabelled")
	wantCondition(t, relabelled, certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
	if relabelled.Labels["touched"] != "yes" {
		t.Errorf("the other writer's change was lost: labels %v", relabelled.Labels)
	}
	// With one worker, a request submitted now is decided only after the controller
	// finished with the earlier ones.
	submit(t, kubelet, "race-1-barrier", good.MustPEM(), nil)
	waitDecided(t, "race-1-barrier")
	wantCondition(t, waitDecided(t, "race-1-admin-denies"), certificatesv1.CertificateDenied, "AdminDecision")

	// The conditions above are the proof; the counts show the conflict path ran. (A
	// later pass over a stale informer copy may add a conflicting call that changes
	// nothing, so they are lower bounds.)
	if got := racer.count("race-1-admin-denies"); got < 1 {
		t.Errorf("controller sent %d approval updates for the request decided by someone else, want the conflicting one", got)
	}
	if got := racer.count("race-1-relabelled"); got < 2 {
		t.Errorf("controller sent %d approval updates for the relabelled request, want at least 2 (conflict, then success)", got)
	}
}

// racingClient is the approver's real clientset whose CSR approval updates go
// through racingCSRs.
type racingClient struct {
	kubernetes.Interface
	csrs *racingCSRs
}

func (c racingClient) CertificatesV1() certsv1client.CertificatesV1Interface {
	return racingCertificates{CertificatesV1Interface: c.Interface.CertificatesV1(), csrs: c.csrs}
}

type racingCertificates struct {
	certsv1client.CertificatesV1Interface
	csrs *racingCSRs
}

func (c racingCertificates) CertificateSigningRequests() certsv1client.CertificateSigningRequestInterface {
	return c.csrs
}

// racingCSRs runs before(name) once per CSR, right before the first UpdateApproval,
// and counts UpdateApproval calls; everything goes to the real API server.
type racingCSRs struct {
	certsv1client.CertificateSigningRequestInterface
	before func(name string)
	mu     sync.Mutex
	calls  map[string]int
}

func (r *racingCSRs) UpdateApproval(ctx context.Context, name string, c *certificatesv1.CertificateSigningRequest, opts metav1.UpdateOptions) (*certificatesv1.CertificateSigningRequest, error) {
	r.mu.Lock()
	r.calls[name]++
	first := r.calls[name] == 1
	r.mu.Unlock()
	if first {
		r.before(name)
	}
	return r.CertificateSigningRequestInterface.UpdateApproval(ctx, name, c, opts)
}

func (r *racingCSRs) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[name]
}

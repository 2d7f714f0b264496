package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// TestTalosProviderIsTheProof runs node-csr-approval with talos-ccm's real
// AddressSource: the ccm/cloud Provider reading simulated Talos nodes through the
// real machinery client (mTLS, WithNode routing). No test double decides what
// is established; the Nodes carry no cached facts, so every decision reads the
// Talos API.
//
//   - the honest kubelet's request (its Talos addresses, its name) is approved;
//   - an IP that only the kubelet-written provided-node-ip annotation (and the
//     kubelet-written status) names — a second family the machine does not have,
//     or an unreachable address listed before the real one — is not proof;
//   - a node whose provided-node-ip leads to another machine's Talos API is
//     denied for that (NodeIdentityMismatch), naming the machine that answered.
func TestTalosProviderIsTheProof(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Stop)
	metal := func(host string) *runtime.PlatformMetadataSpec {
		return &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: host}
	}
	for _, n := range []struct {
		name  string
		ips   []string // what the endpoint routes to the machine
		addrs []talosnode.Address
	}{
		{"tal-ok-1", []string{"10.80.0.1"}, []talosnode.Address{{Link: "eth0", Prefix: "10.80.0.1/24"}, {Link: "external", Prefix: "203.0.113.81/32"}}},
		{"tal-v6-1", []string{"10.80.0.2"}, []talosnode.Address{{Link: "eth0", Prefix: "10.80.0.2/24"}, {Link: "eth0", Prefix: "fd00:80::2/64"}}},
		{"tal-first-1", []string{"fd00:80::3"}, []talosnode.Address{{Link: "eth0", Prefix: "fd00:80::3/64"}}},
	} {
		if _, err := ep.AddNode(n.name, n.ips, talosnode.Spec{Metadata: metal(n.name), Addresses: n.addrs}); err != nil {
			t.Fatal(err)
		}
	}
	client, err := ep.NewClient(t.TempDir(), talos.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	provider := cloud.New(client, nil, cloud.Options{})

	// The kubelets' provided-node-ip (and status.addresses) as they wrote them.
	createNode(t, nodeSpec{name: "tal-ok-1", initialized: true, kubeletIPs: []string{"10.80.0.1"}, kubeletHostname: "tal-ok-1"})
	// a second family the machine does not have
	createNode(t, nodeSpec{name: "tal-v6-1", initialized: true, kubeletIPs: []string{"10.80.0.2", "fd00:80::99"}})
	// an address no machine answers on, before the real one (of the other
	// family: the kubelet allows one per family)
	createNode(t, nodeSpec{name: "tal-first-1", initialized: true, kubeletIPs: []string{"10.80.9.9", "fd00:80::3"}})
	// another machine's address: tal-ok-1 answers there
	impostor := createNode(t, nodeSpec{name: "tal-impostor-1", initialized: true, kubeletIPs: []string{"10.80.0.1"}})

	startController(t, approver, nil, provider)

	ecdsa := func(c *certificatesv1.CertificateSigningRequest) {
		c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	}
	tests := []struct {
		name    string
		node    string
		req     csrtest.Request
		typ     certificatesv1.RequestConditionType
		reason  string
		message []string // parts of the condition message
	}{
		{name: "honest", node: "tal-ok-1", typ: certificatesv1.CertificateApproved, reason: csr.ReasonNodeIdentityVerified,
			req: csrtest.Request{NodeName: "tal-ok-1", DNSNames: []string{"tal-ok-1"}, IPs: csrtest.Addrs("10.80.0.1", "203.0.113.81")}},
		{name: "honest-v6", node: "tal-v6-1", typ: certificatesv1.CertificateApproved, reason: csr.ReasonNodeIdentityVerified,
			req: csrtest.Request{NodeName: "tal-v6-1", IPs: csrtest.Addrs("10.80.0.2")}},
		{name: "annotation-only-v6", node: "tal-v6-1", typ: certificatesv1.CertificateDenied, reason: csr.ReasonIPAddressNotEstablished,
			req:     csrtest.Request{NodeName: "tal-v6-1", IPs: csrtest.Addrs("10.80.0.2", "fd00:80::99")},
			message: []string{"fd00:80::99"}},
		{name: "annotation-only-first", node: "tal-first-1", typ: certificatesv1.CertificateDenied, reason: csr.ReasonIPAddressNotEstablished,
			req:     csrtest.Request{NodeName: "tal-first-1", IPs: csrtest.Addrs("10.80.9.9")},
			message: []string{"10.80.9.9"}},
		{name: "impostor", node: "tal-impostor-1", typ: certificatesv1.CertificateDenied, reason: csr.ReasonNodeIdentityMismatch,
			req:     csrtest.Request{NodeName: "tal-impostor-1", DNSNames: []string{"tal-impostor-1"}, IPs: csrtest.Addrs("10.80.0.1")},
			message: []string{`"tal-impostor-1"`, "10.80.0.1", `"tal-ok-1"`}},
	}
	for _, tt := range tests {
		submit(t, nodeClient(t, tt.node), "tal-"+tt.name, tt.req.MustPEM(), ecdsa)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := waitDecided(t, "tal-"+tt.name)
			wantCondition(t, got, tt.typ, tt.reason)
			for _, m := range tt.message {
				if !strings.Contains(got.Status.Conditions[0].Message, m) {
					t.Errorf("condition message %q does not name %s", got.Status.Conditions[0].Message, m)
				}
			}
		})
	}
	ev := waitEvent(t, "Node", impostor, csr.EventReasonDenied)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, csr.ReasonNodeIdentityMismatch) {
		t.Errorf("impostor node event %s %q", ev.Type, ev.Message)
	}
	// the decisions came from the Talos API, not from a cache or the Node
	for _, name := range []string{"tal-ok-1", "tal-v6-1", "tal-first-1"} {
		if ep.Node(name).Calls() == 0 {
			t.Errorf("the Talos API of %s was never read", name)
		}
	}
}

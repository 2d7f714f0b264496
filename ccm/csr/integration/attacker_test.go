package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// TestAttackerNodeGetsNoOtherAddresses (security round three, hole 1): root
// on one node makes its Talos API say what it likes about its own links and
// metadata, and its kubelet asks for a serving certificate carrying another
// node's addresses and the cluster's. With talos-ccm's real facts source
// reading the simulated Talos API through the real machinery client, none of
// it is approved, and every refusal says why on the CSR:
//
//   - a kernel link named "external" (`ip link add external type dummy`)
//     carrying the victim's internal and public IPs establishes nothing: only
//     Talos' platform pseudo-link of that name counts;
//   - the victim's public IP added to the attacker's physical eth0 on metal
//     (where public addresses are discovered) is established for both, and so
//     refused naming the victim;
//   - the victim's node name, the kubernetes Service IP, the API server's host
//     and its kubernetes/svc names are never a node's, whatever it says.
func TestAttackerNodeGetsNoOtherAddresses(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	ctx := context.Background()
	// the API server creates the kubernetes Service shortly after it starts
	var svc *corev1.Service
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		svc, err = env.Client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("no kubernetes Service: %v", err)
	}
	serviceIP := svc.Spec.ClusterIP
	const (
		victimIP     = "10.86.0.2"
		victimPublic = "203.0.113.86"
		apiHost      = "api.cluster.example"
	)
	ep := talosnode.StartFor(t)
	metal := func(md runtime.PlatformMetadataSpec) *runtime.PlatformMetadataSpec {
		md.Platform = "metal"
		return &md
	}
	for _, n := range []struct {
		name string
		ip   string
		spec talosnode.Spec
	}{
		{"victim-1", victimIP, talosnode.Spec{Metadata: metal(runtime.PlatformMetadataSpec{Hostname: "victim-1"}),
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: victimIP + "/24"}, {Link: "external", Prefix: victimPublic + "/32"}}}},
		// ip link add external type dummy; ip addr add ... dev external
		{"attacker-1", "10.86.0.1", talosnode.Spec{
			Metadata: metal(runtime.PlatformMetadataSpec{Hostname: "attacker-1", InternalDNS: "victim-1", ExternalDNS: apiHost}),
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.86.0.1/24"},
				{Link: "external", Prefix: victimIP + "/32"}, {Link: "external", Prefix: victimPublic + "/32"}, {Link: "external", Prefix: serviceIP + "/32"}},
			Links: []talosnode.Link{{Name: "external", Kind: "dummy"}}}},
		// ip addr add <victim's public IP> dev eth0
		{"attacker-2", "10.86.0.3", talosnode.Spec{Metadata: metal(runtime.PlatformMetadataSpec{Hostname: "attacker-2"}),
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.86.0.3/24"}, {Link: "eth0", Prefix: victimPublic + "/32"}}}},
	} {
		if _, err := ep.AddNode(n.name, []string{n.ip}, n.spec); err != nil {
			t.Fatal(err)
		}
		createNode(t, nodeSpec{name: n.name, initialized: true, kubeletIPs: []string{n.ip}})
	}
	nodeFacts := facts.NewSource(ep.ClientFor(t), cloud.NewInterpreter(nil), facts.Options{})
	opts := csr.NewOptions()
	opts.APIServer = "https://" + apiHost + ":6443"
	startController(t, approver, opts, nodeFacts)

	// The victim asks first: its addresses are then established for it.
	submit(t, nodeClient(t, "victim-1"), "atk-victim", csrtest.Request{NodeName: "victim-1", DNSNames: []string{"victim-1"},
		IPs: csrtest.Addrs(victimIP, victimPublic)}.MustPEM(), nil)
	wantCondition(t, waitDecided(t, "atk-victim"), certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)

	tests := []struct {
		name    string // CSR name
		node    string // requester
		req     csrtest.Request
		reason  string   // of the denial
		message []string // parts of the condition message
	}{
		{name: "atk-dummy-internal", node: "attacker-1", reason: csr.ReasonIPAddressNotEstablished,
			req: csrtest.Request{NodeName: "attacker-1", IPs: csrtest.Addrs("10.86.0.1", victimIP)}, message: []string{victimIP}},
		{name: "atk-dummy-public", node: "attacker-1", reason: csr.ReasonIPAddressNotEstablished,
			req: csrtest.Request{NodeName: "attacker-1", IPs: csrtest.Addrs(victimPublic)}, message: []string{victimPublic}},
		{name: "atk-service-ip", node: "attacker-1", reason: csr.ReasonClusterAddress,
			req: csrtest.Request{NodeName: "attacker-1", IPs: csrtest.Addrs(serviceIP)}, message: []string{serviceIP, "ServiceCIDR"}},
		{name: "atk-api-host", node: "attacker-1", reason: csr.ReasonClusterAddress,
			req: csrtest.Request{NodeName: "attacker-1", DNSNames: []string{apiHost}}, message: []string{apiHost}},
		{name: "atk-api-name", node: "attacker-1", reason: csr.ReasonReservedDNSName,
			req: csrtest.Request{NodeName: "attacker-1", DNSNames: []string{"kubernetes.default.svc"}}},
		{name: "atk-victim-name", node: "attacker-1", reason: csr.ReasonDNSNameNotEstablished,
			req: csrtest.Request{NodeName: "attacker-1", DNSNames: []string{"victim-1"}}, message: []string{"victim-1"}},
		{name: "atk-shared-public", node: "attacker-2", reason: csr.ReasonAddressOfOtherNode,
			req: csrtest.Request{NodeName: "attacker-2", IPs: csrtest.Addrs(victimPublic)}, message: []string{victimPublic, `"victim-1"`}},
	}
	for _, tt := range tests {
		submit(t, nodeClient(t, tt.node), tt.name, tt.req.MustPEM(), nil)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := waitDecided(t, tt.name)
			wantCondition(t, got, certificatesv1.CertificateDenied, tt.reason)
			for _, m := range tt.message {
				if !strings.Contains(got.Status.Conditions[0].Message, m) {
					t.Errorf("condition message %q does not name %s", got.Status.Conditions[0].Message, m)
				}
			}
			ev := waitEvent(t, "CertificateSigningRequest", got, csr.EventReasonDenied)
			if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, tt.reason) {
				t.Errorf("event %s %q", ev.Type, ev.Message)
			}
		})
	}
}

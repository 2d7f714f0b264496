package integration

import (
	"context"
	"fmt"
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
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// TestTalosProviderIsTheProof runs node-csr-approval with talos-ccm's real
// NodeFacts: the ccm/facts Source (interpreted by ccm/cloud) reading simulated
// Talos nodes through the real machinery client (mTLS, WithNode routing). No test double decides what
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
	ep := talosnode.StartFor(t)
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
	client := ep.ClientFor(t)
	nodeFacts := facts.NewSource(client, cloud.NewInterpreter(nil), facts.Options{})

	// The kubelets' provided-node-ip (and status.addresses) as they wrote them.
	createNode(t, nodeSpec{name: "tal-ok-1", initialized: true, kubeletIPs: []string{"10.80.0.1"}, kubeletHostname: "tal-ok-1"})
	// a second family the machine does not have
	createNode(t, nodeSpec{name: "tal-v6-1", initialized: true, kubeletIPs: []string{"10.80.0.2", "fd00:80::99"}})
	// an address no machine answers on, before the real one (of the other
	// family: the kubelet allows one per family)
	createNode(t, nodeSpec{name: "tal-first-1", initialized: true, kubeletIPs: []string{"10.80.9.9", "fd00:80::3"}})
	// another machine's address: tal-ok-1 answers there
	impostor := createNode(t, nodeSpec{name: "tal-impostor-1", initialized: true, kubeletIPs: []string{"10.80.0.1"}})

	startController(t, approver, nil, nodeFacts)

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

// hostileSetup is a Talos endpoint with a node whose Talos API hangs (held) and
// one whose kubelet lists many addresses, talos-ccm's facts source reading it,
// and the Nodes of both.
type hostileSetup struct {
	ep      *talosnode.Endpoint
	facts   *facts.Source
	hung    *talosnode.Node
	manyIPs *talosnode.Node
}

// Names and addresses of the hostile nodes (tests and benchmark).
const (
	hungNode    = "hostile-hung-1"
	hungIP      = "10.82.0.1"
	manyIPsNode = "hostile-many-1"
	// manyIPs addresses are listed in provided-node-ip; all lead to the machine
	manyIPs = 20
)

func metalSpec(name, ip string) talosnode.Spec {
	return talosnode.Spec{Metadata: &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/16"}}}
}

func startHostile(t testing.TB) *hostileSetup {
	t.Helper()
	ep := talosnode.StartFor(t)
	s := &hostileSetup{ep: ep}
	var err error
	if s.hung, err = ep.AddNode(hungNode, []string{hungIP}, metalSpec(hungNode, hungIP)); err != nil {
		t.Fatal(err)
	}
	s.hung.Hold()
	t.Cleanup(s.hung.Release)
	many := make([]string, manyIPs)
	for i := range many {
		many[i] = fmt.Sprintf("10.82.1.%d", i+1)
	}
	if s.manyIPs, err = ep.AddNode(manyIPsNode, many, metalSpec(manyIPsNode, many[0])); err != nil {
		t.Fatal(err)
	}
	// requests and lookups outlive the test unless released
	client, err := ep.NewClient(t.TempDir(), talos.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	s.facts = facts.NewSource(client, cloud.NewInterpreter(nil), facts.Options{LookupTimeout: time.Hour})
	createNode(t, nodeSpec{name: hungNode, initialized: true, kubeletIPs: []string{hungIP}})
	createNode(t, nodeSpec{name: manyIPsNode, initialized: true, kubeletIPs: many})
	return s
}

// TestHostileNodeDoesNotStallApproval: a kubelet controls its node's
// provided-node-ip, and whoever controls a machine can make its Talos API hang.
// Neither may hold up other nodes' certificates. No clock is asserted: the hung
// node's requests stay in flight (held by the endpoint, with timeouts far longer
// than the test) while every other node's requests are decided, and the hung
// node costs one lookup (and no worker) although it has a request pending for each
// worker. The node listing many addresses is refused without a single dial.
func TestHostileNodeDoesNotStallApproval(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	s := startHostile(t)
	const honestN = 8
	var honest []string
	for i := range honestN {
		name, ip := fmt.Sprintf("honest-%d", i), fmt.Sprintf("10.82.2.%d", i+1)
		if _, err := s.ep.AddNode(name, []string{ip}, metalSpec(name, ip)); err != nil {
			t.Fatal(err)
		}
		createNode(t, nodeSpec{name: name, initialized: true, kubeletIPs: []string{ip}})
		honest = append(honest, name)
	}
	opts := csr.NewOptions()
	startController(t, approver, opts, s.facts)

	// The hung node asks first, once per worker.
	hungReq := csrtest.Request{NodeName: hungNode, DNSNames: []string{hungNode}, IPs: csrtest.Addrs(hungIP)}
	for i := range opts.Workers {
		submit(t, nodeClient(t, hungNode), fmt.Sprintf("%s-%d", hungNode, i), hungReq.MustPEM(), nil)
	}
	const perLookup = 3 // PlatformMetadata, AddressStatus, Nodename
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return s.hung.Held() >= perLookup, nil
	}); err != nil {
		t.Fatalf("the hung node's lookup never reached its Talos API (%d requests held)", s.hung.Held())
	}

	submit(t, nodeClient(t, manyIPsNode), manyIPsNode, csrtest.Request{NodeName: manyIPsNode, IPs: csrtest.Addrs("10.82.1.1")}.MustPEM(), nil)
	for i, name := range honest {
		r := csrtest.Request{NodeName: name, DNSNames: []string{name}, IPs: csrtest.Addrs(fmt.Sprintf("10.82.2.%d", i+1))}
		submit(t, nodeClient(t, name), name, r.MustPEM(), nil)
	}
	for _, name := range honest {
		wantCondition(t, waitDecided(t, name), certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
	}
	got := waitDecided(t, manyIPsNode)
	wantCondition(t, got, certificatesv1.CertificateDenied, csr.ReasonProvidedNodeIPInvalid)
	if msg := got.Status.Conditions[0].Message; !strings.Contains(msg, "20 IPv4") {
		t.Errorf("denial %q does not say what is wrong with the addresses", msg)
	}
	node, err := env.Client.CoreV1().Nodes().Get(context.Background(), manyIPsNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, "Node", node, csr.EventReasonDenied); !strings.Contains(ev.Message, csr.ReasonProvidedNodeIPInvalid) {
		t.Errorf("node event %q", ev.Message)
	}
	if calls := s.manyIPs.Calls(); calls != 0 {
		t.Errorf("the node listing %d addresses was dialled %d times; want none", manyIPs, calls)
	}

	// ... all while the hung node's one lookup is still in flight
	if held, calls := s.hung.Held(), s.hung.Calls(); held != perLookup || calls != perLookup {
		t.Fatalf("hung node: %d requests held, %d made; want exactly one lookup in flight (%d)", held, calls, perLookup)
	}
	for i := range opts.Workers {
		c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), fmt.Sprintf("%s-%d", hungNode, i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if decided(c) != nil {
			t.Fatalf("%s decided without an answer from its Talos API: %+v", c.Name, c.Status.Conditions)
		}
	}

	// Once it answers, its requests (set aside meanwhile) are decided on that one answer.
	s.hung.Release()
	for i := range opts.Workers {
		wantCondition(t, waitDecided(t, fmt.Sprintf("%s-%d", hungNode, i)), certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
	}
	if calls := s.hung.Calls(); calls != perLookup {
		t.Errorf("hung node: %d Talos requests for %d CSRs; want one lookup (%d)", calls, opts.Workers, perLookup)
	}
}

// TestHungNodesHoldNoWorker: more nodes whose Talos API hangs than there are
// workers, each with requests pending, hold up no other node: every honest
// request is decided while each hung node's one lookup is still in flight
// (no clock: the endpoint holds their requests until the test releases them).
// None of the hung nodes' requests is decided without an answer; once a hung
// node answers, its requests are decided on that answer (approved when it
// proves the SANs, denied when it does not). A node whose Talos API fails stays
// pending, with a Warning event on the request saying why.
func TestHungNodesHoldNoWorker(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	ep := talosnode.StartFor(t)
	// requests and lookups outlive the test unless released
	client, err := ep.NewClient(t.TempDir(), talos.Options{Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	src := facts.NewSource(client, cloud.NewInterpreter(nil), facts.Options{LookupTimeout: time.Hour})
	opts := csr.NewOptions()
	hungN, perNode := 3*opts.Workers, 2

	addNode := func(name, ip string) *talosnode.Node {
		n, err := ep.AddNode(name, []string{ip}, metalSpec(name, ip))
		if err != nil {
			t.Fatal(err)
		}
		createNode(t, nodeSpec{name: name, initialized: true, kubeletIPs: []string{ip}})
		return n
	}
	var hung []*talosnode.Node
	for i := range hungN {
		n := addNode(fmt.Sprintf("hung-%02d", i), fmt.Sprintf("10.84.0.%d", i+1))
		n.Hold()
		t.Cleanup(n.Release)
		hung = append(hung, n)
	}
	failing := addNode("failing-1", "10.84.1.1")
	failing.SetUnreachable(true, false)
	const honestN = 8
	var honest []string
	for i := range honestN {
		name := fmt.Sprintf("calm-%d", i)
		addNode(name, fmt.Sprintf("10.84.2.%d", i+1))
		honest = append(honest, name)
	}
	startController(t, approver, opts, src)

	// The hung nodes ask first: the first of them with a request for an
	// address that is not its own, the others honestly.
	hungCSR := func(i, j int) string { return fmt.Sprintf("%s-%d", hung[i].Name, j) }
	for i, n := range hung {
		ip := n.IPs[0]
		if i == 0 {
			ip = "10.84.9.9"
		}
		for j := range perNode {
			submit(t, nodeClient(t, n.Name), hungCSR(i, j), csrtest.Request{NodeName: n.Name, DNSNames: []string{n.Name}, IPs: csrtest.Addrs(ip)}.MustPEM(), nil)
		}
	}
	const perLookup = 3 // PlatformMetadata, AddressStatus, Nodename
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		for _, n := range hung {
			if n.Held() < perLookup {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("not every hung node's lookup reached its Talos API")
	}

	failingCSR := submit(t, nodeClient(t, failing.Name), failing.Name, csrtest.Request{NodeName: failing.Name, IPs: csrtest.Addrs("10.84.1.1")}.MustPEM(), nil)
	for i, name := range honest {
		submit(t, nodeClient(t, name), name, csrtest.Request{NodeName: name, DNSNames: []string{name}, IPs: csrtest.Addrs(fmt.Sprintf("10.84.2.%d", i+1))}.MustPEM(), nil)
	}
	for _, name := range honest {
		wantCondition(t, waitDecided(t, name), certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
	}
	// the failing node: postponed with a reason, not decided
	ev := waitEvent(t, "CertificateSigningRequest", failingCSR, csr.EventReasonPostponed)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, csr.ReasonAddressLookupFailed) || !strings.Contains(ev.Message, failing.Name) {
		t.Errorf("postponement event %s %q", ev.Type, ev.Message)
	}

	// ... all while every hung node's one lookup is still in flight, and none
	// of their requests decided
	for i, n := range hung {
		if held, calls := n.Held(), n.Calls(); held != perLookup || calls != perLookup {
			t.Fatalf("%s: %d requests held, %d made; want exactly one lookup in flight (%d)", n.Name, held, calls, perLookup)
		}
		for j := range perNode {
			c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), hungCSR(i, j), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if decided(c) != nil {
				t.Fatalf("%s decided without an answer from its Talos API: %+v", c.Name, c.Status.Conditions)
			}
		}
	}
	c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), failing.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if decided(c) != nil {
		t.Fatalf("%s decided although its Talos API fails: %+v", c.Name, c.Status.Conditions)
	}

	// Once they answer, their requests are decided on that one answer.
	for _, n := range hung {
		n.Release()
	}
	for i, n := range hung {
		for j := range perNode {
			got := waitDecided(t, hungCSR(i, j))
			if i == 0 {
				wantCondition(t, got, certificatesv1.CertificateDenied, csr.ReasonIPAddressNotEstablished)
			} else {
				wantCondition(t, got, certificatesv1.CertificateApproved, csr.ReasonNodeIdentityVerified)
			}
		}
		if calls := n.Calls(); calls != perLookup {
			t.Errorf("%s: %d Talos requests for %d CSRs; want one lookup (%d)", n.Name, calls, perNode, perLookup)
		}
	}
	c, err = env.Client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), failing.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if decided(c) != nil {
		t.Fatalf("%s decided although its Talos API fails: %+v", c.Name, c.Status.Conditions)
	}
}

package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// Review of issue 38 (attacker: root on one Talos node). These tests assert
// the SECURE outcome; a failure is a finding.

// TestReview38PlatformSpoofDNS: the attacker is a metal node, but its Talos
// API (which root on the node controls) says the platform is "vmware" (or
// "Metal", or anything but exactly "metal"/"nocloud"). The self-served
// metadata rule (DNS names must start with the node name) is keyed on that
// answer, so metadata InternalDNS/ExternalDNS become established for it. With
// talos-ccm reaching the API server by IP (in-cluster 10.96.0.1 or KubePrism
// 127.0.0.1, the Talos default), the cluster endpoint's DNS name is known to
// nothing and approved.
func TestReview38PlatformSpoofDNS(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	ep := talosnode.StartFor(t)
	const endpointName = "kube.cluster.example" // Talos cluster.controlPlane.endpoint host
	for _, n := range []struct{ name, ip, platform, dns string }{
		{"r38-spoof-vmware", "10.87.0.1", "vmware", endpointName},
		{"r38-spoof-upper", "10.87.0.2", "Metal", "vault.corp.example"},
	} {
		if _, err := ep.AddNode(n.name, []string{n.ip}, talosnode.Spec{
			Metadata:  &runtime.PlatformMetadataSpec{Platform: n.platform, Hostname: n.name, InternalDNS: n.dns},
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: n.ip + "/24"}}}); err != nil {
			t.Fatal(err)
		}
		createNode(t, nodeSpec{name: n.name, initialized: true, kubeletIPs: []string{n.ip}})
	}
	nodeFacts := facts.NewSource(ep.ClientFor(t), cloud.NewInterpreter(nil), facts.Options{})
	opts := csr.NewOptions()
	opts.APIServer = "https://127.0.0.1:7445" // KubePrism, what talos-ccm on Talos reaches
	startController(t, approver, opts, nodeFacts)

	submit(t, nodeClient(t, "r38-spoof-vmware"), "r38-spoof-vmware", csrtest.Request{NodeName: "r38-spoof-vmware",
		DNSNames: []string{"r38-spoof-vmware", endpointName}}.MustPEM(), nil)
	submit(t, nodeClient(t, "r38-spoof-upper"), "r38-spoof-upper", csrtest.Request{NodeName: "r38-spoof-upper",
		DNSNames: []string{"r38-spoof-upper", "vault.corp.example"}}.MustPEM(), nil)
	for _, name := range []string{"r38-spoof-vmware", "r38-spoof-upper"} {
		got := waitDecided(t, name)
		c := decided(got)
		t.Logf("%s: %s %s: %s", name, c.Type, c.Reason, c.Message)
		if c.Type == certificatesv1.CertificateApproved {
			t.Errorf("FINDING %s: a node whose Talos API claims a non-self-served platform got a certificate for a foreign DNS name: %s", name, c.Message)
		}
	}
}

// TestReview38ClaimBeforeOwnerInitialized: a new node (victim) has joined but
// talos-ccm has not initialized it yet; its status lists its address. The
// attacker (initialized, metal) adds the victim's public IP to its eth0 and
// asks first: nothing holds the address yet, and the node index only
// postpones for initialized nodes.
func TestReview38ClaimBeforeOwnerInitialized(t *testing.T) {
	setup(t)
	cleanupCSRs(t)
	ep := talosnode.StartFor(t)
	const victimPublic = "198.51.100.77"
	if _, err := ep.AddNode("r38-victim", []string{"10.88.0.2"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "r38-victim"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.88.0.2/24"}, {Link: "eth0", Prefix: victimPublic + "/32"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ep.AddNode("r38-early", []string{"10.88.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "r38-early"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.88.0.1/24"}, {Link: "eth0", Prefix: victimPublic + "/32"}}}); err != nil {
		t.Fatal(err)
	}
	createNode(t, nodeSpec{name: "r38-early", initialized: true, kubeletIPs: []string{"10.88.0.1"}})
	createNode(t, nodeSpec{name: "r38-victim", initialized: false, kubeletIPs: []string{"10.88.0.2", victimPublic}})
	nodeFacts := facts.NewSource(ep.ClientFor(t), cloud.NewInterpreter(nil), facts.Options{})
	opts := csr.NewOptions()
	startController(t, approver, opts, nodeFacts)
	obj := submit(t, nodeClient(t, "r38-early"), "r38-early", csrtest.Request{NodeName: "r38-early",
		IPs: csrtest.Addrs(victimPublic)}.MustPEM(), nil)
	// postponed while the node that lists the address is not initialized
	ev := waitEvent(t, "CertificateSigningRequest", obj, csr.EventReasonPostponed)
	if !strings.Contains(ev.Message, csr.ReasonAddressClaimedByOtherNode) || !strings.Contains(ev.Message, "r38-victim") {
		t.Errorf("postponement event %s %q", ev.Type, ev.Message)
	}
	got, err := approver.CertificatesV1().CertificateSigningRequests().Get(context.Background(), obj.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved {
			t.Errorf("the attacker got a certificate for %s, listed by the not-yet-initialized node r38-victim", victimPublic)
		}
	}
}

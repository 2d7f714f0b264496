package csr

import (
	"context"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

// TestClusterAddresses (security round three, hole 1): the cluster's own
// addresses, as the API server lists them, are never a node's; an API
// server endpoint (and the host talos-ccm reaches it at) only a
// control-plane node's, whose own address it is on Talos.
func TestClusterAddresses(t *testing.T) {
	client := fake.NewClientset(
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12", "fd00:96::/108"}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIP: "172.30.0.1", ClusterIPs: []string{"172.30.0.1"}}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"192.168.1.10"}}}},
	)
	a := newClusterAddresses(client, "https://192.168.1.11:6443")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.run(ctx)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return a.synced(), nil
	}); err != nil {
		t.Fatal("never synced")
	}
	c := &Controller{cluster: a}
	worker := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w"}}
	cp := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp", Labels: map[string]string{controlPlaneLabel: ""}}}
	for _, tt := range []struct {
		ip      string       // the IP SAN
		node    *corev1.Node // the requester
		refused bool         // whether checkCluster refuses it
		because string       // part of the message
	}{
		{ip: "10.96.0.1", node: cp, refused: true, because: "ServiceCIDR kubernetes"},
		{ip: "fd00:96::1", node: worker, refused: true, because: "ServiceCIDR"},
		{ip: "172.30.0.1", node: cp, refused: true, because: "Service default/kubernetes"},
		{ip: "192.168.1.10", node: worker, refused: true, because: "endpoint of the API server"},
		{ip: "192.168.1.10", node: cp},
		{ip: "192.168.1.11", node: worker, refused: true, because: "the host of the API server"},
		{ip: "192.168.1.11", node: cp},
		{ip: "192.168.1.12", node: worker},
	} {
		req := &request{x509: &x509.CertificateRequest{IPAddresses: []net.IP{net.ParseIP(tt.ip)}}}
		d, ok := c.checkCluster(req, tt.node)
		if ok == tt.refused || (tt.refused && (d.Reason != ReasonClusterAddress || !strings.Contains(d.Message, tt.because))) {
			t.Errorf("%s for node %s: %v %+v", tt.ip, tt.node.Name, ok, d)
		}
	}
}

package talos_test

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

func TestIsServiceHost(t *testing.T) {
	for host, want := range map[string]bool{
		"talos.default": true, "talos.default.": true, "TALOS.default": true, "talos.default.svc": true,
		"talos.default.svc.cluster.local": true, "talos": false, "talos.kube-system": false,
		"talos.defaults": false, "10.0.0.1": false, "xtalos.default": false,
	} {
		if got := talos.IsServiceHost(host); got != want {
			t.Errorf("IsServiceHost(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestServiceAddresses(t *testing.T) {
	apid, other := "apid", "metrics"
	p50000, p51000, p9 := int32(50000), int32(51000), int32(9)
	notReady := false
	got := talos.ServiceAddresses(50000,
		&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: &other, Port: &p9}, {Name: &apid, Port: &p51000}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.0.0.2"}}, {Addresses: []string{"10.0.0.1"}},
				{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &notReady}},
				{Addresses: []string{"not-an-ip"}},
			}},
		&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv6,
			Ports: []discoveryv1.EndpointPort{{Port: &p50000}},
			// an IPv4 address written into the IPv6 slice (mapped) is not taken
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00::1", "::ffff:10.0.0.9"}}}},
		nil)
	want := []string{"10.0.0.1:51000", "10.0.0.2:51000", "[fd00::1]:50000"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestClientResolvesTalosServiceThroughAPIServer: with the talosconfig Talos
// writes (endpoint talos.default) and no DNS name for it anywhere, the client
// reaches apid at the ready endpoints of the Service's EndpointSlices, read
// from a real API server, follows them when they change, checks apid's
// certificate for talos.default, and says plainly when there are none.
func TestClientResolvesTalosServiceThroughAPIServer(t *testing.T) {
	if _, err := testenv.AssetsDir(); err != nil {
		t.Skip("no control plane: set KUBEBUILDER_ASSETS=$(hack/control-plane.sh)")
	}
	if !netns.Isolated() {
		t.Skip("needs root: the Service's endpoint address lives in the test's network namespace")
	}
	env, err := testenv.Start(testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kube := env.Client

	ep := talosnode.StartFor(t)
	md := runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "w-1", InstanceID: "7"}
	if _, err := ep.AddNode("w-1", []string{"10.9.0.1"}, talosnode.Spec{Metadata: &md}); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", net.JoinHostPort(apidAddr.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	go ep.Serve(lis)
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	path := filepath.Join(t.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(path, "os:reader", "talos.default:"+port); err != nil {
		t.Fatal(err)
	}
	c, err := talos.New(ctx, talos.Options{ConfigPath: path, Timeout: 2 * time.Second, Kube: kube})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	// No EndpointSlice yet: a clear error, not a DNS failure.
	_, err = c.PlatformMetadata(ctx, "w-1")
	if err == nil || !strings.Contains(err.Error(), "default/talos has no ready endpoint") {
		t.Fatalf("without endpoints: %v", err)
	}

	// Talos' Service and slice, first with an address nobody answers on,
	// then with apid's.
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "talos", Namespace: "default"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "apid", Port: 50000}}}}
	if _, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setSlice(ctx, t, kube, "10.250.0.2", port)
	if _, err := c.PlatformMetadata(ctx, "w-1"); err == nil {
		t.Fatal("reached apid through an endpoint that does not serve it")
	}
	setSlice(ctx, t, kube, apidAddr.String(), port)
	var got *talos.PlatformMetadata
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err = c.PlatformMetadata(ctx, "w-1")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("through the Service's endpoints: %v", err)
	}
	if got.InstanceID != "7" {
		t.Fatalf("metadata %+v", got)
	}

	// A certificate without the Service's name is refused: the name is
	// what TLS checks, not the address dialled.
	if err := ep.WriteClientConfig(path, "os:reader", "talos.default.svc.cluster.local:"+port); err != nil {
		t.Fatal(err)
	}
	c2, err := talos.New(ctx, talos.Options{ConfigPath: path, Timeout: 2 * time.Second, Kube: kube})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c2.Close() }()
	if _, err := c2.PlatformMetadata(ctx, "w-1"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a name apid's certificate does not carry was accepted: %v", err)
	}
}

func setSlice(ctx context.Context, t *testing.T, kube kubernetes.Interface, ip, port string) {
	t.Helper()
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	p, name := int32(n), "apid"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "talos-ipv4", Namespace: "default",
			Labels: map[string]string{"kubernetes.io/service-name": "talos", "provider": "talos", "component": "apid"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &p}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}}},
	}
	cur, err := kube.DiscoveryV1().EndpointSlices("default").Get(ctx, es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = cur.ResourceVersion
		_, err = kube.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = kube.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

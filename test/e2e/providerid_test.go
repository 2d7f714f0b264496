package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// A kubelet registers its Node with whatever providerID it likes. One that
// disagrees with the node's Talos metadata proves nothing: the node stays
// uninitialized (taint, no platform label, nothing of ours written), a Warning
// event names both values, talos_ccm_nodes_providerid_mismatch counts it, its
// serving certificate is not approved, and it is retried until an admin
// resolves it — here by deleting the Node, whose kubelet then registers it
// without the providerID, and it is initialized from Talos.
func TestKubeletChosenProviderIDKeepsNodeUninitialized(t *testing.T) {
	ep := startEndpoint(t)
	if _, err := ep.AddNode("pid-1", []string{"10.70.0.1"}, talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "pid-1", InstanceID: "77", Region: "fsn1", Zone: "fsn1-dc14", InstanceType: "cx22"},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.70.0.1/24"}},
	}); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	p := startTalosCCM(t, talosCCMArgs(t, ep, "--secure-port="+strconv.Itoa(port), "--authorization-always-allow-paths=/healthz,/metrics"))

	const chosen = "aws:///us-east-1a/i-chosen-by-the-kubelet"
	n := kubeletNode("pid-1", "10.70.0.1")
	n.Spec.ProviderID = chosen
	register(t, n)
	kubelet := impersonatingNode(t, "pid-1")
	req := csrtest.Request{NodeName: "pid-1", DNSNames: []string{"pid-1"}, IPs: csrtest.Addrs("10.70.0.1")}
	serving := csrtest.Object("pid-1-serving", req.MustPEM())
	allowCSRs(t, "system:node:pid-1")
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := kubelet.CertificatesV1().CertificateSigningRequests().Create(ctx, serving, metav1.CreateOptions{})
		return err == nil, nil // RBAC takes a moment to apply
	}); err != nil {
		t.Fatal("the kubelet cannot create its CSR")
	}
	t.Cleanup(func() {
		_ = env.Client.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), serving.Name, metav1.DeleteOptions{})
	})

	ev := waitEvent(t, "pid-1", "ProviderIDMismatch", 30*time.Second)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, strconv.Quote(chosen)) || !strings.Contains(ev.Message, `"hcloud://77"`) {
		t.Errorf("event %s %q should be a Warning naming both providerIDs", ev.Type, ev.Message)
	}
	waitMetric(t, port, "talos_ccm_nodes_providerid_mismatch", 1)
	// the approver has looked at the request and postponed it
	waitLog(t, p, `"Postponed kubelet serving CSR" csr="pid-1-serving"`, "reason=\"NodeNotInitialized\"")
	// a retry happened (the event is recorded again, or counted again)
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		evs := eventsFor(t, "pid-1", "ProviderIDMismatch")
		return len(evs) > 0 && evs[0].Count >= 2, nil
	}); err != nil {
		t.Errorf("the node was not retried: %v", err)
	}

	node := waitNode(t, "pid-1", time.Second, func(*corev1.Node) bool { return true })
	if initialized(node) || node.Spec.ProviderID != chosen {
		t.Fatalf("node initialized or providerID changed: taints %v providerID %q", node.Spec.Taints, node.Spec.ProviderID)
	}
	for k := range node.Labels {
		if strings.HasPrefix(k, "node.cloudprovider.kubernetes.io/") || strings.HasPrefix(k, "topology.kubernetes.io/") || strings.HasPrefix(k, "node.kubernetes.io/instance-type") {
			t.Errorf("label %s written on a mismatched node", k)
		}
	}
	if len(node.Status.Addresses) != 1 || node.Status.Addresses[0].Type != corev1.NodeHostName {
		t.Errorf("addresses written on a mismatched node: %v", node.Status.Addresses)
	}
	c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), serving.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Status.Conditions) != 0 {
		t.Fatalf("serving CSR of a mismatched node decided: %+v", c.Status.Conditions)
	}

	// The admin deletes the Node; its kubelet registers it again, without the
	// providerID it had made up.
	if err := env.Client.CoreV1().Nodes().Delete(context.Background(), "pid-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := env.Client.CoreV1().Nodes().Get(ctx, "pid-1", metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Fatal("node not deleted")
	}
	// (no status update: talos-ccm may initialize it at once)
	if _, err := env.Client.CoreV1().Nodes().Create(context.Background(), kubeletNode("pid-1", "10.70.0.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node = waitNode(t, "pid-1", 60*time.Second, initialized)
	if node.Spec.ProviderID != "hcloud://77" || node.Labels[names.PlatformLabel] != "hcloud" {
		t.Fatalf("after re-registration: providerID %q labels %v", node.Spec.ProviderID, node.Labels)
	}
	waitMetric(t, port, "talos_ccm_nodes_providerid_mismatch", 0)
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, serving.Name, metav1.GetOptions{})
		return err == nil && len(c.Status.Conditions) > 0, nil
	}); err != nil {
		t.Fatal("serving CSR not decided after the node was initialized")
	}
	c, _ = env.Client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), serving.Name, metav1.GetOptions{})
	if c.Status.Conditions[0].Type != certificatesv1.CertificateApproved {
		t.Fatalf("serving CSR after initialization: %+v", c.Status.Conditions)
	}
}

// allowCSRs lets user create CSRs, as a kubelet may (envtest has no node
// bootstrap RBAC).
func allowCSRs(t *testing.T, user string) {
	t.Helper()
	ctx := context.Background()
	name := "e2e:csr-requester:" + strings.ReplaceAll(user, ":", "-")
	if _, err := env.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
			Verbs: []string{"create", "get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = env.Client.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// impersonatingNode is a client acting as the kubelet of node name.
func impersonatingNode(t *testing.T, name string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + name, Groups: []string{"system:nodes", "system:authenticated"}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// metricValue reads an unlabelled sample from talos-ccm's /metrics.
func metricValue(port int, name string) (float64, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test's own self-signed serving cert
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/metrics", port))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s not exported (HTTP %d)", name, resp.StatusCode)
}

func waitMetric(t *testing.T, port int, name string, want float64) {
	t.Helper()
	var got float64
	var err error
	if perr := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got, err = metricValue(port, name)
		return err == nil && got == want, nil
	}); perr != nil {
		t.Fatalf("%s = %v (%v), want %v", name, got, err, want)
	}
}

// waitLog polls talos-ccm's output for a line containing every part.
func waitLog(t *testing.T, p *process, parts ...string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, line := range strings.Split(p.logs.String(), "\n") {
			ok := true
			for _, part := range parts {
				ok = ok && strings.Contains(line, part)
			}
			if ok {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no log line with %q", parts)
	}
}

package charts_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// TestTalosCCMRunsWithChartRBAC runs the real talos-ccm binary with the
// arguments the chart renders, authenticated as the chart's ServiceAccount (a
// token from the API server), against a simulated Talos node: the chart's RBAC
// is enough for leader election on its lease, delegated authentication of its
// serving port, initializing a node and approving its kubelet serving
// certificate. Only the in-cluster paths are swapped for test files (the
// talosconfig Talos would mount, the rules file, the kubeconfig) and the port
// for a free one.
func TestTalosCCMRunsWithChartRBAC(t *testing.T) {
	env := controlPlane(t)
	ctx := context.Background()
	a := newApplier(t, env)
	o := renderTalosCCM(t, talosCCM.ciValues(t, "multi-cloud"))
	// The Lease too: the chart creates it ahead, talos-ccm may only get and
	// update it.
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Lease"} {
		for _, obj := range o.m.find(kind) {
			if obj.GetAPIVersion() == "talos.dev/v1alpha1" {
				continue
			}
			if _, err := a.Apply(ctx, obj, false); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The ServiceAccount's credentials, as a kubeconfig.
	tok, err := env.Client.CoreV1().ServiceAccounts(releaseNamespace).CreateToken(ctx, "talos-ccm",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	kc.AuthInfos["talos-ccm"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "talos-ccm"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	// A simulated Talos node on hcloud, and the talosconfig Talos would mount.
	ep := talosnode.StartFor(t)
	const node, nodeIP = "chart-hcloud-1", "10.0.9.10"
	md := runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: node, Region: "fsn1", Zone: "fsn1-dc14",
		InstanceType: "cx22", InstanceID: "4711", ProviderID: "hcloud://4711"}
	if _, err := ep.AddNode(node, []string{nodeIP}, talosnode.Spec{Metadata: &md,
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: nodeIP + "/24"}}}); err != nil {
		t.Fatal(err)
	}
	talosconfig := filepath.Join(dir, "talosconfig")
	if err := ep.WriteClientConfig(talosconfig, "os:reader"); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	o.m.one(t, "ConfigMap", "talos-ccm", &cm)
	rules := filepath.Join(dir, "transformations.yaml")
	if err := os.WriteFile(rules, []byte(cm.Data["transformations.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}

	// The chart's args, in-cluster paths swapped.
	args := []string{"--kubeconfig=" + kubeconfig, "--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig}
	for _, arg := range o.container.Args {
		switch flag, _, _ := strings.Cut(arg, "="); flag {
		case "--talosconfig":
			arg = "--talosconfig=" + talosconfig
		case "--cloud-config":
			arg = "--cloud-config=" + rules
		case "--secure-port":
			arg = "--secure-port=" + strconv.Itoa(freePort(t))
		}
		args = append(args, arg)
	}
	logs := &testenv.Buffer{}
	cmd := exec.Command(talosCCMBinary(t), args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("talos-ccm logs:\n%s", tail(logs.String(), 8000))
		}
	})

	// The kubelet registers the node.
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node,
			Labels:      map[string]string{corev1.LabelHostname: node},
			Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: nodeIP}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}
	if _, err := env.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })

	var got *corev1.Node
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-done:
			t.Fatalf("talos-ccm exited")
		default:
		}
		got, err = env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && got.Spec.ProviderID != "" && len(got.Spec.PodCIDRs) > 0 && !hasTaint(got, cloudproviderapi.TaintExternalCloudProvider), nil
	}); err != nil {
		t.Fatalf("node not initialized with the chart's RBAC: %+v", got)
	}
	if got.Spec.ProviderID != "hcloud://4711" || got.Labels[names.PlatformLabel] != "hcloud" ||
		got.Labels["node.cloudprovider.kubernetes.io/clustername"] != "prod-eu" {
		t.Errorf("node: providerID %q labels %v", got.Spec.ProviderID, got.Labels)
	}

	// Its lease, under the chart's name.
	lease, err := env.Client.CoordinationV1().Leases(releaseNamespace).Get(ctx, "talos-ccm-prod", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Errorf("lease kube-system/talos-ccm-prod: %v %+v", err, lease)
	}

	// The kubelet asks for its serving certificate; talos-ccm approves it.
	nodeCfg, err := env.AddUser("system:node:"+node, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	// Real clusters let nodes create CSRs through the Node authorizer; the test
	// API server runs RBAC only, so bind the node to the bootstrap role.
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test:" + node + ":csr"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:node:" + node}},
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
	})
	nodeClient, err := kubernetes.NewForConfig(nodeCfg)
	if err != nil {
		t.Fatal(err)
	}
	var csr *certificatesv1.CertificateSigningRequest
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		csr, err = nodeClient.CertificatesV1().CertificateSigningRequests().Create(ctx, servingCSR(t, node, nodeIP), metav1.CreateOptions{})
		return err == nil, nil // the binding reaches the authorizer shortly
	}); err != nil {
		t.Fatalf("create CSR as the node: %v", err)
	}
	t.Cleanup(func() {
		_ = env.Client.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), csr.Name, metav1.DeleteOptions{})
	})
	var conds []certificatesv1.CertificateSigningRequestCondition
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds = c.Status.Conditions
		return len(conds) > 0, nil
	}); err != nil {
		t.Fatalf("CSR %s not decided", csr.Name)
	}
	if conds[0].Type != certificatesv1.CertificateApproved {
		t.Errorf("CSR conditions %+v, want Approved", conds)
	}
	if strings.Contains(logs.String(), "forbidden") {
		t.Errorf("talos-ccm was refused something:\n%s", grepLines(logs.String(), "forbidden"))
	}
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// servingCSR is what a kubelet with rotate-server-certificates submits.
func servingCSR(t *testing.T, node, ip string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:    []string{node},
		IPAddresses: []net.IP{net.ParseIP(ip)},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeletServingSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		},
	}
}

var (
	binaryOnce sync.Once
	binaryDir  string
	binaryPath string
	binaryErr  error
)

// talosCCMBinary builds cmd/talos-ccm once for the package.
func talosCCMBinary(t *testing.T) string {
	t.Helper()
	binaryOnce.Do(func() {
		if binaryDir, binaryErr = os.MkdirTemp("", "hybrid-ccm-talos-ccm-"); binaryErr != nil {
			return
		}
		// The run's build (test/testbin), or built into binaryDir.
		binaryPath, binaryErr = testbin.Dev(binaryDir, "talos-ccm")
	})
	if binaryErr != nil {
		t.Fatalf("build talos-ccm: %v", binaryErr)
	}
	return binaryPath
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

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

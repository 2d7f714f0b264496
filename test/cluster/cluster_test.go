package cluster_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/registry"
)

func TestMain(m *testing.M) {
	// The cluster's bridge, routes and iptables rules live in a network
	// namespace of the package's own.
	os.Exit(netns.Main(m.Run))
}

const probeImage = "example.test/hybrid-ccm/probe:v1"

// TestCluster brings a three-node cluster up, runs a pod on every node, and
// checks what a cluster does: the nodes register tainted and become Ready,
// pods run from images pulled from the test's registry with their security
// context enforced, pods reach each other across nodes and the API server
// through its Service, logs and exec work once the kubelets' serving CSRs
// are approved, a rebooted node comes back with its pod; and that Down
// leaves the host as it was.
func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	hosts := t.TempDir()
	c, err := cluster.Up(ctx, cluster.Options{
		Nodes:             []cluster.NodeOptions{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}},
		AllocateNodeCIDRs: true, // no talos-ccm here
		RegistryHosts:     hosts,
		Log:               testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	downed := false
	down := func() {
		if downed {
			return
		}
		downed = true
		if t.Failed() {
			t.Logf("cluster logs:\n%s", c.Logs(4000))
		}
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
	}
	defer down()

	lis, err := net.Listen("tcp", net.JoinHostPort(cluster.Gateway.String(), "5000"))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Start(lis, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if err := reg.WriteHostsDir(hosts, "registry.k8s.io", "example.test"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.PushPause(ctx); err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(t.TempDir(), "probe")
	build := exec.Command("go", "build", "-trimpath", "-o", probe, "./probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, out)
	}
	if _, err := reg.PushBinary(ctx, probeImage, probe, registry.ImageOptions{Path: "/probe", Entrypoint: []string{"/probe"}}); err != nil {
		t.Fatal(err)
	}

	// The kubelets register with the uninitialized taint (external cloud
	// provider) and become Ready once they have pod CIDRs.
	for _, n := range c.Nodes() {
		o := waitNode(t, ctx, c, n.Name, func(o *corev1.Node) bool { return ready(o) })
		if !slices.ContainsFunc(o.Spec.Taints, func(t corev1.Taint) bool { return t.Key == names.UninitializedTaint }) {
			t.Errorf("node %s registered without the uninitialized taint: %v", n.Name, o.Spec.Taints)
		}
	}

	// A pod on every node.
	for _, n := range c.Nodes() {
		if _, err := c.Client.CoreV1().Pods("default").Create(ctx, probePod(n.Name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ips := map[string]string{}
	for _, n := range c.Nodes() {
		p := waitPod(t, ctx, c, "probe-"+n.Name)
		ips[n.Name] = p.Status.PodIP
	}

	// Before its serving certificate is approved, a kubelet cannot serve logs.
	if _, err := c.Client.CoreV1().Pods("default").GetLogs("probe-n1", &corev1.PodLogOptions{}).DoRaw(ctx); err == nil {
		t.Error("logs served before the kubelet's serving CSR was approved")
	}
	approveServingCSRs(t, ctx, c)

	for _, n := range c.Nodes() {
		pod := "probe-" + n.Name
		// logs, through the API server and the kubelet's approved certificate
		var logs string
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			logs, err = c.PodLogs(ctx, "default", pod, "probe")
			return err == nil, nil
		}); err != nil {
			t.Fatalf("kubectl logs %s: %v: %s", pod, err, logs)
		}
		if !strings.Contains(logs, "probe serving on :8080 as "+pod) {
			t.Errorf("logs of %s: %q", pod, logs)
		}
		// exec: the pod on this node asks the pod on the next node (pod
		// network across nodes) ...
		next := c.Nodes()[(slices.Index(c.Nodes(), n)+1)%len(c.Nodes())]
		out, _, err := c.Exec(ctx, "default", pod, "probe", "/probe", "get", "http://"+ips[next.Name]+":8080/")
		if err != nil || out != "probe-"+next.Name {
			t.Errorf("from %s to the pod on %s: %v: %q", pod, next.Name, err, out)
		}
		// ... and the API server through the kubernetes Service (kube-proxy).
		_, errOut, err := c.Exec(ctx, "default", pod, "probe", "/probe", "get", "https://10.96.0.1/healthz")
		if err == nil || !strings.Contains(errOut, "certificate") {
			// a TLS error proves the connection reached the API server: the
			// probe does not trust the cluster CA.
			t.Errorf("from %s to the kubernetes Service: %v: %q", pod, err, errOut)
		}
	}

	// The security context is enforced by runc.
	pod, err := c.Client.CoreV1().Pods("default").Get(ctx, "probe-n2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := c.ContainerProcesses(pod, "probe")
	if err != nil || len(procs) == 0 {
		t.Fatalf("processes of probe-n2: %v %v", procs, err)
	}
	for _, p := range procs {
		if p.UID != 65532 || !p.ReadOnlyRoot || !p.NoNewPrivs || p.CapEff != 0 {
			t.Errorf("probe-n2 process %+v: want uid 65532, read-only root, no new privileges, no capabilities", p)
		}
	}

	// The kubelet gives a pod cluster DNS as Talos configures kubelets: the
	// DNS Service's address and the cluster domain's search path (nothing
	// answers there in this cluster: test/fleet deploys CoreDNS).
	resolv, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/etc/resolv.conf", procs[0].PID))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nameserver " + cluster.DNSServiceIP.String(), "search default.svc." + cluster.ClusterDomain + " svc." + cluster.ClusterDomain + " " + cluster.ClusterDomain} {
		if !slices.Contains(strings.Split(string(resolv), "\n"), want) {
			t.Errorf("resolv.conf of probe-n2 has no line %q:\n%s", want, resolv)
		}
	}
	if cluster.DNSServiceIP.String() != "10.96.0.10" {
		t.Errorf("DNS Service address %s, want the tenth of %s, 10.96.0.10, as Talos chooses it", cluster.DNSServiceIP, cluster.ServiceCIDR)
	}

	// A rebooted node comes back; its pod runs again.
	n3 := c.Node("n3")
	if err := n3.Reboot(ctx); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "probe-n3", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		return p.Status.ContainerStatuses[0].RestartCount > 0 && p.Status.ContainerStatuses[0].Ready, nil
	}); err != nil {
		t.Errorf("probe-n3 did not come back after the reboot: %v", err)
	}

	// The API server restarts; the nodes stay Ready.
	if err := c.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		waitNode(t, ctx, c, n.Name, ready)
	}

	down()
	// Both read under the machine's cluster lock: another cluster (a demo
	// on the same machine) cannot change them in between.
	before, after := c.HostSnapshots()
	if d := diff(before, after); d != "" {
		t.Errorf("the host changed:\n%s", d)
	}
}

func probePod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe-" + node, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: ptr.To(false),
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(65532)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "probe", Image: probeImage, Args: []string{"serve"},
				SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
			}},
		},
	}
}

func approveServingCSRs(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	t.Helper()
	approved := map[string]bool{}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, csr := range list.Items {
			if csr.Spec.SignerName != certificatesv1.KubeletServingSignerName || len(csr.Status.Conditions) > 0 {
				continue
			}
			csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
				Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "approved by the cluster test"})
			if _, err := c.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, &csr, metav1.UpdateOptions{}); err == nil {
				approved[csr.Spec.Username] = true
			}
		}
		return len(approved) >= len(c.Nodes()), nil
	}); err != nil {
		t.Fatalf("serving CSRs approved for %v: %v", approved, err)
	}
}

func ready(o *corev1.Node) bool {
	for _, c := range o.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitNode(t *testing.T, ctx context.Context, c *cluster.Cluster, name string, ok func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var got *corev1.Node
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		o, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = o
		return ok(o), nil
	}); err != nil {
		t.Fatalf("node %s: %v; last seen %+v", name, err, got)
	}
	return got
}

func waitPod(t *testing.T, ctx context.Context, c *cluster.Cluster, name string) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("pod %s not ready: %v; status %+v", name, err, got.Status)
	}
	return got
}

func diff(a, b cluster.HostSnapshot) string {
	var out []string
	for k, v := range a.Sysctls {
		if b.Sysctls[k] != v {
			out = append(out, fmt.Sprintf("sysctl %s: %s → %s", k, v, b.Sysctls[k]))
		}
	}
	for _, l := range []struct {
		what string
		a, b []string
	}{{"cgroups", a.Cgroups, b.Cgroups}, {"mounts", a.Mounts, b.Mounts}, {"interfaces", a.Interfaces, b.Interfaces}, {"routes", a.Routes, b.Routes}, {"processes", a.Processes, b.Processes}} {
		if !slices.Equal(l.a, l.b) {
			out = append(out, fmt.Sprintf("%s: %v → %v", l.what, l.a, l.b))
		}
	}
	return strings.Join(out, "\n")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestRecoverAfterKill kills a process that has a cluster up (SIGKILL: no
// Down runs) and checks that the next cluster's first step, Recover, leaves
// the host as it was before.
func TestRecoverAfterKill(t *testing.T) {
	if os.Getenv("HYBRIDCCM_CLUSTER_HELPER") == "1" {
		t.Skip("the helper runs TestHelperClusterUp only")
	}
	if err := cluster.Recover(); err != nil { // what an earlier run may have left
		t.Fatal(err)
	}
	before, err := cluster.TakeHostSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestHelperClusterUp$", "-test.v")
	cmd.Env = append(os.Environ(), "HYBRIDCCM_CLUSTER_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(seen.String(), "HELPER CLUSTER UP") {
		n, err := out.Read(buf)
		seen.Write(buf[:n])
		if err != nil {
			t.Fatalf("helper ended before its cluster was up: %v\n%s", err, seen.String())
		}
	}
	during, err := cluster.TakeHostSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if diff(before, during) == "" {
		t.Fatal("a cluster is up and the host snapshot shows nothing of it: the check could not fail")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	// The helper's inner process (in its own network namespace) dies of
	// its parent-death signal, a moment later.
	var owner int
	if _, err := fmt.Sscanf(seen.String()[strings.Index(seen.String(), "HELPER CLUSTER UP"):], "HELPER CLUSTER UP %d", &owner); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", owner))
		return err != nil, nil
	}); err != nil {
		t.Fatalf("the helper's process %d outlives its parent", owner)
	}
	if err := cluster.Recover(); err != nil {
		t.Fatal(err)
	}
	after, err := cluster.TakeHostSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	if d := diff(before, after); d != "" {
		t.Errorf("the host changed after Recover:\n%s", d)
	}
}

// TestHelperClusterUp is TestRecoverAfterKill's child: a one-node cluster up,
// then wait to be killed.
func TestHelperClusterUp(t *testing.T) {
	if os.Getenv("HYBRIDCCM_CLUSTER_HELPER") != "1" {
		t.Skip("run by TestRecoverAfterKill")
	}
	c, err := cluster.Up(context.Background(), cluster.Options{Nodes: []cluster.NodeOptions{{Name: "n1"}}, AllocateNodeCIDRs: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = c
	fmt.Println("HELPER CLUSTER UP", os.Getpid())
	select {}
}

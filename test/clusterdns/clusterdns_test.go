// Package clusterdns checks cluster DNS as the fleet deploys it (test/fleet:
// CoreDNS as Talos deploys it at bootstrap) on a real cluster with no CCM at
// all: CoreDNS runs on nodes that are still uninitialized, as its
// tolerations allow, once they have pod networks; pods resolve Services
// through the kube-dns ClusterIP (kube-proxy in each node) from every node;
// a name outside the cluster is answered by nobody beyond the machine.
// Only its tests hold code.
package clusterdns

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
)

var f *fleet.Fleet

// machines: a control plane (whose apid answers for the Talos Service) and
// a worker.
var machines = []fleet.Machine{
	{Name: "metal-cp", Platform: "metal", ControlPlane: true},
	{Name: "metal-1", Platform: "metal"},
}

func TestMain(m *testing.M) {
	os.Exit(netns.Main(func() int {
		if os.Geteuid() != 0 {
			fmt.Fprintln(os.Stderr, "test/clusterdns runs a cluster and needs root")
			return 1
		}
		// Long enough to wait for another cluster of this machine to go
		// down first.
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
		defer cancel()
		// No talos-ccm here: kube-controller-manager gives the pod CIDRs.
		fl, err := fleet.Up(ctx, fleet.Options{Machines: machines, AllocateNodeCIDRs: true, Log: fleetcheck.TimedLog{}})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		f = fl
		code := m.Run()
		if code != 0 {
			fmt.Fprintf(os.Stderr, "cluster logs (tails):\n%s\n", f.Logs(3000))
		}
		if err := f.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "down:", err)
		}
		return code
	}))
}

// TestClusterDNS: with no CCM in the cluster (every node keeps the
// uninitialized taint), CoreDNS's two replicas become ready behind the
// kube-dns Service, run as Talos' Deployment says (non-root, only
// NET_BIND_SERVICE, read-only root, no new privileges), and a pod on every
// node resolves through the Service's ClusterIP: the kubernetes Service,
// the Talos Service (whose ClusterIP leads to a control plane's apid), and
// no name outside the cluster (no forward).
func TestClusterDNS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ready := fleetcheck.WaitClusterDNS(t, ctx, f)
	t.Logf("kube-dns ready endpoints: %v", ready)

	// Nothing initialized the nodes: DNS did not wait for a CCM.
	pods, err := f.Client.CoreV1().Pods(fleet.DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: fleet.DNSPodSelector})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		n, err := f.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == names.UninitializedTaint }) {
			t.Errorf("CoreDNS pod %s runs on %s, which is not tainted uninitialized: %v", p.Name, n.Name, n.Spec.Taints)
		}
	}
	svc, err := f.Client.CoreV1().Services(fleet.DNSNamespace).Get(ctx, fleet.DNSService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != cluster.DNSServiceIP.String() {
		t.Errorf("Service %s: ClusterIP %s, want the kubelets' clusterDNS %s", fleet.DNSService, svc.Spec.ClusterIP, cluster.DNSServiceIP)
	}

	// The kubelets' serving certificates, for exec (no talos-ccm approves
	// them here).
	approveServingCSRs(t, ctx)

	// CoreDNS's security context, as the kernel sees its processes: the
	// image's non-root user binds port 53 with the one capability added.
	for _, p := range pods.Items {
		procs, err := f.ContainerProcesses(&p, fleet.CoreDNS)
		if err != nil || len(procs) == 0 {
			t.Fatalf("processes of %s: %v %v", p.Name, procs, err)
		}
		for _, pr := range procs {
			if pr.UID != 65532 || pr.CapEff != 1<<10 || !pr.ReadOnlyRoot || !pr.NoNewPrivs {
				t.Errorf("%s: process %+v: want uid 65532, only CAP_NET_BIND_SERVICE (1<<10), read-only root, no new privileges", p.Name, pr)
			}
		}
	}

	talosIP, controlPlanes := fleetcheck.TalosAPI(t, ctx, f, machines)
	for _, m := range machines {
		pod := fleetcheck.StartProbe(t, ctx, f, "dns-probe-"+m.Name, m.Name)
		for _, c := range []struct {
			name string
			want string
		}{
			{"kubernetes.default", "10.96.0.1"},
			{"talos.default", talosIP},
			{"talos.default.svc." + cluster.ClusterDomain, talosIP},
		} {
			got, err := fleetcheck.Probe(ctx, f, pod, "lookup", c.name)
			if err != nil || !slices.Equal(got, []string{c.want}) {
				t.Errorf("from %s: %s resolves to %v (%v), want %s", m.Name, c.name, got, err, c.want)
			}
		}
		// The Talos Service's name leads to a control plane's apid: the
		// certificate it presents is that machine's.
		ips, err := fleetcheck.Probe(ctx, f, pod, "cert", "talos.default:50000")
		if err != nil || len(ips) == 0 || !slices.Contains(controlPlanes, ips[0]) {
			t.Errorf("from %s: talos.default:50000 presents a certificate for %v (%v), want a control plane's (%v)", m.Name, ips, err, controlPlanes)
		}
		// No forward: a name outside the cluster resolves to nothing.
		if got, err := fleetcheck.Probe(ctx, f, pod, "lookup", "hybrid-ccm.example.com"); err == nil {
			t.Errorf("from %s: hybrid-ccm.example.com resolves to %v: cluster DNS forwarded a name outside the cluster", m.Name, got)
		} else {
			t.Logf("from %s: %v", m.Name, err)
		}
	}
}

// approveServingCSRs approves every node's kubelet-serving CSR, as the
// cluster's CSR approver would.
func approveServingCSRs(t *testing.T, ctx context.Context) {
	t.Helper()
	approved := map[string]bool{}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := f.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, csr := range list.Items {
			if csr.Spec.SignerName != certificatesv1.KubeletServingSignerName {
				continue
			}
			if len(csr.Status.Conditions) == 0 {
				csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
					Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "approved by test/clusterdns"})
				if _, err := f.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, &csr, metav1.UpdateOptions{}); err != nil {
					continue
				}
			}
			if len(csr.Status.Certificate) > 0 || len(csr.Status.Conditions) > 0 {
				approved[strings.TrimPrefix(csr.Spec.Username, "system:node:")] = true
			}
		}
		return len(approved) >= len(machines), nil
	}); err != nil {
		t.Fatalf("serving CSRs approved for %v: %v", approved, err)
	}
	for _, m := range machines {
		fleetcheck.WaitServingCSR(t, ctx, f, m.Name)
	}
}

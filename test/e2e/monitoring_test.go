package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// ScrapesEnv names the directory TestMonitoringScenario writes its scrapes
// to (test/monitoring sets it and evaluates the alerts and the dashboard on
// them). Unset, the scrapes are checked here and dropped.
const ScrapesEnv = "HYBRID_CCM_SCRAPES"

// scrapeTarget is one /metrics endpoint of a real component.
type scrapeTarget struct {
	job, instance string
	get           func(ctx context.Context) ([]byte, error)
	// stopped: the component has been stopped. Its scrape must fail, and is
	// kept as a failed scrape: <step>_<job>_<instance>.down, holding the
	// error (test/monitoring records up 0 for it, as Prometheus does).
	stopped bool
}

// scraper scrapes its targets, step after step, into dir/<timeline>/ as
// <step>_<job>_<instance>.prom (the text exposition format, as served).
type scraper struct {
	t        *testing.T
	dir      string // "" = keep only the last scrape
	timeline string
	step     int
	targets  []scrapeTarget
	last     map[string]string // job/instance -> last body
}

func (s *scraper) scrape() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tg := range s.targets {
		body, err := tg.get(ctx)
		if tg.stopped {
			if err == nil {
				s.t.Fatalf("scrape %s/%s: it answers, but it was stopped", tg.job, tg.instance)
			}
			s.write(fmt.Sprintf("%03d_%s_%s.down", s.step, tg.job, tg.instance), []byte(err.Error()+"\n"))
			continue
		}
		if err != nil {
			s.t.Fatalf("scrape %s/%s: %v", tg.job, tg.instance, err)
		}
		s.last[tg.job+"/"+tg.instance] = string(body)
		s.write(fmt.Sprintf("%03d_%s_%s.prom", s.step, tg.job, tg.instance), body)
	}
	s.step++
}

// write keeps a scrape as dir/<timeline>/name (nothing without a dir).
func (s *scraper) write(name string, body []byte) {
	s.t.Helper()
	if s.dir == "" {
		return
	}
	p := filepath.Join(s.dir, s.timeline, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(p, body, 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// has reports whether the last scrape of job has a sample line starting
// with prefix (a name and, optionally, the start of its labels).
func (s *scraper) has(job, prefix string) bool {
	for k, body := range s.last {
		if !strings.HasPrefix(k, job+"/") {
			continue
		}
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, prefix) {
				return true
			}
		}
	}
	return false
}

func httpGetter(url string) func(context.Context) ([]byte, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test's own self-signed serving certs
	return func(ctx context.Context) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
		}
		return io.ReadAll(resp.Body)
	}
}

// apiServerAdmissionMetrics is the API server's /metrics, kept to the
// admission-policy families (the fence's alert reads one; the whole page is
// megabytes of series no rule here uses).
func apiServerAdmissionMetrics(ctx context.Context) ([]byte, error) {
	body, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var out strings.Builder
	for _, l := range strings.Split(string(body), "\n") {
		if strings.Contains(l, "apiserver_validating_admission_policy_") {
			out.WriteString(l + "\n")
		}
	}
	return []byte(out.String()), nil
}

// TestMonitoringScenario runs the real talos-ccm and ccm-coordinator against
// the real API server through two timelines and scrapes them (and the API
// server) after every step:
//
//   - calm: nodes initialize, a kubelet's own serving CSR is approved, the pod
//     CIDR pool is large, one talos-ccm leads throughout, the NativeCCM has no
//     nodes (nothing to install, Ready), nobody trips the fence;
//   - trouble: a node whose Talos API does not answer stays uninitialized
//     (and is counted unreachable: apid refused to forward to it), a
//     kubelet asks for a certificate for an address that is not its own
//     (denied), the pool runs out, talos-ccm changes leaders three times, the
//     hcloud NativeCCM is installed but no pod runs (no leader, not Ready),
//     and its CCM's identity tries to delete an aws node (the fence refuses);
//     at its end talos-ccm and the coordinator are stopped: their scrapes
//     fail, their own series go stale, and only the absence alerts
//     (TalosCCMDown, CCMCoordinatorDown) can say so.
//
// test/monitoring evaluates every alert and the dashboard on these scrapes;
// here each timeline's last scrape is checked for the series that say so.
func TestMonitoringScenario(t *testing.T) {
	ctx := context.Background()
	dir := os.Getenv(ScrapesEnv)
	admin, err := controllerClient()
	if err != nil {
		t.Fatal(err)
	}

	// The coordinator, with its chart's RBAC, for both timelines.
	ns, cfg := applyCoordinatorChart(t, admin)
	coordPort := freePort(t)
	coordLogs := &testenv.Buffer{}
	coordArgs := []string{"--kubeconfig=" + kubeconfigFor(t, cfg),
		"--release-namespace=" + ns, "--metrics-addr=127.0.0.1:" + strconv.Itoa(coordPort), "--health-addr=0", "--helm-wait=false",
		"--uninstall-grace-period=1s", "--wait-interval=1s", "--ccm-lease-duration=2s"}
	coord := startProcess(t, "ccm-coordinator", coordLogs, coordArgs...)
	coordTarget := scrapeTarget{job: "ccm-coordinator", instance: "ccm-coordinator-0", get: httpGetter(fmt.Sprintf("http://127.0.0.1:%d/metrics", coordPort))}
	apiTarget := scrapeTarget{job: "apiserver", instance: "apiserver-0", get: apiServerAdmissionMetrics}

	nccm := &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "hcloud"}, Spec: v1alpha1.NativeCCMSpec{Platform: "hcloud"}}
	if err := gate.EnsureGrant(ctx, admin, gate.GrantFor(nccm, ns)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteGrant(context.Background(), admin, "hcloud") })
	if err := admin.Create(ctx, nccm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), nccm) })
	waitNativeCCM(t, admin, func(n *v1alpha1.NativeCCM) bool {
		r := condition(n, "Ready")
		return r != nil && r.Status == metav1.ConditionTrue
	})

	ep := startEndpoint(t)
	addTalosNode := func(name, ip string) {
		t.Helper()
		if _, err := ep.AddNode(name, []string{ip}, talosnode.Spec{
			Metadata:  &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name},
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: ip + "/24"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	talosArgs := func(lease, clusterCIDR, mask string, port int) []string {
		args := talosCCMArgs(t, ep,
			"--secure-port="+strconv.Itoa(port), "--authorization-always-allow-paths=/healthz,/metrics",
			"--controllers=cloud-node,node-csr-approval,node-ipam-controller",
			"--allocate-node-cidrs", "--cidr-allocator-type=RangeAllocator",
			"--cluster-cidr="+clusterCIDR, "--node-cidr-mask-size-ipv4="+mask,
			"--leader-elect-lease-duration=3s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=250ms",
			"--leader-elect-resource-name="+lease)
		for i, a := range args {
			if a == "--leader-elect=false" {
				args[i] = "--leader-elect=true"
			}
		}
		return args
	}
	// startLeader starts talos-ccm process i and waits until it leads and
	// exports the Lease's changes of holder as transitions. A leader reads
	// the Lease only once it leads, so a scrape right after it acquired the
	// Lease may find no gauge yet (a timeline missing its lowest value shows
	// fewer changes than there were); it must never find another value (a
	// gauge exported before the first read, at 0, would be a fall and a
	// rise that never happened).
	startLeader := func(lease, clusterCIDR, mask string, i, transitions int) (*process, scrapeTarget) {
		t.Helper()
		port := freePort(t)
		p := startTalosCCM(t, talosArgs(lease, clusterCIDR, mask, port))
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
			return acquiredLease(p.logs.String(), lease), nil
		}); err != nil {
			t.Fatalf("talos-ccm %d does not lead lease %s", i, lease)
		}
		tg := scrapeTarget{job: "talos-ccm", instance: "talos-ccm-" + strconv.Itoa(i), get: httpGetter(fmt.Sprintf("https://127.0.0.1:%d/metrics", port))}
		want := fmt.Sprintf("talos_ccm_leader_transitions %d", transitions)
		var body []byte
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			b, err := tg.get(ctx)
			if err != nil {
				return false, nil // not serving yet
			}
			body = b
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "talos_ccm_leader_transitions ") {
					if l != want {
						t.Errorf("talos-ccm %d, the Lease's holder changed %d times, exports %q", i, transitions, l)
					}
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			t.Fatalf("talos-ccm %d leads lease %s but does not export %q:\n%s", i, lease, want, body)
		}
		return p, tg
	}
	csr := func(node, name string, ips ...string) {
		t.Helper()
		allowCSRs(t, "system:node:"+node)
		kubelet := impersonatingNode(t, node)
		req := csrtest.Request{NodeName: node, DNSNames: []string{node}, IPs: csrtest.Addrs(ips...)}
		obj := csrtest.Object(name, req.MustPEM())
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := kubelet.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{})
			return err == nil, nil
		}); err != nil {
			t.Fatalf("kubelet of %s cannot create CSR %s", node, name)
		}
		t.Cleanup(func() {
			_ = env.Client.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
			return err == nil && len(c.Status.Conditions) > 0, nil
		}); err != nil {
			t.Fatalf("CSR %s not decided", name)
		}
	}
	// steady scrapes the state as it is, long enough (in the alerts'
	// evaluation, a minute per step) for the for: clauses.
	steady := func(s *scraper, n int) {
		for range n {
			time.Sleep(200 * time.Millisecond)
			s.scrape()
		}
	}

	// --- calm ---
	calmLease := fmt.Sprintf("monitoring-calm-%d", time.Now().UnixNano())
	p, tg := startLeader(calmLease, "10.202.0.0/16", "24", 0, 0)
	calm := &scraper{t: t, dir: dir, timeline: "calm", targets: []scrapeTarget{tg, coordTarget, apiTarget}, last: map[string]string{}}
	calm.scrape()
	for i, ip := range []string{"10.72.0.1", "10.72.0.2"} {
		name := "calm-" + strconv.Itoa(i+1)
		addTalosNode(name, ip)
		registerNode(t, kubeletNode(name, ip), ip)
		waitNode(t, name, 60*time.Second, func(n *corev1.Node) bool { return initialized(n) && len(n.Spec.PodCIDRs) > 0 })
		calm.scrape()
	}
	csr("calm-1", "calm-1-serving", "10.72.0.1")
	steady(calm, 20)
	for _, want := range []string{`talos_ccm_nodes_initialized_total{platform="metal"} 2`, `talos_ccm_csr_decisions_total{decision="approve"`, `talos_ccm_leader_transitions 0`, `talos_ccm_ipam_cidrs_free{pool="10.202.0.0/16"}`} {
		if !calm.has("talos-ccm", want) {
			t.Errorf("calm: talos-ccm's last scrape has no %s:\n%s", want, calm.last["talos-ccm/talos-ccm-0"])
		}
	}
	if calm.has("talos-ccm", "talos_ccm_node_uninitialized{") || calm.has("talos-ccm", "talos_ccm_talos_api_unreachable_lookups_total{") || calm.has("talos-ccm", `talos_ccm_csr_decisions_total{decision="deny"`) {
		t.Errorf("calm: talos-ccm reports uninitialized nodes, unreachable Talos APIs or denials")
	}
	if !calm.has("ccm-coordinator", `gotk_reconcile_condition{kind="NativeCCM",name="hcloud",namespace="",status="True",type="Ready"} 1`) {
		t.Errorf("calm: NativeCCM hcloud not Ready in the coordinator's metrics")
	}
	// the calm talos-ccm and its nodes go before trouble starts
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	for _, n := range []string{"calm-1", "calm-2"} {
		_ = env.Client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
	}

	// --- trouble ---
	lease := fmt.Sprintf("monitoring-trouble-%d", time.Now().UnixNano())
	const pool = "10.203.0.0/29" // two /30s
	p, tg = startLeader(lease, pool, "30", 1, 0)
	trouble := &scraper{t: t, dir: dir, timeline: "trouble", targets: []scrapeTarget{tg, coordTarget, apiTarget}, last: map[string]string{}}
	trouble.scrape()
	// three leader changes: each leader is killed (it cannot release the
	// lease) and the next takes over once the lease expires
	for i := 2; i <= 4; i++ {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		p, tg = startLeader(lease, pool, "30", i, i-1)
		trouble.targets[0] = tg
		trouble.scrape()
	}
	// a quarter of an hour (in the alerts' time) before anything else goes
	// wrong: a counter that appears then is new, not as old as the data
	steady(trouble, 16)
	// three nodes for two CIDRs; a fourth whose Talos API never answers
	for i, ip := range []string{"10.73.0.1", "10.73.0.2", "10.73.0.3"} {
		name := "trouble-" + strconv.Itoa(i+1)
		addTalosNode(name, ip)
		registerNode(t, kubeletNode(name, ip), ip)
		waitNode(t, name, 60*time.Second, initialized)
	}
	registerNode(t, kubeletNode("trouble-stuck", "10.73.0.99"), "10.73.0.99")
	trouble.scrape()
	// a kubelet asks for an address that is not its node's, twice
	csr("trouble-1", "trouble-1-foreign-ip", "10.73.0.1", "10.99.0.1")
	trouble.scrape()
	csr("trouble-2", "trouble-2-foreign-ip", "10.73.0.2", "10.99.0.2")
	trouble.scrape()

	// the hcloud NativeCCM gets a node and credentials: installed, no pod runs
	// (an earlier test of the package may have left it)
	if err := admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hcloud", Namespace: ns}, StringData: map[string]string{"token": "t"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	hn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "trouble-hcloud-1", Labels: map[string]string{names.PlatformLabel: "hcloud"}},
		Spec: corev1.NodeSpec{ProviderID: "hcloud://91"}}
	foreign := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "trouble-aws-1", Labels: map[string]string{names.PlatformLabel: "aws"}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///a/i-91"}}
	for _, n := range []*corev1.Node{hn, foreign} {
		if err := admin.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Delete(context.Background(), n) })
	}
	waitNativeCCM(t, admin, func(n *v1alpha1.NativeCCM) bool {
		h := condition(n, v1alpha1.HealthyCondition)
		return h != nil && h.Status == metav1.ConditionFalse && h.Reason == v1alpha1.NoRunningPodsReason
	})
	trouble.scrape()
	// the native CCM's identity deletes an aws node: the fence refuses (twice)
	ccmCfg, err := env.AddUser("system:serviceaccount:"+ns+":"+nccm.ReleaseName(), "system:serviceaccounts", "system:serviceaccounts:"+ns, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	ccm, err := client.New(ccmCfg, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := ccm.Delete(ctx, foreign, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "hybrid-ccm gate") {
			t.Fatalf("the fence let the hcloud CCM delete an aws node: %v", err)
		}
		trouble.scrape()
	}
	steady(trouble, 20)

	for _, want := range []string{`talos_ccm_node_uninitialized{node="trouble-stuck"} 1`, `talos_ccm_leader_transitions 3`,
		`talos_ccm_talos_api_unreachable_nodes{cause="refused",hop="node"} 1`,
		`talos_ccm_csr_decisions_total{decision="deny"`, `talos_ccm_ipam_exhausted_total{pool="` + pool + `"}`, `talos_ccm_ipam_cidrs_free{pool="` + pool + `"} 0`} {
		if !trouble.has("talos-ccm", want) {
			t.Errorf("trouble: talos-ccm's last scrape has no %s:\n%s", want, trouble.last["talos-ccm/talos-ccm-4"])
		}
	}
	for _, want := range []string{
		`gotk_reconcile_condition{kind="NativeCCM",name="hcloud",namespace="",status="False",type="Healthy"} 1`,
		`gotk_reconcile_condition{kind="NativeCCM",name="hcloud",namespace="",status="False",type="Ready"} 1`,
	} {
		if !trouble.has("ccm-coordinator", want) {
			t.Errorf("trouble: the coordinator's last scrape has no %s", want)
		}
	}
	if !trouble.has("apiserver", "apiserver_validating_admission_policy_check_total{") ||
		!strings.Contains(trouble.last["apiserver/apiserver-0"], `policy="`+gate.DefaultFenceName+`"`) {
		t.Errorf("trouble: the API server counts no check of %s:\n%s", gate.DefaultFenceName, trouble.last["apiserver/apiserver-0"])
	}

	// talos-ccm and the coordinator stop (a crash loop, a node gone, a bad
	// rollout): their targets stay, their scrapes fail. Their own alerts go
	// silent with their series; the absence alerts are what fires.
	for _, pr := range []*process{p, coord} {
		_ = pr.cmd.Process.Signal(syscall.SIGKILL)
		<-pr.done
	}
	trouble.targets[0].stopped, trouble.targets[1].stopped = true, true
	steady(trouble, 10)
	// A coordinator again (not scraped), so that the NativeCCM's finalizer
	// uninstalls its release before the next test of the package.
	startProcess(t, "ccm-coordinator", coordLogs, coordArgs...)
	if err := admin.Delete(ctx, nccm); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		return apierrors.IsNotFound(admin.Get(ctx, client.ObjectKey{Name: nccm.Name}, &v1alpha1.NativeCCM{})), nil
	}); err != nil {
		t.Errorf("NativeCCM hcloud not removed by the restarted coordinator")
	}
	if t.Failed() {
		t.Logf("ccm-coordinator logs:\n%s", tail(coordLogs.String(), 4000))
	}
}

// startProcess runs a binary built by TestMain until the test ends.
func startProcess(t *testing.T, name string, logs io.Writer, args ...string) *process {
	t.Helper()
	p := &process{done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binaries, name), args...)
	p.cmd.Stdout, p.cmd.Stderr = logs, logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

func waitNativeCCM(t *testing.T, c client.Client, cond func(*v1alpha1.NativeCCM) bool) {
	t.Helper()
	var got v1alpha1.NativeCCM
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: "hcloud"}, &got); err != nil {
			return false, nil
		}
		return cond(&got), nil
	}); err != nil {
		t.Fatalf("NativeCCM hcloud: %+v", got.Status.Conditions)
	}
}

func condition(n *v1alpha1.NativeCCM, typ string) *metav1.Condition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// registerNode is register for a talos-ccm already running: its status write
// is retried when talos-ccm changed the node in between.
func registerNode(t *testing.T, n *corev1.Node, statusIPs ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatalf("register node %s: %v", n.Name, err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := env.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: n.Name}}
		for _, ip := range statusIPs {
			cur.Status.Addresses = append(cur.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
		}
		cur.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}
		_, err = env.Client.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("node %s status: %v", n.Name, err)
	}
}

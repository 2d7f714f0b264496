// Package demo runs Hybrid CCM end to end on one machine: a real kube-apiserver
// + etcd, a simulated Talos endpoint with nodes of several platforms speaking the
// real Talos API, and the real talos-ccm process. It registers nodes and
// kubelet-serving CSRs the way kubelets do and shows what happens, live.
//
// It is the engine of `hybridctl demo` (and of the test that runs it). Only
// loopback addresses are used; nothing is downloaded.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// Options configure a demo run.
type Options struct {
	// Out receives the live view (or, non-interactive, a line per change).
	Out io.Writer
	// Interactive redraws a table in place (ANSI); otherwise prints a log.
	Interactive bool
	// BinDir holds the talos-ccm binary.
	BinDir string
	// ExitWhenDone returns once the end state is reached (instead of waiting for
	// ctx to be cancelled, e.g. by Ctrl-C).
	ExitWhenDone bool
	// Timeout bounds the wait for the end state.
	Timeout time.Duration
	// TerminalSize, if set, returns the terminal's width and height; the live
	// view cuts its frame to fit (interactive only).
	TerminalSize func() (width, height int)
}

// simNode is one simulated machine.
type simNode struct {
	name     string
	ip       string
	external string
	md       runtime.PlatformMetadataSpec
	system   *hardware.SystemInformationSpec
}

func fleet() []simNode {
	return []simNode{
		{name: "aws-web-1", ip: "10.1.0.11", external: "198.51.100.11", md: runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "aws-web-1", Region: "eu-central-1", Zone: "eu-central-1a", InstanceType: "m6i.large", InstanceID: "i-0a11", ProviderID: "aws:///eu-central-1a/i-0a11"}},
		{name: "aws-web-2", ip: "10.1.0.12", external: "198.51.100.12", md: runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "aws-web-2", Region: "eu-central-1", Zone: "eu-central-1b", InstanceType: "m6i.large", InstanceID: "i-0a12", ProviderID: "aws:///eu-central-1b/i-0a12", Spot: true}},
		{name: "hcloud-app-1", ip: "10.2.0.11", external: "95.216.0.11", md: runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "hcloud-app-1", Region: "fsn1", Zone: "fsn1-dc14", InstanceType: "cx32", InstanceID: "5101"}, system: &hardware.SystemInformationSpec{Manufacturer: "Hetzner", ProductName: "vServer"}},
		{name: "hcloud-app-2", ip: "10.2.0.12", external: "95.216.0.12", md: runtime.PlatformMetadataSpec{Platform: "hcloud", Hostname: "hcloud-app-2", Region: "nbg1", Zone: "nbg1-dc3", InstanceType: "cx32", InstanceID: "5102"}, system: &hardware.SystemInformationSpec{Manufacturer: "Hetzner", ProductName: "vServer"}},
		{name: "gcp-batch-1", ip: "10.3.0.11", external: "34.0.0.11", md: runtime.PlatformMetadataSpec{Platform: "gcp", Hostname: "gcp-batch-1", Region: "europe-west4", Zone: "europe-west4-a", InstanceType: "e2-standard-4", InstanceID: "7001", ProviderID: "gce://hybrid-demo/europe-west4-a/gcp-batch-1"}},
		{name: "gcp-batch-2", ip: "10.3.0.12", external: "34.0.0.12", md: runtime.PlatformMetadataSpec{Platform: "gcp", Hostname: "gcp-batch-2", Region: "europe-west4", Zone: "europe-west4-b", InstanceType: "e2-standard-4", InstanceID: "7002", ProviderID: "gce://hybrid-demo/europe-west4-b/gcp-batch-2"}},
		{name: "web-metal1", ip: "192.168.10.11", md: runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "web-metal1", Region: "home-dc"}},
		{name: "db-metal1", ip: "192.168.10.12", md: runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "db-metal1", Region: "home-dc"}},
	}
}

// Rules is the transformations file of the demo.
const Rules = `global:
  clusterName: hybrid-demo
transformations:
  - name: web-on-metal
    nodeSelector:
      - matchExpressions:
          - key: platform
            operator: In
            values: [metal]
          - key: hostname
            operator: Regexp
            values: ['^web-']
    labels:
      node-role.kubernetes.io/web: ""
    platformMetadata:
      Zone: rack-1
  - name: hetzner-hardware
    nodeSelector:
      - matchExpressions:
          - key: manufacturer
            operator: In
            values: [Hetzner]
    labels:
      example.com/vendor: '{{ lower .Manufacturer }}'
`

// Run runs the demo until the end state (ExitWhenDone) or until ctx ends; it
// always cleans up what it started.
//
// When ctx is cancelled (Ctrl-C) Run stops whatever it has started so far, in
// reverse order, and returns nil: an interrupted demo is a normal way to end it,
// wherever it was. Its last line says whether everything was cleaned up.
func Run(ctx context.Context, o Options) (err error) {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	// envtest logs through controller-runtime; its lines are not part of the
	// view, and without a logger controller-runtime prints a stack trace.
	ctrllog.SetLogger(logr.Discard())
	v := newView(o.Out, o.Interactive)
	v.size = o.TerminalSize
	// registered first, so it runs last: after every cleanup below
	var cleanupErrs []error
	cleanup := func(what string, f func() error) {
		v.note(what)
		switch err := f(); {
		case errors.Is(err, errKilled): // gone, but say so
			v.note(err.Error())
		case err != nil:
			cleanupErrs = append(cleanupErrs, fmt.Errorf("%s: %w", what, err))
		}
	}
	defer func() {
		interrupted := errors.Is(ctx.Err(), context.Canceled)
		if interrupted && err != nil {
			if !errors.Is(err, context.Canceled) {
				v.note("interrupted while: " + err.Error())
			}
			err = nil
		}
		how := "finished"
		if interrupted {
			how = "stopped"
		}
		if cerr := errors.Join(cleanupErrs...); cerr != nil {
			v.note(fmt.Sprintf("demo %s; cleanup incomplete:\n%v", how, cerr))
			if err == nil {
				err = fmt.Errorf("cleanup: %w", cerr)
			}
			return
		}
		v.note("demo " + how + "; everything it started is stopped and its temporary files are removed")
	}()
	work, err := os.MkdirTemp("", "hybrid-ccm-demo-")
	if err != nil {
		return err
	}
	defer cleanup("removing temporary files ("+work+")", func() error { return os.RemoveAll(work) })

	v.step("starting a real control plane (kube-apiserver + etcd)")
	env, err := testenv.Start(testenv.Options{
		CRDDirectoryPaths: []string{filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "crds")},
	})
	if err != nil {
		return err
	}
	defer cleanup("stopping the control plane (kube-apiserver, etcd)", env.Stop)

	v.step("starting the simulated Talos endpoint (mTLS, COSI API) on loopback")
	ep, err := talosnode.Start()
	if err != nil {
		return err
	}
	defer cleanup("stopping the simulated Talos endpoint", func() error { ep.Stop(); return nil })
	nodes := fleet()
	for _, n := range nodes {
		md := n.md
		addrs := []talosnode.Address{{Link: "eth0", Prefix: n.ip + "/24"}}
		if n.external != "" {
			addrs = append(addrs, talosnode.Address{Link: "external", Prefix: n.external + "/32"})
		}
		if _, err := ep.AddNode(n.name, []string{n.ip}, talosnode.Spec{Metadata: &md, Addresses: addrs, System: n.system}); err != nil {
			return err
		}
	}
	talosconfig := filepath.Join(work, "talosconfig")
	if err := ep.WriteClientConfig(talosconfig, "os:reader"); err != nil {
		return err
	}
	rules := filepath.Join(work, "transformations.yaml")
	if err := os.WriteFile(rules, []byte(Rules), 0o600); err != nil {
		return err
	}

	v.step("starting talos-ccm (cloud-node, node-csr-approval, node-ipam-controller)")
	logPath := filepath.Join(work, "talos-ccm.log")
	stopCCM, err := startProcess(filepath.Join(o.BinDir, "talos-ccm"), logPath,
		"--kubeconfig="+env.KubeconfigPath, "--authentication-kubeconfig="+env.KubeconfigPath,
		"--authorization-kubeconfig="+env.KubeconfigPath, "--talosconfig="+talosconfig,
		"--cloud-config="+rules, "--node-initialized-events", "--leader-elect=false", "--secure-port=0", "--v=2",
		"--allocate-node-cidrs", "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56")
	if err != nil {
		return err
	}
	defer cleanup("stopping talos-ccm", stopCCM)

	v.step("starting ccm-coordinator; NativeCCMs for hcloud, aws, gcp with credentials Secrets")
	stopCoord, err := startProcess(filepath.Join(o.BinDir, "ccm-coordinator"), filepath.Join(work, "ccm-coordinator.log"),
		"--kubeconfig="+env.KubeconfigPath, "--metrics-addr=0", "--health-addr=0", "--helm-wait=false",
		"--uninstall-grace-period=30s", "--wait-interval=2s", "--log-level=info")
	if err != nil {
		return err
	}
	defer cleanup("stopping ccm-coordinator", stopCoord)
	cc, err := controllerClient(env)
	if err != nil {
		return err
	}
	if err := createNativeCCMs(ctx, cc); err != nil {
		return err
	}

	v.step("registering nodes as kubelets do (uninitialized taint, provided-node-ip)")
	cs := env.Client
	for _, n := range nodes {
		if err := registerNode(ctx, cs, n); err != nil {
			return err
		}
	}
	v.step("kubelets request serving certificates (kubelet-serving CSRs, real x509)")
	if err := allowNodeCSRs(ctx, cs); err != nil {
		return err
	}
	for _, n := range nodes {
		if err := submitCSR(ctx, env, n, n.name, []string{n.ip}); err != nil {
			return err
		}
	}
	// an impostor: aws-web-1's credentials asking for hcloud-app-1's address
	if err := submitCSR(ctx, env, nodes[0], "forged-by-aws-web-1", []string{nodes[2].ip}); err != nil {
		return err
	}

	var probes []gateProbe
	deadline := time.After(o.Timeout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := observe(ctx, cs, cc, len(nodes))
		if err != nil {
			return err
		}
		st.probes = probes
		if st.done() && probes == nil {
			v.step("the hcloud CCM's identity tries to delete an aws node (what an ungated Hetzner CCM does)")
			if probes, err = probeGate(ctx, env, cs, "hcloud-app-2", "aws-web-1"); err != nil {
				return err
			}
			st.probes = probes
		}
		v.render(st)
		if st.done() && probes != nil && o.ExitWhenDone {
			v.summary(st)
			return st.Check()
		}
		select {
		case <-ctx.Done():
			v.summary(st)
			return nil
		case <-deadline:
			if o.ExitWhenDone {
				b, _ := os.ReadFile(logPath)
				return fmt.Errorf("end state not reached within %s: %s\n--- talos-ccm log (tail) ---\n%s", o.Timeout, st.pending(), tailString(string(b), 3000))
			}
		case <-tick.C:
		}
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// errKilled marks a process that had to be killed: it is gone, but late.
var errKilled = errors.New("killed")

// startProcess starts bin with its output in logPath; the returned function
// stops it (SIGINT, SIGKILL after 5s) and waits for it. The process is in the
// demo's process group, so a Ctrl-C on the terminal reaches it directly too.
func startProcess(bin, logPath string, args ...string) (func() error, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s not built (run `make build`): %w", bin, err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return func() error {
		defer logf.Close()
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
			return nil
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("%w: %s did not stop within 5s of SIGINT", errKilled, filepath.Base(bin))
		}
	}, nil
}

func registerNode(ctx context.Context, cs kubernetes.Interface, n simNode) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name,
			Labels:      map[string]string{corev1.LabelHostname: n.name, corev1.LabelOSStable: "linux"},
			Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: n.ip}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}
	_, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	return err
}

// allowNodeCSRs lets the system:nodes group create and read CSRs (what the Node
// authorizer and the system:node role allow in a real cluster).
func allowNodeCSRs(ctx context.Context, cs kubernetes.Interface) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "demo:kubelet-csr"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get", "list", "watch"}}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "demo:kubelet-csr"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "system:nodes"}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The RBAC authorizer sees the binding through its informer: wait until
	// the API server itself allows a node to create a CSR.
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: "system:node:demo", Groups: []string{"system:nodes", "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Verb: "create"},
	}}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		res, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return res.Status.Allowed, nil
	})
}

// submitCSR creates a kubelet-serving CSR with node n's identity.
func submitCSR(ctx context.Context, env *testenv.Env, n simNode, csrName string, ips []string) error {
	cfg, err := env.AddUser("system:node:"+n.name, "system:nodes")
	if err != nil {
		return err
	}
	nodeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	pemBytes, err := csrtest.Request{NodeName: n.name, DNSNames: []string{n.name}, IPs: csrtest.Addrs(ips...)}.PEM()
	if err != nil {
		return err
	}
	_, err = nodeClient.CertificatesV1().CertificateSigningRequests().Create(ctx, csrtest.Object(csrName, pemBytes), metav1.CreateOptions{})
	return err
}

// state is what the view shows.
type state struct {
	nodes    []corev1.Node
	csrs     []certificatesv1.CertificateSigningRequest
	natives  []v1alpha1.NativeCCM
	probes   []gateProbe
	expected int
}

func observe(ctx context.Context, cs kubernetes.Interface, cc client.Client, expected int) (*state, error) {
	nl, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	cl, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var ncl v1alpha1.NativeCCMList
	if err := cc.List(ctx, &ncl); err != nil {
		return nil, err
	}
	sort.Slice(ncl.Items, func(i, j int) bool { return ncl.Items[i].Name < ncl.Items[j].Name })
	sort.Slice(nl.Items, func(i, j int) bool { return nl.Items[i].Name < nl.Items[j].Name })
	sort.Slice(cl.Items, func(i, j int) bool { return cl.Items[i].Name < cl.Items[j].Name })
	return &state{nodes: nl.Items, csrs: cl.Items, natives: ncl.Items, expected: expected}, nil
}

func initialized(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == cloudproviderapi.TaintExternalCloudProvider {
			return false
		}
	}
	return n.Spec.ProviderID != ""
}

func csrDecision(c *certificatesv1.CertificateSigningRequest) (string, string) {
	for _, cond := range c.Status.Conditions {
		if cond.Type == certificatesv1.CertificateApproved || cond.Type == certificatesv1.CertificateDenied {
			return string(cond.Type), cond.Reason
		}
	}
	return "Pending", ""
}

func (s *state) counts() (initDone, approved, denied int) {
	for i := range s.nodes {
		if initialized(&s.nodes[i]) && len(s.nodes[i].Spec.PodCIDRs) == 2 {
			initDone++
		}
	}
	for i := range s.csrs {
		switch d, _ := csrDecision(&s.csrs[i]); d {
		case "Approved":
			approved++
		case "Denied":
			denied++
		}
	}
	return
}

func (s *state) done() bool {
	i, a, d := s.counts()
	return i == s.expected && a == s.expected && d == len(s.csrs)-s.expected && s.readyNatives() == len(demoClouds)
}

func nativeReady(n *v1alpha1.NativeCCM) (bool, string) {
	c := apimeta.FindStatusCondition(n.Status.Conditions, "Ready")
	if c == nil {
		return false, "(not reconciled yet)"
	}
	return c.Status == metav1.ConditionTrue, c.Reason + ": " + c.Message
}

func (s *state) readyNatives() int {
	n := 0
	for i := range s.natives {
		if ok, _ := nativeReady(&s.natives[i]); ok && s.natives[i].Status.Release != nil {
			n++
		}
	}
	return n
}

func (s *state) pending() string {
	i, a, d := s.counts()
	return fmt.Sprintf("%d/%d nodes initialized, %d/%d CSRs approved, %d denied, %d/%d native CCMs installed",
		i, s.expected, a, s.expected, d, s.readyNatives(), len(demoClouds))
}

// Check verifies the end state in detail (used by the demo test).
func (s *state) Check() error {
	var errs []error
	for i := range s.nodes {
		n := &s.nodes[i]
		if !initialized(n) || n.Labels["node.cloudprovider.kubernetes.io/platform"] == "" {
			errs = append(errs, fmt.Errorf("node %s not initialized", n.Name))
		}
		if len(n.Spec.PodCIDRs) != 2 {
			errs = append(errs, fmt.Errorf("node %s has pod CIDRs %v, want one per family", n.Name, n.Spec.PodCIDRs))
		}
	}
	for i := range s.csrs {
		c := &s.csrs[i]
		d, reason := csrDecision(c)
		want := "Approved"
		if strings.HasPrefix(c.Name, "forged-") {
			want = "Denied"
		}
		if d != want {
			errs = append(errs, fmt.Errorf("CSR %s: %s (%s), want %s", c.Name, d, reason, want))
		}
	}
	for i := range s.natives {
		n := &s.natives[i]
		if ok, why := nativeReady(n); !ok || n.Status.Release == nil {
			errs = append(errs, fmt.Errorf("NativeCCM %s not installed: %s", n.Name, why))
		}
	}
	if len(s.probes) != 2 || s.probes[0].Allowed || !s.probes[1].Allowed {
		errs = append(errs, fmt.Errorf("gate: want the foreign delete denied and the own dry-run delete allowed, got %+v", s.probes))
	}
	return errors.Join(errs...)
}

// demoClouds are the platforms that get a native CCM (metal has none).
var demoClouds = []struct {
	platform string
	secret   string
	data     map[string]string
}{
	{"aws", "aws-ccm", map[string]string{"access-key-id": "AKIADEMO", "secret-access-key": "demo", "cloud.conf": "[Global]\nRegion=eu-central-1\n"}},
	{"gcp", "gcp-ccm", map[string]string{"credentials.json": "{}", "gce.conf": "[global]\nproject-id=hybrid-demo\n"}},
	{"hcloud", "hcloud", map[string]string{"token": "demo-token"}},
}

func controllerClient(env *testenv.Env) (client.Client, error) {
	sch := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(sch)
	_ = v1alpha1.AddToScheme(sch)
	return client.New(env.Config, client.Options{Scheme: sch})
}

// createNativeCCMs creates, per demo cloud, its credentials Secret (dummy
// values: nothing leaves the machine) and a NativeCCM with install policy Auto.
func createNativeCCMs(ctx context.Context, c client.Client) error {
	for _, d := range demoClouds {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: d.secret, Namespace: "kube-system"}, StringData: d.data}
		if err := c.Create(ctx, sec); err != nil {
			return fmt.Errorf("secret %s: %w", d.secret, err)
		}
		n := &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: d.platform}, Spec: v1alpha1.NativeCCMSpec{Platform: d.platform}}
		if err := c.Create(ctx, n); err != nil {
			return fmt.Errorf("nativeccm %s: %w", d.platform, err)
		}
	}
	return nil
}

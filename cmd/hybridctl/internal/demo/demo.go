// Package demo runs Hybrid CCM end to end on one machine: a real kube-apiserver
// + etcd, a simulated Talos endpoint with nodes of several platforms speaking the
// real Talos API, and the real talos-ccm process. It registers nodes and
// kubelet-serving CSRs the way kubelets do and shows what happens, live.
//
// It is the engine of `hybridctl demo` (and of the test that runs it). Only
// loopback addresses are used; nothing is downloaded.
//
// It runs on the local simulation kit under test/ (testenv, talosnode,
// fakeec2, podrunner, netns), which hybridctl therefore links: nothing here
// or there may import testing (cmd/hybridctl's TestShippedBinaryLinksNoTesting).
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/podrunner"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
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
		o.Timeout = 4 * time.Minute
	}
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	if netns.Isolated() {
		if err := netns.LoopbackUp(); err != nil {
			return err
		}
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

	awsCCM, err := awsCCMBinary()
	if err != nil {
		return err
	}
	v.step("building the ccm-gate image and test/testccm (the stand-in for the upstream hcloud and gcp CCM images) for this machine")
	art, err := buildPodArtifacts(ctx, testenv.RepoRoot())
	if err != nil {
		return err
	}
	if art.cached {
		v.note("  reused from " + art.cacheDir)
	} else {
		v.note("  cached in " + art.cacheDir)
	}
	v.note("  the aws CCM is the upstream one: " + awsCCM)
	images, err := art.images(awsCCM)
	if err != nil {
		return err
	}
	providers, err := cloudProviders()
	if err != nil {
		return err
	}

	v.step("starting a real control plane (kube-apiserver + etcd)")
	env, err := testenv.Start(testenv.Options{
		CRDDirectoryPaths: []string{filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "crds")},
	})
	if err != nil {
		return err
	}
	defer cleanup("stopping the control plane (kube-apiserver, etcd)", env.Stop)
	// what the chart makes for the coordinator before it starts: its own
	// namespace, the ClusterRole it binds each native CCM to and the fence
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nativeNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: %w", nativeNamespace, err)
	}
	if _, err := env.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release.LifecycleClusterRole},
		Rules: release.LifecycleRules()}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("clusterrole %s: %w", release.LifecycleClusterRole, err)
	}
	if _, err := env.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release.LoadBalancerClusterRole},
		Rules: release.LoadBalancerRules()}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("clusterrole %s: %w", release.LoadBalancerClusterRole, err)
	}
	if err := installFence(ctx, env); err != nil {
		return err
	}

	v.step("starting the simulated Talos endpoint (mTLS, COSI API), the fake clouds' API and a fake EC2 API on loopback")
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
	cloud, err := startFakeCloud(providers, nodes)
	if err != nil {
		return err
	}
	defer cleanup("stopping the fake clouds' API", cloud.stop)
	ec2, err := startFakeEC2(nodes)
	if err != nil {
		return err
	}
	defer cleanup("stopping the fake EC2 API", ec2.stop)

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
	coordLog := filepath.Join(work, "ccm-coordinator.log")
	stopCoord, err := startProcess(filepath.Join(o.BinDir, "ccm-coordinator"), coordLog,
		"--kubeconfig="+env.KubeconfigPath, "--metrics-addr=0", "--health-addr=0", "--helm-wait=false",
		"--uninstall-grace-period=30s", "--wait-interval=2s", "--log-level=info", "--gate-image="+art.gateRef)
	if err != nil {
		return err
	}
	defer cleanup("stopping ccm-coordinator", stopCoord)

	v.step("starting the pod runner: the native CCM pods the coordinator installs run as local processes (ccm-gate + the upstream AWS CCM or test/testccm)")
	podsLog := &podLog{}
	if podsLog.f, err = os.Create(filepath.Join(work, "pods.log")); err != nil {
		return err
	}
	defer podsLog.f.Close()
	// its own context: Stop, not Ctrl-C, ends the pods (in order, Pod objects deleted)
	runner, err := podrunner.Start(context.Background(), podrunner.Options{Config: env.Config, Images: images,
		NodeName: "demo-control-plane", Dir: filepath.Join(work, "pods"), Log: podsLog})
	if err != nil {
		return err
	}
	defer cleanup("stopping the native CCM pods", func() error { runner.Stop(); return nil })
	if err := runner.Manage(ctx, nativeNamespace, release.ManagedByLabel+"="+release.ManagedByValue); err != nil {
		return err
	}

	cc, err := controllerClient(env)
	if err != nil {
		return err
	}
	if err := createNativeCCMs(ctx, cc, cloud.url, ec2); err != nil {
		return err
	}
	v.step("creating LoadBalancer Services: shop/web-aws (class hybridccm.io/aws: the upstream AWS CCM, a Classic ELB in the fake EC2), shop/web-hcloud, shop/web-gcp (their classes), shop/web (no class: gcp is the default)")
	if err := createServices(ctx, env.Client); err != nil {
		return err
	}

	v.step("registering nodes as kubelets do (uninitialized taint, provided-node-ip, Ready)")
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
	seen := map[string]bool{} // nodes seen initialized with pod CIDRs
	outage := false
	deadline := time.After(o.Timeout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := observe(ctx, cs, cc, len(nodes))
		if err != nil {
			return err
		}
		st.remember(seen)
		st.probes, st.outage, st.questions = probes, outage, append(cloud.questions(), ec2.questions()...)
		st.lbs = append(cloud.lbs.LoadBalancers(), ec2.loadBalancers()...)
		if st.ready() && probes == nil {
			v.step("the hcloud CCM's identity tries to delete an aws node (what an ungated Hetzner CCM does)")
			if probes, err = probeGate(ctx, env, cs, "hcloud-app-1", "aws-web-1"); err != nil {
				return err
			}
			st.probes = probes
			v.render(st)
			v.step(fmt.Sprintf("outage: %s is powered off; hcloud server of %s is deleted; aws instance of %s is terminated, aws spot instance of %s is stopped (their kubelets stop: NotReady)",
				downMetal, goneHcloud, terminatedAWS, stoppedAWS))
			if err := startOutage(ctx, cs, cloud, ec2); err != nil {
				return err
			}
			outage = true
			continue
		}
		v.render(st)
		if st.done() && o.ExitWhenDone {
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
				c, _ := os.ReadFile(coordLog)
				return fmt.Errorf("end state not reached within %s: %s\n--- talos-ccm log (tail) ---\n%s\n--- ccm-coordinator log (tail) ---\n%s\n--- native CCM pods (tail) ---\n%s",
					o.Timeout, st.pending(), tailString(string(b), 3000), tailString(string(c), 3000), tailString(podsLog.String(), 6000))
			}
		case <-tick.C:
		}
	}
}

// ErrNotRoot is returned by Run when it does not run as root.
var ErrNotRoot = errors.New("the demo needs root: it runs in a network namespace of its own, and the native CCM pods with the pod runner (mount namespaces, chroot, setuid); run it as root, e.g. `sudo make demo`")

// The outage the demo stages once everything runs: which machine goes down how.
const (
	// downMetal is powered off: NotReady, and no cloud's CCM may touch it.
	downMetal = "db-metal1"
	// goneHcloud's server is deleted: the hcloud CCM deletes its node.
	goneHcloud = "hcloud-app-2"
	// terminatedAWS's EC2 instance is terminated: the (real) aws CCM deletes
	// its node.
	terminatedAWS = "aws-web-1"
	// stoppedAWS is stopped, not deleted: the aws CCM taints it shutdown.
	stoppedAWS = "aws-web-2"
)

// awsLoadBalancerCalls are the EC2 calls the AWS CCM makes for a Classic ELB:
// the account's instances (to register the nodes'), the VPC's subnets and
// route tables, zones, and the security groups it creates and opens.
var awsLoadBalancerCalls = map[string]bool{
	"ec2:DescribeInstances(all)": true, "ec2:DescribeSubnets": true, "ec2:DescribeRouteTables": true,
	"ec2:DescribeAvailabilityZones": true, "ec2:DescribeSecurityGroups": true, "ec2:CreateSecurityGroup": true,
	"ec2:AuthorizeSecurityGroupIngress": true, "ec2:RevokeSecurityGroupIngress": true, "ec2:DeleteSecurityGroup": true,
	"ec2:CreateTags": true,
}

// awsCCMManager is the field manager of what the upstream AWS CCM writes (its
// User-Agent): the DeletingNode event it records names it.
const awsCCMManager = "aws-cloud-controller-manager"

// startOutage takes the machines down in the clouds, then makes their nodes
// NotReady (Ready Unknown, as when a kubelet stops posting status), the metal
// one first: a CCM whose view leaked it would see it in the same pass as its
// own node.
func startOutage(ctx context.Context, cs kubernetes.Interface, cloud *fakeCloud, ec2 *fakeEC2) error {
	cloud.deleteServer(goneHcloud)
	if err := ec2.setState(terminatedAWS, fakeec2.Terminated); err != nil {
		return err
	}
	if err := ec2.setState(stoppedAWS, fakeec2.Stopped); err != nil {
		return err
	}
	for _, name := range []string{downMetal, goneHcloud, terminatedAWS, stoppedAWS} {
		if err := setReady(ctx, cs, name, corev1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status."); err != nil {
			return err
		}
	}
	return nil
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
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return err
	}
	return setReady(ctx, cs, n.name, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status")
}

// setReady sets node's Ready condition, as its kubelet (or, for Unknown, the
// node lifecycle controller) would.
func setReady(ctx context.Context, cs kubernetes.Interface, name string, status corev1.ConditionStatus, reason, message string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		cond := corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, Message: message,
			LastHeartbeatTime: now, LastTransitionTime: now}
		if i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady }); i >= 0 {
			n.Status.Conditions[i] = cond
		} else {
			n.Status.Conditions = append(n.Status.Conditions, cond)
		}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
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
	// initialized are the nodes seen initialized with pod CIDRs so far (a
	// node the hcloud CCM deletes stays counted).
	initialized map[string]bool
	// outage is set once the demo took machines down; questions are what the
	// fake clouds were asked.
	outage    bool
	questions []cloudQuestion
	// deleting holds, per node, the DeletingNode event a CCM recorded
	deleting map[string]nodeEvent
	// services are the demo's LoadBalancer Services, lbs the clouds' load
	// balancers
	services []corev1.Service
	lbs      []fakelb.LoadBalancer
}

// nodeEvent is who reported what about a node: the event's source component
// and the field manager that created it (the client's User-Agent: which CCM
// binary).
type nodeEvent struct{ component, manager, message string }

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
	// what a native CCM said when it deleted a node (its event)
	el, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=DeletingNode"})
	if err != nil {
		return nil, err
	}
	deleting := map[string]nodeEvent{}
	for _, e := range el.Items {
		if e.InvolvedObject.Kind == "Node" {
			ev := nodeEvent{component: e.Source.Component, message: e.Message}
			if len(e.ManagedFields) > 0 {
				ev.manager = e.ManagedFields[0].Manager
			}
			deleting[e.InvolvedObject.Name] = ev
		}
	}
	sl, err := cs.CoreV1().Services(shopNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	sort.Slice(sl.Items, func(i, j int) bool { return sl.Items[i].Name < sl.Items[j].Name })
	return &state{nodes: nl.Items, csrs: cl.Items, natives: ncl.Items, expected: expected, deleting: deleting, services: sl.Items}, nil
}

// remember adds the nodes initialized now to seen and keeps seen.
func (s *state) remember(seen map[string]bool) {
	for i := range s.nodes {
		if initialized(&s.nodes[i]) && len(s.nodes[i].Spec.PodCIDRs) == 2 {
			seen[s.nodes[i].Name] = true
		}
	}
	s.initialized = seen
}

func (s *state) node(name string) *corev1.Node {
	for i := range s.nodes {
		if s.nodes[i].Name == name {
			return &s.nodes[i]
		}
	}
	return nil
}

func initialized(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == cloudproviderapi.TaintExternalCloudProvider {
			return false
		}
	}
	return n.Spec.ProviderID != ""
}

func hasShutdownTaint(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cloudproviderapi.TaintNodeShutdown })
}

func nodeReady(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
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
	initDone = len(s.initialized)
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

// ready: every node initialized, every CSR decided, every native CCM running
// and gated. The demo then probes the fence and stages the outage.
func (s *state) ready() bool {
	i, a, d := s.counts()
	return i == s.expected && a == s.expected && d == len(s.csrs)-s.expected && s.readyNatives() == len(demoClouds)
}

// asked is how often provider's cloud was asked about node.
func (s *state) asked(provider, node string) int {
	for _, q := range s.questions {
		if q.Provider == provider && q.Node == node {
			return q.Times
		}
	}
	return 0
}

// outageHandled: the hcloud CCM deleted the gone server's node, the aws CCM
// deleted its terminated instance's node, tainted its stopped instance's node
// and went on to a second pass over its nodes (a third question: each pass
// asks EC2 "exists?" and "shutdown?"). Both CCMs have then seen every NotReady
// node their view holds.
func (s *state) outageHandled() bool {
	if !s.outage || s.node(goneHcloud) != nil || s.node(terminatedAWS) != nil {
		return false
	}
	n := s.node(stoppedAWS)
	return n != nil && hasShutdownTaint(n) && s.asked("aws", stoppedAWS) >= 3
}

func (s *state) done() bool {
	return s.ready() && s.probes != nil && s.outageHandled() && s.servicesServed()
}

// servicesServed: every demo Service has its address from its cloud's load
// balancer, which targets only nodes of that cloud's platform, none of them
// gone.
func (s *state) servicesServed() bool { return len(s.serviceProblems()) == 0 }

func (s *state) serviceProblems() []error {
	var errs []error
	for _, d := range demoServices {
		i := slices.IndexFunc(s.services, func(v corev1.Service) bool { return v.Name == d.name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("Service %s/%s missing", shopNamespace, d.name))
			continue
		}
		ing := s.services[i].Status.LoadBalancer.Ingress
		j := slices.IndexFunc(s.lbs, func(lb fakelb.LoadBalancer) bool { return lb.Service == shopNamespace+"/"+d.name })
		if len(ing) == 0 || j < 0 {
			errs = append(errs, fmt.Errorf("Service %s/%s has no address yet", shopNamespace, d.name))
			continue
		}
		lb := s.lbs[j]
		if addr := ing[0].IP + ing[0].Hostname; lb.Provider != d.cloud || addr != lb.IP {
			errs = append(errs, fmt.Errorf("Service %s/%s: address %s from the %s cloud, want the %s cloud's %s", shopNamespace, d.name, addr, lb.Provider, d.cloud, lb.IP))
		}
		for _, n := range lb.Nodes {
			node := s.node(n)
			if node == nil || node.Labels[names.PlatformLabel] != d.platform {
				errs = append(errs, fmt.Errorf("Service %s/%s: its load balancer targets %s, not a %s node (or gone)", shopNamespace, d.name, n, d.platform))
			}
		}
	}
	if len(s.lbs) != len(demoServices) {
		errs = append(errs, fmt.Errorf("%d load balancers, want one per Service", len(s.lbs)))
	}
	return errs
}

// nativeRunning: Ready (the release is deployed and one of its pods holds
// the lease) and Gated.
func nativeRunning(n *v1alpha1.NativeCCM) bool {
	ok, _ := nativeReady(n)
	return ok && n.Status.Release != nil && n.Status.Leader != nil && apimeta.IsStatusConditionTrue(n.Status.Conditions, v1alpha1.GatedCondition)
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
		if nativeRunning(&s.natives[i]) {
			n++
		}
	}
	return n
}

func (s *state) pending() string {
	i, a, d := s.counts()
	out := fmt.Sprintf("%d/%d nodes initialized, %d/%d CSRs approved, %d denied, %d/%d native CCMs installed, running and gated",
		i, s.expected, a, s.expected, d, s.readyNatives(), len(demoClouds))
	switch {
	case !s.outage:
		out += ", outage not started"
	case s.outageHandled():
		out += fmt.Sprintf("; outage: %s deleted by the hcloud CCM, %s deleted and %s tainted shutdown by the aws CCM, %s left alone",
			goneHcloud, terminatedAWS, stoppedAWS, downMetal)
	default:
		out += "; outage: waiting for the native CCMs"
	}
	served := 0
	for _, lb := range s.lbs {
		if slices.ContainsFunc(s.services, func(v corev1.Service) bool {
			return shopNamespace+"/"+v.Name == lb.Service && len(v.Status.LoadBalancer.Ingress) > 0
		}) {
			served++
		}
	}
	out += fmt.Sprintf("; %d/%d LoadBalancer Services have an address from their cloud", served, len(demoServices))
	return out
}

// Check verifies the end state in detail (used by the demo test).
func (s *state) Check() error {
	var errs []error
	for i := range s.nodes {
		n := &s.nodes[i]
		if !initialized(n) || n.Labels[names.PlatformLabel] == "" {
			errs = append(errs, fmt.Errorf("node %s not initialized", n.Name))
		}
		if len(n.Spec.PodCIDRs) != 2 {
			errs = append(errs, fmt.Errorf("node %s has pod CIDRs %v, want one per family", n.Name, n.Spec.PodCIDRs))
		}
		if n.Name != stoppedAWS && hasShutdownTaint(n) {
			errs = append(errs, fmt.Errorf("node %s has the shutdown taint", n.Name))
		}
	}
	if len(s.initialized) != s.expected {
		errs = append(errs, fmt.Errorf("%d nodes were seen initialized, want %d", len(s.initialized), s.expected))
	}
	for _, f := range fleet() {
		if f.name != goneHcloud && f.name != terminatedAWS && s.node(f.name) == nil {
			errs = append(errs, fmt.Errorf("node %s was deleted", f.name))
		}
	}
	if s.node(goneHcloud) != nil {
		errs = append(errs, fmt.Errorf("node %s (server deleted) is still there", goneHcloud))
	}
	if s.node(terminatedAWS) != nil {
		errs = append(errs, fmt.Errorf("node %s (instance terminated) is still there", terminatedAWS))
	} else if ev := s.deleting[terminatedAWS]; ev.manager != awsCCMManager {
		errs = append(errs, fmt.Errorf("node %s: want its DeletingNode event from the upstream AWS CCM (%s), got %+v", terminatedAWS, awsCCMManager, ev))
	}
	if n := s.node(downMetal); n != nil && nodeReady(n) == corev1.ConditionTrue {
		errs = append(errs, fmt.Errorf("node %s is Ready, want it down", downMetal))
	}
	if n := s.node(stoppedAWS); n == nil || !hasShutdownTaint(n) {
		errs = append(errs, fmt.Errorf("node %s (instance stopped) has no shutdown taint", stoppedAWS))
	}
	// each cloud was asked only about its own NotReady machines (EC2: by
	// instance ID), and the AWS CCM's service controller made only the calls
	// of its Classic ELB (test/aws TestAWSCCMLoadBalancers lists them)
	for _, q := range s.questions {
		if q.Provider == "aws" && (strings.HasPrefix(q.Node, "elasticloadbalancing:") || awsLoadBalancerCalls[q.Node]) {
			continue
		}
		if !(q.Provider == "hcloud" && q.Node == goneHcloud) && !(q.Provider == "aws" && (q.Node == terminatedAWS || q.Node == stoppedAWS)) {
			errs = append(errs, fmt.Errorf("the %s CCM asked its cloud about %s (%d times)", q.Provider, q.Node, q.Times))
		}
	}
	for _, want := range []struct{ provider, node string }{{"hcloud", goneHcloud}, {"aws", terminatedAWS}, {"aws", stoppedAWS}} {
		if s.asked(want.provider, want.node) == 0 {
			errs = append(errs, fmt.Errorf("the %s CCM never asked its cloud about %s", want.provider, want.node))
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
	if len(s.natives) != len(demoClouds) {
		errs = append(errs, fmt.Errorf("%d NativeCCMs, want %d", len(s.natives), len(demoClouds)))
	}
	errs = append(errs, s.serviceProblems()...)
	for i := range s.natives {
		n := &s.natives[i]
		if _, why := nativeReady(n); !nativeRunning(n) {
			errs = append(errs, fmt.Errorf("NativeCCM %s not running and gated: %s", n.Name, why))
		} else if !strings.HasPrefix(n.Status.Leader.Pod, n.Status.Release.Name+"-") {
			errs = append(errs, fmt.Errorf("NativeCCM %s: lease held by %q, not a pod of release %s", n.Name, n.Status.Leader.Pod, n.Status.Release.Name))
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
	// lb: spec.loadBalancers
	lb *v1alpha1.LoadBalancers
}{
	// cloud.conf: added by createNativeCCMs (the fake EC2's address)
	{"aws", "aws-ccm", map[string]string{"access-key-id": "AKIADEMO", "secret-access-key": "demo"}, &v1alpha1.LoadBalancers{Enabled: true}},
	{"gcp", "gcp-ccm", map[string]string{"credentials.json": "{}", "gce.conf": "[global]\nproject-id=hybrid-demo\n"},
		&v1alpha1.LoadBalancers{Enabled: true, Default: true}},
	{"hcloud", "hcloud", map[string]string{"token": "demo-token"}, &v1alpha1.LoadBalancers{Enabled: true}},
}

// demoServices are the LoadBalancer Services the demo creates (namespace
// shopNamespace): one per cloud that serves load balancers, and one without a
// class for the default; cloud is the provider whose load balancer must serve
// it, platform the nodes it may target.
var demoServices = []struct {
	name, class, cloud, platform string
}{
	{"web-aws", "hybridccm.io/aws", "aws", "aws"},
	{"web-hcloud", "hybridccm.io/hcloud", "hcloud", "hcloud"},
	{"web-gcp", "hybridccm.io/gcp", "gce", "gcp"},
	{"web", "", "gce", "gcp"},
}

// shopNamespace holds the demo's Services.
const shopNamespace = "shop"

// createServices creates the demo's LoadBalancer Services.
func createServices(ctx context.Context, cs kubernetes.Interface) error {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: shopNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, d := range demoServices {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: d.name, Namespace: shopNamespace},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": d.name},
				Ports: []corev1.ServicePort{{Port: 80}}}}
		if d.class != "" {
			svc.Spec.LoadBalancerClass = &d.class
		}
		if _, err := cs.CoreV1().Services(shopNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("service %s: %w", d.name, err)
		}
	}
	return nil
}

func controllerClient(env *testenv.Env) (client.Client, error) {
	sch := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(sch)
	_ = v1alpha1.AddToScheme(sch)
	return client.New(env.Config, client.Options{Scheme: sch})
}

// nativeNamespace is the coordinator's own namespace (its default, as the
// chart makes it): the native CCM releases, their credentials and pods.
const nativeNamespace = "hybrid-ccm-system"

// createNativeCCMs creates, per demo cloud, its credentials Secret (dummy
// values: nothing leaves the machine) and a NativeCCM with install policy
// Auto whose CCM serves on loopback only: the upstream AWS CCM with a
// cloud.conf pointing at the fake EC2, test/testccm asking the fake cloud at
// cloudURL.
func createNativeCCMs(ctx context.Context, c client.Client, cloudURL string, ec2 *fakeEC2) error {
	for _, d := range demoClouds {
		data := maps.Clone(d.data)
		var env []corev1.EnvVar
		if d.platform == "aws" {
			data["cloud.conf"] = ec2.cloudConf()
		} else {
			env = []corev1.EnvVar{{Name: "TESTCCM_CLOUD_URL", Value: cloudURL}}
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: d.secret, Namespace: nativeNamespace}, StringData: data}
		if err := c.Create(ctx, sec); err != nil {
			return fmt.Errorf("secret %s: %w", d.secret, err)
		}
		n := &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: d.platform}, Spec: v1alpha1.NativeCCMSpec{
			Platform:      d.platform,
			LoadBalancers: d.lb,
			Overrides: &v1alpha1.Overrides{
				Env:    env,
				Values: &apiextensionsv1.JSON{Raw: []byte(`{"bindAddress":"127.0.0.1"}`)},
			},
		}}
		// what the fence confines its CCM to, created with the NativeCCM
		// as the hybrid-ccm chart does
		if err := gate.EnsureGrant(ctx, c, gate.GrantFor(n, nativeNamespace)); err != nil {
			return fmt.Errorf("nativeccm %s: %w", d.platform, err)
		}
		if err := c.Create(ctx, n); err != nil {
			return fmt.Errorf("nativeccm %s: %w", d.platform, err)
		}
	}
	return nil
}

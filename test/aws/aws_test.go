// Package aws proves the promise "unmodified upstream CCMs, lifecycle-only,
// gated" with a real one: k8s.io/cloud-provider-aws's
// aws-cloud-controller-manager, built from source at the version
// profiles/aws.yaml names (hack/aws-ccm.sh), run with the container the
// coordinator renders from its profile, behind a ccm-gate process and with
// exactly the RBAC its release grants, against a real API server and a
// loopback fake of the EC2 API (test/fakeec2), one node per EC2 state the
// lifecycle controller acts on (test/oncluster runs it as the coordinator's
// pod on real kubelets); and, with its
// service controller on, that it serves LoadBalancer Services from the fake's
// Classic ELB API, behind the gate only those of its class
// (loadbalancer_test.go); and, with nodes in two regions, that one CCM
// configured for one region deletes the other region's NotReady node
// (upstream cloud-provider-aws#939) while one gated CCM per region, each
// shown only its region's nodes, deletes nothing it does not own
// (regions_test.go). Everything runs in a network namespace with only lo
// (TestMain). Only its tests hold code.
package aws

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencepkg "github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const (
	namespace = "kube-system"
	// ccmNamespace is the coordinator's own (the chart's default): the native
	// CCM, its release, credentials and lease live there.
	ccmNamespace = "hybrid-ccm-system"
	region       = "eu-west-1"
	zone         = "eu-west-1a"
	clusterID    = "hybrid-test"
	accessKey    = "AKIAFAKEHYBRIDCCM"
	platformLb   = names.PlatformLabel
)

// node is a Node as its kubelet registers it and, unless uninitialized,
// talos-ccm initializes it (platform label, providerID); instance is the EC2
// instance behind it, if any.
type node struct {
	name, platform, providerID string
	ready, uninitialized       bool
	// instance is the EC2 state ("" absent from EC2, or no EC2 instance).
	instance, instanceID string
	// labels are set besides those of kubelet and talos-ccm.
	labels map[string]string
	// zone is the instance's availability zone; empty: zone.
	zone string
}

// Own nodes: one per EC2 state the lifecycle controller acts on.
var own = []node{
	{name: "aws-running", platform: "aws", instanceID: "i-0000000000000a001", instance: fakeec2.Running, ready: true},
	{name: "aws-notready", platform: "aws", instanceID: "i-0000000000000a002", instance: fakeec2.Running},
	{name: "aws-stopped", platform: "aws", instanceID: "i-0000000000000a003", instance: fakeec2.Stopped},
	{name: "aws-terminated", platform: "aws", instanceID: "i-0000000000000a004", instance: fakeec2.Terminated},
	{name: "aws-absent", platform: "aws", instanceID: "i-0000000000000a005"},
}

// newNode is a machine moved from EC2 to bare metal that kept its EC2 host
// name (an instance ID, as EC2's resource-based names are); EC2 still lists
// the old instance as terminated. It has just registered: uninitialized, no
// platform label, no providerID.
const newNode = "i-0000000000000b001"

// Foreign nodes: no AWS CCM may touch them or ask EC2 about them.
var foreign = []node{
	{name: "hcloud-1", platform: "hcloud", providerID: "hcloud://1001", ready: true},
	{name: "hcloud-down", platform: "hcloud", providerID: "hcloud://1002"},
	{name: "metal-down", platform: "metal"},
	{name: "aws-label-hcloud-id", platform: "aws", providerID: "hcloud://1003"},
	{name: newNode, uninitialized: true, instanceID: newNode, instance: fakeec2.Terminated},
}

func (n node) id() string {
	if n.providerID != "" || n.platform != "aws" {
		return n.providerID
	}
	return "aws:///" + n.availabilityZone() + "/" + n.instanceID
}

func (n node) availabilityZone() string {
	if n.zone != "" {
		return n.zone
	}
	return zone
}

func instances() []fakeec2.Instance { return ec2Instances(append(slices.Clone(own), foreign...)) }

// ec2Instances are the EC2 instances behind the nodes, in their zones.
func ec2Instances(nodes []node) []fakeec2.Instance {
	var out []fakeec2.Instance
	for i, n := range nodes {
		if n.instance == "" {
			continue
		}
		z := n.availabilityZone()
		out = append(out, fakeec2.Instance{ID: n.instanceID, State: n.instance, Zone: z, Type: "m5.large",
			PrivateIP: fmt.Sprintf("10.0.0.%d", i+10), PrivateDNSName: fmt.Sprintf("ip-10-0-0-%d.%s.compute.internal", i+10, fakeec2.RegionOf(z)),
			Tags: map[string]string{"kubernetes.io/cluster/" + clusterID: "owned"}})
	}
	return out
}

// serveEC2 serves the fake's endpoints of the given regions on loopback, each
// at its own address as AWS serves each region at its own host, and its
// instance metadata service on the address the SDK asks (lo carries it in
// this network namespace), where every request is recorded, until the test
// ends. It returns the endpoints' base URLs by region.
func serveEC2(t *testing.T, ec2 *fakeec2.Server, regions ...string) map[string]string {
	t.Helper()
	urls := map[string]string{}
	for _, r := range regions {
		srv := httptest.NewServer(ec2.Region(r))
		t.Cleanup(srv.Close)
		urls[r] = srv.URL
	}
	imdsLn, err := net.Listen("tcp", net.JoinHostPort(imdsAddr.String(), "80"))
	if err != nil {
		t.Fatal(err)
	}
	imds := &http.Server{Handler: ec2.IMDS()}
	go func() { _ = imds.Serve(imdsLn) }()
	t.Cleanup(func() { _ = imds.Close() })
	return urls
}

// cloudConf is the cloud.conf profiles/aws.yaml asks for off EC2: [Global]
// Region, VPC, SubnetID, KubernetesClusterID and the fake's endpoints of
// that region (url), signed for it.
func cloudConf(region, url string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[Global]\nRegion = %s\nVPC = vpc-0fake\nSubnetID = subnet-0fake\nKubernetesClusterID = %s\n", region, clusterID)
	for i, s := range []struct{ service, path string }{
		{"EC2", "ec2"}, {"Elastic Load Balancing", "elasticloadbalancing"}, {"Elastic Load Balancing v2", "elasticloadbalancingv2"}, {"KMS", "kms"}, {"STS", "sts"},
	} {
		fmt.Fprintf(&b, "\n[ServiceOverride %q]\nService = %s\nRegion = %s\nURL = %s/%s\nSigningRegion = %s\n", fmt.Sprint(i+1), s.service, region, url, s.path, region)
	}
	return b.String()
}

// TestAWSCCMGated runs the real AWS CCM as the coordinator's release runs it
// — the CCM container rendered from the built-in aws profile (lifecycle-only,
// cloud.conf, no metadata service), behind ccm-gate for platform aws, with
// exactly the release's RBAC and the fence confining its identity — and
// checks the lifecycle controller's every decision: the terminated and the
// absent instances' nodes deleted, the stopped instance's node tainted, every
// foreign node untouched and never asked about. Then the same binary runs
// with the same RBAC but without the gate (Ungated), showing what the gate
// prevents. (The coordinator installing it on real kubelets is test/oncluster's.)
func TestAWSCCMGated(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	ec2 := fakeec2.New(instances()...)
	endpoint := serveEC2(t, ec2, region)[region]

	// The nodes, as kubelets register them and talos-ccm initializes them.
	for _, n := range append(slices.Clone(own), foreign...) {
		register(t, ctx, n)
	}
	before := map[string]string{} // foreign node -> resourceVersion
	for _, n := range append(foreign, own[0], own[1]) {
		o, err := env.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before[n.name] = o.ResourceVersion
	}

	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ccmNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The credentials, as docs/profiles.md names their keys.
	conf := cloudConf(region, endpoint)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "aws-ccm", Namespace: ccmNamespace},
		StringData: map[string]string{"access-key-id": accessKey, "secret-access-key": "fake-secret", "cloud.conf": conf}}
	if _, err := env.Client.CoreV1().Secrets(ccmNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, ok := set.Get("aws")
	if !ok {
		t.Fatal("no built-in aws profile")
	}
	// The container is the profile's: the upstream image, lifecycle-only, the
	// cloud.conf from the Secret, no metadata service.
	ccm := renderCCM(t, ctx, "native-ccm-aws", nil)
	checkCCMContainer(t, ccm, builtImage(t, ctx, p))

	// The fence confines NativeCCM aws's identity; the release's RBAC.
	const name = "aws"
	rel := confineRelease(t, ctx, name, false)

	// ccm-gate as the coordinator's sidecar runs it, the CCM behind it.
	gated, stopGated := context.WithCancel(ctx)
	gate, _ := rel.start(t, gated, ccmProcess{container: ccm, conf: conf, secret: fakeSecret})

	// The lifecycle controller's decisions, on its own nodes.
	gone(t, ctx, "aws-terminated", ec2)
	gone(t, ctx, "aws-absent", ec2)
	waitNode(t, ctx, "aws-stopped", "has the shutdown taint", func(o *corev1.Node) bool { return hasTaint(o, cloudproviderapi.TaintNodeShutdown) })

	// Three more monitor periods (each asks about the stopped instance twice)
	// before judging what it left alone.
	askedAbout := func(id string) int { return asked(ec2, id, "") }
	seen := askedAbout("i-0000000000000a003")
	poll(t, ctx, "three more monitor periods", func() bool { return askedAbout("i-0000000000000a003") >= seen+6 })

	calls := ec2.Calls()
	t.Logf("the AWS CCM's calls to the fake EC2 API (%d):", len(calls))
	for _, line := range summarize(calls) {
		t.Logf("  %s", line)
	}
	allowed := []string{"i-0000000000000a002", "i-0000000000000a003", "i-0000000000000a004", "i-0000000000000a005"}
	for _, c := range calls {
		if c.Service != "ec2" || c.Action != "DescribeInstances" || len(c.Filters) > 0 {
			t.Errorf("unexpected call %s", c)
		}
		for _, id := range c.InstanceIDs {
			if !slices.Contains(allowed, id) {
				t.Errorf("asked EC2 about %s (%s), not a NotReady node of its own", id, c)
			}
		}
		if c.AccessKey != accessKey || c.Region != region || c.SignedRegion != region {
			t.Errorf("call %s sent to region %q signed by %q for %q, want the Secret's key %q for %q", c, c.Region, c.AccessKey, c.SignedRegion, accessKey, region)
		}
	}
	for _, id := range allowed {
		if askedAbout(id) == 0 {
			t.Errorf("never asked EC2 about %s", id)
		}
	}
	// Nothing else changed.
	for name, rv := range before {
		o, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("node %s: %v", name, err)
			continue
		}
		if o.ResourceVersion != rv {
			t.Errorf("node %s was changed: taints %v", name, o.Spec.Taints)
		}
	}

	// The gated CCM stops.
	stopGated()
	gate.Stop()
	t.Run("Ungated", func(t *testing.T) { ungated(t, ctx, rel.sa, ccm, conf, ec2) })

	// The profile's AWS_EC2_METADATA_DISABLED is what keeps it off the
	// metadata service: without it the SDK asks IMDS at every start.
	t.Run("MetadataServiceWithoutProfileEnv", func(t *testing.T) {
		ec2.Reset()
		noIMDS := ccm
		noIMDS.Env = slices.DeleteFunc(slices.Clone(ccm.Env), func(e corev1.EnvVar) bool { return e.Name == "AWS_EC2_METADATA_DISABLED" })
		runDirect(t, ctx, noIMDS, conf, "aws-ccm-ungated")
		poll(t, ctx, "the CCM asks the metadata service", func() bool {
			return slices.ContainsFunc(ec2.Calls(), func(c fakeec2.Call) bool { return c.Service == "imds" })
		})
		for _, c := range ec2.Calls() {
			if c.Service == "imds" {
				t.Logf("without AWS_EC2_METADATA_DISABLED: %s", c)
			}
		}
	})
}

// ungated runs the same binary as the gated CCM (stopped) with the same
// arguments, environment and RBAC (those of ServiceAccount sa), but straight
// against the API server under an identity the fence does not know: what the
// gate prevents.
func ungated(t *testing.T, ctx context.Context, sa string, ccm corev1.Container, conf string, ec2 *fakeec2.Server) {
	const ungatedSA = "aws-ccm-ungated"
	copyRBAC(t, ctx, sa, ungatedSA)
	// The same cluster again: the deleted nodes re-registered.
	for _, n := range own {
		if n.name == "aws-terminated" || n.name == "aws-absent" {
			register(t, ctx, n)
		}
	}
	ec2.Reset()
	runDirect(t, ctx, ccm, conf, ungatedSA)

	// What the gate prevents: the brand-new node deleted, the bare-metal node
	// looked up in EC2 by name.
	poll(t, ctx, "the ungated CCM acted on foreign nodes", func() bool {
		_, err := env.Client.CoreV1().Nodes().Get(ctx, newNode, metav1.GetOptions{})
		askedMetal := slices.ContainsFunc(ec2.Calls(), func(c fakeec2.Call) bool {
			return slices.Contains(c.Filters, "private-dns-name=metal-down")
		})
		return apierrors.IsNotFound(err) && askedMetal
	})
	var deleted []string
	for _, n := range foreign {
		if _, err := env.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			deleted = append(deleted, n.name)
		}
	}
	var foreignCalls []string
	for _, c := range ec2.Calls() {
		if len(c.Filters) > 0 || slices.Contains(c.InstanceIDs, newNode) {
			foreignCalls = append(foreignCalls, c.String())
		}
	}
	slices.Sort(foreignCalls)
	foreignCalls = slices.Compact(foreignCalls)
	t.Logf("without the gate the AWS CCM deleted foreign nodes %v and asked EC2 about foreign nodes:\n  %s", deleted, strings.Join(foreignCalls, "\n  "))
	if !slices.Contains(deleted, newNode) {
		t.Errorf("ungated: %s not deleted", newNode)
	}
}

// runDirect runs the AWS CCM binary with the pod's CCM container's arguments
// and environment, straight against the API server as the ServiceAccount sa,
// until the test ends.
func runDirect(t *testing.T, ctx context.Context, ccm corev1.Container, conf, sa string) {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	writeKubeconfig(t, ctx, sa, kubeconfig)
	s, err := env.Client.CoreV1().Secrets(ccmNamespace).Get(ctx, "aws-ccm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	startCCM(t, ctx, ccmProcess{container: ccm, conf: conf, kubeconfig: kubeconfig, authKubeconfig: kubeconfig, secret: s.Data})
}

// ccmProcess is how the AWS CCM binary runs outside a pod.
type ccmProcess struct {
	// container gives the arguments and environment (as the release
	// renders them).
	container corev1.Container
	// conf is cloud.conf.
	conf string
	// kubeconfig is the API server the CCM works with (--kubeconfig: the
	// gate, or the API server itself); authKubeconfig the one its secure
	// port's delegated authentication and authorization ask (in a pod:
	// in-cluster, the API server).
	kubeconfig, authKubeconfig string
	// secret is the data of the credentials Secret the container's env
	// refers to.
	secret map[string][]byte
	// leaderElect keeps the release's leader election (its lease); without
	// it the CCM runs with --leader-elect=false.
	leaderElect bool
}

// fakeSecret is the data of the credentials Secret, as docs/profiles.md
// names its keys.
var fakeSecret = map[string][]byte{"access-key-id": []byte(accessKey), "secret-access-key": []byte("fake-secret")}

// nativeRelease is a NativeCCM's release as the coordinator installs it: its
// ServiceAccount (native-ccm-<name>), confined by the fence, with the
// release's RBAC.
type nativeRelease struct {
	sa, token string
	// direct reaches the API server itself as the ServiceAccount.
	direct *rest.Config
	// client is the controller-runtime client confine used.
	client client.Client
}

// confineRelease makes NativeCCM name one the fence confines and grants its
// ServiceAccount what its release binds it to (grantRelease).
func confineRelease(t *testing.T, ctx context.Context, name string, loadBalancers bool) nativeRelease {
	t.Helper()
	c := confine(t, ctx, name)
	sa := "native-ccm-" + name
	token := grantRelease(t, ctx, sa, loadBalancers)
	return nativeRelease{sa: sa, token: token, client: c,
		direct: &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: token}}
}

// start runs ccm-gate as the coordinator's sidecar runs it for the release
// (platform aws, with the extra flags gateArgs) and the CCM behind it, as p
// says, until ctx ends (the CCM) or the test does (the gate); p's
// kubeconfigs are the gate's and the API server's with the release's token.
func (r nativeRelease) start(t *testing.T, ctx context.Context, p ccmProcess, gateArgs ...string) (*gatetest.Gate, *testenv.Buffer) {
	t.Helper()
	gate, err := gatetest.StartGate(gateBin, t.TempDir(), "aws", env.Config, r.token, gateArgs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gate.Stop)
	p.kubeconfig, p.authKubeconfig = writeTokenKubeconfig(t, gate.Config, r.token), writeTokenKubeconfig(t, r.direct, r.token)
	return gate, startCCM(t, ctx, p)
}

// startCCM starts the AWS CCM binary as p says, without leader election,
// until the test ends, and returns its output.
func startCCM(t *testing.T, ctx context.Context, p ccmProcess) *testenv.Buffer {
	t.Helper()
	dir := t.TempDir()
	confPath := filepath.Join(dir, "cloud.conf")
	if err := os.WriteFile(confPath, []byte(p.conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ccm, kubeconfig := p.container, p.kubeconfig

	// Each process listens on a free secure port (in a pod it has its own
	// network namespace).
	_, port, err := net.SplitHostPort(gatetest.FreePort())
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--secure-port=" + port}
	for _, a := range ccm.Args {
		switch {
		case strings.HasPrefix(a, "--kubeconfig="), strings.HasPrefix(a, "--cloud-config="), strings.HasPrefix(a, "--master="), strings.HasPrefix(a, "--secure-port="),
			strings.HasPrefix(a, "--leader-elect") && !p.leaderElect:
			continue
		}
		args = append(args, a)
	}
	args = append(args, "--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+p.authKubeconfig, "--authorization-kubeconfig="+p.authKubeconfig,
		"--cloud-config="+confPath)
	if !p.leaderElect {
		args = append(args, "--leader-elect=false")
	}
	cmd := exec.CommandContext(ctx, awsCCM, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	for _, e := range ccm.Env {
		switch {
		case e.ValueFrom == nil:
			cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
		case e.ValueFrom.SecretKeyRef != nil:
			if v, ok := p.secret[e.ValueFrom.SecretKeyRef.Key]; ok {
				cmd.Env = append(cmd.Env, e.Name+"="+string(v))
			}
		}
	}
	out := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	t.Logf("%s %s", filepath.Base(awsCCM), strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("CCM output (tail):\n%s", tail(out.String(), 20000))
		}
	})
	return out
}

// confine makes NativeCCM name (platform aws) one the fence confines, as an
// admin and the charts leave it: the fence, the NativeCCM, its grant. It
// returns the controller-runtime client it used.
func confine(t *testing.T, ctx context.Context, name string) client.Client {
	t.Helper()
	c, err := gatetest.Client(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := gatetest.InstallFence(ctx, c, ccmNamespace); err != nil {
		t.Fatal(err)
	}
	remove, err := gatetest.Confine(ctx, c, fencepkg.Fence{Namespace: ccmNamespace}, name, "aws")
	if remove != nil {
		t.Cleanup(remove)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// builtImage is the image the coordinator renders for the aws profile on
// this API server (its release for the API server's minor), which must be the
// release hack/aws-ccm.sh built (in a directory aws-ccm-<tag>) for the control
// plane's minor: the test runs the CCM the coordinator would install.
func builtImage(t *testing.T, ctx context.Context, p *profile.Profile) string {
	t.Helper()
	_, minor := apiServerMinor(t)
	tag, _, err := p.TagFor(minor)
	if err != nil {
		t.Fatal(err)
	}
	if built := filepath.Base(filepath.Dir(awsCCM)); built != "aws-ccm-"+tag {
		t.Fatalf("hack/aws-ccm.sh built %s (%s), but for Kubernetes 1.%d the aws profile names %s", built, awsCCM, minor, tag)
	}
	return p.CCM.Image.Repository + ":" + tag
}

// apiServerMinor is the API server's version and its minor.
func apiServerMinor(t *testing.T) (string, int) {
	t.Helper()
	info, err := env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	minor, err := profile.ServerMinor(info.GitVersion)
	if err != nil {
		t.Fatal(err)
	}
	return info.GitVersion, minor
}

// checkCCMContainer checks the rendered CCM container against the profile.
func checkCCMContainer(t *testing.T, ccm corev1.Container, image string) {
	t.Helper()
	if ccm.Image != image {
		t.Errorf("CCM image %q, want the profile's %q", ccm.Image, image)
	}
	for _, want := range []string{"--cloud-provider=aws", "--controllers=cloud-node-lifecycle", "--cloud-config=/etc/kubernetes/cloud-config/cloud.conf", "--configure-cloud-routes=false"} {
		if !slices.Contains(ccm.Args, want) {
			t.Errorf("CCM args %v lack %s", ccm.Args, want)
		}
	}
	if !slices.ContainsFunc(ccm.Env, func(e corev1.EnvVar) bool { return e.Name == "AWS_EC2_METADATA_DISABLED" && e.Value == "true" }) {
		t.Errorf("CCM env %v lacks AWS_EC2_METADATA_DISABLED=true", ccm.Env)
	}
}

// copyRBAC binds a new ServiceAccount to copies of every Role and ClusterRole
// the given ServiceAccount is bound to.
func copyRBAC(t *testing.T, ctx context.Context, from, to string) {
	t.Helper()
	rbac := env.Client.RbacV1()
	if _, err := env.Client.CoreV1().ServiceAccounts(ccmNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: to, Namespace: ccmNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: to, Namespace: ccmNamespace}
	bound := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == from && s.Namespace == ccmNamespace
		})
	}
	roleName := func(ref rbacv1.RoleRef) string {
		if strings.HasPrefix(ref.Name, "system:") {
			return ref.Name // built-in: stays
		}
		return to + ":" + ref.Name
	}
	crbs, err := rbac.ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range crbs.Items {
		if !bound(b.Subjects) {
			continue
		}
		if name := roleName(b.RoleRef); name != b.RoleRef.Name {
			r, err := rbac.ClusterRoles().Get(ctx, b.RoleRef.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: r.Rules}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		nb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: to + ":" + b.Name}, Subjects: []rbacv1.Subject{subject},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName(b.RoleRef)}}
		if _, err := rbac.ClusterRoleBindings().Create(ctx, nb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		n++
	}
	rbs, err := rbac.RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range rbs.Items {
		if !bound(b.Subjects) {
			continue
		}
		name := roleName(b.RoleRef)
		if b.RoleRef.Kind == "Role" && !strings.HasPrefix(b.RoleRef.Name, "extension-apiserver-authentication-reader") {
			r, err := rbac.Roles(b.Namespace).Get(ctx, b.RoleRef.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := rbac.Roles(b.Namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.Namespace}, Rules: r.Rules}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		} else {
			name = b.RoleRef.Name
		}
		nb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: to + ":" + b.Name, Namespace: b.Namespace}, Subjects: []rbacv1.Subject{subject},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: b.RoleRef.Kind, Name: name}}
		if _, err := rbac.RoleBindings(b.Namespace).Create(ctx, nb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("ServiceAccount %s is bound to nothing", from)
	}
}

func writeKubeconfig(t *testing.T, ctx context.Context, sa, path string) {
	t.Helper()
	exp := int64(3600)
	tok, err := env.Client.CoreV1().ServiceAccounts(ccmNamespace).CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := clientcmdapi.NewConfig()
	c.Clusters["test"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	c.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	c.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: sa}
	c.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*c, path); err != nil {
		t.Fatal(err)
	}
}

// gone waits until the node is deleted.
func gone(t *testing.T, ctx context.Context, name string, ec2 *fakeec2.Server) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("node %s was not deleted; EC2 calls: %v", name, summarize(ec2.Calls()))
	}
}

// register creates the Node as its kubelet would and, unless uninitialized,
// as talos-ccm leaves it (platform label, providerID, taint removed), then
// sets its Ready condition.
func register(t *testing.T, ctx context.Context, n node) {
	t.Helper()
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name,
		Labels: map[string]string{corev1.LabelHostname: n.name, corev1.LabelOSStable: "linux"}}}
	for k, v := range n.labels {
		obj.Labels[k] = v
	}
	if n.uninitialized {
		obj.Spec.Taints = []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	} else {
		obj.Labels[platformLb] = n.platform
		obj.Spec.ProviderID = n.id()
	}
	created, err := env.Client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{}) })
	status, reason := corev1.ConditionTrue, "KubeletReady"
	if !n.ready {
		status, reason = corev1.ConditionFalse, "KubeletNotReady"
	}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: reason}}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func hasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

func waitNode(t *testing.T, ctx context.Context, name, what string, cond func(*corev1.Node) bool) {
	t.Helper()
	var last *corev1.Node
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return cond(n), nil
	}); err != nil {
		t.Fatalf("node %s never %s; last seen %+v", name, what, last)
	}
}

func poll(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("not reached: %s", what)
	}
}

// asked counts the calls that named instance id, sent to region ("" any).
func asked(ec2 *fakeec2.Server, id, region string) int {
	n := 0
	for _, c := range ec2.Calls() {
		if slices.Contains(c.InstanceIDs, id) && (region == "" || c.Region == region) {
			n++
		}
	}
	return n
}

// summarize counts identical calls.
func summarize(calls []fakeec2.Call) []string {
	count := map[string]int{}
	var order []string
	for _, c := range calls {
		s := c.String()
		if count[s] == 0 {
			order = append(order, s)
		}
		count[s]++
	}
	out := make([]string, len(order))
	for i, s := range order {
		out[i] = fmt.Sprintf("%dx %s", count[s], s)
	}
	return out
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

package oncluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/registry"
)

const (
	namespace = "kube-system"
	// ccmNamespace is the coordinator's own (the chart's default).
	ccmNamespace = "hybrid-ccm-system"
	awsRegion    = "eu-west-1"
	awsCluster   = "hybrid-test"
)

// nativeCCMs are the NativeCCMs the install runs.
var nativeCCMs = []string{"aws", "hcloud", "gcp"}

// clouds are the fake cloud APIs the native CCMs ask, on the cluster's
// gateway: EC2 for the real AWS CCM, the instance API of test/testccm for
// the others.
type clouds struct {
	ec2      *fakeec2.Server
	ec2URL   string
	other    *fakeCloud
	otherURL string
}

var (
	installed     *clouds
	installedOnce sync.Once
	installErr    error
)

// install runs the documented install once for the package's tests.
func install(t *testing.T) *clouds {
	t.Helper()
	installedOnce.Do(func() { installed, installErr = doInstall(t) })
	if installErr != nil {
		t.Fatalf("install: %v", installErr)
	}
	return installed
}

func doInstall(t *testing.T) (*clouds, error) {
	ctx := context.Background()
	cl := &clouds{other: &fakeCloud{log: map[string]int{}}}
	var instances []fakeec2.Instance
	for i, m := range machines {
		if m.Platform != "aws" {
			continue
		}
		id := m.ProviderID[strings.LastIndex(m.ProviderID, "/")+1:]
		instances = append(instances, fakeec2.Instance{ID: id, State: fakeec2.Running, Zone: m.Zone, Type: m.InstanceType,
			PrivateIP: f.Node(m.Name).IP.String(), PrivateDNSName: fmt.Sprintf("ip-10-99-0-%d.%s.compute.internal", 11+i, awsRegion),
			Tags: map[string]string{"kubernetes.io/cluster/" + awsCluster: "owned"}})
	}
	cl.ec2 = fakeec2.New(instances...)
	var err error
	if cl.ec2URL, err = serve(cl.ec2); err != nil {
		return nil, err
	}
	if cl.otherURL, err = serve(cl.other); err != nil {
		return nil, err
	}

	// helm install hybrid-ccm oci://<registry>/charts/hybrid-ccm --version <v>
	// -n kube-system -f multi-cloud.yaml
	values, err := installValues(cl.otherURL)
	if err != nil {
		return nil, err
	}
	if err := helmInstall(ctx, "hybrid-ccm", f.ChartRef("hybrid-ccm"), version, values); err != nil {
		return nil, err
	}

	// The clouds' credentials, in the coordinator's namespace the chart made
	// (docs/profiles.md names the keys).
	for name, data := range map[string]map[string]string{
		"hcloud":  {"token": "test-token"},
		"aws-ccm": {"access-key-id": "AKIAFAKEHYBRIDCCM", "secret-access-key": "fake-secret", "cloud.conf": awsCloudConf(cl.ec2URL)},
		"gcp-ccm": {"credentials.json": "{}", "gce.conf": "[global]\nproject-id = prod\n"},
	} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ccmNamespace}, StringData: data}
		if _, err := f.Client.CoreV1().Secrets(ccmNamespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	// Talos answers the chart's talos.dev ServiceAccount with a Secret.
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := f.AnswerTalosServiceAccount(actx, namespace, "talos-ccm-talos"); err != nil {
		return nil, err
	}
	return cl, nil
}

// serve serves h on the cluster's gateway (pods reach it there).
func serve(h http.Handler) (string, error) {
	lis, err := net.Listen("tcp", net.JoinHostPort(cluster.Gateway.String(), "0"))
	if err != nil {
		return "", err
	}
	go func() { _ = http.Serve(lis, h) }()
	return "http://" + lis.Addr().String(), nil
}

// installValues are testdata/multi-cloud.yaml, with talos-ccm's standby and
// the stand-in CCMs pointed at the fake cloud (the AWS CCM finds its fake
// EC2 through cloud.conf).
func installValues(cloudURL string) (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join("testdata", "multi-cloud.yaml"))
	if err != nil {
		return nil, err
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		return nil, err
	}
	// A standby behind talos-ccm's lease (TestOperations deletes the leader).
	values["talos-ccm"].(map[string]any)["replicas"] = 2
	for name, c := range values["clouds"].(map[string]any) {
		if name == "aws" {
			continue
		}
		c.(map[string]any)["overrides"] = map[string]any{"env": []any{map[string]any{"name": "TESTCCM_CLOUD_URL", "value": cloudURL}}}
	}
	return values, nil
}

// helmInstall is `helm install release ref --version v -n kube-system
// --values values` with Helm's own SDK: the chart pulled from the registry.
func helmInstall(ctx context.Context, release, ref, version string, values map[string]any) error {
	cfg, settings, err := helmConfig()
	if err != nil {
		return err
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.Version = release, namespace, version
	path, err := in.ChartPathOptions.LocateChart(ref, settings)
	if err != nil {
		return fmt.Errorf("helm pull %s: %w", ref, err)
	}
	ch, err := loader.Load(path)
	if err != nil {
		return err
	}
	if _, err := in.RunWithContext(ctx, ch, values); err != nil {
		return fmt.Errorf("helm install %s %s: %w", release, ref, err)
	}
	return nil
}

func helmConfig() (*action.Configuration, *cli.EnvSettings, error) {
	kubeconfig, ns := f.KubeconfigPath, namespace
	cfg := &action.Configuration{}
	if err := cfg.Init(&genericclioptions.ConfigFlags{KubeConfig: &kubeconfig, Namespace: &ns}, namespace, "secret", func(string, ...any) {}); err != nil {
		return nil, nil, err
	}
	rc, err := helmregistry.NewClient(helmregistry.ClientOptHTTPClient(f.Registry.HTTPClient()))
	if err != nil {
		return nil, nil, err
	}
	cfg.RegistryClient = rc
	settings := cli.New()
	settings.RepositoryCache = filepath.Join(f.Work(), "helm-cache")
	return cfg, settings, nil
}

// awsCloudConf is the cloud.conf profiles/aws.yaml asks for off EC2.
func awsCloudConf(url string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[Global]\nRegion = %s\nVPC = vpc-0fake\nSubnetID = subnet-0fake\nKubernetesClusterID = %s\n", awsRegion, awsCluster)
	for i, s := range []struct{ service, path string }{
		{"EC2", "ec2"}, {"Elastic Load Balancing", "elasticloadbalancing"}, {"Elastic Load Balancing v2", "elasticloadbalancingv2"}, {"KMS", "kms"}, {"STS", "sts"},
	} {
		fmt.Fprintf(&b, "\n[ServiceOverride %q]\nService = %s\nRegion = %s\nURL = %s/%s\nSigningRegion = %s\n", fmt.Sprint(i+1), s.service, awsRegion, url, s.path, awsRegion)
	}
	return b.String()
}

// TestInstallAsDocumented follows the life of real nodes after the
// documented install: the kubelets registered tainted; talos-ccm (a pod)
// initializes every node from its own Talos API and gives it pod CIDRs, from
// which containerd builds the node's pod network (kube-controller-manager's
// allocator is off: talos-ccm must run before any pod network exists); the
// kubelets' serving CSRs are approved and issued, so logs and exec through
// the API server work on every node; the coordinator's native CCMs (the real
// AWS CCM among them) run on containerd, gated, with their security contexts
// enforced, and hold their leases.
func TestInstallAsDocumented(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	install(t)

	for _, m := range machines {
		o := waitNode(t, ctx, m.Name, "initialized, with pod CIDRs, Ready", func(o *corev1.Node) bool {
			return initialized(o) && len(o.Spec.PodCIDRs) > 0 && ready(o)
		})
		if o.Labels[names.PlatformLabel] != m.Platform {
			t.Errorf("node %s: platform label %q, want %q", m.Name, o.Labels[names.PlatformLabel], m.Platform)
		}
		if m.ProviderID != "" && o.Spec.ProviderID != m.ProviderID {
			t.Errorf("node %s: providerID %q, want %q", m.Name, o.Spec.ProviderID, m.ProviderID)
		}
		if m.Region != "" && o.Labels[corev1.LabelTopologyRegion] != m.Region {
			t.Errorf("node %s: region %q, want %q", m.Name, o.Labels[corev1.LabelTopologyRegion], m.Region)
		}
		t.Logf("node %s: %s %s pod CIDRs %v", m.Name, o.Labels[names.PlatformLabel], o.Spec.ProviderID, o.Spec.PodCIDRs)
	}

	// Every kubelet's serving CSR was approved (by talos-ccm: nothing else
	// approves them here) and issued.
	for _, m := range machines {
		csr := waitServingCSR(t, ctx, m.Name)
		t.Logf("node %s: serving CSR %s %s: %s", m.Name, csr.Name, csr.Status.Conditions[0].Reason, csr.Status.Conditions[0].Message)
	}

	// A pod on every node: logs and exec through the API server (they need
	// the kubelet's approved serving certificate), and the pod network.
	probes := runProbes(t, ctx)
	for _, m := range machines {
		pod := "probe-" + m.Name
		logs, err := f.PodLogs(ctx, "default", pod, "probe")
		if err != nil || !strings.Contains(logs, "probe serving on :8080 as "+pod) {
			t.Errorf("logs of %s: %v %q", pod, err, logs)
		}
		next := machines[(slices.IndexFunc(machines, func(x fleet.Machine) bool { return x.Name == m.Name })+1)%len(machines)]
		out, _, err := f.Exec(ctx, "default", pod, "probe", "/probe", "get", "http://"+probes[next.Name]+":8080/")
		if err != nil || out != "probe-"+next.Name {
			t.Errorf("exec in %s, to the pod on %s: %v %q", pod, next.Name, err, out)
		}
	}

	// The coordinator installs each cloud's CCM; each becomes Ready: its
	// release deployed and one of its pods holding its lease.
	for _, name := range []string{"aws", "hcloud", "gcp"} {
		o := chartstest.WaitNativeCCMRunning(t, ctx, f.Config, name)
		if !strings.HasPrefix(o.Status.Leader.Pod, "native-ccm-"+name) {
			t.Errorf("NativeCCM %s: leader %+v, want a pod of native-ccm-%s", name, o.Status.Leader, name)
		}
		pod, err := f.Client.CoreV1().Pods(ccmNamespace).Get(ctx, o.Status.Leader.Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// containerd and runc enforce what the pod asks: no root, a
		// read-only root filesystem, no privilege escalation, no capability.
		for _, c := range pod.Spec.Containers {
			procs, err := f.ContainerProcesses(pod, c.Name)
			if err != nil || len(procs) == 0 {
				t.Errorf("pod %s container %s: processes %v %v", pod.Name, c.Name, procs, err)
				continue
			}
			for _, p := range procs {
				if p.UID == 0 || !p.ReadOnlyRoot || !p.NoNewPrivs || p.CapEff != 0 {
					t.Errorf("pod %s container %s process %+v: want non-root, read-only root, no new privileges, no capabilities", pod.Name, c.Name, p)
				}
			}
		}
		restarts := 0
		for _, cs := range pod.Status.ContainerStatuses {
			restarts += int(cs.RestartCount)
		}
		t.Logf("NativeCCM %s: leader %s on %s, %d restarts", name, pod.Name, pod.Spec.NodeName, restarts)
	}
	// Every native CCM pod reached Ready without a restart of any container:
	// the gate holds the CCM back until its release's RBAC is in effect
	// (issue 22 item 8: the hcloud CCM exited twice at its first start, each
	// exit adding crash-loop back-off).
	assertNativeCCMsStartedOnce(t, ctx)
	if o := chartstest.NativeCCM(t, ctx, f.Config, "digital-ocean"); o.Status.Release != nil {
		t.Errorf("suspended NativeCCM digital-ocean has release %+v", o.Status.Release)
	}

	// Nothing asked a cloud about a node not its own.
	for _, a := range installed.other.asked() {
		provider, node, _ := strings.Cut(a, "/")
		if want := map[string]string{"hcloud": "hcloud", "gce": "gcp"}[provider]; !strings.HasPrefix(node, want+"-") {
			t.Errorf("the %s CCM asked its cloud about %s", provider, node)
		}
	}
	for _, c := range installed.ec2.Calls() {
		for _, m := range machines {
			if m.Platform != "aws" && strings.Contains(c.String(), m.Name) {
				t.Errorf("the AWS CCM asked EC2 about %s: %s", m.Name, c)
			}
		}
	}
}

// assertNativeCCMsStartedOnce waits (bounded) for every pod of every
// installed NativeCCM to be Ready and fails for any container, the gate
// sidecar included, that has restarted; it says why it last exited.
func assertNativeCCMsStartedOnce(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, name := range nativeCCMs {
		list, err := f.Client.CoreV1().Pods(ccmNamespace).List(ctx, metav1.ListOptions{LabelSelector: release.NativeCCMLabel + "=native-ccm-" + name})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 0 {
			t.Errorf("NativeCCM %s: no pods labelled %s=native-ccm-%s", name, release.NativeCCMLabel, name)
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			pod := waitPodReady(t, ctx, ccmNamespace, p.Name)
			statuses := append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...)
			for _, cs := range statuses {
				if cs.RestartCount != 0 {
					why := ""
					if term := cs.LastTerminationState.Terminated; term != nil {
						why = fmt.Sprintf(": last exit %d (%s) %q", term.ExitCode, term.Reason, term.Message)
					}
					t.Errorf("NativeCCM %s: pod %s container %s restarted %d times%s", name, pod.Name, cs.Name, cs.RestartCount, why)
				}
			}
			t.Logf("NativeCCM %s: pod %s Ready, %d containers, none restarted", name, pod.Name, len(statuses))
			// What the gate waited for before it let the CCM start (how
			// long depends on when the API server's authorizer saw the
			// release's bindings).
			logs, err := f.PodLogs(ctx, ccmNamespace, pod.Name, "ccm-gate")
			if err != nil {
				t.Errorf("logs of %s's gate: %v", pod.Name, err)
				continue
			}
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, "waiting for the CCM's permissions") || strings.Contains(line, "may do what it needs at start") {
					t.Logf("NativeCCM %s gate: %s", name, line)
				}
			}
		}
	}
}

// runProbes runs test/cluster's probe on every node and returns the pods' IPs.
func runProbes(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "probe")
	if err := goBuild(ctx, bin, "./test/cluster/probe"); err != nil {
		t.Fatal(err)
	}
	probeImage := f.Registry.Host() + "/test/probe:v1"
	if _, err := f.Registry.PushBinary(ctx, probeImage, bin, registry.ImageOptions{Path: "/probe"}); err != nil {
		t.Fatal(err)
	}
	ips := map[string]string{}
	for _, m := range machines {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "probe-" + m.Name, Namespace: "default"},
			Spec: corev1.PodSpec{
				NodeName:                     m.Name,
				AutomountServiceAccountToken: ptr.To(false),
				Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				Containers: []corev1.Container{{
					Name: "probe", Image: probeImage, Args: []string{"serve"},
					SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
				}},
			},
		}
		if _, err := f.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range machines {
		p := waitPodReady(t, ctx, "default", "probe-"+m.Name)
		ips[m.Name] = p.Status.PodIP
	}
	return ips
}

func waitPodReady(t *testing.T, ctx context.Context, ns, name string) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := f.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p
		return podReady(p), nil
	}); err != nil {
		var states []string
		if got != nil {
			for _, cs := range got.Status.ContainerStatuses {
				states = append(states, fmt.Sprintf("%s: ready %v restarts %d state %+v last %+v", cs.Name, cs.Ready, cs.RestartCount, cs.State, cs.LastTerminationState))
			}
			events, _ := f.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			for _, e := range events.Items {
				states = append(states, fmt.Sprintf("event %s %s: %s", e.Type, e.Reason, e.Message))
			}
		}
		t.Fatalf("pod %s/%s not ready: %v; %s", ns, name, err, strings.Join(states, "\n"))
	}
	return got
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitServingCSR waits for the node's kubelet-serving CSR to be approved
// and issued, and returns the newest.
func waitServingCSR(t *testing.T, ctx context.Context, node string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	return waitServingCSRSince(t, ctx, node, metav1.Time{})
}

// waitServingCSRSince is waitServingCSR for a CSR created at since or later.
func waitServingCSRSince(t *testing.T, ctx context.Context, node string, since metav1.Time) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	var got *certificatesv1.CertificateSigningRequest
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := f.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		got = nil
		for i, c := range list.Items {
			if c.Spec.SignerName == certificatesv1.KubeletServingSignerName && c.Spec.Username == "system:node:"+node &&
				!c.CreationTimestamp.Before(&since) && (got == nil || got.CreationTimestamp.Before(&c.CreationTimestamp)) {
				got = &list.Items[i]
			}
		}
		return got != nil && len(got.Status.Conditions) > 0 && len(got.Status.Certificate) > 0, nil
	}); err != nil {
		t.Fatalf("serving CSR of %s not approved and issued: %+v", node, got)
	}
	for _, c := range got.Status.Conditions {
		if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			t.Errorf("serving CSR %s of %s: %s %s", got.Name, node, c.Reason, c.Message)
		}
	}
	return got
}

func initialized(n *corev1.Node) bool {
	return !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cloudproviderapi.TaintExternalCloudProvider })
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitNode(t *testing.T, ctx context.Context, name, what string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var last *corev1.Node
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := f.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return cond(n), nil
	}); err != nil {
		t.Fatalf("node %s: not %s; last seen labels %v taints %v providerID %q podCIDRs %v conditions %+v", name, what,
			last.GetLabels(), specOf(last).Taints, specOf(last).ProviderID, specOf(last).PodCIDRs, statusOf(last).Conditions)
	}
	return last
}

func specOf(n *corev1.Node) corev1.NodeSpec {
	if n == nil {
		return corev1.NodeSpec{}
	}
	return n.Spec
}

func statusOf(n *corev1.Node) corev1.NodeStatus {
	if n == nil {
		return corev1.NodeStatus{}
	}
	return n.Status
}

// fakeCloud answers test/testccm's instance questions: every instance
// exists and runs; it records who asked about what.
type fakeCloud struct {
	mu  sync.Mutex
	log map[string]int
}

func (c *fakeCloud) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	provider, node := r.URL.Query().Get("provider"), r.URL.Query().Get("node")
	c.mu.Lock()
	c.log[provider+"/"+node]++
	c.mu.Unlock()
	_ = json.NewEncoder(w).Encode(map[string]bool{"exists": true, "shutdown": false})
}

func (c *fakeCloud) asked() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k := range c.log {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

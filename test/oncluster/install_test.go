package oncluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleethelm"
	"github.com/hybrid-ccm/hybrid-ccm/test/registry"
)

const (
	namespace = "kube-system"
	// ccmNamespace is the coordinator's own (the chart's default).
	ccmNamespace = "hybrid-ccm-system"
	// pullSecret is the image pull Secret of the private registry
	// (testdata/multi-cloud.yaml names it).
	pullSecret = "release-registry"
	awsRegion  = "eu-west-1"
	awsCluster = "hybrid-test"
	// awsRegion2 is the second aws region's (aws-2's).
	awsRegion2 = "us-east-1"
)

// The NativeCCMs of the two aws regions (testdata/multi-cloud.yaml), each
// owning its region's nodes.
const (
	awsCCM  = "aws-" + awsRegion
	awsCCM2 = "aws-" + awsRegion2
)

// nativeCCMs are the NativeCCMs the install runs.
var nativeCCMs = []string{awsCCM, awsCCM2, "hcloud", "gcp"}

var (
	// clouds are the fake cloud APIs the native CCMs ask (test/fleet's), on
	// the cluster's gateway: EC2 and ELB for the real AWS CCM, the instance
	// and load-balancer API of test/testccm for the others.
	clouds        *fleet.Clouds
	installedOnce sync.Once
	installErr    error
)

// install runs the documented install once for the package's tests.
func install(t *testing.T) *fleet.Clouds {
	t.Helper()
	installedOnce.Do(func() { clouds, installErr = doInstall() })
	if installErr != nil {
		t.Fatalf("install: %v", installErr)
	}
	return clouds
}

func doInstall() (*fleet.Clouds, error) {
	ctx := context.Background()
	cl, err := f.StartClouds(fleet.CloudOptions{AWSRegion: awsRegion, AWSClusterID: awsCluster})
	if err != nil {
		return nil, err
	}

	// The image pull Secret of the private registry, in talos-ccm's
	// namespace before the install (kubectl create secret docker-registry).
	if err := f.CreatePullSecret(ctx, namespace, pullSecret); err != nil {
		return cl, err
	}
	// helm install hybrid-ccm oci://<registry>/charts/hybrid-ccm --version <v>
	// -n kube-system -f multi-cloud.yaml (Helm logged in to the registry)
	values, err := installValues(cl.TestCCMURL())
	if err != nil {
		return cl, err
	}
	if err := fleethelm.Install(ctx, f, namespace, "hybrid-ccm", f.ChartRef("hybrid-ccm"), version, values); err != nil {
		return cl, err
	}

	// The pull Secret in the coordinator's namespace the chart made, as
	// docs/install.md says: its pod retries its pull until it is there.
	if err := f.CreatePullSecret(ctx, ccmNamespace, pullSecret); err != nil {
		return cl, err
	}
	// The clouds' credentials, in the coordinator's namespace the chart made
	// (docs/profiles.md names the keys); aws's one per region.
	if err := fleetcheck.CredentialsSecrets(ctx, f, cl, ccmNamespace, true); err != nil {
		return cl, err
	}
	if _, err := fleetcheck.AWSRegionSecrets(ctx, f, cl, ccmNamespace); err != nil {
		return cl, err
	}
	// Talos answers the chart's talos.dev ServiceAccount with a Secret.
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := f.AnswerTalosServiceAccount(actx, namespace, "talos-ccm-talos"); err != nil {
		return cl, err
	}
	return cl, nil
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
	for _, c := range values["clouds"].(map[string]any) {
		if c.(map[string]any)["platform"] == "aws" {
			continue
		}
		c.(map[string]any)["overrides"] = map[string]any{"env": []any{map[string]any{"name": "TESTCCM_CLOUD_URL", "value": cloudURL}}}
	}
	return values, nil
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

	// No DNS answered anyone meanwhile (NoClusterDNS): no kube-dns Service,
	// and a pod cannot resolve the Talos Service's name. talos-ccm found
	// the Talos API without it (its talosconfig names only talos.default),
	// through the Service's EndpointSlices, and the control planes' apids
	// forwarded its requests to every machine.
	if _, err := f.Client.CoreV1().Services(fleet.DNSNamespace).Get(ctx, fleet.DNSService, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Service %s/%s: %v, want none (no cluster DNS)", fleet.DNSNamespace, fleet.DNSService, err)
	}
	if out, _, err := f.Exec(ctx, "default", "probe-"+machines[0].Name, "probe", "/probe", "lookup", "talos.default"); err == nil {
		t.Errorf("a pod resolves talos.default to %q with no cluster DNS", out)
	}
	if fleetcheck.ControlPlaneForwards(f, machines) == 0 {
		t.Error("no request reached a machine through a control plane's apid (talos.default)")
	}
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

	// The coordinator installs each cloud's CCM, one per aws region; each
	// becomes Ready: its release deployed and one of its own pods holding
	// its own lease.
	leases := map[string]string{}
	for _, name := range nativeCCMs {
		o := chartstest.WaitNativeCCMRunning(t, ctx, f.Config, name)
		pod, err := f.Client.CoreV1().Pods(ccmNamespace).Get(ctx, o.Status.Leader.Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rel := pod.Labels[release.NativeCCMLabel]; rel != "native-ccm-"+name || o.Status.Leader.Lease != ccmNamespace+"/native-ccm-"+name {
			t.Errorf("NativeCCM %s: leader %+v, a pod of %q, want a pod of native-ccm-%s holding lease %s/native-ccm-%s", name, o.Status.Leader, rel, name, ccmNamespace, name)
		}
		if other, ok := leases[o.Status.Leader.Lease]; ok {
			t.Errorf("NativeCCMs %s and %s share lease %s", other, name, o.Status.Leader.Lease)
		}
		leases[o.Status.Leader.Lease] = name
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
	// Each aws NativeCCM owns its region's node alone, and together they own
	// every aws node.
	for _, name := range []string{awsCCM, awsCCM2} {
		var o *v1alpha1.NativeCCM
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			o = chartstest.NativeCCM(t, ctx, f.Config, name)
			return apimeta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.NodesOwnedCondition) && o.Status.Nodes == 1, nil
		}); err != nil {
			t.Errorf("NativeCCM %s: %d nodes, NodesOwned %+v; want its region's one node, every aws node owned", name, o.Status.Nodes,
				apimeta.FindStatusCondition(o.Status.Conditions, v1alpha1.NodesOwnedCondition))
		}
	}
	// Every native CCM pod reached Ready without a restart of any container:
	// the gate holds the CCM back until its release's RBAC is in effect
	// (issue 22 item 8: the hcloud CCM exited twice at its first start, each
	// exit adding crash-loop back-off).
	assertNativeCCMsStartedOnce(t, ctx)
	if o := chartstest.NativeCCM(t, ctx, f.Config, "digital-ocean"); o.Status.Release != nil {
		t.Errorf("suspended NativeCCM digital-ocean has release %+v", o.Status.Release)
	}

	// The product stays up: every native CCM renews its lease several times
	// while no container of the product restarts; every pod of the product
	// is Ready, each runs as its own ServiceAccount with no admin power.
	renewals(t, ctx, nativeCCMs, 3)
	pods := productPods(t, ctx)
	var running []string
	for _, p := range pods {
		running = append(running, p.Labels["app.kubernetes.io/name"]+"/"+p.Spec.ServiceAccountName)
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			done := cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0 // an init container that ran
			if cs.RestartCount != 0 || (!cs.Ready && !done) {
				t.Errorf("pod %s container %s: ready %v, %d restarts, last state %+v", p.Name, cs.Name, cs.Ready, cs.RestartCount, cs.LastTerminationState.Terminated)
			}
		}
	}
	slices.Sort(running)
	t.Logf("pods of the product: %v", running)
	// talos-ccm and its standby, ccm-coordinator, one pod per native CCM.
	if len(running) != 2+1+len(nativeCCMs) {
		t.Errorf("pods of the product %v, want two of talos-ccm, ccm-coordinator and one per native CCM %v", running, nativeCCMs)
	}
	noAdminCredentials(t, ctx, pods)

	// Nothing asked a cloud about a node not its own.
	noForeignQuestions(t)

	// LoadBalancer Services: each of the hcloud and aws CCMs (their service
	// controllers behind their gates) serves its own class, aws also those
	// without a class; each load balancer targets only its cloud's nodes.
	t.Run("LoadBalancers", func(t *testing.T) { loadBalancers(t, ctx) })
	// Every EC2 call so far (the load balancers') went to the endpoint of
	// the region of the nodes it names.
	awsAskedInItsRegion(t, awsNodes)

	// Metrics, scraped as docs/operations.md says.
	t.Run("Metrics", func(t *testing.T) { scrapeMetrics(t, ctx) })

	// `helm test`, as docs/operations.md says: it passes on this install,
	// and fails naming the problem when the coordinator is scaled to 0.
	t.Run("HelmTest", func(t *testing.T) { helmTest(t, ctx) })
}

// noForeignQuestions fails the test for every question a cloud was asked
// about a node of another platform (test/fleet's clouds record them: what a
// gated CCM never asks).
func noForeignQuestions(t *testing.T) {
	t.Helper()
	for _, q := range clouds.Questions() {
		if q.Foreign {
			t.Errorf("the %s CCM asked its cloud about %s, a node not its own (%d times)", q.Provider, q.About, q.Times)
		}
	}
}

// productPods are the pods of the product: the chart's (talos-ccm in
// kube-system, ccm-coordinator) and the native CCMs', not being deleted.
func productPods(t *testing.T, ctx context.Context) []corev1.Pod {
	t.Helper()
	var out []corev1.Pod
	for _, ns := range []string{namespace, ccmNamespace} {
		list, err := f.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// renewals waits until every native CCM's lease was renewed n more times.
func renewals(t *testing.T, ctx context.Context, ccms []string, n int) {
	t.Helper()
	seen := map[string][]time.Time{}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		done := true
		for _, name := range ccms {
			l, err := f.Client.CoordinationV1().Leases(ccmNamespace).Get(ctx, "native-ccm-"+name, metav1.GetOptions{})
			if err != nil || l.Spec.RenewTime == nil {
				return false, nil
			}
			ts := seen[name]
			if len(ts) == 0 || !ts[len(ts)-1].Equal(l.Spec.RenewTime.Time) {
				seen[name] = append(ts, l.Spec.RenewTime.Time)
			}
			done = done && len(seen[name]) > n
		}
		return done, nil
	}); err != nil {
		t.Errorf("native CCM leases not renewed %d times: %v", n, seen)
	}
}

// noAdminCredentials: no pod of the product runs as the default
// ServiceAccount, mounts a host path or another identity's token Secret,
// and no pod's ServiceAccount is bound to cluster-admin, admin or edit.
func noAdminCredentials(t *testing.T, ctx context.Context, pods []corev1.Pod) {
	t.Helper()
	crbs, err := f.Client.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rbs, err := f.Client.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	powerful := map[string]bool{"cluster-admin": true, "admin": true, "edit": true, "system:controller:clusterrole-aggregation-controller": true}
	type binding struct {
		name, role string
		subjects   []rbacv1.Subject
	}
	var bindings []binding
	for _, b := range crbs.Items {
		bindings = append(bindings, binding{"ClusterRoleBinding " + b.Name, b.RoleRef.Name, b.Subjects})
	}
	for _, b := range rbs.Items {
		if b.RoleRef.Kind == "ClusterRole" {
			bindings = append(bindings, binding{"RoleBinding " + b.Namespace + "/" + b.Name, b.RoleRef.Name, b.Subjects})
		}
	}
	for _, p := range pods {
		sa := p.Spec.ServiceAccountName
		if sa == "" || sa == "default" {
			t.Errorf("pod %s runs as ServiceAccount %q: every component has its own", p.Name, sa)
		}
		for _, v := range p.Spec.Volumes {
			if v.HostPath != nil {
				t.Errorf("pod %s mounts host path %s", p.Name, v.HostPath.Path)
			}
			if v.Secret != nil && strings.Contains(v.Secret.SecretName, "token") {
				t.Errorf("pod %s mounts Secret %s", p.Name, v.Secret.SecretName)
			}
		}
		for _, b := range bindings {
			for _, s := range b.subjects {
				if s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == p.Namespace && powerful[b.role] {
					t.Errorf("pod %s: ServiceAccount %s is bound to %s by %s", p.Name, sa, b.role, b.name)
				}
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

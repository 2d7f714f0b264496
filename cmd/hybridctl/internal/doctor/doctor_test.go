package doctor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/cli"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/doctor"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{
		CRDDirectoryPaths: []string{filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "crds")},
	}, func(e *testenv.Env) { env = e }))
}

func node(name, platform, providerID string, uninitialized bool, podCIDRs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
		Spec: corev1.NodeSpec{ProviderID: providerID, PodCIDRs: podCIDRs}}
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR = podCIDRs[0]
	}
	if platform != "" {
		n.Labels[names.PlatformLabel] = platform
	}
	if uninitialized {
		n.Spec.Taints = []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	}
	return n
}

func ccmDeployment(name string, labels map[string]string, image string, args ...string) *appsv1.Deployment {
	sel := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: labels},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ccm", Image: image, Args: args}}}}},
	}
}

// coordinatorNS is the coordinator's namespace, whose native CCMs the fence
// confines.
const coordinatorNS = "hybrid-ccm-system"

// grant creates NativeCCM n's fence grant, as the hybrid-ccm chart does.
func grant(t *testing.T, c client.Client, n *v1.NativeCCM) {
	t.Helper()
	if err := gate.EnsureGrant(context.Background(), c, gate.GrantFor(n, coordinatorNS)); err != nil {
		t.Fatal(err)
	}
}

func nativeCCM(t *testing.T, c client.Client, name string, ready metav1.ConditionStatus, reason, msg string) {
	t.Helper()
	ctx := context.Background()
	n := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{Platform: name}}
	if name != "aws" { // aws's grant is missing
		grant(t, c, n)
	}
	if err := c.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	apimeta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: "Ready", Status: ready, Reason: reason, Message: msg})
	if err := c.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

func create(t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func findings(r *doctor.Report) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.Check+" "+f.Object)
	}
	sort.Strings(out)
	return out
}

func TestDoctor(t *testing.T) {
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	later := doctor.Options{UninitializedAfter: 10 * time.Minute, CSRPendingAfter: 5 * time.Minute, Now: time.Now().Add(time.Hour)}

	// a healthy cluster: the fence, initialized node, talos-ccm, a
	// lifecycle-only CCM with its own lease, a Ready NativeCCM with its grant
	if _, err := gate.EnsureFence(ctx, c, gate.Fence{Namespace: coordinatorNS}); err != nil {
		t.Fatal(err)
	}
	// talos-ccm and the coordinator (as the umbrella chart names it) each
	// with a ready replica leading
	create(t, c,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: coordinatorNS, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}},
		node("good-1", "hcloud", "hcloud://1", false, "10.244.0.0/24"),
		ccmDeployment("talos-ccm", nil, "ghcr.io/hybrid-ccm/talos-ccm:v0.1.0", "--cloud-provider=talos", "--leader-elect-resource-name=talos-ccm"),
		ccmDeployment("native-ccm-hcloud", map[string]string{"hybridccm.io/managed-by": "ccm-coordinator"},
			"docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.26.0", "--cloud-provider=hcloud", "--controllers=cloud-node-lifecycle", "--leader-elect-resource-name=native-ccm-hcloud"),
	)
	coordinator := ccmDeployment("hybrid-ccm", map[string]string{"app.kubernetes.io/name": "ccm-coordinator"}, "ghcr.io/hybrid-ccm/ccm-coordinator:v0.1.0")
	coordinator.Namespace = coordinatorNS
	coordinator.Spec.Template.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	coordinator.Spec.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	create(t, c, coordinator)
	setReady(t, c, "kube-system", "talos-ccm", 1)
	setReady(t, c, coordinatorNS, "hybrid-ccm", 1)
	create(t, c, lease("kube-system", "talos-ccm", "cp-1_0f3c", later.Now), lease(coordinatorNS, "ccm-coordinator.hybridccm.io", "hybrid-ccm-6d9f_1a2b", later.Now))
	nativeCCM(t, c, "hcloud", metav1.ConditionTrue, "Installed", "release native-ccm-hcloud deployed")
	rep, err := doctor.Run(ctx, c, later)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 0 || rep.Inspected != (doctor.Counts{Nodes: 1, NativeCCMs: 1, Workloads: 2}) {
		t.Fatalf("healthy cluster: %+v", rep)
	}
	out, err := runDoctor()
	if err != nil || !strings.Contains(out, "No problems found.") {
		t.Fatalf("healthy cluster: hybridctl doctor = %v\n%s", err, out)
	}
	// its JSON: findings, notes and what was inspected, each in lower camel case
	out, err = runDoctor("-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("hybridctl doctor -o json: %v\n%s", err, out)
	}
	if got := slices.DeleteFunc(slices.Sorted(maps.Keys(doc)), func(k string) bool { return k == "notes" }); fmt.Sprint(got) != "[findings inspected]" {
		t.Errorf("doctor -o json keys %v, want findings, inspected (and notes):\n%s", got, out)
	}
	if in, _ := doc["inspected"].(map[string]any); fmt.Sprint(in) != "map[ccmWorkloads:2 kubeletServingCSRs:0 nativeCCMs:1 nodes:1]" {
		t.Errorf("doctor -o json inspected = %v", in)
	}

	// now every kind of problem
	create(t, c,
		node("stuck-1", "", "", true),
		node("nolabel-1", "", "aws:///us-east-1a/i-1", false),
		node("noid-1", "metal", "", false),
		node("overlap-a", "metal", "talos://metal/10.0.0.1", false, "10.244.1.0/24"),
		node("overlap-b", "metal", "talos://metal/10.0.0.2", false, "10.244.1.128/25", "fd00:10::/64"),
		ccmDeployment("aws-cloud-controller-manager", nil, "registry.k8s.io/provider-aws/cloud-controller-manager:v1.30.0", "--cloud-provider=aws"),
		ccmDeployment("gce-ccm", nil, "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v30", "--cloud-provider=gce", "--controllers=cloud-node-lifecycle"),
	)
	nativeCCM(t, c, "aws", metav1.ConditionFalse, "CredentialsMissing", "secret kube-system/aws-credentials not found")
	// a NativeCCM the coordinator never reconciled: the fix points to the
	// coordinator's logs, under the name it runs as
	fresh := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "fresh"}, Spec: v1.NativeCCMSpec{Platform: "fresh"}}
	grant(t, c, fresh)
	create(t, c, fresh)
	// a second talos-ccm with no ready replica, a third whose replicas run
	// but whose lease nobody holds
	zero := ccmDeployment("talos-ccm-zero", nil, "ghcr.io/hybrid-ccm/talos-ccm:v0.1.0", "--cloud-provider=talos", "--leader-elect-resource-name=talos-ccm-zero")
	zero.Namespace = "default"
	leaderless := ccmDeployment("talos-ccm-leaderless", nil, "ghcr.io/hybrid-ccm/talos-ccm:v0.1.0", "--cloud-provider=talos", "--leader-elect-resource-name=talos-ccm-leaderless")
	leaderless.Namespace = "default"
	create(t, c, zero, leaderless, lease("kube-system", "talos-ccm-leaderless", "", later.Now))
	setReady(t, c, "default", "talos-ccm-leaderless", 1)
	// the native CCMs' node rights: hcloud's own (fenced), one left behind
	// by a NativeCCM that is gone (fenced: refused everything), one of a
	// namespace the fence does not confine, and one given to a user
	lifecycle := func(name string, s rbacv1.Subject) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: release.LifecycleClusterRole},
			Subjects: []rbacv1.Subject{s}}
	}
	// two NativeCCMs that both want to be the default for classless Services
	for _, n := range []string{"lb-one", "lb-two"} {
		obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: v1.NativeCCMSpec{Platform: n, Suspend: true,
			LoadBalancers: &v1.LoadBalancers{Enabled: true, Default: true}}}
		grant(t, c, obj)
		create(t, c, obj)
	}
	create(t, c,
		lifecycle("native-ccm-hcloud", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "native-ccm-hcloud", Namespace: coordinatorNS}),
		lifecycle("native-ccm-gone", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "native-ccm-gone", Namespace: coordinatorNS}),
		lifecycle("native-ccm-elsewhere", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "native-ccm-elsewhere", Namespace: "kube-system"}),
		lifecycle("someones", rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}),
		// NativeCCM gone's identity and grant, left behind
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-gone", Namespace: coordinatorNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-hcloud", Namespace: coordinatorNS}},
	)
	grant(t, c, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "gone"}, Spec: v1.NativeCCMSpec{Platform: "hcloud"}})
	// a NativeCCM split by region: its members' identities are no orphans
	// (one in status.members, one the coordinator is installing); a value it
	// does not serve is a finding of its own. A member identity of a
	// NativeCCM that is not split is an orphan.
	split := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "split"}, Spec: v1.NativeCCMSpec{Platform: "split",
		Domain: &v1.Domain{SplitBy: "topology.kubernetes.io/region"}}}
	grant(t, c, split)
	create(t, c, split,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-split--eu-west-1", Namespace: coordinatorNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-split--us-east-1", Namespace: coordinatorNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-hcloud--fsn1", Namespace: coordinatorNS}},
		// the fence reads it as split's member for "eu--x" (first "--"):
		// no member has that value
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-split--eu--x", Namespace: coordinatorNS}})
	split.Status.Members = []v1.MemberStatus{{Value: "eu-west-1", Release: "native-ccm-split--eu-west-1", Ready: true}}
	apimeta.SetStatusCondition(&split.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", Message: "every member leads"})
	apimeta.SetStatusCondition(&split.Status.Conditions, metav1.Condition{Type: v1.NodesOwnedCondition, Status: metav1.ConditionFalse, Reason: "SplitValuesUnserved",
		Message: "1 node(s) with topology.kubernetes.io/region=ap-south-1 have no member: more than 32 values"})
	if err := c.Status().Update(ctx, split); err != nil {
		t.Fatal(err)
	}
	// installed, Helm content, but the CCM exits at start (issue 17)
	const forbidden = `unable to load configmap based request-header-client-ca-file: configmaps "extension-apiserver-authentication" is forbidden`
	crashing := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "gcp"}, Spec: v1.NativeCCMSpec{Platform: "gcp"}}
	grant(t, c, crashing)
	create(t, c, crashing)
	crashing.Status.Release = &v1.ReleaseStatus{Name: "native-ccm-gcp", Namespace: "kube-system", Revision: 1}
	for _, ct := range []string{"Ready", v1.HealthyCondition} {
		apimeta.SetStatusCondition(&crashing.Status.Conditions, metav1.Condition{Type: ct, Status: metav1.ConditionFalse,
			Reason: v1.CrashLoopingReason, Message: "container gcp-cloud-controller-manager of pod native-ccm-gcp-6d4b7c9f8-kx7vq restarted 3 time(s), last exit code 1 (Error): " + forbidden})
	}
	apimeta.SetStatusCondition(&crashing.Status.Conditions, metav1.Condition{Type: v1.InstalledCondition, Status: metav1.ConditionTrue, Reason: v1.InstallSucceededReason, Message: "installed"})
	if err := c.Status().Update(ctx, crashing); err != nil {
		t.Fatal(err)
	}
	// a NativeCCM that takes over from the AWS CCM the cluster runs, waiting
	// for it to stop; one whose previous CCM runs again beside it
	waiting := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "takeover"}, Spec: v1.NativeCCMSpec{Platform: "takeover",
		TakeOver: &v1.TakeOver{Lease: "kube-system/cloud-controller-manager"}}}
	beside := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "beside"}, Spec: v1.NativeCCMSpec{Platform: "beside",
		TakeOver: &v1.TakeOver{Lease: "kube-system/cloud-controller-manager"}}}
	for _, n := range []*v1.NativeCCM{waiting, beside} {
		grant(t, c, n)
		create(t, c, n)
	}
	apimeta.SetStatusCondition(&waiting.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: v1.WaitingForPreviousCCMReason,
		Message: `waiting for the previous CCM to stop: Lease kube-system/cloud-controller-manager is held by "aws-cloud-controller-manager-x7k2p_5c1e", renewed 1s ago (lease duration 15s)`})
	beside.Status.Release = &v1.ReleaseStatus{Name: "native-ccm-beside", Namespace: coordinatorNS, Revision: 1}
	apimeta.SetStatusCondition(&beside.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: v1.InstallSucceededReason, Message: "installed"})
	apimeta.SetStatusCondition(&beside.Status.Conditions, metav1.Condition{Type: v1.ConflictCondition, Status: metav1.ConditionTrue, Reason: v1.ForeignCloudNodeControllerReason,
		Message: "DaemonSet/kube-system/aws-cloud-controller-manager (not managed by ccm-coordinator) runs the cloud-node controller (--controllers=*); " +
			`the previous CCM runs again beside this one: Lease kube-system/cloud-controller-manager is held by "aws-cloud-controller-manager-x7k2p_5c1e" and renewed within its lease duration (15s) (spec.takeOver.lease); uninstall it`})
	for _, n := range []*v1.NativeCCM{waiting, beside} {
		if err := c.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	pemBytes := csrtest.Request{NodeName: "stuck-1", DNSNames: []string{"stuck-1"}}.MustPEM()
	create(t, c, csrtest.Object("stuck-1-serving", pemBytes))
	// a decided CSR is not a problem
	decided := csrtest.Object("good-1-serving", csrtest.Request{NodeName: "good-1", DNSNames: []string{"good-1"}}.MustPEM())
	create(t, c, decided)
	decided.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test"}}
	if err := c.SubResource("approval").Update(ctx, decided); err != nil {
		t.Fatal(err)
	}

	rep, err = doctor.Run(ctx, c, later)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ControllerNotReady deployment/default/talos-ccm-zero",
		"ControllerWithoutLeader lease/kube-system/talos-ccm-leaderless",
		"FenceGrantMissing nativeccm/aws",
		"ForeignCloudNodeController Deployment/kube-system/aws-cloud-controller-manager",
		"KubeletServingCSRPending csr/stuck-1-serving",
		"LoadBalancerClassConflict loadbalancerclass/(none)",
		"NativeCCMNodesNotOwned nativeccm/split",
		"NativeCCMNotReady nativeccm/aws",
		"NativeCCMNotReady nativeccm/fresh",
		"NativeCCMNotRunning nativeccm/gcp",
		"NativeCCMWaitingForPreviousCCM nativeccm/takeover",
		"NodeUninitialized node/stuck-1",
		"NodeWithoutPlatformLabel node/nolabel-1",
		"NodeWithoutProviderID node/noid-1",
		"OrphanedFenceGrant clusterrole/hybrid-ccm:fence:gone",
		"OrphanedNativeCCMIdentity serviceaccount/hybrid-ccm-system/native-ccm-gone",
		"OrphanedNativeCCMIdentity serviceaccount/hybrid-ccm-system/native-ccm-hcloud--fsn1",
		"OrphanedNativeCCMIdentity serviceaccount/hybrid-ccm-system/native-ccm-split--eu--x",
		"OrphanedNativeCCMIdentity serviceaccount/hybrid-ccm-system/native-ccm-split--us-east-1",
		"PodCIDROverlap node/overlap-b",
		"PreviousCCMRunning nativeccm/beside",
		"SharedLeaderLease lease/kube-system/cloud-controller-manager",
		"UnfencedNodeLifecycleGrant clusterrolebinding/native-ccm-elsewhere",
		"UnfencedNodeLifecycleGrant clusterrolebinding/someones",
	}
	if got := findings(rep); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("findings:\n got %q\nwant %q", got, want)
	}
	for _, f := range rep.Findings {
		if f.Object == "serviceaccount/"+coordinatorNS+"/native-ccm-split--eu--x" && !strings.Contains(f.Message, `a member of NativeCCM split for "eu--x"`) {
			t.Errorf("a member name with two separators: %s", f.Message)
		}
		if f.Object == "serviceaccount/"+coordinatorNS+"/native-ccm-split--us-east-1" && !strings.Contains(f.Message, `a member of NativeCCM split for "us-east-1", which split does not list (status.members) after 15m0s`) {
			t.Errorf("split member left behind: %s", f.Message)
		}
		if f.Object == "nativeccm/takeover" && (!strings.Contains(f.Message, `Lease kube-system/cloud-controller-manager is held by "aws-cloud-controller-manager-x7k2p_5c1e"`) ||
			!strings.Contains(f.Fix, "uninstall the CCM that holds Lease kube-system/cloud-controller-manager") || !strings.Contains(f.Fix, "native-ccm-takeover is installed once that Lease runs out")) {
			t.Errorf("waiting for the previous CCM: %s (fix: %s)", f.Message, f.Fix)
		}
		if f.Check == doctor.CheckPreviousCCMRunning && !strings.Contains(f.Fix, "uninstall the CCM that holds Lease kube-system/cloud-controller-manager") {
			t.Errorf("previous CCM running again: fix %q", f.Fix)
		}
		if f.Message == "" || f.Fix == "" {
			t.Errorf("finding %s %s lacks message or fix", f.Check, f.Object)
		}
	}
	// the same cluster seen "now": young nodes and CSRs are not yet problems,
	// nor a split member's identity its NativeCCM does not list yet
	rep, err = doctor.Run(ctx, c, doctor.Options{UninitializedAfter: 10 * time.Minute, CSRPendingAfter: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range findings(rep) {
		if strings.HasPrefix(f, doctor.CheckUninitialized) || strings.HasPrefix(f, doctor.CheckPendingCSR) || strings.HasSuffix(f, "native-ccm-split--us-east-1") || strings.HasSuffix(f, "native-ccm-split--eu--x") {
			t.Errorf("young object reported: %s", f)
		}
	}
	// the command exits non-zero and explains
	out, err = runDoctor("--uninitialized-after=0s", "--csr-pending-after=0s")
	if !errors.Is(err, cli.ErrFindings) {
		t.Fatalf("want ErrFindings, got %v\n%s", err, out)
	}
	for _, s := range []string{"22 problem(s)", "NativeCCMWaitingForPreviousCCM", "PreviousCCMRunning", "talos-ccm: 0 of 1 replicas ready", "kubectl -n default describe deploy/talos-ccm-zero",
		"talos-ccm has ready replicas but its leader-election Lease has no holder: none leads", "check ccm-coordinator is running: kubectl -n hybrid-ccm-system logs deploy/hybrid-ccm", "NativeCCMs lb-one, lb-two are all the default",
		"NativeCCM gone, which does not exist: the fence refuses it every node and Service write",
		"NativeCCM hcloud's member for \"fsn1\", but hcloud is not split",
		"nodes of its domain have no CCM: SplitValuesUnserved: 1 node(s) with topology.kubernetes.io/region=ap-south-1",
		"a ServiceAccount native-ccm-gone is confined to what it grants instead of refused everything",
		"ServiceAccount hybrid-ccm-system/native-ccm-aws is not granted NativeCCM aws, platform aws (fence.hybridccm.io/fence), so the fence refuses its writes",
		"create ClusterRole and ClusterRoleBinding hybrid-ccm:fence:aws with the NativeCCM",
		"the fence confines only the native CCMs of namespace hybrid-ccm-system", "aws-cloud-controller-manager", "How to fix:", "overlaps 10.244.1.0/24 of node overlap-a",
		"its CCM is not running: CrashLooping", forbidden, "logs -l hybridccm.io/native-ccm=native-ccm-gcp --all-containers --previous"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

func runDoctor(args ...string) (string, error) {
	cmd := cli.NewRootCommand()
	var buf strings.Builder
	cmd.SetOut(&buf)
	cmd.SetErr(&buf)
	cmd.SetArgs(append([]string{"doctor", "--kubeconfig", env.KubeconfigPath}, args...))
	err := cmd.ExecuteContext(context.Background())
	return buf.String(), err
}

// TestDoctorFence: a fence the API server does not enforce as this version
// does is a finding: an older one with a paramKind (it refuses every node
// write of everyone after each API server start), one bound without Deny,
// one that is gone.
func TestDoctorFence(t *testing.T) {
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	fence := gate.Fence{Namespace: coordinatorNS}
	fenceFindings := func() []string {
		t.Helper()
		rep, err := doctor.Run(ctx, c, doctor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range rep.Findings {
			if f.Check == doctor.CheckFence {
				out = append(out, f.Object+": "+f.Message)
			}
		}
		return out
	}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = gate.EnsureFence(context.Background(), c, fence) })
	if got := fenceFindings(); len(got) != 0 {
		t.Fatalf("the current fence: %q", got)
	}
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := c.Get(ctx, client.ObjectKey{Name: gate.DefaultFenceName}, &binding); err != nil {
		t.Fatal(err)
	}
	binding.Spec.ValidationActions = []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn}
	if err := c.Update(ctx, &binding); err != nil {
		t.Fatal(err)
	}
	if got := fenceFindings(); len(got) != 1 || !strings.Contains(got[0], "does not bind the fence with Deny") {
		t.Fatalf("a fence that only warns: %q", got)
	}
	// the fence of the previous design: paramKind NativeCCM
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: gate.DefaultFenceName}, &policy); err != nil {
		t.Fatal(err)
	}
	policy.Spec.ParamKind = &admissionregistrationv1.ParamKind{APIVersion: v1.GroupVersion.String(), Kind: v1.NativeCCMKind}
	if err := c.Update(ctx, &policy); err != nil {
		t.Fatal(err)
	}
	if got := fenceFindings(); len(got) != 2 || !strings.Contains(strings.Join(got, "\n"), "has paramKind hybridccm.io/v1alpha1 NativeCCM: an older fence, which refuses every node write of every identity") {
		t.Fatalf("a fence with a paramKind: %q", got)
	}
	if err := gate.DeleteFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	if got := fenceFindings(); len(got) != 1 || !strings.Contains(got[0], "does not exist: the API server confines no native CCM") {
		t.Fatalf("no fence: %q", got)
	}
}

// fencedNamespace returns an admin client, with the fence of the
// coordinator's namespace installed and the namespace (TestDoctor's, or new).
func fencedNamespace(t *testing.T) (client.Client, corev1.Namespace) {
	t.Helper()
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gate.EnsureFence(ctx, c, gate.Fence{Namespace: coordinatorNS}); err != nil {
		t.Fatal(err)
	}
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: coordinatorNS}, &ns); err != nil {
		ns = corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: coordinatorNS}}
		create(t, c, &ns)
	}
	return c, ns
}

// coordinatorPolicy is the coordinator's admission policy as the
// ccm-coordinator chart renders it with values.
func coordinatorPolicy(t *testing.T, values map[string]any) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	ch, err := loader.Load(filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator"))
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: "ccm-coordinator", Namespace: "kube-system", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	var p admissionregistrationv1.ValidatingAdmissionPolicy
	for _, doc := range strings.Split(files["ccm-coordinator/templates/policy.yaml"], "\n---") {
		if err := yaml.Unmarshal([]byte(doc), &p); err != nil {
			t.Fatal(err)
		}
		if p.Kind == "ValidatingAdmissionPolicy" {
			return &p
		}
	}
	t.Fatal("the chart renders no ValidatingAdmissionPolicy in policy.yaml")
	return nil
}

// TestDoctorCoordinatorNamespace (issue 22): in the coordinator's
// namespace, a workload with host access, privileges or a root user, a
// Service that publishes something, and a Pod Security level below
// restricted are findings that name the fields; the host network of a
// platform whose profile declares it (per the coordinator's admission
// policy as its chart renders it) is not.
func TestDoctorCoordinatorNamespace(t *testing.T) {
	ctx := context.Background()
	// the namespace (TestDoctor's, or new), for now without Pod Security
	c, ns := fencedNamespace(t)
	labels := ns.Labels
	ns.Labels = nil
	if err := c.Update(ctx, &ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var ns corev1.Namespace
		if err := c.Get(context.Background(), client.ObjectKey{Name: coordinatorNS}, &ns); err == nil {
			ns.Labels = labels
			_ = c.Update(context.Background(), &ns)
		}
	})
	policy := coordinatorPolicy(t, map[string]any{})
	create(t, c, policy)
	t.Cleanup(func() { _ = c.Delete(context.Background(), policy) })

	safe := corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
		Containers:      []corev1.Container{{Name: "ccm", Image: "example.com/ccm:1", SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}}},
	}
	workload := func(kind, name, platform string, edit func(*corev1.PodSpec)) client.Object {
		spec := *safe.DeepCopy()
		if edit != nil {
			edit(&spec)
		}
		sel := map[string]string{"app": name}
		tpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name, release.PlatformLabel: platform}}, Spec: spec}
		meta := metav1.ObjectMeta{Name: name, Namespace: coordinatorNS}
		if kind == "DaemonSet" {
			return &appsv1.DaemonSet{ObjectMeta: meta, Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: tpl}}
		}
		return &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: tpl}}
	}
	service := func(name string, spec corev1.ServiceSpec) *corev1.Service {
		spec.Ports = []corev1.ServicePort{{Port: 80}}
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: coordinatorNS}, Spec: spec}
	}
	objs := []client.Object{
		workload("DaemonSet", "native-ccm-x", "hcloud", func(s *corev1.PodSpec) {
			s.HostPID, s.HostNetwork, s.HostIPC = true, true, true
			s.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0),
				Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}
			s.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		}),
		workload("Deployment", "native-ccm-root", "hcloud", func(s *corev1.PodSpec) { s.SecurityContext = nil }),
		workload("DaemonSet", "native-ccm-metal", "metal", func(s *corev1.PodSpec) { s.HostNetwork = true }),
		workload("Deployment", "native-ccm-safe", "hcloud", nil),
		service("open", corev1.ServiceSpec{ExternalIPs: []string{"10.0.0.10", "8.8.8.8"}}),
		service("nodeport", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort}),
		service("lb", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To("hybridccm.io/aws")}),
		service("internal", corev1.ServiceSpec{}),
	}
	create(t, c, objs...)
	for _, o := range objs {
		t.Cleanup(func() { _ = c.Delete(context.Background(), o) })
	}
	namespaceFindings := func() map[string]string {
		t.Helper()
		rep, err := doctor.Run(ctx, c, doctor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, f := range rep.Findings {
			switch f.Check {
			case doctor.CheckUnsafeWorkload, doctor.CheckPublishedSvc, doctor.CheckPodSecurity:
				if f.Message == "" || f.Fix == "" {
					t.Errorf("finding %s %s lacks message or fix", f.Check, f.Object)
				}
				out[f.Check+" "+f.Object] = f.Message
			}
		}
		return out
	}
	got := namespaceFindings()
	want := map[string][]string{
		"UnsafeWorkloadInCoordinatorNamespace daemonset/hybrid-ccm-system/native-ccm-x": {
			"spec.template.spec.hostPID", "spec.template.spec.hostIPC", "spec.template.spec.hostNetwork", "volumes[0].hostPath", `host path "/"`,
			"containers[0].securityContext.privileged", "containers[0].securityContext.capabilities.add", "SYS_ADMIN", "containers[0].securityContext.runAsUser"},
		"UnsafeWorkloadInCoordinatorNamespace deployment/hybrid-ccm-system/native-ccm-root": {"containers[0].securityContext.runAsNonRoot"},
		// no profile declares the host network yet
		"UnsafeWorkloadInCoordinatorNamespace daemonset/hybrid-ccm-system/native-ccm-metal": {"spec.template.spec.hostNetwork"},
		"PublishingServiceInCoordinatorNamespace service/hybrid-ccm-system/open":            {"spec.externalIPs 10.0.0.10, 8.8.8.8", "CVE-2020-8554"},
		"PublishingServiceInCoordinatorNamespace service/hybrid-ccm-system/nodeport":        {"NodePort"},
		"PublishingServiceInCoordinatorNamespace service/hybrid-ccm-system/lb":              {"LoadBalancer (class hybridccm.io/aws)"},
		"CoordinatorNamespacePodSecurity namespace/hybrid-ccm-system":                       {"enforces Pod Security level none"},
	}
	checkFindings := func(got map[string]string, want map[string][]string) {
		t.Helper()
		for k, parts := range want {
			msg, ok := got[k]
			if !ok {
				t.Errorf("no finding %s (got %q)", k, got)
				continue
			}
			for _, p := range parts {
				if !strings.Contains(msg, p) {
					t.Errorf("finding %s does not say %q: %s", k, p, msg)
				}
			}
		}
		for k, msg := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("unexpected finding %s: %s", k, msg)
			}
		}
	}
	checkFindings(got, want)

	// a profile declares the host network for metal (the chart renders the
	// policy with the override): metal's pod is no finding, and the
	// namespace's Pod Security level must let it run
	declared := coordinatorPolicy(t, map[string]any{"profileOverrides": map[string]any{"metal.yaml": map[string]any{
		"apiVersion": "hybridccm.io/v1alpha1", "kind": "Profile", "name": "metal", "platforms": []any{"metal"}, "providerIDPrefixes": []any{"metal://"},
		"ccm":         map[string]any{"image": map[string]any{"repository": "example.com/metal", "tag": "v1"}, "cloudProvider": "metal", "securePort": 10299, "hostNetwork": true},
		"credentials": map[string]any{"none": true}, "chart": map[string]any{"source": "builtin"}}}})
	var current admissionregistrationv1.ValidatingAdmissionPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: policy.Name}, &current); err != nil {
		t.Fatal(err)
	}
	current.Spec = declared.Spec
	if err := c.Update(ctx, &current); err != nil {
		t.Fatal(err)
	}
	delete(want, "UnsafeWorkloadInCoordinatorNamespace daemonset/hybrid-ccm-system/native-ccm-metal")
	delete(want, "CoordinatorNamespacePodSecurity namespace/hybrid-ccm-system")
	checkFindings(namespaceFindings(), want)
}

// setReady records ready replicas in a Deployment's status, as the
// Deployment controller would.
func setReady(t *testing.T, c client.Client, ns, name string, ready int32) {
	t.Helper()
	var d appsv1.Deployment
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &d); err != nil {
		t.Fatal(err)
	}
	d.Status.Replicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = ready, ready, ready
	if err := c.Status().Update(context.Background(), &d); err != nil {
		t.Fatal(err)
	}
}

// lease is a leader-election Lease held by holder (none when empty),
// renewed at renewed for 15 s.
func lease(ns, name, holder string, renewed time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &metav1.MicroTime{Time: renewed}}}
	if holder != "" {
		l.Spec.HolderIdentity = &holder
	}
	return l
}

// TestDoctorUpstreamSkew: a NativeCCM whose upstream CCM is two minors older
// than the API server, or newer, is a finding (with the fix for where its
// tag came from); one minor older, the same minor, or an unknown minor is not.
func TestDoctorUpstreamSkew(t *testing.T) {
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		name, source, minor string
		skew                *int32
	}{
		{"skew-old", "Profile", "1.34", ptr.To[int32](2)},
		{"skew-new", "Override", "1.37", ptr.To[int32](-1)},
		{"skew-one", "Profile", "1.35", ptr.To[int32](1)},
		{"skew-none", "Profile", "1.36", ptr.To[int32](0)},
		{"skew-unknown", "ProfileDefault", "", nil},
	} {
		obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: v1.NativeCCMSpec{Platform: n.name}}
		create(t, c, obj)
		obj.Status.Upstream = &v1.UpstreamStatus{Image: "registry.example/ccm:" + n.minor, Source: n.source,
			KubernetesMinor: n.minor, APIServerVersion: "v1.36.3", Skew: n.skew}
		if err := c.Status().Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := doctor.Run(ctx, c, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]doctor.Finding{}
	for _, f := range rep.Findings {
		if f.Check == doctor.CheckUpstreamSkew {
			got[f.Object] = f
		}
	}
	if len(got) != 2 {
		t.Fatalf("skew findings %v, want nativeccm/skew-old and nativeccm/skew-new", got)
	}
	if f := got["nativeccm/skew-old"]; !strings.Contains(f.Message, "registry.example/ccm:1.34 (for Kubernetes 1.34), 2 minor(s) older than the API server v1.36.3") ||
		!strings.Contains(f.Fix, "ccm.image.tags") {
		t.Errorf("finding %+v", f)
	}
	if f := got["nativeccm/skew-new"]; !strings.Contains(f.Message, "1 minor(s) newer than the API server v1.36.3") ||
		!strings.Contains(f.Fix, "kubectl edit nativeccm skew-new") {
		t.Errorf("finding %+v", f)
	}
}

// TestDoctorForeignNodeLabels: a NativeCCM whose CCM leaves foreign nodes
// alone by a label (GCP's) is a finding while an initialized node of another
// platform lacks it; its own nodes, unlabelled and uninitialized nodes are
// not counted, and a node with the label is fine.
func TestDoctorForeignNodeLabels(t *testing.T) {
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	const label = "components.gke.io/gke-unmanaged-node"
	labelled := node("0fl-aws-2", "fl-aws", "aws:///eu-west-1a/i-2", false)
	labelled.Labels[label] = "true"
	wrong := node("0fl-aws-3", "fl-aws", "aws:///eu-west-1a/i-3", false)
	wrong.Labels[label] = "false"
	create(t, c,
		node("0fl-gcp-1", "fl-gcp", "gce://p/z/fl-gcp-1", false),
		node("0fl-aws-1", "fl-aws", "aws:///eu-west-1a/i-1", false),
		labelled, wrong,
		node("0fl-young-1", "fl-aws", "", true),
	)
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "fl-gcp"}, Spec: v1.NativeCCMSpec{Platform: "fl-gcp"}}
	create(t, c, obj)
	obj.Status.Upstream = &v1.UpstreamStatus{Image: "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v36.3.8", Source: "Profile",
		NodeFilter: &v1.NodeFilterStatus{ForeignNodeLabels: []string{label + "=true"}}}
	if err := c.Status().Update(ctx, obj); err != nil {
		t.Fatal(err)
	}
	rep, err := doctor.Run(ctx, c, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []doctor.Finding
	for _, f := range rep.Findings {
		if f.Check == doctor.CheckForeignNodeLabels {
			got = append(got, f)
		}
	}
	// other tests' nodes of other platforms lack it too (the message names
	// the first five, in name order: these come first)
	if len(got) != 1 || got[0].Object != "nativeccm/fl-gcp" || !strings.Contains(got[0].Message, "0fl-aws-1") ||
		!strings.Contains(got[0].Message, "0fl-aws-3") || strings.Contains(got[0].Message, "0fl-aws-2") ||
		strings.Contains(got[0].Message, "0fl-gcp-1") || strings.Contains(got[0].Message, "0fl-young-1") ||
		!strings.Contains(got[0].Fix, "docs/profiles.md") {
		t.Fatalf("findings %+v", got)
	}
}

// TestDoctorNodesInNoDomain: nodes of a platform a NativeCCM serves that no
// NativeCCM's domain covers are found; a platform no NativeCCM serves is not
// reported this way.
func TestDoctorNodesInNoDomain(t *testing.T) {
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	const region = "topology.kubernetes.io/region"
	in := func(n *corev1.Node, r string) *corev1.Node { n.Labels[region] = r; return n }
	create(t, c,
		in(node("0dom-eu-1", "dom-aws", "aws:///eu-west-1a/i-1", false), "eu-west-1"),
		in(node("0dom-us-1", "dom-aws", "aws:///us-east-1a/i-2", false), "us-east-1"),
		node("0dom-none-1", "dom-aws", "aws:///x/i-3", false),
		in(node("0dom-other-1", "dom-unserved", "x://1", false), "us-east-1"),
	)
	create(t, c, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "dom-aws-eu"}, Spec: v1.NativeCCMSpec{Platform: "dom-aws",
		Domain: &v1.Domain{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{region: "eu-west-1"}}}}})
	rep, err := doctor.Run(ctx, c, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []doctor.Finding
	for _, f := range rep.Findings {
		if f.Check == doctor.CheckUnowned {
			got = append(got, f)
		}
	}
	if len(got) != 1 || got[0].Object != "platform/dom-aws" || !strings.Contains(got[0].Message, "2 node(s) of platform dom-aws") ||
		!strings.Contains(got[0].Message, "0dom-none-1, 0dom-us-1") || strings.Contains(got[0].Message, "0dom-eu-1") ||
		!strings.Contains(got[0].Fix, "spec.domain.selector") {
		t.Fatalf("findings %+v", got)
	}
}

package gate_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

func TestFenceValidate(t *testing.T) {
	tests := []struct {
		name  string
		fence gate.Fence
		// want is a substring of the error; empty: valid.
		want string
	}{
		{name: "valid", fence: gate.Fence{Namespace: "hybrid-ccm-system"}},
		{name: "valid with a name", fence: gate.Fence{Name: "x.example.com", Namespace: "kube-system"}},
		{name: "no namespace", fence: gate.Fence{}, want: "namespace"},
		{name: "namespace is not a label", fence: gate.Fence{Namespace: "a:b"}, want: "namespace"},
		{name: "bad name", fence: gate.Fence{Name: "A B", Namespace: "n"}, want: "name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.fence.Objects()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, gate.ErrConfig)):
				t.Fatalf("error %v, want an ErrConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestValidatePrefixes(t *testing.T) {
	for _, tc := range []struct {
		prefixes []string
		want     string
	}{
		{prefixes: []string{"hcloud://", "hrobot://"}},
		{prefixes: []string{"oci://", "ocid1."}},
		{prefixes: nil, want: "at least one"},
		{prefixes: []string{"h"}, want: "providerIDPrefixes[0]"},
		{prefixes: []string{"aws://", ""}, want: "providerIDPrefixes[1]"},
		{prefixes: []string{"a b://"}, want: "providerIDPrefixes[0]"},
		{prefixes: []string{"a://", "b://", "c://", "d://", "e://", "f://", "g://", "h://", "i://"}, want: "at most 8"},
	} {
		err := gate.ValidatePrefixes(tc.prefixes)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: unexpected error: %v", tc.prefixes, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, gate.ErrConfig)):
			t.Errorf("%q: error %v, want an ErrConfig mentioning %q", tc.prefixes, err, tc.want)
		}
	}
}

func TestPolicyShape(t *testing.T) {
	p, b, err := gate.Fence{Namespace: "hybrid-ccm-system"}.Objects()
	if err != nil {
		t.Fatal(err)
	}
	if got := *p.Spec.FailurePolicy; got != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %s, want Fail (Ignore lets evaluation errors through)", got)
	}
	// A param kind the API server cannot resolve or has not synced refuses
	// every request the rules match, before matchConditions, of everyone.
	if pk := p.Spec.ParamKind; pk != nil {
		t.Errorf("paramKind %+v, want none", pk)
	}
	if r := b.Spec.ParamRef; r != nil {
		t.Errorf("paramRef %+v, want none", r)
	}
	res := p.Spec.MatchConstraints.ResourceRules[0].Resources
	if strings.Join(res, ",") != "nodes,nodes/status,services,services/status" {
		t.Errorf("resources %v, want nodes and services with their status", res)
	}
	if b.Spec.PolicyName != p.Name || len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Errorf("binding %+v does not deny with policy %s", b.Spec, p.Name)
	}
	if len(p.Spec.MatchConditions) != 1 || p.Spec.MatchConditions[0].Expression != `request.userInfo.username.startsWith("system:serviceaccount:hybrid-ccm-system:native-ccm-")` {
		t.Errorf("matchConditions %+v do not select exactly the namespace's native CCM ServiceAccounts", p.Spec.MatchConditions)
	}
	// Nothing the coordinator writes: no NativeCCM, no params.
	for _, v := range p.Spec.Variables {
		if strings.Contains(v.Expression, "params") {
			t.Errorf("variable %s reads params: %s", v.Name, v.Expression)
		}
	}
	for _, v := range p.Spec.Validations {
		if strings.Contains(v.Expression, "params") || strings.Contains(v.MessageExpression, "params") {
			t.Errorf("validation %s reads params", v.Expression)
		}
	}
	if p.Annotations[gate.DigestAnnotation] != gate.FenceDigest() || b.Annotations[gate.DigestAnnotation] != gate.FenceDigest() {
		t.Errorf("digest annotations %v %v, want %s", p.Annotations, b.Annotations, gate.FenceDigest())
	}
	other, _, err := gate.Fence{Name: "other.example.com", Namespace: "elsewhere", ProviderIDPrefixes: map[string][]string{"x": {"x://"}}}.Objects()
	if err != nil || other.Annotations[gate.DigestAnnotation] != gate.FenceDigest() {
		t.Errorf("the digest depends on name, namespace or prefixes: %v %v", other.Annotations, err)
	}
}

func TestPrefixTable(t *testing.T) {
	builtin, err := gate.BuiltinPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	for platform, want := range map[string][]string{"hcloud": {"hcloud://", "hrobot://"}, "aws": {"aws://"}, "oracle": {"oci://", "ocid1."}} {
		if got := builtin[platform]; strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("built-in prefixes of %s: %v, want %v", platform, got, want)
		}
	}
	// Two profiles of one platform: the union, sorted, once each.
	table := gate.PrefixTable(
		&profile.Profile{Platforms: []string{"hcloud"}, ProviderIDPrefixes: []string{"hrobot://", "hcloud://"}},
		&profile.Profile{Platforms: []string{"hcloud", "robot"}, ProviderIDPrefixes: []string{"robot://", "hrobot://"}},
	)
	if got := strings.Join(table["hcloud"], ","); got != "hcloud://,hrobot://,robot://" {
		t.Errorf("hcloud: %s", got)
	}
	if got := strings.Join(table["robot"], ","); got != "hrobot://,robot://" {
		t.Errorf("robot: %s", got)
	}
}

// fenceFixture is one cluster state for the fence checks.
var fenceNodes = []gatetest.NodeSpec{
	{Name: "fence-own", Platform: "hcloud", ProviderID: "hcloud://1001"},
	{Name: "fence-own-robot", Platform: "hcloud", ProviderID: "hrobot://2002"},
	{Name: "fence-aws", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0abc"},
	{Name: "fence-metal", Platform: "metal", ProviderID: "talos://metal/10.0.0.5"},
	{Name: "fence-uninit", Platform: "", ProviderID: ""},
	{Name: "fence-hcloud-noid", Platform: "hcloud", ProviderID: ""},
	{Name: "fence-hcloud-awsid", Platform: "hcloud", ProviderID: "aws:///eu-west-1a/i-0def"},
	{Name: "fence-unlabelled-hcloudid", Platform: "", ProviderID: "hcloud://3003"},
}

func TestFence(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := e.Client
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns, sa = "kube-system", "native-ccm-hcloud"
	if err := gatetest.GrantNativeCCM(ctx, admin, ns, sa); err != nil {
		t.Fatal(err)
	}
	ccmCfg, err := gatetest.ServiceAccountUser(e, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	ccm := kubernetes.NewForConfigOrDie(ccmCfg)
	// Another native CCM the hcloud fence must not touch.
	if err := gatetest.GrantNativeCCM(ctx, admin, ns, "native-ccm-aws"); err != nil {
		t.Fatal(err)
	}
	awsCfg, err := gatetest.ServiceAccountUser(e, ns, "native-ccm-aws")
	if err != nil {
		t.Fatal(err)
	}
	awsCCM := kubernetes.NewForConfigOrDie(awsCfg)

	if err := gatetest.CreateNodes(ctx, admin, fenceNodes...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range fenceNodes {
			_ = admin.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		}
	})

	fence := gate.Fence{Namespace: ns}
	if err := gate.DeleteFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	changed, err := gate.EnsureFence(ctx, c, fence)
	if err != nil || !changed {
		t.Fatalf("EnsureFence: changed=%v err=%v, want a new policy", changed, err)
	}
	t.Cleanup(func() { _ = gate.DeleteFence(context.Background(), c, fence) })
	if err := gate.CheckFence(ctx, c, fence); err != nil {
		t.Fatalf("CheckFence of the fence just written: %v", err)
	}
	if changed, err := gate.EnsureFence(ctx, c, fence); err != nil || changed {
		t.Fatalf("second EnsureFence: changed=%v err=%v, want no write", changed, err)
	}
	// The NativeCCMs and their grants, as an admin (or the hybrid-ccm chart)
	// leaves them; the prefixes of hcloud and aws are the built-in profiles'.
	// "aws" is another native CCM the hcloud one must not touch and that must
	// not touch hcloud's. "bare" has RBAC for nodes but no NativeCCM, so no
	// grant: an orphaned identity.
	for _, p := range []struct{ name, platform string }{{"hcloud", "hcloud"}, {"aws", "aws"}} {
		remove, err := gatetest.Confine(ctx, c, fence, p.name, p.platform)
		if remove != nil {
			t.Cleanup(remove)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := gatetest.GrantNativeCCM(ctx, admin, ns, "native-ccm-bare"); err != nil {
		t.Fatal(err)
	}
	bareCfg, err := gatetest.ServiceAccountUser(e, ns, "native-ccm-bare")
	if err != nil {
		t.Fatal(err)
	}
	bare := kubernetes.NewForConfigOrDie(bareCfg)
	// "wild" has its grant, and cluster-admin besides: RBAC then grants it
	// every platform, which the fence refuses.
	remove, err := gatetest.Confine(ctx, c, fence, "wild", "hcloud")
	t.Cleanup(remove)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "fence-test-wild-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "native-ccm-wild", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), "fence-test-wild-admin", metav1.DeleteOptions{})
	})
	wildCfg, err := gatetest.ServiceAccountUser(e, ns, "native-ccm-wild")
	if err != nil {
		t.Fatal(err)
	}
	wild := kubernetes.NewForConfigOrDie(wildCfg)
	if err := gatetest.WaitFence(ctx, ccm, "fence-aws", true); err != nil {
		t.Fatalf("fence never became active: %v", err)
	}
	// ...with the prefixes just written (an older fence may linger for a
	// moment): the Robot node is hcloud's.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return ccm.CoreV1().Nodes().Delete(ctx, "fence-own-robot", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}) == nil, nil
	}); err != nil {
		t.Fatalf("the fence never let hcloud's CCM delete its Robot node: %v", err)
	}

	taint := `{"spec":{"taints":[{"key":"node.cloudprovider.kubernetes.io/shutdown","effect":"NoSchedule"}]}}`
	condition := `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Probe","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`
	dry := []string{metav1.DryRunAll}
	patch := func(cs kubernetes.Interface, node, body string, sub ...string) error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{DryRun: dry}, sub...)
		return err
	}
	del := func(cs kubernetes.Interface, node string) error {
		return cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: dry})
	}
	update := func(cs kubernetes.Interface, node string, edit func(*corev1.Node)) error {
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(n)
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{DryRun: dry})
		return err
	}

	checks := []struct {
		name string
		// do is the request, dry-run, so that the fixture stays.
		do func() error
		// allow: the request must pass; otherwise it must be denied by the fence.
		allow bool
		// node the denial message must name.
		node string
		// who the denial must name (default NativeCCM hcloud), and a reason it
		// must give (optional).
		who, reason string
	}{
		{name: "taint own node", do: func() error { return patch(ccm, "fence-own", addShutdownTaint(t, admin, "fence-own")) }, allow: true},
		{name: "taint own Robot node", do: func() error { return patch(ccm, "fence-own-robot", addShutdownTaint(t, admin, "fence-own-robot")) }, allow: true},
		{name: "replace own node's taints by the shutdown taint", do: func() error { return patch(ccm, "fence-own", taint) }, node: "fence-own"},
		{name: "update own node's taints", do: func() error {
			return update(ccm, "fence-own", func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: gate.ShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule})
			})
		}, allow: true},
		{name: "status of own node", do: func() error { return patch(ccm, "fence-own", condition, "status") }, node: "fence-own"},
		{name: "update own node's annotations", do: func() error {
			return update(ccm, "fence-own", func(n *corev1.Node) { n.Annotations = map[string]string{"x": "y"} })
		}, node: "fence-own"},
		{name: "delete own node", do: func() error { return del(ccm, "fence-own") }, allow: true},
		{name: "delete own Robot node", do: func() error { return del(ccm, "fence-own-robot") }, allow: true},

		{name: "taint aws node", do: func() error { return patch(ccm, "fence-aws", taint) }, node: "fence-aws"},
		{name: "status of aws node", do: func() error { return patch(ccm, "fence-aws", condition, "status") }, node: "fence-aws"},
		{name: "update aws node", do: func() error {
			return update(ccm, "fence-aws", func(n *corev1.Node) { n.Annotations = map[string]string{"x": "y"} })
		}, node: "fence-aws"},
		{name: "delete aws node", do: func() error { return del(ccm, "fence-aws") }, node: "fence-aws"},
		{name: "delete metal node", do: func() error { return del(ccm, "fence-metal") }, node: "fence-metal"},
		{name: "delete uninitialized node", do: func() error { return del(ccm, "fence-uninit") }, node: "fence-uninit"},
		{name: "taint uninitialized node", do: func() error { return patch(ccm, "fence-uninit", taint) }, node: "fence-uninit"},
		{name: "delete hcloud node without providerID", do: func() error { return del(ccm, "fence-hcloud-noid") }, node: "fence-hcloud-noid"},
		{name: "taint hcloud node without providerID", do: func() error { return patch(ccm, "fence-hcloud-noid", taint) }, node: "fence-hcloud-noid"},
		{name: "delete hcloud-labelled node with aws providerID", do: func() error { return del(ccm, "fence-hcloud-awsid") }, node: "fence-hcloud-awsid"},
		{name: "delete unlabelled node with hcloud providerID", do: func() error { return del(ccm, "fence-unlabelled-hcloudid") }, node: "fence-unlabelled-hcloudid"},
		{name: "relabel own node to aws", do: func() error {
			return patch(ccm, "fence-own", `{"metadata":{"labels":{"`+names.PlatformLabel+`":"aws"}}}`)
		}, node: "fence-own"},
		{name: "remove own node's platform label", do: func() error {
			return patch(ccm, "fence-own", `{"metadata":{"labels":{"`+names.PlatformLabel+`":null}}}`)
		}, node: "fence-own"},
		{name: "claim uninitialized node by label", do: func() error {
			return patch(ccm, "fence-uninit", `{"metadata":{"labels":{"`+names.PlatformLabel+`":"hcloud"}}}`)
		}, node: "fence-uninit"},
		{name: "stamp hcloud providerID on uninitialized node", do: func() error {
			return patch(ccm, "fence-uninit", `{"spec":{"providerID":"hcloud://4004"}}`)
		}, node: "fence-uninit"},
		{name: "stamp providerID on labelled node without one", do: func() error {
			return patch(ccm, "fence-hcloud-noid", `{"spec":{"providerID":"hcloud://4005"}}`)
		}, node: "fence-hcloud-noid"},

		{name: "aws CCM may not taint hcloud node", do: func() error { return patch(awsCCM, "fence-own", taint) }, node: "fence-own", who: "NativeCCM aws"},
		{name: "aws CCM may not delete hcloud node", do: func() error { return del(awsCCM, "fence-own") }, node: "fence-own", who: "NativeCCM aws"},
		{name: "no NativeCCM: a node not deletable", do: func() error { return del(bare, "fence-own") }, node: "fence-own", who: "NativeCCM bare", reason: "holds no fence grant"},
		{name: "no NativeCCM: a node not taintable", do: func() error { return patch(bare, "fence-own", addShutdownTaint(t, admin, "fence-own")) }, node: "fence-own", who: "NativeCCM bare", reason: "holds no fence grant"},
		{name: "no NativeCCM: no status", do: func() error { return patch(bare, "fence-aws", condition, "status") }, node: "fence-aws", who: "NativeCCM bare", reason: "holds no fence grant"},
		{name: "wildcard RBAC: own node not deletable", do: func() error { return del(wild, "fence-own") }, node: "fence-own", who: "NativeCCM wild", reason: "for any name"},
		{name: "wildcard RBAC: foreign node not deletable", do: func() error { return del(wild, "fence-aws") }, node: "fence-aws", who: "NativeCCM wild", reason: "for any name"},

		{name: "other identities are not fenced (admin deletes aws node)", do: func() error { return del(admin, "fence-aws") }, allow: true},
		{name: "aws CCM may taint its own node", do: func() error { return patch(awsCCM, "fence-aws", addShutdownTaint(t, admin, "fence-aws")) }, allow: true},
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			who := tc.who
			if who == "" {
				who = "NativeCCM hcloud"
			}
			checkFenceDecision(t, tc.do(), tc.allow, who, tc.node, tc.reason)
		})
	}

	// Changed prefixes take effect: hcloud's nodes lose the Robot prefix.
	t.Run("prefixes changed", func(t *testing.T) {
		f := fence
		f.ProviderIDPrefixes = map[string][]string{"hcloud": {"hcloud://"}, "aws": {"aws://"}}
		if _, err := gate.EnsureFence(ctx, c, f); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = gate.EnsureFence(context.Background(), c, fence) })
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			err := del(ccm, "fence-own-robot")
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), `does not start with hcloud://`), nil
		})
		if err != nil {
			t.Fatalf("the Robot node stayed deletable after the prefix went: %v", err)
		}
	})
	// A grant taken away takes effect: the NativeCCM is gone.
	t.Run("grant removed", func(t *testing.T) {
		if err := gate.DeleteGrant(ctx, c, "aws"); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			err := patch(awsCCM, "fence-aws", addShutdownTaint(t, admin, "fence-aws"))
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "holds no fence grant"), nil
		})
		if err != nil {
			t.Fatalf("aws's CCM kept its own node after its grant went: %v", err)
		}
	})
}

// TestFenceOrphanedIdentity: a ServiceAccount native-ccm-<name> of the
// coordinator's namespace without its NativeCCM (so without its grant), with
// RBAC for every node and Service write (what a coordinator could bind to any
// native-ccm-* name), may change no node and no Service (issue 22, item 7:
// it labelled an aws node control-plane and deleted it).
func TestFenceOrphanedIdentity(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := e.Client
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns, svcNS, sa = "kube-system", "orphan-fence", "native-ccm-orphan"
	if err := gatetest.InstallFence(ctx, c, ns); err != nil {
		t.Fatal(err)
	}
	if err := gatetest.GrantNativeCCM(ctx, admin, ns, sa); err != nil {
		t.Fatal(err)
	}
	if err := grantServices(ctx, admin, ns, sa); err != nil {
		t.Fatal(err)
	}
	createNodes := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: sa + ":create-nodes"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"create"}}}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, createNodes, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: createNodes.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: createNodes.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cfg, err := gatetest.ServiceAccountUser(e, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	orphan := kubernetes.NewForConfigOrDie(cfg)
	node := gatetest.NodeSpec{Name: "orphan-aws", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0orphan"}
	if err := gatetest.CreateNodes(ctx, admin, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: svcNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), svcNS, metav1.DeleteOptions{}) })
	class := "hybridccm.io/aws"
	if _, err := admin.CoreV1().Services(svcNS).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lb"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class, Ports: []corev1.ServicePort{{Port: 80}}}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := gatetest.WaitFence(ctx, orphan, node.Name, true); err != nil {
		t.Fatal(err)
	}
	dry := []string{metav1.DryRunAll}
	nodePatch := func(body string, sub ...string) func() error {
		return func() error {
			_, err := orphan.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{DryRun: dry}, sub...)
			return err
		}
	}
	svcs := orphan.CoreV1().Services(svcNS)
	for _, tc := range []struct {
		name, object string
		do           func() error
	}{
		{"label a node control-plane", "node orphan-aws", nodePatch(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`)},
		{"delete a node", "node orphan-aws", func() error { return orphan.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{DryRun: dry}) }},
		{"taint a node", "node orphan-aws", nodePatch(addShutdownTaint(t, admin, node.Name))},
		{"status of a node", "node orphan-aws", nodePatch(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Probe"}]}}`, "status")},
		{"create a node", "", func() error {
			_, err := orphan.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "orphan-new"}}, metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{"status of a Service", "Service orphan-fence/lb", func() error {
			_, err := svcs.Patch(ctx, "lb", types.StrategicMergePatchType, []byte(`{"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.1"}]}}}`), metav1.PatchOptions{DryRun: dry}, "status")
			return err
		}},
		{"label a Service", "Service orphan-fence/lb", func() error {
			_, err := svcs.Patch(ctx, "lb", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{DryRun: dry})
			return err
		}},
		{"create a Service", "Service orphan-fence/new", func() error {
			_, err := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "new"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{"delete a Service", "Service orphan-fence/lb", func() error { return svcs.Delete(ctx, "lb", metav1.DeleteOptions{DryRun: dry}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := []string{"NativeCCM orphan", "holds no fence grant"}
			if tc.object != "" {
				want = append(want, tc.object)
			}
			if tc.name == "create a node" {
				want = append(want, "may not create node orphan-new")
			}
			checkFenceDecision(t, tc.do(), false, want...)
		})
	}
}

// addShutdownTaint is the patch cloud-provider's taint helper sends: every
// taint of the node as it is, plus the shutdown taint.
func addShutdownTaint(t *testing.T, admin kubernetes.Interface, node string) string {
	t.Helper()
	n, err := admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taints := append(n.Spec.Taints, corev1.Taint{Key: gate.ShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule})
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion}, "spec": map[string]any{"taints": taints}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConfigErrorsAreMarked(t *testing.T) {
	if _, _, err := (gate.Fence{}).Objects(); !errors.Is(err, gate.ErrConfig) {
		t.Fatalf("no namespace: %v does not wrap ErrConfig", err)
	}
	s := gate.Sidecar{Release: "r", Namespace: "n", Platform: "p", ProxyPort: 1, HealthPort: 2}
	if err := s.Mutate(&release.Manifests{}); !errors.Is(err, gate.ErrConfig) {
		t.Fatalf("no image: %v does not wrap ErrConfig", err)
	}
}

// checkFenceDecision fails the test unless err is nil where allow is set,
// and otherwise a Forbidden from the fence whose message mentions every one
// of want.
func checkFenceDecision(t *testing.T, err error, allow bool, want ...string) {
	t.Helper()
	if allow {
		if err != nil {
			t.Fatalf("want allowed, got %v", err)
		}
		return
	}
	if !apierrors.IsForbidden(err) {
		t.Fatalf("want Forbidden by the fence, got %v", err)
	}
	msg := err.Error()
	t.Logf("denied: %s", msg)
	for _, w := range append([]string{"hybrid-ccm gate"}, want...) {
		if !strings.Contains(msg, w) {
			t.Errorf("denial %q does not mention %q", msg, w)
		}
	}
}

// BenchmarkFencedWrite: a dry-run shutdown taint on its own node by a native
// CCM, which the fence evaluates in full (three authorizer checks), next to
// the same request by a ServiceAccount with the same RBAC that the fence does
// not match (the difference is the fence's cost), and by an admin.
func BenchmarkFencedWrite(b *testing.B) {
	if env == nil {
		b.Skip("no control plane: set KUBEBUILDER_ASSETS=$(hack/control-plane.sh)")
	}
	ctx := context.Background()
	admin := env.Client
	c, err := gatetest.Client(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	const ns = "kube-system"
	fence := gate.Fence{Namespace: ns}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		b.Fatal(err)
	}
	remove, err := gatetest.Confine(ctx, c, fence, "bench", "hcloud")
	b.Cleanup(remove)
	if err != nil {
		b.Fatal(err)
	}
	if err := gatetest.GrantNativeCCM(ctx, admin, ns, "native-ccm-bench"); err != nil {
		b.Fatal(err)
	}
	cfg, err := gatetest.ServiceAccountUser(env, ns, "native-ccm-bench")
	if err != nil {
		b.Fatal(err)
	}
	ccm := kubernetes.NewForConfigOrDie(cfg)
	if err := gatetest.GrantNativeCCM(ctx, admin, ns, "bench-unfenced"); err != nil {
		b.Fatal(err)
	}
	cfg, err = gatetest.ServiceAccountUser(env, ns, "bench-unfenced")
	if err != nil {
		b.Fatal(err)
	}
	unfenced := kubernetes.NewForConfigOrDie(cfg)
	node := gatetest.NodeSpec{Name: "bench-own", Platform: "hcloud", ProviderID: "hcloud://5005"}
	if err := gatetest.CreateNodes(ctx, admin, node); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	n, err := admin.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: gate.ShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule})
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := ccm.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	}); err != nil {
		b.Fatalf("the fence never let the CCM taint its own node: %v", err)
	}
	for _, who := range []struct {
		name string
		cs   kubernetes.Interface
	}{{"admin", admin}, {"serviceaccount", unfenced}, {"fenced", ccm}} {
		b.Run(who.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := who.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package charts_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestCoordinatorPolicyReleaseRecords (security round three, hole 2): a
// compromised coordinator wrote a Helm release record whose manifest and
// hook an admin's `helm uninstall` then ran as the admin. The coordinator's
// admission policy, as the chart renders it, lets it write release records
// only of its own releases (sh.helm.release.v1.native-ccm-*, labelled
// name=native-ccm-*, in its namespace), and nothing Helm would read as a
// record of another release: not by type, not by name, not by the label
// owner=helm.
func TestCoordinatorPolicyReleaseRecords(t *testing.T) {
	env := controlPlane(t)
	a := newApplier(t, env)
	ctx := context.Background()
	username, ns := installCoordinatorPolicy(t, env, a)
	// RBAC lets the identity write Secrets: only the policy stands in the way.
	grant(t, env.Client, ns, username)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: username, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	coordinator := kubernetes.NewForConfigOrDie(cfg)

	record := func(name, typ string, labels map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Type: corev1.SecretType(typ), Data: map[string][]byte{"release": []byte("H4sI")}}
	}
	helm := func(release string) map[string]string {
		return map[string]string{"owner": "helm", "name": release, "status": "deployed", "version": "9"}
	}
	write := func(s *corev1.Secret) error {
		_, err := coordinator.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	forged := record("sh.helm.release.v1.hybrid-ccm.v9", "helm.sh/release.v1", helm("hybrid-ccm"))
	// A new policy takes a moment to become active, and so does the grant:
	// until RBAC's informer has it, the write is forbidden by RBAC, not by
	// the policy. Wait for the policy's own refusal.
	const refusal = "Helm release records only of its own releases"
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		err := write(forged)
		return (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), refusal), nil
	}); err != nil {
		t.Fatalf("the forged record of release hybrid-ccm is written: %v", write(forged))
	}
	tests := []struct {
		name   string         // case
		secret *corev1.Secret // what the coordinator writes
		allow  bool           // whether the policy lets it
	}{
		{"own release record", record("sh.helm.release.v1.native-ccm-hcloud.v1", "helm.sh/release.v1", helm("native-ccm-hcloud")), true},
		{"credentials Secret it manages", record("hcloud-credentials", "Opaque", map[string]string{"hybridccm.io/managed-by": "ccm-coordinator"}), true},
		{"record of the umbrella release", forged, false},
		{"record of a native-ccm name labelled as another release", record("sh.helm.release.v1.native-ccm-x.v1", "helm.sh/release.v1", helm("hybrid-ccm")), false},
		{"a record's name on an Opaque Secret it labels as its own", record("sh.helm.release.v1.talos-ccm.v3", "Opaque",
			map[string]string{"hybridccm.io/managed-by": "ccm-coordinator"}), false},
		{"owner=helm on an Opaque Secret it labels as its own", record("notes", "Opaque",
			map[string]string{"hybridccm.io/managed-by": "ccm-coordinator", "owner": "helm", "name": "hybrid-ccm"}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := write(tt.secret)
			switch {
			case tt.allow && err != nil:
				t.Fatalf("refused: %v", err)
			case !tt.allow && !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
				t.Fatalf("written (err %v)", err)
			case !tt.allow && !strings.Contains(err.Error(), refusal):
				t.Fatalf("refused for another reason: %v", err)
			}
		})
	}
}

// grant lets user create Secrets in ns (RBAC). It takes effect when RBAC's
// informer has it: the caller waits for a refusal of the policy it checks.
func grant(t *testing.T, c kubernetes.Interface, ns, user string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "test-records", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-records", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
	if _, err := c.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.RbacV1().RoleBindings(ns).Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		_ = c.RbacV1().Roles(ns).Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
}

// TestCoordinatorPolicyLoadBalancerBinding (security round three, item 5):
// the coordinator could bind the load-balancer role (which reads every
// Service) to a new native-ccm-* ServiceAccount of its own. Its policy lets
// it bind that role only to a ServiceAccount whose fence grant serves load
// balancers, as the API server's authorizer says for that ServiceAccount.
func TestCoordinatorPolicyLoadBalancerBinding(t *testing.T) {
	env := controlPlane(t)
	a := newApplier(t, env)
	ctx := context.Background()
	username, ns := installCoordinatorPolicy(t, env, a)
	const role = "hybrid-ccm:native-ccm-load-balancer"
	rbac := env.Client.RbacV1()
	mk := func(objs ...any) {
		for _, o := range objs {
			var err error
			switch o := o.(type) {
			case *rbacv1.ClusterRole:
				_, err = rbac.ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
				t.Cleanup(func() { _ = rbac.ClusterRoles().Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
			case *rbacv1.ClusterRoleBinding:
				_, err = rbac.ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
				t.Cleanup(func() { _ = rbac.ClusterRoleBindings().Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
			}
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
	}
	crb := func(name string, roleName string, subjects ...rbacv1.Subject) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"hybridccm.io/managed-by": "ccm-coordinator"}},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName}, Subjects: subjects}
	}
	sa := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: "ServiceAccount", Namespace: ns, Name: name}
	}
	mk(
		// the coordinator's right to bind the role (RBAC)
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-lb-binder"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterrolebindings"}, Verbs: []string{"create"}},
			{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterroles"}, ResourceNames: []string{role}, Verbs: []string{"bind"}}}},
		crb("test-lb-binder", "test-lb-binder", rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: username}),
		// NativeCCM "granted" serves load balancers (its grant, as the hybrid-ccm chart makes it)
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-lb-grant"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"fence.hybridccm.io"}, Resources: []string{"loadbalancers"}, Verbs: []string{"fence"}}}},
		crb("test-lb-grant", "test-lb-grant", sa("native-ccm-granted")),
	)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: username, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	coordinator := kubernetes.NewForConfigOrDie(cfg)
	bind := func(subject string) error {
		_, err := coordinator.RbacV1().ClusterRoleBindings().Create(ctx, crb("native-ccm-"+subject+"-lb", role, sa("native-ccm-"+subject)),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return bind("granted") == nil && apierrors.IsForbidden(bind("sneaky")), nil
	}); err != nil {
		t.Fatalf("granted: %v; without a grant: %v", bind("granted"), bind("sneaky"))
	}
	if err := bind("sneaky"); !strings.Contains(err.Error(), "whose fence grant serves load balancers") {
		t.Fatalf("refused for another reason: %v", err)
	}
}

// installCoordinatorPolicy applies the coordinator's policy and binding as the
// chart renders them (removed when the test ends) and returns the identity
// they confine and its namespace.
func installCoordinatorPolicy(t *testing.T, env *testenv.Env, a *chartstest.Applier) (username, ns string) {
	t.Helper()
	ctx := context.Background()
	m := mustRender(t, ccmCoordinator, nil)
	createNamespaces(t, a, m)
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		for _, obj := range m.find(kind) {
			if kind == "ValidatingAdmissionPolicy" {
				username = policyUsername(obj.Object)
			}
			if _, err := a.Apply(ctx, obj, false); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{})
				_ = env.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{})
			})
		}
	}
	parts := strings.Split(username, ":")
	if len(parts) != 4 {
		t.Fatalf("the policy names no ServiceAccount: %q", username)
	}
	return username, parts[2]
}

// policyUsername is the identity a policy's matchConditions select.
func policyUsername(obj map[string]any) string {
	conds, _, _ := unstructured.NestedSlice(obj, "spec", "matchConditions")
	for _, c := range conds {
		cond, _ := c.(map[string]any)
		if expr, _ := cond["expression"].(string); strings.Contains(expr, "request.userInfo.username == ") {
			return strings.Trim(strings.TrimPrefix(expr, "request.userInfo.username == "), "'")
		}
	}
	return ""
}

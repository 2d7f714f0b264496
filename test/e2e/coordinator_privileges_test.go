package e2e

import (
	"context"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestCoordinatorPrivileges: authenticated as the coordinator's ServiceAccount,
// with exactly the RBAC and admission policy its chart ships, every abuse of
// issue 14 is refused by the API server, and what the coordinator does for a
// native CCM is allowed. Writes are dry runs (they pass authorization and
// admission, and store nothing) unless the case needs an existing object.
func TestCoordinatorPrivileges(t *testing.T) {
	ctx := context.Background()
	admin, err := controllerClient()
	if err != nil {
		t.Fatal(err)
	}
	ns, cfg := applyCoordinatorChart(t, admin)
	coord, err := client.New(cfg, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + ns + ":ccm-coordinator"
	managed := map[string]string{release.ManagedByLabel: release.ManagedByValue}

	// priv's grant serves load balancers: the coordinator may bind the
	// load-balancer role to its ServiceAccount, and to no other
	privGrant, privGrantBinding, err := gate.Grant{NativeCCM: "priv", Namespace: ns, Platform: "priv",
		LoadBalancers: &v1alpha1.GateLoadBalancers{Class: "hybridccm.io/priv"}}.Objects()
	if err != nil {
		t.Fatal(err)
	}
	// What exists in a cluster: kube-system's Secrets and talos-ccm, a
	// credentials Secret in the coordinator's namespace, objects there it did
	// not create, someone else's admission policy and a node.
	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "talos-ccm-talos", Namespace: "kube-system"}, StringData: map[string]string{"config": "x"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "talos-ccm", Namespace: "kube-system"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "priv-credentials", Namespace: ns}, StringData: map[string]string{"token": "t"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "not-its-own", Namespace: ns}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "priv-someones-binding"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "someone"}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "priv-someones-binding", Namespace: "kube-system"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "someone"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "priv-node-1"}},
		&v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "priv"}, Spec: v1alpha1.NativeCCMSpec{Platform: "priv", Install: v1alpha1.InstallNever}},
		// an admin's grant for NativeCCM priv, and one for another cloud's
		privGrant, privGrantBinding,
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: gate.GrantName("priv-aws")}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{gate.GrantGroup}, Resources: []string{"platforms"}, ResourceNames: []string{"aws"}, Verbs: []string{gate.GrantVerb}}}},
	} {
		if err := admin.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		// nothing stays for the package's later tests (a node would take a
		// pod CIDR from their pools)
		t.Cleanup(func() { _ = admin.Delete(context.Background(), o) })
	}

	nativeSA := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "native-ccm-priv", Namespace: ns}}
	deployment := func(namespace, sa string, labels map[string]string) *appsv1.Deployment {
		sel := map[string]string{"app": "priv"}
		tplLabels := map[string]string{"app": "priv"}
		for k, v := range labels {
			tplLabels[k] = v
		}
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: namespace, Labels: labels},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: sel},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: tplLabels},
					// as the coordinator renders a native CCM's pod (no
					// host access, no root: TestCoordinatorWritesOnlySafeWorkloads)
					Spec: safePod(sa),
				},
			},
		}
	}
	crb := func(role string, subjects []rbacv1.Subject) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Labels: managed},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}, Subjects: subjects}
	}
	leaseRule := rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"native-ccm-priv"}, Verbs: []string{"get", "update"}}
	dry := []client.CreateOption{client.DryRunAll}

	type access func(ctx context.Context) error
	denied := []struct {
		name string
		do   access
	}{
		{"read a kube-system Secret", func(ctx context.Context) error {
			return coord.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "talos-ccm-talos"}, &corev1.Secret{})
		}},
		{"list kube-system Secrets", func(ctx context.Context) error {
			return coord.List(ctx, &corev1.SecretList{}, client.InNamespace("kube-system"))
		}},
		{"create a Deployment in kube-system running as talos-ccm", func(ctx context.Context) error {
			return coord.Create(ctx, deployment("kube-system", "talos-ccm", managed), dry...)
		}},
		{"create a Deployment running as a ServiceAccount called talos-ccm", func(ctx context.Context) error {
			return coord.Create(ctx, deployment(ns, "talos-ccm", managed), dry...)
		}},
		{"create a Deployment running as itself", func(ctx context.Context) error {
			return coord.Create(ctx, deployment(ns, "ccm-coordinator", managed), dry...)
		}},
		{"create a Deployment running as the default ServiceAccount", func(ctx context.Context) error {
			return coord.Create(ctx, deployment(ns, "", managed), dry...)
		}},
		{"create a native CCM Deployment it does not label", func(ctx context.Context) error {
			return coord.Create(ctx, deployment(ns, "native-ccm-priv", nil), dry...)
		}},
		{"create a pod", func(ctx context.Context) error {
			return coord.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: ns, Labels: managed},
				Spec: corev1.PodSpec{ServiceAccountName: "native-ccm-priv", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, dry...)
		}},
		{"request a token for talos-ccm", func(ctx context.Context) error {
			return coord.SubResource("token").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "talos-ccm", Namespace: "kube-system"}}, &authenticationv1.TokenRequest{})
		}},
		{"create a ServiceAccount token Secret", func(ctx context.Context) error {
			return coord.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv-token", Namespace: ns, Labels: managed,
				Annotations: map[string]string{corev1.ServiceAccountNameKey: "native-ccm-priv"}}, Type: corev1.SecretTypeServiceAccountToken}, dry...)
		}},
		{"create a ServiceAccount not named like a native CCM", func(ctx context.Context) error {
			return coord.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "helper", Namespace: ns, Labels: managed}}, dry...)
		}},
		{"bind cluster-admin", func(ctx context.Context) error {
			return coord.Create(ctx, crb("cluster-admin", nativeSA), dry...)
		}},
		{"bind the load balancer ClusterRole to a native CCM whose grant serves none", func(ctx context.Context) error {
			return coord.Create(ctx, crb(release.LoadBalancerClusterRole, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "native-ccm-nolb", Namespace: ns}}), dry...)
		}},
		{"bind the lifecycle ClusterRole to a user", func(ctx context.Context) error {
			return coord.Create(ctx, crb(release.LifecycleClusterRole, []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}}), dry...)
		}},
		{"bind the lifecycle ClusterRole to talos-ccm", func(ctx context.Context) error {
			return coord.Create(ctx, crb(release.LifecycleClusterRole, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "talos-ccm", Namespace: "kube-system"}}), dry...)
		}},
		{"bind system:auth-delegator to all ServiceAccounts", func(ctx context.Context) error {
			return coord.Create(ctx, crb("system:auth-delegator", []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts"}}), dry...)
		}},
		{"create a ClusterRole", func(ctx context.Context) error {
			return coord.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Labels: managed}}, dry...)
		}},
		{"create a Role reading Secrets", func(ctx context.Context) error {
			return coord.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: ns, Labels: managed},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list"}}}}, dry...)
		}},
		{"bind its own Role (Secrets) to a user", func(ctx context.Context) error {
			return coord.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: ns, Labels: managed},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ccm-coordinator"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}}}, dry...)
		}},
		{"bind the authentication reader to a user", func(ctx context.Context) error {
			return coord.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: "kube-system", Labels: managed},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}}}, dry...)
		}},
		{"delete a ClusterRoleBinding it did not write", func(ctx context.Context) error {
			return coord.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "priv-someones-binding"}}, client.DryRunAll)
		}},
		{"delete a kube-system RoleBinding it did not write", func(ctx context.Context) error {
			return coord.Delete(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "priv-someones-binding", Namespace: "kube-system"}}, client.DryRunAll)
		}},
		{"change an object of its namespace it did not write", func(ctx context.Context) error {
			return coord.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "not-its-own", Namespace: ns}},
				client.RawPatch(types.MergePatchType, []byte(`{"data":{"x":"y"}}`)), client.DryRunAll)
		}},
		{"patch a node", func(ctx context.Context) error {
			return coord.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "priv-node-1"}},
				client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{names.PlatformLabel:"x"}}}`)), client.DryRunAll)
		}},
		{"delete a node", func(ctx context.Context) error {
			return coord.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "priv-node-1"}}, client.DryRunAll)
		}},
		{"squat a lease", func(ctx context.Context) error {
			return coord.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "talos-ccm", Namespace: ns, Labels: managed},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("evil")}}, dry...)
		}},
		{"read (or approve) CSRs", func(ctx context.Context) error {
			return coord.List(ctx, &certificatesv1.CertificateSigningRequestList{})
		}},
		{"delete the fence", func(ctx context.Context) error {
			return coord.Delete(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: gate.DefaultFenceName}}, client.DryRunAll)
		}},
		{"loosen the fence", func(ctx context.Context) error {
			return coord.Patch(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: gate.DefaultFenceName}},
				client.RawPatch(types.MergePatchType, []byte(`{"spec":{"failurePolicy":"Ignore"}}`)), client.DryRunAll)
		}},
		{"write an admission policy binding", func(ctx context.Context) error {
			return coord.Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "priv-binding"},
				Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: gate.DefaultFenceName,
					ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Audit}}}, dry...)
		}},
		{"list admission policies", func(ctx context.Context) error {
			return coord.List(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyList{})
		}},
		{"move a NativeCCM to another platform", func(ctx context.Context) error {
			return coord.Patch(ctx, &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "priv"}},
				client.RawPatch(types.MergePatchType, []byte(`{"spec":{"platform":"aws"}}`)), client.DryRunAll)
		}},
		{"label a NativeCCM", func(ctx context.Context) error {
			return coord.Patch(ctx, &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "priv"}},
				client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`)), client.DryRunAll)
		}},
		{"create a NativeCCM", func(ctx context.Context) error {
			return coord.Create(ctx, &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "priv-evil"}, Spec: v1alpha1.NativeCCMSpec{Platform: "metal"}}, dry...)
		}},
		{"delete a NativeCCM", func(ctx context.Context) error {
			return coord.Delete(ctx, &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "priv"}}, client.DryRunAll)
		}},
		// The fence's grants: what it confines each native CCM to.
		{"bind another cloud's fence grant to a native CCM", func(ctx context.Context) error {
			return coord.Create(ctx, crb(gate.GrantName("priv-aws"), nativeSA), dry...)
		}},
		{"create a ClusterRole of fence grants", func(ctx context.Context) error {
			return coord.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Labels: managed}, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{gate.GrantGroup}, Resources: []string{"platforms"}, ResourceNames: []string{"aws"}, Verbs: []string{gate.GrantVerb}}}}, dry...)
		}},
		{"create a Role of fence grants", func(ctx context.Context) error {
			return coord.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: ns, Labels: managed}, Rules: []rbacv1.PolicyRule{
				leaseRule, {APIGroups: []string{gate.GrantGroup}, Resources: []string{"platforms"}, ResourceNames: []string{"aws"}, Verbs: []string{gate.GrantVerb}}}}, dry...)
		}},
		{"move a NativeCCM's grant to another platform", func(ctx context.Context) error {
			return coord.Patch(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: gate.GrantName("priv")}},
				client.RawPatch(types.MergePatchType, []byte(`{"rules":[{"apiGroups":["`+gate.GrantGroup+`"],"resources":["platforms"],"resourceNames":["aws"],"verbs":["fence"]}]}`)), client.DryRunAll)
		}},
		{"give a NativeCCM's grant to another ServiceAccount", func(ctx context.Context) error {
			return coord.Patch(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: gate.GrantName("priv")}},
				client.RawPatch(types.MergePatchType, []byte(`{"subjects":[{"kind":"ServiceAccount","name":"native-ccm-other","namespace":"`+ns+`"}]}`)), client.DryRunAll)
		}},
		{"delete a NativeCCM's grant", func(ctx context.Context) error {
			return coord.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: gate.GrantName("priv")}}, client.DryRunAll)
		}},
		{"write a Lease in kube-system", func(ctx context.Context) error {
			return coord.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: "kube-system", Labels: managed}}, dry...)
		}},
	}
	for _, c := range denied {
		err := c.do(ctx)
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s may %s: %v", user, c.name, err)
			continue
		}
		t.Logf("%s: %s", c.name, shorten(err.Error()))
	}

	// What it does for a native CCM.
	allowed := []struct {
		name string
		do   access
	}{
		{"read a credentials Secret of its namespace", func(ctx context.Context) error {
			return coord.Get(ctx, client.ObjectKey{Namespace: ns, Name: "priv-credentials"}, &corev1.Secret{})
		}},
		{"list Helm's release Secrets", func(ctx context.Context) error {
			return coord.List(ctx, &corev1.SecretList{}, client.InNamespace(ns), client.MatchingLabels{"owner": "helm"})
		}},
		{"create a Helm release Secret", func(ctx context.Context) error {
			return coord.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.native-ccm-priv.v1", Namespace: ns,
				Labels: map[string]string{"owner": "helm", "name": "native-ccm-priv"}}, Type: "helm.sh/release.v1"}, dry...)
		}},
		{"create a native CCM ServiceAccount", func(ctx context.Context) error {
			return coord.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: ns, Labels: managed}}, dry...)
		}},
		{"create a native CCM Deployment", func(ctx context.Context) error {
			return coord.Create(ctx, deployment(ns, "native-ccm-priv", managed), dry...)
		}},
		{"bind the lifecycle ClusterRole to a native CCM", func(ctx context.Context) error {
			return coord.Create(ctx, crb(release.LifecycleClusterRole, nativeSA), dry...)
		}},
		{"bind the load balancer ClusterRole to a native CCM", func(ctx context.Context) error {
			return coord.Create(ctx, crb(release.LoadBalancerClusterRole, nativeSA), dry...)
		}},
		{"bind system:auth-delegator to a native CCM", func(ctx context.Context) error {
			return coord.Create(ctx, crb(release.AuthDelegatorClusterRole, nativeSA), dry...)
		}},
		{"bind the authentication reader to a native CCM", func(ctx context.Context) error {
			return coord.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv:x", Namespace: "kube-system", Labels: managed},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: release.AuthenticationReaderRole},
				Subjects: nativeSA}, dry...)
		}},
		{"create a native CCM's lease Role", func(ctx context.Context) error {
			return coord.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: ns, Labels: managed},
				Rules: []rbacv1.PolicyRule{leaseRule}}, dry...)
		}},
		{"create a native CCM's Lease", func(ctx context.Context) error {
			return coord.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-priv", Namespace: ns, Labels: managed}}, dry...)
		}},
		{"create its leader-election Lease", func(ctx context.Context) error {
			return coord.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "ccm-coordinator.hybridccm.io", Namespace: ns}}, dry...)
		}},
		{"read the fence", func(ctx context.Context) error {
			return gate.CheckFence(ctx, coord, gate.Fence{Namespace: ns})
		}},
		{"ask whether a native CCM holds its grant", func(ctx context.Context) error {
			return gate.CheckGrant(ctx, coord, gate.Grant{NativeCCM: "priv", Namespace: ns, Platform: "priv"})
		}},
		{"add its finalizer to a NativeCCM", func(ctx context.Context) error {
			return coord.Patch(ctx, &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "priv"}},
				client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+v1alpha1.Finalizer+`"]}}`)), client.DryRunAll)
		}},
		{"write a NativeCCM's status.gate", func(ctx context.Context) error {
			return coord.Status().Patch(ctx, &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "priv"}},
				client.RawPatch(types.MergePatchType, []byte(`{"status":{"gate":{"providerIDPrefixes":["priv://"]}}}`)), &client.SubResourcePatchOptions{PatchOptions: client.PatchOptions{DryRun: []string{metav1.DryRunAll}}})
		}},
	}
	for _, c := range allowed {
		if err := c.do(ctx); err != nil {
			t.Errorf("%s may not %s: %v", user, c.name, err)
		}
	}
}

func shorten(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

package doctor_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	helmrelease "helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/cleanup"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/doctor"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestReleaseRecordsWithoutHelm (security round three, hole 2): a record
// the coordinator wrote is never run through Helm. doctor flags a record
// whose hook and manifest an admin's `helm uninstall` would run (a hook
// binding cluster-admin, the fence in the manifest), not an honest one; and
// `hybridctl cleanup native-ccm` removes a release by the coordinator's
// labels and its records, leaving every object the coordinator did not label
// as that release's (the fence included) where it is.
func TestReleaseRecordsWithoutHelm(t *testing.T) {
	ctx := context.Background()
	c, _ := fencedNamespace(t)
	records := driver.NewSecrets(env.Client.CoreV1().Secrets(coordinatorNS))
	write := func(rel string, manifest string, hooks ...*helmrelease.Hook) {
		t.Helper()
		if err := records.Create("sh.helm.release.v1."+rel+".v1", &helmrelease.Release{Name: rel, Namespace: coordinatorNS, Version: 1,
			Info: &helmrelease.Info{Status: helmrelease.StatusDeployed}, Manifest: manifest, Hooks: hooks}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = records.Delete("sh.helm.release.v1." + rel + ".v1") })
	}
	write("native-ccm-honest", "---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: native-ccm-honest\n  namespace: "+coordinatorNS+"\n")
	write("native-ccm-forged", "---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata:\n  name: "+gate.DefaultFenceName+"\n",
		&helmrelease.Hook{Name: "admin", Kind: "ClusterRoleBinding", Events: []helmrelease.HookEvent{helmrelease.HookPreDelete},
			Manifest: "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: admin\nroleRef:\n  kind: ClusterRole\n  name: cluster-admin\n"})

	rep, err := doctor.Run(ctx, c, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range rep.Findings {
		if f.Check == doctor.CheckReleaseRecord {
			got = append(got, f.Object+": "+f.Message)
			if !strings.Contains(f.Fix, "hybridctl cleanup native-ccm forged") {
				t.Errorf("fix %q", f.Fix)
			}
		}
	}
	if len(got) != 2 || !strings.Contains(got[0], "sh.helm.release.v1.native-ccm-forged.v1") ||
		!strings.Contains(strings.Join(got, "\n"), `hook ClusterRoleBinding "admin"`) || !strings.Contains(strings.Join(got, "\n"), "ValidatingAdmissionPolicy") {
		t.Fatalf("release record findings:\n%s", strings.Join(got, "\n"))
	}

	// cleanup: the forged release's labelled objects and records go, nothing else
	labels := func(rel string) map[string]string {
		return map[string]string{release.ManagedByLabel: release.ManagedByValue, release.NativeCCMLabel: rel}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-forged", Namespace: coordinatorNS, Labels: labels("native-ccm-forged")}}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-forged:extension-apiserver-authentication-reader", Namespace: "kube-system", Labels: labels("native-ccm-forged")},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"}}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-forged:auth-delegator", Labels: labels("native-ccm-forged")},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"}}
	other := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-honest", Namespace: coordinatorNS, Labels: labels("native-ccm-honest")}}
	unlabelled := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-forged-notes", Namespace: coordinatorNS}}
	create(t, c, sa, rb, crb, other, unlabelled)
	t.Cleanup(func() {
		for _, o := range []client.Object{sa, rb, crb, other, unlabelled} {
			_ = c.Delete(context.Background(), o)
		}
	})

	dry, err := cleanup.NativeCCM(ctx, c, "forged", cleanup.Options{Namespace: coordinatorNS, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := cleanup.NativeCCM(ctx, c, "forged", cleanup.Options{Namespace: coordinatorNS})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ClusterRoleBinding /native-ccm-forged:auth-delegator",
		"RoleBinding kube-system/native-ccm-forged:extension-apiserver-authentication-reader",
		"Secret " + coordinatorNS + "/sh.helm.release.v1.native-ccm-forged.v1",
		"ServiceAccount " + coordinatorNS + "/native-ccm-forged",
	}
	slices.Sort(deleted)
	slices.Sort(dry)
	if !slices.Equal(deleted, want) || !slices.Equal(dry, want) {
		t.Fatalf("deleted %q (dry run %q), want %q", deleted, dry, want)
	}
	for _, o := range []client.Object{other, unlabelled} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Errorf("%s: %v", o.GetName(), err)
		}
	}
	if _, err := records.Get("sh.helm.release.v1.native-ccm-honest.v1"); err != nil {
		t.Errorf("the other release's record: %v", err)
	}
	// the record listed the fence: cleanup never reads a record's manifest
	if err := c.Get(ctx, client.ObjectKey{Name: gate.DefaultFenceName}, &admissionregistrationv1.ValidatingAdmissionPolicy{}); err != nil {
		t.Errorf("the fence: %v", err)
	}
}

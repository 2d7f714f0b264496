package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

func createSecret(t *testing.T, name string, data map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: releaseNamespace}, StringData: data}
	switch err := k8s.Create(ctxT(t), s); {
	case apierrors.IsAlreadyExists(err):
		// another test's, which deletes it
	case err != nil:
		t.Fatal(err)
	default:
		// gone when the test ends: a test run again (-count) starts without it
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), s) })
	}
}

func createNode(t *testing.T, name, platform, providerID string) {
	t.Helper()
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{names.PlatformLabel: platform}},
		Spec:       corev1.NodeSpec{ProviderID: providerID},
	}
	create(t, n)
}

// create creates obj and deletes it when the test ends.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Create(ctxT(t), obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), obj) })
}

func deleteNode(t *testing.T, name string) {
	t.Helper()
	if err := k8s.Delete(ctxT(t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

// createNativeCCM creates the NativeCCM and, as whoever creates a NativeCCM
// does, its fence grant.
func createNativeCCM(t *testing.T, obj *v1.NativeCCM) {
	t.Helper()
	if err := gate.EnsureGrant(ctxT(t), k8s, gate.GrantFor(obj, releaseNamespace)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteGrant(context.Background(), k8s, obj.Name) })
	create(t, obj)
}

func getNativeCCM(t *testing.T, name string) *v1.NativeCCM {
	t.Helper()
	obj := &v1.NativeCCM{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Name: name}, obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

// waitCondition waits until the NativeCCM has the condition with status and
// reason (reason "" matches any).
func waitCondition(t *testing.T, name, ctype string, status metav1.ConditionStatus, reason string) *v1.NativeCCM {
	t.Helper()
	var obj *v1.NativeCCM
	eventually(t, fmt.Sprintf("%s %s=%s (%s)", name, ctype, status, reason), func() (bool, string) {
		obj = getNativeCCM(t, name)
		c := conditions.Get(obj, ctype)
		if c == nil {
			return false, fmt.Sprintf("no %s condition; status %+v", ctype, obj.Status)
		}
		state := fmt.Sprintf("%s=%s reason=%s message=%q", ctype, c.Status, c.Reason, c.Message)
		if c.Status != status || (reason != "" && c.Reason != reason) {
			return false, state
		}
		// The patch helper writes conditions before the rest of the status:
		// wait for the whole status of a finished reconcile.
		if ctype == meta.ReadyCondition && status == metav1.ConditionTrue && obj.Status.ObservedGeneration != obj.Generation {
			return false, state + " (status not fully written)"
		}
		// The same after a requested reconcile, which keeps the generation.
		if v, ok := meta.ReconcileAnnotationValue(obj.GetAnnotations()); ok && status == metav1.ConditionTrue &&
			(ctype == meta.ReadyCondition || ctype == v1.InstalledCondition) && obj.Status.LastHandledReconcileAt != v {
			return false, state + " (requested reconcile not fully written)"
		}
		if status == metav1.ConditionTrue && (ctype == meta.ReadyCondition || ctype == v1.InstalledCondition) &&
			c.Reason != v1.NoNodesReason && c.Reason != v1.InstallDisabledReason && obj.Status.Release == nil {
			return false, state + " (release not yet recorded)"
		}
		return true, state
	})
	return obj
}

// updateNativeCCM changes the spec with retries on write conflicts (the
// reconciler writes status concurrently).
func updateNativeCCM(t *testing.T, name string, change func(*v1.NativeCCM)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj := getNativeCCM(t, name)
		change(obj)
		return k8s.Update(ctxT(t), obj)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func getDeployment(t *testing.T, name string) (*appsv1.Deployment, error) {
	d := &appsv1.Deployment{}
	err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: name}, d)
	return d, err
}

func hasEvent(t *testing.T, object, reason string) (bool, string) {
	t.Helper()
	// The recorder writes events asynchronously, after the status patch a
	// test usually waits for; give it time before calling one missing.
	return poll(20*time.Second, func() (bool, string) { return eventNow(t, object, reason) })
}

// eventsOf lists the events of object (by name).
func eventsOf(t *testing.T, object string) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	if err := k8s.List(ctxT(t), &list, client.MatchingFields{"involvedObject.name": object}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// eventNow reports whether object has an event with reason at this moment.
func eventNow(t *testing.T, object, reason string) (bool, string) {
	t.Helper()
	var seen []string
	for _, e := range eventsOf(t, object) {
		seen = append(seen, e.Reason)
		if e.Reason == reason {
			return true, ""
		}
	}
	return false, fmt.Sprintf("events of %s: %v", object, seen)
}

func hcloudSecret(t *testing.T) {
	createSecret(t, "hcloud", map[string]string{"token": "test-token"})
}

// TestInstallsOnFirstNodeAndUninstallsAfterGracePeriod: the built-in hcloud
// profile, nodes with platform=hcloud appear → release with lifecycle-only
// args, own ServiceAccount, least-privilege RBAC and a unique lease; the last
// node goes → uninstalled once the grace period has passed.
func TestInstallsOnFirstNodeAndUninstallsAfterGracePeriod(t *testing.T) {
	hcloudSecret(t)
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "hcloud"},
		Spec:       v1.NativeCCMSpec{Platform: "hcloud", UninstallGracePeriod: &metav1.Duration{Duration: 3 * time.Second}},
	})

	// No nodes: Ready, nothing installed.
	obj := waitCondition(t, "hcloud", meta.ReadyCondition, metav1.ConditionTrue, v1.NoNodesReason)
	if obj.Status.Release != nil || !conditions.IsFalse(obj, v1.InstalledCondition) {
		t.Fatalf("installed without nodes: %+v", obj.Status)
	}
	if _, err := getDeployment(t, "native-ccm-hcloud"); !apierrors.IsNotFound(err) {
		t.Fatalf("deployment exists without nodes: %v", err)
	}

	createNode(t, "hc-1", "hcloud", "hcloud://1001")
	obj = waitCondition(t, "hcloud", v1.InstalledCondition, metav1.ConditionTrue, "")
	if obj.Status.Release == nil || obj.Status.Release.Revision != 1 || obj.Status.Release.Chart != "native-ccm@0.1.0" || obj.Status.Nodes != 1 {
		t.Fatalf("status = %+v", obj.Status)
	}
	if obj.Status.ObservedGeneration != obj.Generation {
		t.Errorf("observedGeneration %d != generation %d", obj.Status.ObservedGeneration, obj.Generation)
	}

	d, err := getDeployment(t, "native-ccm-hcloud")
	if err != nil {
		t.Fatal(err)
	}
	spec := d.Spec.Template.Spec
	args := spec.Containers[0].Args
	for _, want := range []string{
		"--controllers=cloud-node-lifecycle",
		"--use-service-account-credentials=false",
		"--leader-elect=true",
		"--leader-elect-resource-name=native-ccm-hcloud",
		"--leader-elect-resource-namespace=" + releaseNamespace,
		"--secure-port=10273",
		"--cloud-provider=hcloud",
		"--allow-untagged-cloud=true",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	if spec.ServiceAccountName != "native-ccm-hcloud" {
		t.Errorf("serviceAccountName = %s", spec.ServiceAccountName)
	}
	if _, ok := spec.NodeSelector["node-role.kubernetes.io/control-plane"]; !ok {
		t.Errorf("nodeSelector = %v", spec.NodeSelector)
	}
	if spec.Containers[0].Image != "docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.35.0" {
		t.Errorf("image = %s", spec.Containers[0].Image)
	}

	sa := &corev1.ServiceAccount{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: "native-ccm-hcloud"}, sa); err != nil {
		t.Fatalf("service account: %v", err)
	}
	crb := &rbacv1.ClusterRoleBinding{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Name: "native-ccm-hcloud"}, crb); err != nil {
		t.Fatal(err)
	}
	if crb.RoleRef.Name != release.LifecycleClusterRole {
		t.Errorf("bound to %s, want the static %s", crb.RoleRef.Name, release.LifecycleClusterRole)
	}
	cr := &rbacv1.ClusterRole{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Name: crb.RoleRef.Name}, cr); err != nil {
		t.Fatal(err)
	}
	for _, rule := range cr.Rules {
		for _, v := range rule.Verbs {
			if v == "*" || v == "deletecollection" {
				t.Errorf("cluster role grants %s", v)
			}
		}
		if !slices.Equal(rule.Resources, []string{"nodes"}) && !slices.Equal(rule.Resources, []string{"events"}) {
			t.Errorf("cluster role grants %v", rule.Resources)
		}
	}
	role := &rbacv1.Role{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: "native-ccm-hcloud"}, role); err != nil {
		t.Fatal(err)
	}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Verbs, []string{"get", "update"}) {
		t.Errorf("lease role grants more than get/update of its Lease: %+v", role.Rules)
	}
	if !slices.Equal(role.Rules[0].ResourceNames, []string{"native-ccm-hcloud"}) {
		t.Errorf("lease rule = %+v", role.Rules[0])
	}
	// The API server itself says what the identity may do.
	for _, tc := range []struct {
		// verb, resource and name of the access review.
		verb, resource, group, ns, name string
		// allowed is the expected answer.
		allowed bool
	}{
		{"delete", "nodes", "", "", "any", true},
		{"patch", "nodes", "", "", "any", true},
		// cloud-node-lifecycle patches; it never updates (PUT) a node or its status
		{"update", "nodes", "", "", "any", false},
		{"deletecollection", "nodes", "", "", "", false},
		{"create", "nodes", "", "", "", false},
		{"get", "secrets", "", releaseNamespace, "hcloud", false},
		{"update", "leases", "coordination.k8s.io", releaseNamespace, "native-ccm-hcloud", true},
		{"update", "leases", "coordination.k8s.io", "kube-system", "cloud-controller-manager", false},
		{"list", "pods", "", "", "", false},
	} {
		if got := canI(t, "system:serviceaccount:"+releaseNamespace+":native-ccm-hcloud", tc.verb, tc.group, tc.resource, tc.ns, tc.name); got != tc.allowed {
			t.Errorf("can %s %s %s/%s = %v, want %v", tc.verb, tc.resource, tc.ns, tc.name, got, tc.allowed)
		}
	}
	// The gate holds the CCM back until its identity may do all its release
	// binds it to: all of it is granted (else the CCM would never start),
	// with the client CA the CCM reads at start among it.
	var startup []string
	for _, ic := range spec.InitContainers {
		if ic.Name != gate.SidecarName {
			continue
		}
		for _, a := range ic.Args {
			if v, ok := strings.CutPrefix(a, "--startup-access="); ok {
				startup = append(startup, v)
			}
		}
	}
	if !slices.Contains(startup, "verb=get,resource=configmaps,namespace=kube-system,name=extension-apiserver-authentication") ||
		!slices.Contains(startup, "verb=update,group=coordination.k8s.io,resource=leases,namespace="+releaseNamespace+",name=native-ccm-hcloud") {
		t.Errorf("gate's startup access %q lacks the client CA or the lease", startup)
	}
	for _, s := range startup {
		a, err := proxy.ParseAccess(s)
		if err != nil {
			t.Fatal(err)
		}
		if a.Subresource != "" {
			t.Fatalf("%s: canI knows no subresources", s)
		}
		if !canI(t, "system:serviceaccount:"+releaseNamespace+":native-ccm-hcloud", a.Verb, a.Group, a.Resource, a.Namespace, a.Name) {
			t.Errorf("the gate waits for %s, which the release does not grant", s)
		}
	}
	if ok, state := hasEvent(t, "hcloud", v1.InstallSucceededReason); !ok {
		t.Errorf("no InstallSucceeded event: %s", state)
	}

	// A second node changes nothing but the count.
	createNode(t, "hc-2", "hcloud", "hcloud://1002")
	eventually(t, "2 nodes counted", func() (bool, string) {
		o := getNativeCCM(t, "hcloud")
		return o.Status.Nodes == 2 && o.Status.Release.Revision == 1, fmt.Sprintf("%+v", o.Status)
	})

	// The last node goes: pending uninstall, then uninstalled after the grace period.
	deleteNode(t, "hc-1")
	deleteNode(t, "hc-2")
	var noNodesSince time.Time
	eventually(t, "no nodes observed", func() (bool, string) {
		o := getNativeCCM(t, "hcloud")
		if o.Status.NoNodesSince != nil {
			noNodesSince = o.Status.NoNodesSince.Time
		}
		return o.Status.Nodes == 0 && o.Status.NoNodesSince != nil, fmt.Sprintf("%+v", o.Status)
	})
	obj = waitCondition(t, "hcloud", v1.InstalledCondition, metav1.ConditionFalse, v1.NoNodesReason)
	uninstalledAt := conditions.GetLastTransitionTime(obj, v1.InstalledCondition).Time
	if uninstalledAt.Before(noNodesSince.Add(3 * time.Second).Truncate(time.Second)) {
		t.Errorf("uninstalled at %s, before the grace period ended (%s + 3s)", uninstalledAt, noNodesSince)
	}
	// The patch helper writes conditions before the rest of the status.
	eventually(t, "release record cleared", func() (bool, string) {
		o := getNativeCCM(t, "hcloud")
		return o.Status.Release == nil, fmt.Sprintf("release still recorded: %+v", o.Status.Release)
	})
	eventually(t, "deployment removed", func() (bool, string) {
		_, err := getDeployment(t, "native-ccm-hcloud")
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if ok, state := hasEvent(t, "hcloud", v1.UninstallSucceededReason); !ok {
		t.Errorf("no UninstallSucceeded event: %s", state)
	}
}

func canI(t *testing.T, user, verb, group, resource, ns, name string) bool {
	t.Helper()
	body := fmt.Sprintf(`{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":%q,"groups":["system:serviceaccounts","system:authenticated"],"resourceAttributes":{"verb":%q,"group":%q,"resource":%q,"namespace":%q,"name":%q}}}`,
		user, verb, group, resource, ns, name)
	raw, err := env.Client.AuthorizationV1().RESTClient().Post().AbsPath("/apis/authorization.k8s.io/v1/subjectaccessreviews").Body([]byte(body)).DoRaw(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Status struct{ Allowed bool } `json:"status"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out.Status.Allowed
}

// TestOverrideChangeUpgrades: changing spec.overrides makes a new revision.
func TestOverrideChangeUpgrades(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "hca-1", "hcloud-a", "hcloud://2001")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "hcloud-a"},
		Spec:       v1.NativeCCMSpec{Platform: "hcloud-a"},
	})
	obj := waitCondition(t, "hcloud-a", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	firstDigest := obj.Status.Release.Digest

	updateNativeCCM(t, "hcloud-a", func(o *v1.NativeCCM) {
		o.Spec.Overrides = &v1.Overrides{
			Args:  []string{"--v=4"},
			Image: &v1.Image{Tag: "v9.9.9"},
			Env:   []corev1.EnvVar{{Name: "HCLOUD_DEBUG", Value: "true"}},
		}
	})
	obj = waitCondition(t, "hcloud-a", meta.ReadyCondition, metav1.ConditionTrue, v1.UpgradeSucceededReason)
	if obj.Status.Release.Revision != 2 || obj.Status.Release.Digest == firstDigest {
		t.Errorf("release = %+v", obj.Status.Release)
	}
	d, err := getDeployment(t, "native-ccm-hcloud-a")
	if err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--v=4") || !strings.HasSuffix(c.Image, ":v9.9.9") || !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "HCLOUD_DEBUG" }) {
		t.Errorf("container = %+v", c)
	}
	if ok, state := hasEvent(t, "hcloud-a", v1.UpgradeSucceededReason); !ok {
		t.Error(state)
	}
}

// TestEnforcedOverrideIsStalled: an override that tries to change an enforced
// flag is a configuration error: Stalled, Ready=False, nothing installed.
func TestEnforcedOverrideIsStalled(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "hce-1", "hcloud-e", "hcloud://5001")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "hcloud-e"},
		Spec:       v1.NativeCCMSpec{Platform: "hcloud-e", Overrides: &v1.Overrides{Args: []string{"--controllers=*"}}},
	})
	obj := waitCondition(t, "hcloud-e", meta.StalledCondition, metav1.ConditionTrue, v1.InvalidOverridesReason)
	if !conditions.IsFalse(obj, meta.ReadyCondition) || obj.Status.Release != nil {
		t.Errorf("status = %+v", obj.Status)
	}
	// The patch helper writes the conditions before the rest of the status.
	eventually(t, "a stalled generation is fully handled", func() (bool, string) {
		o := getNativeCCM(t, "hcloud-e")
		return o.Status.ObservedGeneration == o.Generation, fmt.Sprintf("observedGeneration %d, generation %d", o.Status.ObservedGeneration, o.Generation)
	})
	// A flag without its value in values.args of the builtin chart (which
	// the CRD cannot judge) would take the enforced --controllers as its
	// value: Stalled, with a condition and an event naming the field and the fix.
	updateNativeCCM(t, "hcloud-e", func(o *v1.NativeCCM) {
		o.Spec.Overrides = &v1.Overrides{Values: &apiextensionsv1.JSON{Raw: []byte(`{"args":["--cluster-name"]}`)}}
	})
	const want = `spec.overrides.values.args[0]: Invalid value: "--cluster-name"`
	eventually(t, "stalled naming values.args", func() (bool, string) {
		o := getNativeCCM(t, "hcloud-e")
		c := conditions.Get(o, meta.StalledCondition)
		return c != nil && c.Reason == v1.InvalidOverridesReason && strings.Contains(c.Message, want) && strings.Contains(c.Message, "--cluster-name=value"),
			fmt.Sprintf("%+v", c)
	})
	eventually(t, "a Warning event naming values.args", func() (bool, string) {
		var list corev1.EventList
		if err := k8s.List(ctxT(t), &list, client.MatchingFields{"involvedObject.name": "hcloud-e"}); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Reason == v1.InvalidOverridesReason && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, want) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(list.Items))
	})
	if o := getNativeCCM(t, "hcloud-e"); o.Status.Release != nil {
		t.Errorf("installed: %+v", o.Status.Release)
	}
	// Fixing the spec recovers.
	updateNativeCCM(t, "hcloud-e", func(o *v1.NativeCCM) { o.Spec.Overrides = nil })
	obj = waitCondition(t, "hcloud-e", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if conditions.Has(obj, meta.StalledCondition) {
		t.Errorf("still stalled: %+v", obj.Status.Conditions)
	}
}

// TestFailedUpgradeRollsBack: an upgrade the API server rejects leaves the
// previous revision running (rolled back) and Ready=False, and it is retried.
func TestFailedUpgradeRollsBack(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "hcb-1", "hcloud-b", "hcloud://3001")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "hcloud-b"},
		Spec:       v1.NativeCCMSpec{Platform: "hcloud-b"},
	})
	obj := waitCondition(t, "hcloud-b", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)

	updateNativeCCM(t, "hcloud-b", func(o *v1.NativeCCM) {
		o.Spec.Overrides = &v1.Overrides{Values: &apiextensionsv1.JSON{Raw: []byte(`{"podLabels":{"broken":"not a valid label value!"}}`)}}
	})
	obj = waitCondition(t, "hcloud-b", meta.ReadyCondition, metav1.ConditionFalse, v1.UpgradeFailedReason)
	eventually(t, "rollback and retries", func() (bool, string) {
		ok, state := eventNow(t, "hcloud-b", v1.RollbackSucceededReason)
		o := getNativeCCM(t, "hcloud-b")
		return ok && o.Status.Failures >= 2 && o.Status.Release.Status == "deployed", state + fmt.Sprintf(" %+v", o.Status.Release) + fmt.Sprint(o.Status.Failures)
	})
	d, err := getDeployment(t, "native-ccm-hcloud-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, bad := d.Spec.Template.Labels["broken"]; bad {
		t.Errorf("failed upgrade left its change: %v", d.Spec.Template.Labels)
	}
	if !conditions.IsTrue(obj, meta.ReconcilingCondition) {
		t.Errorf("a retrying NativeCCM is Reconciling: %+v", obj.Status.Conditions)
	}

	// Fixing the override lets the next upgrade succeed.
	updateNativeCCM(t, "hcloud-b", func(o *v1.NativeCCM) {
		o.Spec.Overrides = &v1.Overrides{Values: &apiextensionsv1.JSON{Raw: []byte(`{"podLabels":{"fixed":"yes"}}`)}}
	})
	waitCondition(t, "hcloud-b", meta.ReadyCondition, metav1.ConditionTrue, v1.UpgradeSucceededReason)
}

// TestFailingChartIsRetried: a chart the API server rejects → Ready=False
// InstallFailed, retried with backoff; switching to a good profile recovers.
func TestFailingChartIsRetried(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "ba-1", "broken-a", "hcloud://4001")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "broken-a"},
		Spec:       v1.NativeCCMSpec{Platform: "broken-a"},
	})
	obj := waitCondition(t, "broken-a", meta.ReadyCondition, metav1.ConditionFalse, v1.InstallFailedReason)
	if !strings.Contains(conditions.GetMessage(obj, meta.ReadyCondition), "Not_A_Valid_Name") {
		t.Errorf("message does not say what failed: %s", conditions.GetMessage(obj, meta.ReadyCondition))
	}
	eventually(t, "retries", func() (bool, string) {
		o := getNativeCCM(t, "broken-a")
		return o.Status.Failures >= 3, fmt.Sprint(o.Status.Failures)
	})
	if ok, state := hasEvent(t, "broken-a", v1.InstallFailedReason); !ok {
		t.Error(state)
	}
}

// TestWaitsForCredentials: no Secret → Ready=False CredentialsNotFound and no
// release; the Secret appears → installed.
func TestWaitsForCredentials(t *testing.T) {
	createNode(t, "aws-1", "aws-a", "aws:///eu-central-1a/i-0123")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "aws-a"},
		Spec: v1.NativeCCMSpec{
			Platform:    "aws-a",
			Credentials: &v1.Credentials{SecretRef: meta.LocalObjectReference{Name: "aws-a-credentials"}},
		},
	})
	obj := waitCondition(t, "aws-a", meta.ReadyCondition, metav1.ConditionFalse, v1.CredentialsNotFoundReason)
	if !strings.Contains(conditions.GetMessage(obj, meta.ReadyCondition), "aws-a-credentials") || obj.Status.Release != nil {
		t.Fatalf("status = %+v", obj.Status)
	}
	// Keys missing: still waiting, naming the key.
	createSecret(t, "aws-a-credentials", map[string]string{"access-key-id": "AKIA"})
	eventually(t, "missing keys named", func() (bool, string) {
		o := getNativeCCM(t, "aws-a")
		m := conditions.GetMessage(o, meta.ReadyCondition)
		return strings.Contains(m, "key secret-access-key") && strings.Contains(m, "key cloud.conf"), m
	})
	s := &corev1.Secret{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: "aws-a-credentials"}, s); err != nil {
		t.Fatal(err)
	}
	s.StringData = map[string]string{"secret-access-key": "x", "cloud.conf": "[Global]\nRegion=eu-central-1\n"}
	if err := k8s.Update(ctxT(t), s); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, "aws-a", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	d, err := getDeployment(t, "native-ccm-aws-a")
	if err != nil {
		t.Fatal(err)
	}
	// The credentials Secret is the one Secret volume (the gate adds its own
	// ConfigMap and emptyDir volumes).
	var vol []corev1.Volume
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			vol = append(vol, v)
		}
	}
	if len(vol) != 1 || vol[0].Secret.SecretName != "aws-a-credentials" || !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--cloud-config=/etc/kubernetes/cloud-config/cloud.conf") {
		t.Errorf("cloud-config not wired: %+v %v", vol, d.Spec.Template.Spec.Containers[0].Args)
	}
}

// TestUpstreamChartFromHTTPRepository: a chart from an HTTP chart repository is
// held to the same rules by the post-renderer.
func TestUpstreamChartFromHTTPRepository(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "up-1", "upstream-a", "hcloud://6001")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "upstream-a"},
		Spec:       v1.NativeCCMSpec{Platform: "upstream-a"},
	})
	obj := waitCondition(t, "upstream-a", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if obj.Status.Release.Chart != "fake-ccm@1.0.0" {
		t.Errorf("chart = %s", obj.Status.Release.Chart)
	}
	d, err := getDeployment(t, "native-ccm-upstream-a-upstream")
	if err != nil {
		t.Fatal(err)
	}
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	for _, want := range []string{"--controllers=cloud-node-lifecycle", "--use-service-account-credentials=false", "--leader-elect-resource-name=native-ccm-upstream-a", "--secure-port=10307", "--allow-untagged-cloud=true", "--webhook-secure-port=0"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %v lack %s", c.Args, want)
		}
	}
	if spec.ServiceAccountName != "native-ccm-upstream-a" || c.Ports[0].ContainerPort != 10307 {
		t.Errorf("sa=%s ports=%v", spec.ServiceAccountName, c.Ports)
	}
	if c.Env[0].ValueFrom.SecretKeyRef.Name != "hcloud" || c.Image != "docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.35.0" {
		t.Errorf("values mapping not applied: %+v %s", c.Env, c.Image)
	}
	crb := &rbacv1.ClusterRoleBinding{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Name: "native-ccm-upstream-a-cluster-admin"}, crb); !apierrors.IsNotFound(err) {
		t.Errorf("upstream cluster-admin binding was installed: %v", err)
	}
	sa := &corev1.ServiceAccount{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: "cloud-controller-manager"}, sa); !apierrors.IsNotFound(err) {
		t.Errorf("upstream ServiceAccount was installed: %v", err)
	}
}

// TestConflictsAreReported: a foreign CCM with the default controllers and our
// lease name, and nodes without providerID, show as the Conflict condition and
// Warning events.
func TestConflictsAreReported(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "hcc-1", "hcloud-c", "hcloud://7001")
	createNode(t, "hcc-2", "hcloud-c", "")
	foreign := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "someones-ccm", Namespace: releaseNamespace},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "ccm", Image: "example/cloud-controller-manager:v1",
					Args: []string{"--cloud-provider=x", "--leader-elect-resource-name", "native-ccm-hcloud-c", "--leader-elect-resource-namespace=" + releaseNamespace},
				}}},
			},
		},
	}
	create(t, foreign)
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "hcloud-c"},
		Spec:       v1.NativeCCMSpec{Platform: "hcloud-c"},
	})
	obj := waitCondition(t, "hcloud-c", v1.ConflictCondition, metav1.ConditionTrue, v1.LeaseNameSharedReason)
	msg := conditions.GetMessage(obj, v1.ConflictCondition)
	for _, want := range []string{"Deployment/" + releaseNamespace + "/someones-ccm uses lease", "runs the cloud-node controller (--controllers=*)", "1 node(s) of platform hcloud-c have no providerID: hcc-2"} {
		if !strings.Contains(msg, want) {
			t.Errorf("conflict message %q lacks %q", msg, want)
		}
	}
	eventually(t, "nodesWithoutProviderID counted", func() (bool, string) {
		o := getNativeCCM(t, "hcloud-c")
		return o.Status.NodesWithoutProviderID == 1, fmt.Sprint(o.Status.NodesWithoutProviderID)
	})
	for _, reason := range []string{v1.LeaseNameSharedReason, v1.ForeignCloudNodeControllerReason, v1.EmptyProviderIDReason} {
		if ok, state := hasEvent(t, "hcloud-c", reason); !ok {
			t.Errorf("no %s event: %s", reason, state)
		}
	}
	// Our own release is not a conflict.
	waitCondition(t, "hcloud-c", v1.InstalledCondition, metav1.ConditionTrue, "")
	if err := k8s.Delete(ctxT(t), foreign); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Patch(ctxT(t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hcc-2"}}, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"providerID":"hcloud://7002"}}`))); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, "hcloud-c", v1.ConflictCondition, metav1.ConditionFalse, v1.NoConflictReason)
}

// TestDeleteUninstalls: the finalizer removes the release before the NativeCCM goes.
func TestDeleteUninstalls(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "hcd-1", "hcloud-d", "hcloud://8001")
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "hcloud-d"}, Spec: v1.NativeCCMSpec{Platform: "hcloud-d"}}
	createNativeCCM(t, obj)
	waitCondition(t, "hcloud-d", v1.InstalledCondition, metav1.ConditionTrue, "")
	if !slices.Contains(getNativeCCM(t, "hcloud-d").Finalizers, v1.Finalizer) {
		t.Fatal("no finalizer")
	}
	if err := k8s.Delete(ctxT(t), obj); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NativeCCM and release gone", func() (bool, string) {
		err := k8s.Get(ctxT(t), client.ObjectKey{Name: "hcloud-d"}, &v1.NativeCCM{})
		_, derr := getDeployment(t, "native-ccm-hcloud-d")
		var secrets corev1.SecretList
		_ = k8s.List(ctxT(t), &secrets, client.InNamespace(releaseNamespace), client.MatchingLabels{"owner": "helm", "name": "native-ccm-hcloud-d"})
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(derr) && len(secrets.Items) == 0, fmt.Sprintf("nativeccm: %v, deployment: %v, history: %d", err, derr, len(secrets.Items))
	})
}

// TestPrinterColumns: what `kubectl get nativeccms` shows, from the API server.
func TestPrinterColumns(t *testing.T) {
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "printer"},
		Spec:       v1.NativeCCMSpec{Platform: "gcp", Profile: "gcp", Install: v1.InstallNever},
	})
	waitCondition(t, "printer", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallDisabledReason)

	raw, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/apis/hybridccm.io/v1alpha1/nativeccms/printer").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	var names []string
	cells := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		names = append(names, c.Name)
		cells[c.Name] = table.Rows[0].Cells[i]
	}
	want := []string{"Name", "Platform", "Install", "Nodes", "Revision", "Chart", "Upstream", "Skew", "Leader", "Renewed", "Ready", "Conflict", "Status", "Age"}
	if !slices.Equal(names, want) {
		t.Errorf("columns = %v, want %v", names, want)
	}
	for col, v := range map[string]any{"Name": "printer", "Platform": "gcp", "Install": "Never", "Nodes": float64(0), "Ready": "True", "Conflict": "False", "Status": "not installed: install policy is Never",
		// the gcp profile's release for the API server's minor (1.34-1.36); on
		// 1.37 its 1.36 release (it names none for 1.37)
		"Skew": float64(printerSkew(t))} {
		if cells[col] != v {
			t.Errorf("column %s = %#v, want %#v", col, cells[col], v)
		}
	}
	// Wide-only columns are marked priority 1.
	for _, c := range table.ColumnDefinitions {
		if (c.Name == "Chart" || c.Name == "Upstream" || c.Name == "Skew" || c.Name == "Conflict") != (c.Priority == 1) {
			t.Errorf("column %s priority %d", c.Name, c.Priority)
		}
	}
}

var _ = release.DigestLabel

// printerSkew is the skew the gcp profile's release has on the test API
// server: 0 on 1.34-1.36, 1 on 1.37 (the profile names no 1.37 release).
func printerSkew(t *testing.T) int {
	t.Helper()
	_, minor := apiServer(t)
	return minor - min(minor, 36)
}

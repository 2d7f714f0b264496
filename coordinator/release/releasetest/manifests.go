package releasetest

import (
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// Decoded holds the typed objects of a rendered release.
type Decoded struct {
	Deployments         []*appsv1.Deployment
	DaemonSets          []*appsv1.DaemonSet
	ServiceAccounts     []*corev1.ServiceAccount
	ClusterRoles        []*rbacv1.ClusterRole
	Roles               []*rbacv1.Role
	ClusterRoleBindings []*rbacv1.ClusterRoleBinding
	RoleBindings        []*rbacv1.RoleBinding
	// Kinds lists every object as kind/name, in order.
	Kinds []string
}

// Decode parses rendered manifests into typed objects.
func Decode(t testing.TB, manifest string) Decoded {
	t.Helper()
	m, err := release.ParseManifests([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	var d Decoded
	for _, o := range m.Objects {
		d.Kinds = append(d.Kinds, o.GetKind()+"/"+o.GetName())
		var target any
		switch o.GetKind() {
		case "Deployment":
			x := &appsv1.Deployment{}
			d.Deployments, target = append(d.Deployments, x), x
		case "DaemonSet":
			x := &appsv1.DaemonSet{}
			d.DaemonSets, target = append(d.DaemonSets, x), x
		case "ServiceAccount":
			x := &corev1.ServiceAccount{}
			d.ServiceAccounts, target = append(d.ServiceAccounts, x), x
		case "ClusterRole":
			x := &rbacv1.ClusterRole{}
			d.ClusterRoles, target = append(d.ClusterRoles, x), x
		case "Role":
			x := &rbacv1.Role{}
			d.Roles, target = append(d.Roles, x), x
		case "ClusterRoleBinding":
			x := &rbacv1.ClusterRoleBinding{}
			d.ClusterRoleBindings, target = append(d.ClusterRoleBindings, x), x
		case "RoleBinding":
			x := &rbacv1.RoleBinding{}
			d.RoleBindings, target = append(d.RoleBindings, x), x
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, target); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// AssertLifecycleOnly checks the invariants every native CCM release must hold.
func AssertLifecycleOnly(t testing.TB, manifest string, l release.Lifecycle) {
	t.Helper()
	d := Decode(t, manifest)
	if len(d.Deployments)+len(d.DaemonSets) != 1 {
		t.Fatalf("want exactly one CCM workload, got %v", d.Kinds)
	}
	var spec corev1.PodSpec
	if len(d.Deployments) == 1 {
		spec = d.Deployments[0].Spec.Template.Spec
	} else {
		spec = d.DaemonSets[0].Spec.Template.Spec
	}
	if spec.ServiceAccountName != l.Release {
		t.Errorf("serviceAccountName = %q, want %q", spec.ServiceAccountName, l.Release)
	}
	if _, ok := spec.NodeSelector["node-role.kubernetes.io/control-plane"]; !ok {
		t.Errorf("not scheduled on control-plane nodes: %v", spec.NodeSelector)
	}
	args := " " + strings.Join(append(append([]string{}, spec.Containers[0].Command...), spec.Containers[0].Args...), " ")
	for _, want := range l.EnforcedArgs() {
		if strings.Count(args, " "+want) != 1 {
			t.Errorf("args %q: want %q exactly once", args, want)
		}
	}
	for _, want := range l.EnforcedArgs() {
		flag := profile.FlagName(want)
		if n := strings.Count(args, flag+"="); n != 1 && flag != "--leader-elect" {
			t.Errorf("flag %s appears %d times in %q", flag, n, args)
		}
	}
	if len(d.ServiceAccounts) != 1 || d.ServiceAccounts[0].Name != l.Release {
		t.Errorf("service accounts = %v", d.Kinds)
	}
	// Bound to the static ClusterRole the coordinator chart ships (the
	// standalone native-ccm chart renders its own).
	rules, lifecycle := release.LifecycleRules(), release.LifecycleClusterRole
	if len(d.ClusterRoles) > 1 {
		t.Fatalf("cluster roles: %v", d.Kinds)
	}
	if len(d.ClusterRoles) == 1 {
		rules, lifecycle = d.ClusterRoles[0].Rules, d.ClusterRoles[0].Name
	}
	for _, b := range d.ClusterRoleBindings {
		if b.RoleRef.Name != lifecycle && b.RoleRef.Name != release.AuthDelegatorClusterRole ||
			len(b.Subjects) != 1 || b.Subjects[0].Name != l.Release {
			t.Errorf("ClusterRoleBinding %s: %+v %+v", b.Name, b.RoleRef, b.Subjects)
		}
	}
	for _, r := range rules {
		for _, v := range r.Verbs {
			if v == "*" || v == "deletecollection" || v == "create" && r.Resources[0] == "nodes" {
				t.Errorf("cluster role grants %s on %v", v, r.Resources)
			}
		}
		for _, res := range r.Resources {
			if res != "nodes" && res != "events" {
				t.Errorf("cluster role grants %v", res)
			}
		}
	}
	// its own Lease, get and update only: no create (lease squatting)
	if len(d.Roles) == 1 && (len(d.Roles[0].Rules) != 1 || !slices.Equal(d.Roles[0].Rules[0].Verbs, []string{"get", "update"})) {
		t.Errorf("lease role rules = %+v", d.Roles[0].Rules)
	}
	if len(d.Roles) != 1 || d.Roles[0].Rules[0].ResourceNames[0] != l.LeaseName {
		t.Errorf("lease role = %+v", d.Roles)
	}
}

// AssertLifecycleRules: the release is bound to LifecycleClusterRole (which the
// ccm-coordinator chart ships with LifecycleRules; test/e2e compares them), and
// on nodes exactly what cloud-node-lifecycle uses (get, list, watch, patch,
// delete: no update, no create, nothing on nodes/status). The native-ccm
// chart's own RBAC, rendered without the post-renderer, is replaced by it.
func AssertLifecycleRules(t testing.TB, manifest string) {
	t.Helper()
	d := Decode(t, manifest)
	if len(d.ClusterRoles) != 0 {
		t.Fatalf("cluster roles rendered: %v", d.Kinds)
	}
	lifecycle := 0
	for _, b := range d.ClusterRoleBindings {
		if b.RoleRef.Kind == "ClusterRole" && b.RoleRef.Name == release.LifecycleClusterRole {
			lifecycle++
		}
	}
	if lifecycle != 1 {
		t.Errorf("ClusterRoleBindings to %s: %d, want 1", release.LifecycleClusterRole, lifecycle)
	}
	var nodeVerbs []string
	for _, r := range release.LifecycleRules() {
		for _, res := range r.Resources {
			if strings.HasPrefix(res, "nodes") {
				if res != "nodes" {
					t.Errorf("cluster role grants %v on %s", r.Verbs, res)
				}
				nodeVerbs = append(nodeVerbs, r.Verbs...)
			}
		}
	}
	if !slices.Equal(nodeVerbs, []string{"get", "list", "watch", "patch", "delete"}) {
		t.Errorf("cluster role grants %v on nodes, want get, list, watch, patch, delete", nodeVerbs)
	}
}

// AssertDelegatedAuthn: besides its own ClusterRole and lease Role, the CCM's
// ServiceAccount is bound to exactly the two roles its secure port needs
// (delegated authentication and authorization): without them a CCM built on
// k8s.io/cloud-provider/app exits at start.
func AssertDelegatedAuthn(t testing.TB, d Decoded, sa, namespace string) {
	t.Helper()
	// the static lifecycle ClusterRole, or the standalone chart's own
	lifecycle := release.LifecycleClusterRole
	if len(d.ClusterRoles) == 1 {
		lifecycle = d.ClusterRoles[0].Name
	}
	want := map[string]string{
		"ClusterRole/" + release.AuthDelegatorClusterRole:                                        "",
		"ClusterRole/" + lifecycle:                                                               "",
		"Role/" + release.AuthenticationReaderRole + "@" + release.AuthenticationReaderNamespace: "",
		"Role/" + d.Roles[0].Name + "@" + d.Roles[0].Namespace:                                   "",
	}
	got := map[string]string{}
	check := func(kind, name, ns string, subjects []rbacv1.Subject) {
		key := kind + "/" + name
		if ns != "" {
			key += "@" + ns
		}
		got[key] = ""
		if len(subjects) != 1 || subjects[0].Kind != rbacv1.ServiceAccountKind || subjects[0].Name != sa || subjects[0].Namespace != namespace {
			t.Errorf("binding to %s: subjects %+v, want ServiceAccount %s/%s only", key, subjects, namespace, sa)
		}
	}
	for _, b := range d.ClusterRoleBindings {
		check(b.RoleRef.Kind, b.RoleRef.Name, "", b.Subjects)
	}
	for _, b := range d.RoleBindings {
		check(b.RoleRef.Kind, b.RoleRef.Name, b.Namespace, b.Subjects)
	}
	if !maps.Equal(got, want) {
		t.Errorf("bindings %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}

// AssertFlags: every enforced flag exactly once with its enforced value, no
// value of a removed two-token flag left ("talos-ccm", "*", "true", "5s"),
// --node-monitor-period only as the profile sets it (--node_monitor_period=7s).
func AssertFlags(t testing.TB, all []string, l release.Lifecycle) {
	t.Helper()
	for _, want := range l.EnforcedArgs() {
		name := profile.FlagName(want)
		var seen []string
		for _, a := range all {
			if profile.FlagName(a) == name {
				seen = append(seen, a)
			}
		}
		if len(seen) != 1 || seen[0] != want {
			t.Errorf("%s: rendered %v, want exactly %s", name, seen, want)
		}
	}
	var monitor []string
	for _, a := range all {
		switch a {
		case "talos-ccm", "*", "true", "5s":
			t.Errorf("a value of a replaced flag is left: %q in %v", a, all)
		}
		if profile.FlagName(a) == "--node-monitor-period" {
			monitor = append(monitor, a)
		}
	}
	if strings.Join(monitor, " ") != "--node_monitor_period=7s" {
		t.Errorf("--node-monitor-period: %v, want only the profile's", monitor)
	}
}

package release

import (
	"context"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current output")

// TestGoldenProfiles renders every built-in profile through the embedded chart
// and the post-renderer and compares the manifests with testdata/golden.
func TestGoldenProfiles(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(nil, Options{})
	for _, name := range set.Names() {
		t.Run(name, func(t *testing.T) {
			p, _ := set.Get(name)
			req, err := FromProfile(p, Instance{ReleaseName: "native-ccm-" + name, Namespace: "kube-system", Platform: p.Platforms[0]})
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Render(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join("testdata", "golden", name+".yaml")
			if *update {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run go test ./coordinator/release -run TestGoldenProfiles -update)", err)
			}
			if got != string(want) {
				t.Errorf("rendered manifests differ from %s (run with -update after checking the change):\n%s", file, lineDiff(string(want), got))
			}
			assertLifecycleOnly(t, got, req.Lifecycle)
			assertLifecycleRules(t, got)
			assertDelegatedAuthn(t, decode(t, got), req.Lifecycle.ServiceAccountName(), req.Lifecycle.Namespace)
		})
	}
}

func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, c string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			c = g[i]
		}
		if a != c {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + a + "\n  got:  " + c + "\n")
		}
	}
	return b.String()
}

// decoded holds the typed objects of a rendered release.
type decoded struct {
	deployments []*appsv1.Deployment
	daemonSets  []*appsv1.DaemonSet
	sas         []*corev1.ServiceAccount
	clusterRole []*rbacv1.ClusterRole
	roles       []*rbacv1.Role
	crbs        []*rbacv1.ClusterRoleBinding
	rbs         []*rbacv1.RoleBinding
	kinds       []string
}

func decode(t *testing.T, manifest string) decoded {
	t.Helper()
	m, err := parseManifests([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	var d decoded
	for _, o := range m.Objects {
		d.kinds = append(d.kinds, o.GetKind()+"/"+o.GetName())
		var target any
		switch o.GetKind() {
		case "Deployment":
			x := &appsv1.Deployment{}
			d.deployments, target = append(d.deployments, x), x
		case "DaemonSet":
			x := &appsv1.DaemonSet{}
			d.daemonSets, target = append(d.daemonSets, x), x
		case "ServiceAccount":
			x := &corev1.ServiceAccount{}
			d.sas, target = append(d.sas, x), x
		case "ClusterRole":
			x := &rbacv1.ClusterRole{}
			d.clusterRole, target = append(d.clusterRole, x), x
		case "Role":
			x := &rbacv1.Role{}
			d.roles, target = append(d.roles, x), x
		case "ClusterRoleBinding":
			x := &rbacv1.ClusterRoleBinding{}
			d.crbs, target = append(d.crbs, x), x
		case "RoleBinding":
			x := &rbacv1.RoleBinding{}
			d.rbs, target = append(d.rbs, x), x
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, target); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// assertLifecycleOnly checks the invariants every native CCM release must hold.
func assertLifecycleOnly(t *testing.T, manifest string, l Lifecycle) {
	t.Helper()
	d := decode(t, manifest)
	if len(d.deployments)+len(d.daemonSets) != 1 {
		t.Fatalf("want exactly one CCM workload, got %v", d.kinds)
	}
	var spec corev1.PodSpec
	if len(d.deployments) == 1 {
		spec = d.deployments[0].Spec.Template.Spec
	} else {
		spec = d.daemonSets[0].Spec.Template.Spec
	}
	if spec.ServiceAccountName != l.Release {
		t.Errorf("serviceAccountName = %q, want %q", spec.ServiceAccountName, l.Release)
	}
	if _, ok := spec.NodeSelector["node-role.kubernetes.io/control-plane"]; !ok {
		t.Errorf("not scheduled on control-plane nodes: %v", spec.NodeSelector)
	}
	args := strings.Join(append(append([]string{}, spec.Containers[0].Command...), spec.Containers[0].Args...), " ")
	for _, want := range l.enforcedArgs() {
		if strings.Count(args, " "+want) != 1 {
			t.Errorf("args %q: want %q exactly once", args, want)
		}
	}
	for _, flag := range enforcedFlagNames {
		if n := strings.Count(args, flag+"="); n != 1 && flag != "--leader-elect" {
			t.Errorf("flag %s appears %d times in %q", flag, n, args)
		}
	}
	if len(d.sas) != 1 || d.sas[0].Name != l.Release {
		t.Errorf("service accounts = %v", d.kinds)
	}
	// Bound to the static ClusterRole the coordinator chart ships (the
	// standalone native-ccm chart renders its own).
	rules, lifecycle := LifecycleRules(), LifecycleClusterRole
	if len(d.clusterRole) > 1 {
		t.Fatalf("cluster roles: %v", d.kinds)
	}
	if len(d.clusterRole) == 1 {
		rules, lifecycle = d.clusterRole[0].Rules, d.clusterRole[0].Name
	}
	for _, b := range d.crbs {
		if b.RoleRef.Name != lifecycle && b.RoleRef.Name != AuthDelegatorClusterRole ||
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
	if len(d.roles) == 1 && (len(d.roles[0].Rules) != 1 || !slices.Equal(d.roles[0].Rules[0].Verbs, []string{"get", "update"})) {
		t.Errorf("lease role rules = %+v", d.roles[0].Rules)
	}
	if len(d.roles) != 1 || d.roles[0].Rules[0].ResourceNames[0] != l.LeaseName {
		t.Errorf("lease role = %+v", d.roles)
	}
}

// assertLifecycleRules: the release is bound to LifecycleClusterRole (which the
// ccm-coordinator chart ships with LifecycleRules; test/e2e compares them), and
// on nodes exactly what cloud-node-lifecycle uses (get, list, watch, patch,
// delete: no update, no create, nothing on nodes/status). The native-ccm
// chart's own RBAC, rendered without the post-renderer, is replaced by it.
func assertLifecycleRules(t *testing.T, manifest string) {
	t.Helper()
	d := decode(t, manifest)
	if len(d.clusterRole) != 0 {
		t.Fatalf("cluster roles rendered: %v", d.kinds)
	}
	lifecycle := 0
	for _, b := range d.crbs {
		if b.RoleRef.Kind == "ClusterRole" && b.RoleRef.Name == LifecycleClusterRole {
			lifecycle++
		}
	}
	if lifecycle != 1 {
		t.Errorf("ClusterRoleBindings to %s: %d, want 1", LifecycleClusterRole, lifecycle)
	}
	var nodeVerbs []string
	for _, r := range LifecycleRules() {
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

// assertDelegatedAuthn: besides its own ClusterRole and lease Role, the CCM's
// ServiceAccount is bound to exactly the two roles its secure port needs
// (delegated authentication and authorization): without them a CCM built on
// k8s.io/cloud-provider/app exits at start.
func assertDelegatedAuthn(t *testing.T, d decoded, sa, namespace string) {
	t.Helper()
	// the static lifecycle ClusterRole, or the standalone chart's own
	lifecycle := LifecycleClusterRole
	if len(d.clusterRole) == 1 {
		lifecycle = d.clusterRole[0].Name
	}
	want := map[string]string{
		"ClusterRole/" + AuthDelegatorClusterRole:                                "",
		"ClusterRole/" + lifecycle:                                               "",
		"Role/" + AuthenticationReaderRole + "@" + AuthenticationReaderNamespace: "",
		"Role/" + d.roles[0].Name + "@" + d.roles[0].Namespace:                   "",
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
	for _, b := range d.crbs {
		check(b.RoleRef.Kind, b.RoleRef.Name, "", b.Subjects)
	}
	for _, b := range d.rbs {
		check(b.RoleRef.Kind, b.RoleRef.Name, b.Namespace, b.Subjects)
	}
	if !maps.Equal(got, want) {
		t.Errorf("bindings %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}

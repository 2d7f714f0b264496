package charts_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// renderWithHooks renders c as render does and returns the release's
// objects and its hooks (the test pods), each parsed.
func renderWithHooks(t *testing.T, c chart, values map[string]any) (objs, hooks manifests) {
	t.Helper()
	ch, err := loader.Load(c.path(t))
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.ReleaseName, in.Namespace = c.releaseName(), releaseNamespace
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.KubeVersion = kubeVersion
	in.APIVersions = chartutil.VersionSet{}
	rel, err := in.Run(ch, values)
	if err != nil {
		t.Fatalf("render %s: %v", c, err)
	}
	if objs, err = parse(rel.Manifest); err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, h := range rel.Hooks {
		docs = append(docs, h.Manifest)
	}
	if hooks, err = parse(strings.Join(docs, "\n---\n")); err != nil {
		t.Fatal(err)
	}
	return objs, hooks
}

func toTyped(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// TestHelmTestPods: every chart that installs a controller has one helm
// test hook, a pod running hybridctl doctor scoped to that chart's
// controller: in the release namespace (where `helm test --logs` reads
// it), as the chart's test ServiceAccount, with the product's hybridctl
// image of the chart's version and the image pull Secrets of the chart's
// pods, restricted (non-root, no privilege escalation, no capabilities,
// read-only root), selected by none of the chart's Services, disruption
// budgets or network policies. test.enabled=false renders no test and no
// test ServiceAccount or RBAC.
func TestHelmTestPods(t *testing.T) {
	// the controller's namespace each chart's test checks, as doctor --namespace
	controllerNS := map[string]string{"talos-ccm": releaseNamespace, "ccm-coordinator": "hybrid-ccm-system"}
	for _, tc := range []struct {
		chart  chart
		values map[string]any
		// want: doctor --component of each test pod, in order
		want []string
		// pullSecrets of the test pods
		pullSecrets []string
	}{
		{chart: talosCCM, values: map[string]any{"imagePullSecrets": []any{map[string]any{"name": "regcred"}}},
			want: []string{"talos-ccm"}, pullSecrets: []string{"regcred"}},
		{chart: ccmCoordinator, values: map[string]any{"networkPolicy": map[string]any{"enabled": true}},
			want: []string{"ccm-coordinator"}},
		{chart: hybridCCM, values: map[string]any{"global": map[string]any{"imagePullSecrets": []any{map[string]any{"name": "mirror"}}},
			"talos-ccm": map[string]any{"replicas": 2, "networkPolicy": map[string]any{"enabled": true}}},
			want: []string{"ccm-coordinator", "talos-ccm"}, pullSecrets: []string{"mirror"}},
	} {
		t.Run(string(tc.chart), func(t *testing.T) {
			objs, hooks := renderWithHooks(t, tc.chart, tc.values)
			var got []string
			for _, h := range hooks {
				if h.GetKind() != "Pod" {
					t.Errorf("hook %s %s: only test pods are hooks", h.GetKind(), h.GetName())
					continue
				}
				var pod corev1.Pod
				toTyped(t, h, &pod)
				if a := pod.Annotations; a["helm.sh/hook"] != "test" || a["helm.sh/hook-delete-policy"] != "before-hook-creation" {
					t.Errorf("pod %s annotations %v: want a test hook replaced by the next run", pod.Name, a)
				}
				if pod.Namespace != releaseNamespace {
					t.Errorf("pod %s in %s, want the release namespace %s", pod.Name, pod.Namespace, releaseNamespace)
				}
				if len(pod.Spec.Containers) != 1 {
					t.Fatalf("pod %s: %d containers", pod.Name, len(pod.Spec.Containers))
				}
				ct := pod.Spec.Containers[0]
				if ct.Image != "ghcr.io/hybrid-ccm/hybridctl:0.1.0" {
					t.Errorf("pod %s image %s", pod.Name, ct.Image)
				}
				comp := strings.TrimPrefix(ct.Args[1], "--component=")
				got = append(got, comp)
				if want := []string{"doctor", "--component=" + comp, "--namespace=" + controllerNS[comp]}; !slices.Equal(ct.Args, want) {
					t.Errorf("pod %s args %q, want %q", pod.Name, ct.Args, want)
				}
				if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
					t.Errorf("pod %s restartPolicy %q", pod.Name, pod.Spec.RestartPolicy)
				}
				var secrets []string
				for _, s := range pod.Spec.ImagePullSecrets {
					secrets = append(secrets, s.Name)
				}
				if !slices.Equal(secrets, tc.pullSecrets) {
					t.Errorf("pod %s imagePullSecrets %v, want %v", pod.Name, secrets, tc.pullSecrets)
				}
				psc, sc := pod.Spec.SecurityContext, ct.SecurityContext
				if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
					sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
					sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || pod.Spec.HostNetwork {
					t.Errorf("pod %s is not restricted: %+v %+v", pod.Name, psc, sc)
				}
				// its ServiceAccount is the release's, in its namespace
				found := false
				for _, sa := range objs.find("ServiceAccount") {
					found = found || (sa.GetName() == pod.Spec.ServiceAccountName && sa.GetNamespace() == pod.Namespace)
				}
				if !found || pod.Spec.AutomountServiceAccountToken == nil || !*pod.Spec.AutomountServiceAccountToken {
					t.Errorf("pod %s: ServiceAccount %s not in the release (%v) or its token not mounted", pod.Name, pod.Spec.ServiceAccountName, found)
				}
				// no selector of the chart picks it
				podLabels := labels.Set(pod.Labels)
				for _, o := range objs {
					var sel *metav1.LabelSelector
					switch o.GetKind() {
					case "Deployment":
						s, _, _ := unstructured.NestedMap(o.Object, "spec", "selector")
						sel = &metav1.LabelSelector{}
						toTyped(t, &unstructured.Unstructured{Object: s}, sel)
					case "PodDisruptionBudget", "NetworkPolicy":
						path := []string{"spec", "selector"}
						if o.GetKind() == "NetworkPolicy" {
							path = []string{"spec", "podSelector"}
						}
						s, _, _ := unstructured.NestedMap(o.Object, path...)
						sel = &metav1.LabelSelector{}
						toTyped(t, &unstructured.Unstructured{Object: s}, sel)
					case "Service":
						s, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector")
						sel = &metav1.LabelSelector{MatchLabels: s}
					default:
						continue
					}
					ls, err := metav1.LabelSelectorAsSelector(sel)
					if err != nil {
						t.Fatal(err)
					}
					if o.GetNamespace() == pod.Namespace && !ls.Empty() && ls.Matches(podLabels) {
						t.Errorf("%s %s selects test pod %s", o.GetKind(), o.GetName(), pod.Name)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("test pods check %v, want %v", got, tc.want)
			}

			// off: no test, and nothing of it
			off := map[string]any{"test": map[string]any{"enabled": false}}
			if tc.chart == hybridCCM {
				off = map[string]any{"talos-ccm": off, "ccm-coordinator": off}
			}
			objs, hooks = renderWithHooks(t, tc.chart, off)
			if len(hooks) != 0 {
				t.Errorf("test.enabled=false: %d hooks", len(hooks))
			}
			for _, o := range objs {
				if strings.HasSuffix(o.GetName(), "-test") || strings.HasSuffix(o.GetName(), ":test") {
					t.Errorf("test.enabled=false: %s %s rendered", o.GetKind(), o.GetName())
				}
			}
		})
	}
}

// TestHelmTestRBAC: the test ServiceAccounts only read (get, list), only
// the kinds their doctor checks read, a Lease and the fence only by name,
// and their bindings name only them.
func TestHelmTestRBAC(t *testing.T) {
	objs, _ := renderWithHooks(t, hybridCCM, nil)
	want := map[string][]string{
		// kind/name: group/resource:verbs[:resourceNames]
		"ClusterRole/talos-ccm:test":  {"/nodes:list", "certificates.k8s.io/certificatesigningrequests:list"},
		"Role/talos-ccm:test":         {"apps/deployments:list", "coordination.k8s.io/leases:get:talos-ccm"},
		"ClusterRole/hybrid-ccm:test": {"hybridccm.io/nativeccms:list", "admissionregistration.k8s.io/validatingadmissionpolicies,validatingadmissionpolicybindings:get:native-ccm-fence.hybridccm.io"},
		"Role/hybrid-ccm:test":        {"apps/deployments:list", "coordination.k8s.io/leases:get:ccm-coordinator.hybridccm.io"},
	}
	subjects := map[string]rbacv1.Subject{
		"talos-ccm:test":  {Kind: "ServiceAccount", Name: "talos-ccm-test", Namespace: releaseNamespace},
		"hybrid-ccm:test": {Kind: "ServiceAccount", Name: "hybrid-ccm-test", Namespace: releaseNamespace},
	}
	got := map[string][]string{}
	for _, o := range objs {
		if !strings.HasSuffix(o.GetName(), ":test") {
			continue
		}
		switch o.GetKind() {
		case "ClusterRole", "Role":
			var r rbacv1.ClusterRole // same rules as a Role
			toTyped(t, o, &r)
			for _, rule := range r.Rules {
				s := strings.Join(rule.APIGroups, ",") + "/" + strings.Join(rule.Resources, ",") + ":" + strings.Join(rule.Verbs, ",")
				if len(rule.ResourceNames) > 0 {
					s += ":" + strings.Join(rule.ResourceNames, ",")
				}
				got[o.GetKind()+"/"+o.GetName()] = append(got[o.GetKind()+"/"+o.GetName()], s)
			}
		case "ClusterRoleBinding", "RoleBinding":
			var b rbacv1.ClusterRoleBinding
			toTyped(t, o, &b)
			if b.RoleRef.Name != b.Name || len(b.Subjects) != 1 || b.Subjects[0] != subjects[b.Name] {
				t.Errorf("%s %s binds %s to %+v", o.GetKind(), b.Name, b.RoleRef.Name, b.Subjects)
			}
			if wantKind := strings.TrimSuffix(o.GetKind(), "Binding"); b.RoleRef.Kind != wantKind {
				t.Errorf("%s %s binds a %s", o.GetKind(), b.Name, b.RoleRef.Kind)
			}
		}
	}
	for k, rules := range want {
		if !slices.Equal(got[k], rules) {
			t.Errorf("%s rules %q, want %q", k, got[k], rules)
		}
	}
	if len(got) != len(want) {
		t.Errorf("test roles %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}

// TestHelmTestPodsOnAPIServer: the test pods pass a real API server's
// validation and its Pod Security admission at level restricted
// (server-side apply, dry-run, in a namespace that enforces it).
func TestHelmTestPodsOnAPIServer(t *testing.T) {
	env := controlPlane(t)
	a := newApplier(t, env)
	ctx := context.Background()
	const ns = "helm-test-restricted"
	nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": ns, "labels": map[string]any{"pod-security.kubernetes.io/enforce": "restricted"}}}}
	if _, err := a.Apply(ctx, nsObj, false); err != nil {
		t.Fatal(err)
	}
	_, hooks := renderWithHooks(t, hybridCCM, nil)
	if len(hooks) != 2 {
		t.Fatalf("%d test pods, want 2", len(hooks))
	}
	for _, h := range hooks {
		h.SetNamespace(ns)
		if _, err := a.Apply(ctx, h, true); err != nil {
			t.Errorf("test pod %s: %v", h.GetName(), err)
		}
	}
	// the namespace does enforce it: without its security context a pod is refused
	bare := hooks[0].DeepCopy()
	unstructured.RemoveNestedField(bare.Object, "spec", "securityContext")
	if _, err := a.Apply(ctx, bare, true); err == nil || !strings.Contains(err.Error(), "restricted") {
		t.Errorf("a test pod without its security context: %v, want refused by Pod Security (restricted)", err)
	}
}

// TestHelmTestNotes: the umbrella's NOTES say how to run helm test, unless
// neither subchart has one.
func TestHelmTestNotes(t *testing.T) {
	notes := func(values map[string]any) string {
		rel, err := dryInstall(t, hybridCCM, values)
		if err != nil {
			t.Fatal(err)
		}
		return rel.Info.Notes
	}
	const line = "helm test hybrid-ccm -n kube-system --logs"
	if n := notes(nil); !strings.Contains(n, line) {
		t.Errorf("NOTES lack %q:\n%s", line, n)
	}
	off := map[string]any{"test": map[string]any{"enabled": false}}
	if n := notes(map[string]any{"talos-ccm": off}); !strings.Contains(n, line) {
		t.Errorf("with the coordinator's test only, NOTES lack %q:\n%s", line, n)
	}
	if n := notes(map[string]any{"talos-ccm": off, "ccm-coordinator": off}); strings.Contains(n, "helm test") {
		t.Errorf("without tests, NOTES still say:\n%s", n)
	}
}

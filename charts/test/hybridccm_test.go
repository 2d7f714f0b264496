package charts_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// nativeCCMs decodes the rendered NativeCCMs strictly (an unknown field fails)
// into the coordinator's API type, by name.
func nativeCCMs(t *testing.T, m manifests) map[string]v1.NativeCCM {
	t.Helper()
	out := map[string]v1.NativeCCM{}
	for _, u := range m.find(v1.GroupVersion.String() + " " + v1.NativeCCMKind) {
		var n v1.NativeCCM
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &n, true); err != nil {
			t.Fatalf("NativeCCM %s does not decode into the API type: %v", u.GetName(), err)
		}
		out[n.Name] = n
	}
	return out
}

// TestUmbrellaDefaults: by default the umbrella installs both controllers and
// no NativeCCM; talos-ccm keeps its own stable name.
func TestUmbrellaDefaults(t *testing.T) {
	m := mustRender(t, hybridCCM, nil)
	for _, name := range []string{"talos-ccm", "hybrid-ccm"} {
		found := false
		for _, o := range m.find("Deployment") {
			found = found || o.GetName() == name
		}
		if !found {
			t.Errorf("Deployment %s not rendered (have %v)", name, m.names())
		}
	}
	if n := len(nativeCCMs(t, m)); n != 0 {
		t.Errorf("NativeCCMs = %d with no cloud enabled", n)
	}
	if n := len(m.find("talos.dev/v1alpha1 ServiceAccount")); n != 1 {
		t.Errorf("talos.dev ServiceAccounts = %d", n)
	}

	// Each controller can be left out (installed separately).
	m = mustRender(t, hybridCCM, values(t, `components: {talos-ccm: false}`))
	for _, o := range m.find("Deployment") {
		if o.GetName() == "talos-ccm" {
			t.Error("talos-ccm rendered although components.talos-ccm=false")
		}
	}
	m = mustRender(t, hybridCCM, values(t, `components: {ccm-coordinator: false}`))
	for _, o := range m.find("Deployment") {
		if o.GetName() != "talos-ccm" {
			t.Errorf("Deployment %s rendered although components.ccm-coordinator=false", o.GetName())
		}
	}
}

// TestUmbrellaNativeCCMs: every enabled cloud becomes one NativeCCM whose spec
// carries the cloud's values, falling back to cloudDefaults.
func TestUmbrellaNativeCCMs(t *testing.T) {
	got := nativeCCMs(t, mustRender(t, hybridCCM, hybridCCM.ciValues(t, "multi-cloud")))
	gp := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	want := map[string]v1.NativeCCMSpec{
		"hcloud": {
			Platform: "hcloud", Install: v1.InstallAuto, UninstallGracePeriod: gp(time.Hour),
			Credentials: &v1.Credentials{SecretRef: meta.LocalObjectReference{Name: "hcloud-prod"}},
			Overrides: &v1.Overrides{
				Image: &v1.Image{Tag: "v1.35.0"},
				Env:   []corev1.EnvVar{{Name: "HCLOUD_DEBUG", Value: "false"}},
			},
			LoadBalancers: &v1.LoadBalancers{Enabled: true},
		},
		"aws": {
			Platform: "aws", Install: v1.InstallAlways, UninstallGracePeriod: gp(15 * time.Minute),
			Credentials:   &v1.Credentials{SecretRef: meta.LocalObjectReference{Name: "aws-ccm-prod"}},
			LoadBalancers: &v1.LoadBalancers{Enabled: true, Default: true},
			TakeOver:      &v1.TakeOver{Lease: "kube-system/cloud-controller-manager"},
		},
		"gcp":           {Platform: "gcp", Install: v1.InstallAuto, UninstallGracePeriod: gp(time.Hour)},
		"digital-ocean": {Platform: "digital-ocean", Install: v1.InstallAuto, UninstallGracePeriod: gp(time.Hour), Suspend: true},
	}
	if len(got) != len(want) {
		t.Errorf("NativeCCMs %d, want %d", len(got), len(want))
	}
	for name, spec := range want {
		n, ok := got[name]
		if !ok {
			t.Errorf("no NativeCCM %s", name)
			continue
		}
		if !equality.Semantic.DeepEqual(n.Spec, spec) {
			t.Errorf("NativeCCM %s spec:\n got  %+v\n want %+v", name, n.Spec, spec)
		}
		if n.Namespace != "" {
			t.Errorf("NativeCCM %s namespaced (%s); the kind is cluster-scoped", name, n.Namespace)
		}
		if n.Labels["app.kubernetes.io/instance"] != hybridCCM.releaseName() {
			t.Errorf("NativeCCM %s labels %v", name, n.Labels)
		}
	}
	if got["gcp"].Annotations["example.com/owner"] != "platform-team" {
		t.Errorf("gcp annotations %v", got["gcp"].Annotations)
	}

	// A cloud of your own: another key, its platform and profile named.
	got = nativeCCMs(t, mustRender(t, hybridCCM, values(t, `
clouds:
  hcloud-fsn:
    enabled: true
    platform: hcloud
    profile: hcloud
    overrides:
      args: ["--allow-untagged-cloud"]
      values: {replicaCount: 2}
`)))
	n := got["hcloud-fsn"]
	if n.Spec.Platform != "hcloud" || n.Spec.Profile != "hcloud" || n.Spec.Overrides == nil ||
		len(n.Spec.Overrides.Args) != 1 || n.Spec.Overrides.Values == nil || !strings.Contains(string(n.Spec.Overrides.Values.Raw), `"replicaCount":2`) {
		t.Errorf("hcloud-fsn spec %+v", n.Spec)
	}
}

// TestUmbrellaFenceGrants: with every NativeCCM, its fence grant, exactly
// what the coordinator checks for (gate.GrantFor: its platform, and its class
// and the default when load balancers are on), bound to the ServiceAccount in
// the coordinator's namespace; and nothing the coordinator could bind or
// change (no label it owns).
func TestUmbrellaFenceGrants(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		ns   string
	}{
		{"multi-cloud", hybridCCM.ciValues(t, "multi-cloud"), "hybrid-ccm-system"},
		{"own class, own namespace", values(t, `
ccm-coordinator: {releaseNamespace: ccm-elsewhere}
clouds:
  hcloud-fsn: {enabled: true, platform: hcloud, loadBalancers: {enabled: true, class: example.com/fsn}}
  aws: {enabled: false}
`), "ccm-elsewhere"},
		{"two regions of one cloud", values(t, `
clouds:
  aws: {enabled: false}
  aws-eu: {enabled: true, platform: aws, domain: {matchLabels: {topology.kubernetes.io/region: eu-west-1}}}
  aws-us: {enabled: true, platform: aws, credentials: {secretName: aws-us}, loadBalancers: {enabled: true, class: hybridccm.io/aws-us},
    domain: {matchExpressions: [{key: topology.kubernetes.io/region, operator: In, values: [us-east-2, us-east-1]}]}}
`), "hybrid-ccm-system"},
		{"split by region", values(t, `
clouds:
  aws: {enabled: true, domain: {splitBy: topology.kubernetes.io/region}}
  aws-gov: {enabled: true, platform: aws, credentials: {secretName: aws-gov},
    domain: {splitBy: topology.kubernetes.io/region, matchLabels: {node.cloudprovider.kubernetes.io/domain: gov}}}
`), "hybrid-ccm-system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRender(t, hybridCCM, tc.vals)
			ccms := nativeCCMs(t, m)
			if len(ccms) == 0 {
				t.Fatal("no NativeCCMs")
			}
			roles, bindings := 0, 0
			for _, o := range m.find("ClusterRole") {
				if strings.HasPrefix(o.GetName(), gate.GrantPrefix) {
					roles++
				}
			}
			for _, o := range m.find("ClusterRoleBinding") {
				if strings.HasPrefix(o.GetName(), gate.GrantPrefix) {
					bindings++
				}
			}
			if roles != len(ccms) || bindings != len(ccms) {
				t.Errorf("%d grant ClusterRoles and %d bindings for %d NativeCCMs", roles, bindings, len(ccms))
			}
			for name, n := range ccms {
				wantRole, wantBinding, err := gate.GrantFor(&n, tc.ns).Objects()
				if err != nil {
					t.Fatal(err)
				}
				var role rbacv1.ClusterRole
				var binding rbacv1.ClusterRoleBinding
				m.one(t, "ClusterRole", gate.GrantName(name), &role)
				m.one(t, "ClusterRoleBinding", gate.GrantName(name), &binding)
				for _, c := range []struct {
					what      string
					got, want any
				}{
					{"rules", role.Rules, wantRole.Rules},
					{"roleRef", binding.RoleRef, wantBinding.RoleRef},
					{"subjects", binding.Subjects, wantBinding.Subjects},
					{"grant label", role.Labels[gate.GrantLabel] + "," + binding.Labels[gate.GrantLabel], name + "," + name},
				} {
					if !equality.Semantic.DeepEqual(c.got, c.want) {
						t.Errorf("grant of %s: %s %+v, want %+v", name, c.what, c.got, c.want)
					}
				}
				for _, l := range []map[string]string{role.Labels, binding.Labels} {
					if _, ok := l[release.ManagedByLabel]; ok {
						t.Errorf("grant of %s labelled %s: the coordinator may change what carries it", name, release.ManagedByLabel)
					}
				}
			}
		})
	}
}

// TestUmbrellaSchema: cloud values the coordinator would reject (or that could
// never become a valid NativeCCM) are refused at install time.
func TestUmbrellaSchema(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values string
	}{
		{"unknown install policy", `clouds: {hcloud: {enabled: true, install: Sometimes}}`},
		{"name too long for a release", `clouds: {a-very-long-cloud-name-that-does-not-fit-in-42: {enabled: true}}`},
		{"name not a DNS label", `clouds: {Hetzner: {enabled: true}}`},
		{"Secret name with capitals", `clouds: {hcloud: {enabled: true, credentials: {secretName: HCloud}}}`},
		{"credentials in clear", `clouds: {hcloud: {enabled: true, credentials: {token: abc}}}`},
		{"misspelt field", `clouds: {hcloud: {enabled: true, platfrom: hcloud}}`},
		{"bad grace period", `cloudDefaults: {uninstallGracePeriod: soon}`},
		{"unknown component", `components: {gate: true}`},
		{"load balancer class without a prefix", `clouds: {hcloud: {enabled: true, loadBalancers: {enabled: true, class: hcloud}}}`},
		{"load balancer class injected", "clouds: {hcloud: {enabled: true, loadBalancers: {enabled: true, class: \"a/b\\ndefault: true\"}}}"},
		{"load balancers without enabled", `clouds: {hcloud: {enabled: true, loadBalancers: {default: true}}}`},
		{"subchart schema still applies", `talos-ccm: {controllers: [route]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, hybridCCM, values(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), "schema") {
				t.Errorf("values accepted (err %v):\n%s", err, tc.values)
			}
		})
	}
	// Two clouds whose grants would let both CCMs write the same Services;
	// flags the coordinator sets, refused naming the value and the rule.
	for _, tc := range []struct{ name, values, want string }{
		{"enforced flag in overrides", `clouds: {hcloud: {enabled: true, overrides: {args: ["--controllers=*"]}}}`,
			`clouds.hcloud.overrides.args[0] "--controllers=*": --controllers is not yours to set: the coordinator runs the CCM lifecycle-only`},
		{"lease flag in overrides", `clouds: {hcloud: {enabled: true, overrides: {args: ["--cloud-config=/x", "--leader-elect-resource-name=x"]}}}`,
			`clouds.hcloud.overrides.args[1] "--leader-elect-resource-name=x": --leader-elect-resource-name is not yours to set: the coordinator gives each native CCM its own lease`},
		{"the coordinator in kube-system", `ccm-coordinator: {namespace: kube-system}`,
			`namespace "kube-system": the coordinator reads and writes Secrets and creates workloads in its namespace; give it one of its own`},
		{"the coordinator in kube-system (the old key)", `ccm-coordinator: {releaseNamespace: kube-system}`,
			`releaseNamespace "kube-system": the coordinator reads and writes Secrets and creates workloads in its namespace; give it one of its own`},
		{"the gate's kubeconfig", `clouds: {aws: {enabled: true, overrides: {args: ["--kubeconfig=/etc/admin.conf"]}}}`,
			`clouds.aws.overrides.args[0] "--kubeconfig=/etc/admin.conf": --kubeconfig is not yours to set: the CCM reaches the API server only through its ccm-gate sidecar`},
		{"one class twice", `clouds: {aws: {enabled: true, loadBalancers: {enabled: true, class: example.com/lb}}, hcloud: {enabled: true, loadBalancers: {enabled: true, class: example.com/lb}}}`,
			"clouds aws and hcloud both serve load balancer class example.com/lb"},
		{"a default class twice", `clouds: {hcloud: {enabled: true, loadBalancers: {enabled: true}}, hcloud-fsn: {enabled: true, platform: hcloud, loadBalancers: {enabled: true}}}`,
			"both serve load balancer class hybridccm.io/hcloud"},
		{"two defaults", `clouds: {aws: {enabled: true, loadBalancers: {enabled: true, default: true}}, hcloud: {enabled: true, loadBalancers: {enabled: true, default: true}}}`,
			"clouds aws, hcloud are all the default"},
		{"a take-over lease without its namespace", `clouds: {aws: {enabled: true, takeOver: {lease: cloud-controller-manager}}}`,
			`clouds.aws.takeOver.lease "cloud-controller-manager": must be <namespace>/<name> of a Lease, e.g. kube-system/cloud-controller-manager`},
		{"a take-over lease with capitals", `clouds: {aws: {enabled: true, takeOver: {lease: Kube-System/ccm}}}`,
			`clouds.aws.takeOver.lease "Kube-System/ccm": must be <namespace>/<name>`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := render(t, hybridCCM, values(t, tc.values)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("rendered (err %v), want an error saying %q", err, tc.want)
			}
		})
	}
	// One class each, one default, and a cloud with load balancers off: fine.
	if _, err := render(t, hybridCCM, values(t, `clouds: {aws: {enabled: true, loadBalancers: {enabled: true, default: true}}, hcloud: {enabled: true, loadBalancers: {enabled: true}}, gcp: {enabled: true, loadBalancers: {enabled: false, default: true}}}`)); err != nil {
		t.Errorf("distinct classes refused: %v", err)
	}
}

// TestUmbrellaDomains: clouds.<name>.domain becomes spec.domain.selector
// (and splitBy spec.domain.splitBy), and domains the fence cannot enforce are
// refused at render time.
func TestUmbrellaDomains(t *testing.T) {
	m := mustRender(t, hybridCCM, values(t, `
clouds:
  aws-eu: {enabled: true, platform: aws, domain: {matchLabels: {topology.kubernetes.io/region: eu-west-1}}}
`))
	n := nativeCCMs(t, m)["aws-eu"]
	if d := n.Spec.Domain; d == nil || d.Selector == nil || d.Selector.MatchLabels["topology.kubernetes.io/region"] != "eu-west-1" {
		t.Fatalf("spec.domain %+v", n.Spec.Domain)
	}
	m = mustRender(t, hybridCCM, values(t, `
clouds:
  aws: {enabled: true, domain: {splitBy: topology.kubernetes.io/region}}
`))
	n = nativeCCMs(t, m)["aws"]
	if d := n.Spec.Domain; d == nil || d.SplitBy != "topology.kubernetes.io/region" || d.Selector != nil {
		t.Fatalf("clouds.aws.domain.splitBy: spec.domain %+v, want splitBy alone", n.Spec.Domain)
	}
	for _, tc := range []struct{ vals, want string }{
		{`clouds: {aws: {enabled: true, domain: {splitBy: topology.kubernetes.io/region}, loadBalancers: {enabled: true}}}`, "clouds.aws: domain.splitBy and loadBalancers.enabled"},
		{`clouds: {aws: {enabled: true, domain: {splitBy: "not a key"}}}`, "clouds.aws.domain.splitBy"},
		{`clouds: {aws-eu: {enabled: true, platform: aws, domain: {matchExpressions: [{key: topology.kubernetes.io/region, operator: In, values: [a]}], matchLabels: {topology.kubernetes.io/region: a}}}}`, "is given twice"},
		{`clouds: {aws-eu: {enabled: true, platform: aws, domain: {matchExpressions: [{key: topology.kubernetes.io/region, operator: NotIn, values: [a]}]}}}`, "value must be 'In'"},
	} {
		_, err := render(t, hybridCCM, values(t, tc.vals))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.vals, err, tc.want)
		}
	}
}

// TestTakeOverLeaseGrant: clouds.<name>.takeOver.lease becomes the
// NativeCCM's spec.takeOver.lease and a Role in the Lease's namespace that
// lets the coordinator's ServiceAccount (in its own namespace) get that one
// Lease, nothing else; the ccm-coordinator chart alone does the same for
// takeOverLeases. Without either, the coordinator gets no Role outside its
// own namespace but the authentication reader's binder in kube-system.
func TestTakeOverLeaseGrant(t *testing.T) {
	want := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
		ResourceNames: []string{"cloud-controller-manager"}, Verbs: []string{"get"}}}
	for _, tc := range []struct {
		name   string
		c      chart
		values map[string]any
		role   string // the Role's name, in kube-system
		sa     string // namespace/name of the coordinator's ServiceAccount
	}{
		{"umbrella", hybridCCM, values(t, `
ccm-coordinator: {namespace: ccm-elsewhere}
clouds: {aws: {enabled: true, loadBalancers: {enabled: true, default: true}, takeOver: {lease: kube-system/cloud-controller-manager}}}`),
			"hybrid-ccm:take-over:aws", "ccm-elsewhere/" + hybridCCM.releaseName()},
		{"ccm-coordinator", ccmCoordinator, values(t, `takeOverLeases: [kube-system/cloud-controller-manager]`),
			ccmCoordinator.releaseName() + ":take-over:cloud-controller-manager", "hybrid-ccm-system/" + ccmCoordinator.releaseName()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRender(t, tc.c, tc.values)
			if tc.c == hybridCCM {
				if n := nativeCCMs(t, m)["aws"]; n.Spec.TakeOver == nil || n.Spec.TakeOver.Lease != "kube-system/cloud-controller-manager" {
					t.Errorf("NativeCCM aws spec.takeOver %+v", n.Spec.TakeOver)
				}
			}
			var role rbacv1.Role
			var binding rbacv1.RoleBinding
			m.one(t, "Role", tc.role, &role)
			m.one(t, "RoleBinding", tc.role, &binding)
			ns, name, _ := strings.Cut(tc.sa, "/")
			if role.Namespace != "kube-system" || binding.Namespace != "kube-system" || !equality.Semantic.DeepEqual(role.Rules, want) ||
				binding.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: tc.role}) ||
				!equality.Semantic.DeepEqual(binding.Subjects, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}) {
				t.Errorf("Role %s/%s %+v, RoleBinding %s/%s %+v %+v", role.Namespace, role.Name, role.Rules, binding.Namespace, binding.Name, binding.RoleRef, binding.Subjects)
			}
		})
	}
	for _, c := range []chart{hybridCCM, ccmCoordinator} {
		for _, r := range mustRender(t, c, nil).find("Role") {
			if strings.Contains(r.GetName(), ":take-over:") {
				t.Errorf("%s renders Role %s/%s by default", c, r.GetNamespace(), r.GetName())
			}
		}
	}
	if _, err := render(t, ccmCoordinator, values(t, `takeOverLeases: [kube-system/cloud-controller-manager, cloud-controller-manager]`)); err == nil ||
		!strings.Contains(err.Error(), `takeOverLeases[1] "cloud-controller-manager": must be <namespace>/<name> of a Lease`) {
		t.Errorf("takeOverLeases without a namespace: %v, want a refusal naming takeOverLeases[1]", err)
	}
}

package charts_test

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/app"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
)

// talosCCMObjects are the talos-ccm chart's objects a test looks at.
type talosCCMObjects struct {
	deployment appsv1.Deployment
	container  corev1.Container
	args       map[string]string // --flag -> value ("" for a bare flag)
	m          manifests
}

// renderTalosCCM renders the talos-ccm chart (release "talos-ccm") with values.
func renderTalosCCM(t *testing.T, vals map[string]any) talosCCMObjects {
	t.Helper()
	o := talosCCMObjects{m: mustRender(t, talosCCM, vals)}
	o.m.one(t, "Deployment", "talos-ccm", &o.deployment)
	if n := len(o.deployment.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("containers = %d, want 1", n)
	}
	o.container = o.deployment.Spec.Template.Spec.Containers[0]
	o.args = map[string]string{}
	for _, a := range o.container.Args {
		k, v, _ := strings.Cut(a, "=")
		if _, dup := o.args[k]; dup {
			t.Errorf("flag %s given twice", k)
		}
		o.args[k] = v
	}
	return o
}

// TestTalosCCMDeployment: with default values the chart runs talos-ccm on
// control-plane nodes, ahead of initialization, with the defaults of
// docs/talos-ccm.md and Talos API access through the talos.dev ServiceAccount.
func TestTalosCCMDeployment(t *testing.T) {
	o := renderTalosCCM(t, nil)
	pod := o.deployment.Spec.Template.Spec

	if pod.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName = %q", pod.PriorityClassName)
	}
	// No pod network exists before talos-ccm gives the nodes their pod
	// CIDRs: it runs in the node's network (test/oncluster proves the
	// bootstrap on real kubelets).
	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %q: want the node's network", pod.HostNetwork, pod.DNSPolicy)
	}
	if _, ok := pod.NodeSelector["node-role.kubernetes.io/control-plane"]; !ok {
		t.Errorf("nodeSelector = %v, want control-plane nodes", pod.NodeSelector)
	}
	// A CCM must start on nodes nothing has initialized yet.
	for _, taint := range []corev1.Taint{
		{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule},
		{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule},
	} {
		if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &taint, false) }) {
			t.Errorf("taint %s:%s is not tolerated", taint.Key, taint.Effect)
		}
	}
	if pod.ServiceAccountName != "talos-ccm" {
		t.Errorf("serviceAccountName = %q", pod.ServiceAccountName)
	}

	// The defaults of docs/talos-ccm.md, which are also the binary's own.
	for flag, want := range map[string]string{
		"--controllers":                     "cloud-node,node-csr-approval",
		"--kube-api-qps":                    "1000",
		"--kube-api-burst":                  "2000",
		"--concurrent-node-syncs":           "32",
		"--leader-elect":                    "true",
		"--leader-elect-resource-name":      app.DefaultLeaseName,
		"--leader-elect-resource-namespace": releaseNamespace,
		"--use-service-account-credentials": "false",
		"--cloud-provider":                  "talos",
		"--cloud-config":                    "/etc/talos-ccm/transformations.yaml",
		"--talosconfig":                     "/var/run/secrets/talos.dev/config",
		"--secure-port":                     "10258",
	} {
		if got, ok := o.args[flag]; !ok || got != want {
			t.Errorf("%s = %q (given: %v), want %q", flag, got, ok, want)
		}
	}
	if app.DefaultQPS != 1000 || app.DefaultBurst != 2000 || app.DefaultConcurrentNodeSyncs != 32 {
		t.Errorf("talos-ccm's defaults changed (qps %v, burst %v, syncs %v): update values.yaml and docs",
			app.DefaultQPS, app.DefaultBurst, app.DefaultConcurrentNodeSyncs)
	}
	for _, flag := range []string{"--allocate-node-cidrs", "--cluster-cidr"} {
		if _, ok := o.args[flag]; ok {
			t.Errorf("%s given without node-ipam-controller", flag)
		}
	}

	// Talos API access: a talos.dev ServiceAccount with os:reader, whose Secret
	// (same name, created by Talos) is mounted where --talosconfig points.
	tsas := o.m.find("talos.dev/v1alpha1 ServiceAccount")
	if len(tsas) != 1 {
		t.Fatalf("talos.dev ServiceAccounts = %d, want 1", len(tsas))
	}
	tsa := tsas[0]
	roles, _, _ := unstructured.NestedStringSlice(tsa.Object, "spec", "roles")
	if !slices.Equal(roles, []string{"os:reader"}) || tsa.GetNamespace() != releaseNamespace {
		t.Errorf("talos.dev ServiceAccount %s/%s roles %v, want os:reader in %s", tsa.GetNamespace(), tsa.GetName(), roles, releaseNamespace)
	}
	mounted := mountedVolume(o, "/var/run/secrets/talos.dev")
	if mounted == nil || mounted.Secret == nil || mounted.Secret.SecretName != tsa.GetName() {
		t.Errorf("/var/run/secrets/talos.dev is %+v, want the Secret %s", mounted, tsa.GetName())
	}
	// The rules file is the chart's ConfigMap.
	cfg := mountedVolume(o, "/etc/talos-ccm")
	if cfg == nil || cfg.ConfigMap == nil || cfg.ConfigMap.Name != "talos-ccm" {
		t.Errorf("/etc/talos-ccm is %+v, want the ConfigMap talos-ccm", cfg)
	}
}

func mountedVolume(o talosCCMObjects, path string) *corev1.VolumeSource {
	for _, vm := range o.container.VolumeMounts {
		if vm.MountPath == path {
			for _, v := range o.deployment.Spec.Template.Spec.Volumes {
				if v.Name == vm.Name {
					return &v.VolumeSource
				}
			}
		}
	}
	return nil
}

// TestTalosCCMArgsParse: every argument the chart renders, for every value set,
// is a flag talos-ccm accepts with a value it parses (its own flag set).
func TestTalosCCMArgsParse(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			o := renderTalosCCM(t, talosCCM.valuesFor(t, vs.name))
			cmd, err := app.NewCommand(nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Flags().Parse(o.container.Args); err != nil {
				t.Fatalf("talos-ccm rejects the chart's args: %v\nargs: %q", err, o.container.Args)
			}
			// Spot-check that values arrive, not just parse.
			for flag, want := range map[string]string{"kube-api-qps": "1000", "leader-elect": "true"} {
				if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
					t.Errorf("--%s parsed as %q, want %q", flag, got, want)
				}
			}
		})
	}
}

// TestTalosCCMTransformations: the rules given as values reach talos-ccm as a
// --cloud-config file that its own strict loader accepts, templates untouched.
func TestTalosCCMTransformations(t *testing.T) {
	o := renderTalosCCM(t, talosCCM.ciValues(t, "multi-cloud"))
	var cm corev1.ConfigMap
	o.m.one(t, "ConfigMap", "talos-ccm", &cm)
	path := filepath.Join(t.TempDir(), "transformations.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["transformations.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := transform.Load(path)
	if err != nil {
		t.Fatalf("talos-ccm would not start with the rendered rules: %v", err)
	}
	var names []string
	for _, r := range cfg.Transformations {
		names = append(names, r.Name)
	}
	if !slices.Equal(names, []string{"metal-region", "web-nodes", "spot"}) {
		t.Errorf("rules = %v", names)
	}
	if cfg.Global.ClusterName != "prod-eu" || !cfg.Global.Enforce {
		t.Errorf("global = %+v", cfg.Global)
	}
	if !strings.Contains(cm.Data["transformations.yaml"], "{{ .Region }}-metal") {
		t.Error("the rule template was rendered by Helm instead of passed through")
	}
	// A change of the rules rolls the pods.
	def := renderTalosCCM(t, nil)
	key := "checksum/cloud-config"
	if o.deployment.Spec.Template.Annotations[key] == def.deployment.Spec.Template.Annotations[key] {
		t.Error("pod template does not change with the rules")
	}

	// No rules at all is a valid file too.
	var empty corev1.ConfigMap
	def.m.one(t, "ConfigMap", "talos-ccm", &empty)
	if err := os.WriteFile(path, []byte(empty.Data["transformations.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := transform.Load(path); err != nil {
		t.Errorf("default rules file: %v", err)
	}
}

// rule builds a PolicyRule (test tables read better with it).
func rule(groups, resources, verbs []string, names ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs, ResourceNames: names}
}

var (
	core         = []string{""}
	certificates = []string{"certificates.k8s.io"}
	eventsRule   = rule([]string{"", "events.k8s.io"}, []string{"events"}, []string{"create", "patch", "update"})
	csrRules     = []rbacv1.PolicyRule{
		rule(certificates, []string{"certificatesigningrequests"}, []string{"get", "list", "watch"}),
		rule(certificates, []string{"certificatesigningrequests/approval"}, []string{"update"}),
		rule(certificates, []string{"signers"}, []string{"approve"}, "kubernetes.io/kubelet-serving"),
		// the cluster's own addresses, never a node's (the Service and
		// EndpointSlice default/kubernetes: a Role in default)
		rule([]string{"networking.k8s.io"}, []string{"servicecidrs"}, []string{"list", "watch"}),
	}
)

// TestTalosCCMRBAC: the ClusterRole holds exactly what the selected controllers
// need; the lease Role is limited to the lease's name; delegated
// authentication uses the cluster's standard roles.
func TestTalosCCMRBAC(t *testing.T) {
	for _, tc := range []struct {
		name        string
		controllers []any               // values: controllers
		want        []rbacv1.PolicyRule // the ClusterRole's rules, in order
	}{
		{
			name:        "default",
			controllers: nil,
			want: append([]rbacv1.PolicyRule{
				rule(core, []string{"nodes"}, []string{"get", "list", "watch", "update"}),
				rule(core, []string{"nodes/status"}, []string{"patch"}),
				eventsRule,
			}, csrRules...),
		},
		{
			name:        "cloud-node only",
			controllers: []any{"cloud-node"},
			want: []rbacv1.PolicyRule{
				rule(core, []string{"nodes"}, []string{"get", "list", "watch", "update"}),
				rule(core, []string{"nodes/status"}, []string{"patch"}),
				eventsRule,
			},
		},
		{
			name:        "cloud-node and node-ipam-controller: update and patch",
			controllers: []any{"cloud-node", "node-ipam-controller"},
			want: []rbacv1.PolicyRule{
				rule(core, []string{"nodes"}, []string{"get", "list", "watch", "update", "patch"}),
				rule(core, []string{"nodes/status"}, []string{"patch"}),
				eventsRule,
			},
		},
		{
			name:        "node-csr-approval only: nodes read-only",
			controllers: []any{"node-csr-approval"},
			want: append([]rbacv1.PolicyRule{
				rule(core, []string{"nodes"}, []string{"get", "list", "watch"}),
				eventsRule,
			}, csrRules...),
		},
		{
			name:        "node-ipam-controller only: patch, no update, no status",
			controllers: []any{"node-ipam-controller"},
			want: []rbacv1.PolicyRule{
				rule(core, []string{"nodes"}, []string{"get", "list", "watch", "patch"}),
				eventsRule,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{}
			if tc.controllers != nil {
				vals["controllers"] = tc.controllers
			}
			o := renderTalosCCM(t, vals)
			var cr rbacv1.ClusterRole
			o.m.one(t, "ClusterRole", "talos-ccm", &cr)
			if !equality.Semantic.DeepEqual(cr.Rules, tc.want) {
				t.Errorf("ClusterRole rules:\n got  %+v\n want %+v", cr.Rules, tc.want)
			}
		})
	}

	o := renderTalosCCM(t, map[string]any{"leaderElection": map[string]any{"leaseName": "talos-ccm-eu"}})
	var role rbacv1.Role
	o.m.one(t, "Role", "talos-ccm:leader-election", &role)
	// no lease create (RBAC cannot limit it by name): the chart creates the Lease
	wantLease := []rbacv1.PolicyRule{
		rule([]string{"coordination.k8s.io"}, []string{"leases"}, []string{"get", "update"}, "talos-ccm-eu"),
	}
	if role.Namespace != releaseNamespace || !equality.Semantic.DeepEqual(role.Rules, wantLease) {
		t.Errorf("lease Role %s: %+v", role.Namespace, role.Rules)
	}
	var lease coordinationv1.Lease
	o.m.one(t, "Lease", "talos-ccm-eu", &lease)
	if lease.Namespace != releaseNamespace || lease.Spec.HolderIdentity != nil {
		t.Errorf("Lease %s/%s: %+v", lease.Namespace, lease.Name, lease.Spec)
	}
	if o.args["--leader-elect-resource-name"] != "talos-ccm-eu" {
		t.Errorf("lease flag = %q", o.args["--leader-elect-resource-name"])
	}

	// Every binding names the chart's ServiceAccount, and only these roles
	// (but helm test's, TestHelmTestRBAC).
	wantRefs := map[string]string{
		"ClusterRoleBinding/talos-ccm":                                    "ClusterRole/talos-ccm",
		"ClusterRoleBinding/talos-ccm:auth-delegator":                     "ClusterRole/system:auth-delegator",
		"RoleBinding/talos-ccm:extension-apiserver-authentication-reader": "Role/extension-apiserver-authentication-reader",
		"RoleBinding/talos-ccm:leader-election":                           "Role/talos-ccm:leader-election",
		"RoleBinding/talos-ccm:api-server-addresses":                      "Role/talos-ccm:api-server-addresses",
		"RoleBinding/talos-ccm:talos-service":                             "Role/talos-ccm:talos-service",
	}
	got := map[string]string{}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, u := range o.m.find(kind) {
			if strings.HasSuffix(u.GetName(), ":test") {
				continue
			}
			var b rbacv1.RoleBinding // same shape as ClusterRoleBinding
			o.m.one(t, kind, u.GetName(), &b)
			got[kind+"/"+b.Name] = b.RoleRef.Kind + "/" + b.RoleRef.Name
			want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "talos-ccm", Namespace: releaseNamespace}}
			if !equality.Semantic.DeepEqual(b.Subjects, want) {
				t.Errorf("%s %s subjects %+v", kind, b.Name, b.Subjects)
			}
			if b.Name == "talos-ccm:extension-apiserver-authentication-reader" && b.Namespace != "kube-system" {
				t.Errorf("%s in namespace %q, want kube-system", b.Name, b.Namespace)
			}
		}
	}
	if !equality.Semantic.DeepEqual(got, wantRefs) {
		t.Errorf("bindings:\n got  %v\n want %v", got, wantRefs)
	}

	// The Talos Service's EndpointSlices, by the names Talos gives them,
	// read only: whatever else the chart turns off.
	var talosService rbacv1.Role
	o.m.one(t, "Role", "talos-ccm:talos-service", &talosService)
	wantService := []rbacv1.PolicyRule{
		rule([]string{"discovery.k8s.io"}, []string{"endpointslices"}, []string{"list", "watch"}, "talos-ipv4", "talos-ipv6"),
	}
	if talosService.Namespace != "default" || !equality.Semantic.DeepEqual(talosService.Rules, wantService) {
		t.Errorf("Talos Service Role %s: %+v", talosService.Namespace, talosService.Rules)
	}

	// Without leader election (and node-csr-approval, whose Role is in
	// default): no lease Role at all (helm test's reads no
	// Lease then, TestHelmTestRBAC), only the Talos Service's.
	o = renderTalosCCM(t, map[string]any{"leaderElection": map[string]any{"enabled": false}, "test": map[string]any{"enabled": false},
		"controllers": []any{"cloud-node"}})
	if roles := o.m.find("Role"); len(roles) != 1 || roles[0].GetName() != "talos-ccm:talos-service" || o.args["--leader-elect"] != "false" {
		t.Errorf("leader election off: Roles %d, --leader-elect=%s", len(roles), o.args["--leader-elect"])
	}
}

// TestTalosCCMOptions: values reach the flags of the controllers they belong
// to, and an existing talosconfig Secret replaces the talos.dev ServiceAccount.
func TestTalosCCMOptions(t *testing.T) {
	o := renderTalosCCM(t, talosCCM.ciValues(t, "multi-cloud"))
	for flag, want := range map[string]string{
		"--controllers":              "cloud-node,node-csr-approval,node-ipam-controller",
		"--allocate-node-cidrs":      "true",
		"--cidr-allocator-type":      "RangeAllocator",
		"--cluster-cidr":             "10.244.0.0/16,fd00:10:244::/56",
		"--service-cluster-ip-range": "10.96.0.0/12,fd00:10:96::/112",
		"--node-cidr-mask-size-ipv6": "64",
		"--csr-allowed-ip-ranges":    "192.0.2.0/28",
		"--concurrent-node-syncs":    "64",
		"--node-initialized-events":  "",
		"--talos-timeout":            "5s",
	} {
		if got, ok := o.args[flag]; !ok || got != want {
			t.Errorf("%s = %q (given: %v), want %q", flag, got, ok, want)
		}
	}
	if _, ok := o.args["--node-cidr-mask-size-ipv4"]; ok {
		t.Error("--node-cidr-mask-size-ipv4 given although left at talos-ccm's default")
	}

	// Only node-csr-approval: no cloud-node or IPAM flags.
	o = renderTalosCCM(t, map[string]any{"controllers": []any{"node-csr-approval"}})
	for _, flag := range []string{"--concurrent-node-syncs", "--node-status-update-frequency", "--allocate-node-cidrs"} {
		if _, ok := o.args[flag]; ok {
			t.Errorf("%s given without its controller", flag)
		}
	}

	o = renderTalosCCM(t, map[string]any{"talos": map[string]any{"existingSecret": "my-talosconfig"}})
	if n := len(o.m.find("talos.dev/v1alpha1 ServiceAccount")); n != 0 {
		t.Errorf("talos.dev ServiceAccounts = %d with an existing Secret", n)
	}
	if v := mountedVolume(o, "/var/run/secrets/talos.dev"); v == nil || v.Secret == nil || v.Secret.SecretName != "my-talosconfig" {
		t.Errorf("talosconfig volume = %+v", v)
	}
}

// TestTalosCCMSchema: values talos-ccm would refuse, or that would break the
// hybrid setup, are refused at `helm install` time.
func TestTalosCCMSchema(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values string
		want   string // the refusal names the value and the rule; empty: the schema's
	}{
		{"unknown controller", `controllers: [cloud-node, route]`, ""},
		{"no controller", `controllers: []`, ""},
		{"the shared lease name", `leaderElection: {leaseName: cloud-controller-manager}`, `leaderElection.leaseName "cloud-controller-manager": that is every upstream CCM's default lease`},
		{"a flag the chart sets", `extraArgs: ["--controllers=*"]`, `extraArgs[0] "--controllers=*": --controllers is not yours to set: the chart sets it from controllers`},
		{"leader election through extraArgs", `extraArgs: ["--leader-elect-resource-name=x"]`, `extraArgs[0] "--leader-elect-resource-name=x": --leader-elect-resource-name is not yours to set: the chart sets it from leaderElection`},
		{"the log level", `extraArgs: ["--node-status-update-frequency=10s", "--v=4"]`, `extraArgs[1] "--v=4": --v is not yours to set: the chart sets it from logVerbosity`},
		{"not a flag", `extraArgs: ["controllers"]`, ""},
		{"misspelt rule field", `transformations: {rules: [{name: a, lables: {a: b}}]}`, ""},
		{"unknown operator", `transformations: {rules: [{name: a, nodeSelector: [{matchExpressions: [{key: platform, operator: Matches}]}]}]}`, ""},
		{"empty selector term", `transformations: {rules: [{name: a, nodeSelector: [{matchExpressions: []}]}]}`, ""},
		{"bad taint effect", `transformations: {rules: [{name: a, taints: [{key: a, effect: Never}]}]}`, ""},
		{"zero QPS", `client: {qps: 0}`, ""},
		{"bad duration", `talos: {timeout: ten}`, ""},
		{"unknown allocator", `nodeIPAM: {allocatorType: Magic}`, ""},
		{"not a Talos role", `talos: {serviceAccount: {roles: [admin]}}`, ""},
		{"unknown key", `replica: 2`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, talosCCM, values(t, tc.values))
			if want := cmp.Or(tc.want, "schema"); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("values accepted (err %v), want a refusal saying %q:\n%s", err, want, tc.values)
			}
		})
	}
}

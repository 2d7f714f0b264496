package release_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
)

// upstreamLike is what an upstream CCM chart typically renders: default
// controllers, default lease, its own ServiceAccount bound to a broad role,
// flags in two-token form, a node-manager DaemonSet and a metrics Service
// published on every node.
const upstreamLike = `
apiVersion: v1
kind: Service
metadata: {name: cloud-controller-manager-metrics, namespace: kube-system}
spec: {type: NodePort, selector: {app: ccm}, ports: [{port: 10258}]}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: cloud-controller-manager, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system:cloud-controller-manager}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: cloud-controller-manager, namespace: kube-system}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: cloud-node-manager, namespace: kube-system}
spec:
  selector: {matchLabels: {app: cnm}}
  template:
    metadata: {labels: {app: cnm}}
    spec: {containers: [{name: cnm, image: cnm:1}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: cloud-controller-manager, namespace: kube-system}
spec:
  selector: {matchLabels: {app: ccm}}
  template:
    metadata: {labels: {app: ccm}}
    spec:
      serviceAccountName: cloud-controller-manager
      hostNetwork: true
      containers:
        - name: ccm
          image: upstream/ccm:old
          command: [/bin/ccm, --controllers, "*", --cloud-provider=x]
          args: [--leader-elect-resource-name=cloud-controller-manager, --secure-port, "10258", --use-service-account-credentials=true, --v=2]
          ports: [{containerPort: 10258, hostPort: 10258, name: https}]
          livenessProbe: {httpGet: {path: /healthz, port: 10258, scheme: HTTPS}}
`

func TestLifecycleEnforcesOnUpstreamManifests(t *testing.T) {
	l := release.Lifecycle{
		Release: "native-ccm-azure", Namespace: "kube-system", Platform: "azure",
		LeaseName: "native-ccm-azure", SecurePort: 10271, Image: "mcr/azure-ccm:v2",
		Args: []string{"--v=4", "--configure-cloud-routes=false"},
		Drop: []profile.ObjectMatch{{Kind: "DaemonSet", Name: ".*node-manager"}},
		// the upstream chart runs on the host network, as the profile declares
		HostNetwork: true,
	}
	rendered := enforce(t, l, upstreamLike)
	releasetest.AssertLifecycleOnly(t, rendered, l)
	releasetest.AssertLifecycleRules(t, rendered)

	d := releasetest.Decode(t, rendered)
	c := d.Deployments[0].Spec.Template.Spec.Containers[0]
	tests := []struct {
		// what is checked.
		name string
		// ok is the check's outcome.
		ok bool
	}{
		{"node-manager DaemonSet dropped", len(d.DaemonSets) == 0},
		{"cluster-admin binding dropped", !strings.Contains(rendered, "cluster-admin")},
		{"Service dropped", !strings.Contains(rendered, "kind: Service\n")},
		{"pod hardened", len(release.PodSecurityProblems(&d.Deployments[0].Spec.Template.Spec, true)) == 0},
		{"foreign ServiceAccount dropped", len(d.ServiceAccounts) == 1 && d.ServiceAccounts[0].Name == "native-ccm-azure"},
		{"command keeps binary and non-enforced flags", strings.Join(c.Command, " ") == "/bin/ccm --cloud-provider=x"},
		{"two-token --controllers value removed", !strings.Contains(strings.Join(c.Command, " "), "*")},
		{"profile arg replaces same flag", strings.Count(strings.Join(c.Args, " "), "--v=") == 1 && strings.Contains(strings.Join(c.Args, " "), "--v=4")},
		{"profile arg appended", strings.Contains(strings.Join(c.Args, " "), "--configure-cloud-routes=false")},
		{"image enforced", c.Image == "mcr/azure-ccm:v2"},
		{"container and host port moved", c.Ports[0].ContainerPort == 10271 && c.Ports[0].HostPort == 10271},
		{"probe port moved", c.LivenessProbe.HTTPGet.Port.IntValue() == 10271},
		{"workload labelled as ours", d.Deployments[0].Labels[release.ManagedByLabel] == release.ManagedByValue},
	}
	for _, tt := range tests {
		if !tt.ok {
			t.Errorf("%s\n%s", tt.name, rendered)
		}
	}
}

// enforce runs the lifecycle enforcement over rendered manifests and
// returns the result, or fails the test.
func enforce(t *testing.T, l release.Lifecycle, rendered string) string {
	t.Helper()
	m, err := release.ParseManifests([]byte(rendered))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Mutate(m); err != nil {
		t.Fatal(err)
	}
	out, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestLifecycleRejectsAmbiguousWorkloads(t *testing.T) {
	l := release.Lifecycle{Release: "r", Namespace: "n", Platform: "p", LeaseName: "r", SecurePort: 10300}
	m, err := release.ParseManifests([]byte(upstreamLike))
	if err != nil {
		t.Fatal(err)
	}
	err = l.Mutate(m)
	if err == nil || !strings.Contains(err.Error(), "several workloads") || !strings.Contains(err.Error(), "chart.workload") {
		t.Fatalf("err = %v", err)
	}
}

func TestFromProfileRejectsEnforcedOverrideArgs(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	_, err = release.FromProfile(p, release.Instance{ReleaseName: "r", Namespace: "n", Platform: "hcloud", Args: []string{"--controllers=*"}})
	if err == nil || !strings.Contains(err.Error(), "spec.overrides.args[0]") {
		t.Fatalf("err = %v", err)
	}
}

// Azure's node filter selects every informer of its CCM, Services too: the
// lifecycle-only CCM gets --node-filter-requirements with its platform, one
// that serves load balancers does not (it would see no unlabelled Service).
func TestAzureNodeFilterOnlyWithoutLoadBalancers(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("azure")
	const filter = "--node-filter-requirements=node.cloudprovider.kubernetes.io/platform=azure"
	for _, tc := range []struct {
		lbs  *release.LoadBalancerSettings
		want bool
	}{
		{nil, true},
		{&release.LoadBalancerSettings{Class: "hybridccm.io/azure"}, false},
	} {
		req, err := release.FromProfile(p, release.Instance{ReleaseName: "native-ccm-azure", Namespace: "n", Platform: "azure", KubernetesMinor: 36, LoadBalancers: tc.lbs})
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(req.Lifecycle.Args, filter); got != tc.want || (len(req.Upstream.NodeFilterArgs) > 0) != tc.want {
			t.Errorf("load balancers %v: args %q, status filter %q; want the filter: %v", tc.lbs != nil, req.Lifecycle.Args, req.Upstream.NodeFilterArgs, tc.want)
		}
	}
}

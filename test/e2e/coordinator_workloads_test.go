package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
)

// safePod is a native CCM pod as the coordinator renders it, reduced to
// what its admission policy looks at: a non-root user, no privilege
// escalation, no capabilities.
func safePod(sa string) corev1.PodSpec {
	return corev1.PodSpec{
		ServiceAccountName: sa,
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(release.NonRootUID),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		Containers: []corev1.Container{{Name: "ccm", Image: "example.com/ccm:1", SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
	}
}

// nativeWorkload is a Deployment or DaemonSet named like a native CCM, as
// its ServiceAccount, labelled as the coordinator labels it (platform
// hcloud), with pod spec spec.
func nativeWorkload(kind, ns string, spec corev1.PodSpec) client.Object {
	labels := map[string]string{release.ManagedByLabel: release.ManagedByValue, release.NativeCCMLabel: "native-ccm-x", release.PlatformLabel: "hcloud", "app": "x"}
	meta := metav1.ObjectMeta{Name: "native-ccm-x", Namespace: ns, Labels: labels}
	tpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	if kind == "DaemonSet" {
		return &appsv1.DaemonSet{ObjectMeta: meta, Spec: appsv1.DaemonSetSpec{Selector: sel, Template: tpl}}
	}
	return &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Selector: sel, Template: tpl}}
}

// TestCoordinatorWritesOnlySafeWorkloads (issue 22, items 2 and 5):
// authenticated as the coordinator's ServiceAccount, with exactly the RBAC
// and admission policies its chart ships, the API server refuses every pod
// with host access, privileges or a root user in a workload it writes, each
// naming the field, and every Service; what the coordinator renders for
// each built-in profile (its own code, the gate sidecar included) is
// admitted, and its pod meets the namespace's Pod Security level.
func TestCoordinatorWritesOnlySafeWorkloads(t *testing.T) {
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
	dry := client.DryRunAll
	const sa = "native-ccm-x"

	// the control: the same workloads without the unsafe field are admitted
	for _, kind := range []string{"Deployment", "DaemonSet"} {
		if err := coord.Create(ctx, nativeWorkload(kind, ns, safePod(sa)), dry); err != nil {
			t.Fatalf("a safe native CCM %s is refused: %v", kind, err)
		}
	}

	type unsafe struct {
		name string
		edit func(*corev1.PodSpec)
		// want are parts of the refusal: the field, and what of it
		want []string
	}
	ccm := func(s *corev1.PodSpec) *corev1.SecurityContext { return s.Containers[0].SecurityContext }
	cases := []unsafe{
		{"hostPID", func(s *corev1.PodSpec) { s.HostPID = true }, []string{"spec.template.spec.hostPID"}},
		{"hostNetwork", func(s *corev1.PodSpec) { s.HostNetwork = true }, []string{"spec.template.spec.hostNetwork", "hybridccm.io/platform: hcloud", "ccm.hostNetwork"}},
		{"hostIPC", func(s *corev1.PodSpec) { s.HostIPC = true }, []string{"spec.template.spec.hostIPC"}},
		// (the API server itself refuses privileged with allowPrivilegeEscalation: false)
		{"privileged", func(s *corev1.PodSpec) { ccm(s).Privileged, ccm(s).AllowPrivilegeEscalation = ptr.To(true), nil }, []string{"securityContext.privileged", "containers ccm"}},
		{"privileged init container", func(s *corev1.PodSpec) {
			c := s.Containers[0]
			c.Name, c.SecurityContext = "init", &corev1.SecurityContext{Privileged: ptr.To(true)}
			s.InitContainers = append(s.InitContainers, c)
		}, []string{"securityContext.privileged", "containers init"}},
		{"runAsUser 0 in the container", func(s *corev1.PodSpec) { ccm(s).RunAsUser = ptr.To[int64](0) }, []string{"runAsUser 0", "container ccm"}},
		{"runAsUser 0 in the pod", func(s *corev1.PodSpec) { s.SecurityContext.RunAsUser = ptr.To[int64](0) }, []string{"runAsUser 0", "spec.template.spec.securityContext.runAsUser"}},
		{"no runAsNonRoot", func(s *corev1.PodSpec) { s.SecurityContext.RunAsNonRoot = nil }, []string{"runAsNonRoot: true", "may run as root: ccm"}},
		{"SYS_ADMIN", func(s *corev1.PodSpec) { ccm(s).Capabilities.Add = []corev1.Capability{"SYS_ADMIN"} }, []string{"securityContext.capabilities.add", "ccm: SYS_ADMIN"}},
		{"privilege escalation", func(s *corev1.PodSpec) { ccm(s).AllowPrivilegeEscalation = ptr.To(true) }, []string{"allowPrivilegeEscalation: false", "containers ccm"}},
		{"privilege escalation by default", func(s *corev1.PodSpec) { ccm(s).AllowPrivilegeEscalation = nil }, []string{"allowPrivilegeEscalation: false", "containers ccm"}},
		{"hostPath /", func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, []string{"spec.template.spec.volumes[].hostPath", "root: /"}},
		{"hostPort", func(s *corev1.PodSpec) {
			s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 10258, HostPort: 10258}}
		}, []string{"ports[].hostPort", "containers ccm"}},
		// the DaemonSet: all of it at once
		{"everything", func(s *corev1.PodSpec) {
			s.HostPID, s.HostNetwork, s.HostIPC = true, true, true
			ccm(s).Privileged, ccm(s).RunAsUser, ccm(s).AllowPrivilegeEscalation = ptr.To(true), ptr.To[int64](0), nil
			ccm(s).Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
			s.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
			s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}, []string{"spec.template.spec.host"}},
	}
	for _, kind := range []string{"DaemonSet", "Deployment"} {
		for _, c := range cases {
			spec := safePod(sa)
			c.edit(&spec)
			err := coord.Create(ctx, nativeWorkload(kind, ns, spec), dry)
			checkRefusal(t, kind+" with "+c.name, err, c.want...)
		}
	}
	// the privileged Deployment pinned to the control planes
	pinned := safePod(sa)
	pinned.NodeSelector = map[string]string{"node-role.kubernetes.io/control-plane": ""}
	pinned.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	pinned.Containers[0].SecurityContext.Privileged = ptr.To(true)
	pinned.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
	checkRefusal(t, "privileged Deployment pinned to the control planes", coord.Create(ctx, nativeWorkload("Deployment", ns, pinned), dry),
		"Deployment "+ns+"/native-ccm-x", "securityContext.privileged")
	// and an update that makes a safe workload unsafe
	safe := nativeWorkload("Deployment", ns, safePod(sa))
	if err := coord.Create(ctx, safe); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), safe) })
	d := safe.(*appsv1.Deployment)
	d.Spec.Template.Spec.HostPID = true
	checkRefusal(t, "an update to hostPID", coord.Update(ctx, d, client.DryRunAll), "spec.template.spec.hostPID")

	// Services: not among its rights; and were they granted, the policy
	// refuses them, naming what each would publish.
	services := []struct {
		name string
		svc  corev1.ServiceSpec
		want []string
	}{
		{"externalIPs", corev1.ServiceSpec{ExternalIPs: []string{"10.0.0.10", "8.8.8.8"}, Ports: []corev1.ServicePort{{Port: 53}}}, []string{"spec.externalIPs 10.0.0.10, 8.8.8.8", "CVE-2020-8554"}},
		{"NodePort", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{Port: 80}}}, []string{"spec.type NodePort"}},
		{"LoadBalancer", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To("hybridccm.io/aws"), Ports: []corev1.ServicePort{{Port: 80}}}, []string{"spec.type LoadBalancer", "spec.loadBalancerClass hybridccm.io/aws"}},
		{"ClusterIP", corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}, []string{"may not write Services"}},
	}
	svc := func(name string, spec corev1.ServiceSpec) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-" + strings.ToLower(name), Namespace: ns,
			Labels: map[string]string{release.ManagedByLabel: release.ManagedByValue}}, Spec: spec}
	}
	for _, s := range services {
		checkRefusal(t, "Service with "+s.name+" (RBAC)", coord.Create(ctx, svc(s.name, s.svc), dry), `cannot create resource "services"`)
	}
	grant := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "test-services", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"create"}}}}
	grantBinding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-services", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: grant.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "ccm-coordinator", Namespace: ns}}}
	for _, o := range []client.Object{grant, grantBinding} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Delete(context.Background(), o) })
	}
	// RBAC takes the new binding a moment: until then it refuses
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := coord.Create(ctx, svc("probe", corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}), dry)
		return err != nil && !strings.Contains(err.Error(), `cannot create resource "services"`), nil
	})
	if err != nil {
		t.Fatal("the test's grant of Services never took effect")
	}
	for _, s := range services {
		checkRefusal(t, "Service with "+s.name+" (policy)", coord.Create(ctx, svc(s.name, s.svc), dry), s.want...)
	}

	// What the coordinator renders for every built-in profile, through its
	// own code (profile, Helm chart, post-renderer, gate sidecar): admitted
	// as the coordinator, and its pod admitted by Pod Security.
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range set.Names() {
		p, _ := set.Get(name)
		rel := "native-ccm-" + name
		req, err := release.FromProfile(p, release.Instance{ReleaseName: rel, Namespace: ns, Platform: p.Platforms[0]})
		if err != nil {
			t.Fatal(err)
		}
		req.Mutators = []release.Mutator{gate.SidecarFor(req.Lifecycle, "ghcr.io/hybrid-ccm/ccm-gate:test")}
		out, err := helm.NewEngine(nil, helm.Options{}).Render(ctx, req)
		if err != nil {
			t.Fatalf("profile %s: %v", name, err)
		}
		m, err := release.ParseManifests([]byte(out))
		if err != nil {
			t.Fatal(err)
		}
		var workloads int
		for _, o := range m.Objects {
			switch o.GetKind() {
			case "Deployment", "DaemonSet":
			case "Service":
				t.Errorf("profile %s renders Service %s", name, o.GetName())
				continue
			default:
				continue
			}
			workloads++
			o.SetNamespace(ns)
			if err := coord.Create(ctx, o, dry); err != nil {
				t.Errorf("profile %s: the coordinator may not write its %s %s: %v", name, o.GetKind(), o.GetName(), err)
				continue
			}
			var tpl corev1.PodTemplateSpec
			raw, _ := o.Object["spec"].(map[string]any)["template"].(map[string]any)
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &tpl); err != nil {
				t.Fatal(err)
			}
			// Pod Security admits (or refuses) pods, not workloads: the pod
			// its ReplicaSet would create, as an admin, with its
			// ServiceAccount in place.
			acct := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: tpl.Spec.ServiceAccountName, Namespace: ns}}
			if err := admin.Create(ctx, acct); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = admin.Delete(context.Background(), acct) })
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: rel + "-pod", Namespace: ns, Labels: tpl.Labels}, Spec: tpl.Spec}
			if err := admin.Create(ctx, pod, dry); err != nil {
				t.Errorf("profile %s: the Pod Security level of namespace %s refuses its pod: %v", name, ns, err)
			}
		}
		if workloads != 1 {
			t.Errorf("profile %s renders %d workloads", name, workloads)
		}
	}
	// and Pod Security does refuse what the policy refuses, for anyone
	unsafePod := safePod(sa)
	unsafePod.HostNetwork = true
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "host-network", Namespace: ns}, Spec: unsafePod}
	checkRefusal(t, "a hostNetwork pod created by an admin", admin.Create(ctx, pod, dry), "violates PodSecurity", "host namespaces")
}

// TestCoordinatorHostNetworkOnlyWhereAProfileDeclaresIt: with the chart
// rendered for a profile override that declares ccm.hostNetwork for hcloud,
// the coordinator's admission policy lets the hcloud native CCM the
// coordinator renders run on the host network, and still refuses the host
// network to any other platform and every other host access to hcloud's.
func TestCoordinatorHostNetworkOnlyWhereAProfileDeclaresIt(t *testing.T) {
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
	// the policy as the chart renders it with the override, in place of the
	// default one (put back for the package's other tests)
	override := map[string]any{"profileOverrides": map[string]any{"hcloud.yaml": map[string]any{"name": "hcloud", "ccm": map[string]any{"hostNetwork": true}}}}
	var rendered *admissionregistrationv1.ValidatingAdmissionPolicy
	for _, o := range renderChartWith(t, "ccm-coordinator", "kube-system", override) {
		if o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() == "ccm-coordinator.hybridccm.io" {
			rendered = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, rendered); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rendered == nil {
		t.Fatal("the chart renders no policy ccm-coordinator.hybridccm.io")
	}
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	if err := admin.Get(ctx, client.ObjectKey{Name: rendered.Name}, &policy); err != nil {
		t.Fatal(err)
	}
	original := policy.Spec
	policy.Spec = rendered.Spec
	if err := admin.Update(ctx, &policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := admin.Get(ctx, client.ObjectKey{Name: rendered.Name}, &p); err != nil {
			t.Errorf("put back the default policy: %v", err)
			return
		}
		p.Spec = original
		if err := admin.Update(ctx, &p); err != nil {
			t.Errorf("put back the default policy: %v", err)
			return
		}
		// until the API server enforces it again, it would let the next
		// test's hcloud pod on the host network
		hn := safePod("native-ccm-x")
		hn.HostNetwork = true
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return apierrors.IsForbidden(coord.Create(ctx, nativeWorkload("Deployment", ns, hn), client.DryRunAll)), nil
		})
		if err != nil {
			t.Errorf("the default policy is not enforced again: %v", err)
		}
	})

	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	p.CCM.HostNetwork = true
	req, err := release.FromProfile(p, release.Instance{ReleaseName: "native-ccm-hcloud", Namespace: ns, Platform: "hcloud"})
	if err != nil {
		t.Fatal(err)
	}
	req.Mutators = []release.Mutator{gate.SidecarFor(req.Lifecycle, "ghcr.io/hybrid-ccm/ccm-gate:test")}
	out, err := helm.NewEngine(nil, helm.Options{}).Render(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	m, err := release.ParseManifests([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	deps := m.Find("Deployment")
	if len(deps) != 1 {
		t.Fatalf("rendered %d Deployments", len(deps))
	}
	if hn, _, _ := unstructured.NestedBool(deps[0].Object, "spec", "template", "spec", "hostNetwork"); !hn {
		t.Fatal("the hcloud native CCM with ccm.hostNetwork does not run on the host network")
	}
	// the new policy takes the API server a moment: until then it refuses
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return coord.Create(ctx, deps[0].DeepCopy(), client.DryRunAll) == nil, nil
	})
	if err != nil {
		t.Fatalf("the coordinator may not write hcloud's native CCM on the host network: %v", coord.Create(ctx, deps[0].DeepCopy(), client.DryRunAll))
	}
	other := safePod("native-ccm-x")
	other.HostNetwork = true
	aws := nativeWorkload("Deployment", ns, other)
	aws.GetLabels()[release.PlatformLabel] = "aws"
	aws.(*appsv1.Deployment).Spec.Template.Labels[release.PlatformLabel] = "aws"
	checkRefusal(t, "an aws native CCM on the host network", coord.Create(ctx, aws, client.DryRunAll),
		"spec.template.spec.hostNetwork", "hybridccm.io/platform: aws", "only the profiles of hcloud do")
	hostPID := safePod("native-ccm-x")
	hostPID.HostNetwork, hostPID.HostPID = true, true
	checkRefusal(t, "the hcloud native CCM with hostPID", coord.Create(ctx, nativeWorkload("Deployment", ns, hostPID), client.DryRunAll), "spec.template.spec.hostPID")
}

// checkRefusal fails unless err is a refusal (403) that says every part of want.
func checkRefusal(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: not refused: %v", what, err)
		return
	}
	if i := slices.IndexFunc(want, func(w string) bool { return !strings.Contains(err.Error(), w) }); i >= 0 {
		t.Errorf("%s: the refusal does not say %q: %v", what, want[i], err)
		return
	}
	t.Logf("%s: %s", what, err)
}

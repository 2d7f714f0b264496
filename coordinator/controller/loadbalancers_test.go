package controller

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// ccmContainer is the release's CCM container (the one with --cloud-provider).
func ccmContainer(t *testing.T, release string) corev1.Container {
	t.Helper()
	d, err := getDeployment(t, release)
	if err != nil {
		t.Fatalf("release Deployment %s: %v", release, err)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--cloud-provider") }) {
			return c
		}
	}
	t.Fatalf("no CCM container in %s", release)
	return corev1.Container{}
}

func gateStatus(t *testing.T, name string) *v1.GateStatus {
	t.Helper()
	var obj v1.NativeCCM
	if err := k8s.Get(ctxT(t), client.ObjectKey{Name: name}, &obj); err != nil {
		t.Fatal(err)
	}
	return obj.Status.Gate
}

// TestLoadBalancers: spec.loadBalancers turns on the profile's service
// controller with its env and the static load balancer ClusterRole, and
// status.gate says which Services the fence lets the CCM change. Of two
// NativeCCMs asking for the same class or both for the default, the older
// keeps it and the younger gets a Conflict naming it; when the older goes,
// the younger takes over without a change of its own spec. A profile whose
// CCM cannot serve load balancers stalls the NativeCCM with its reason.
func TestLoadBalancers(t *testing.T) {
	hcloudSecret(t)
	for _, n := range []string{"lb-a", "lb-b", "lb-c", "lb-no"} {
		createNode(t, n+"-1", n, "hcloud://"+fmt.Sprint(len(n)*1000+int(n[len(n)-1])))
	}
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "lb-a"},
		Spec: v1.NativeCCMSpec{Platform: "lb-a", LoadBalancers: &v1.LoadBalancers{Enabled: true, Default: true}}})
	waitCondition(t, "lb-a", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)

	c := ccmContainer(t, "native-ccm-lb-a")
	if !slices.Contains(c.Args, "--controllers=cloud-node-lifecycle,service") {
		t.Errorf("args %v: want the service controller next to cloud-node-lifecycle", c.Args)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "HCLOUD_LOAD_BALANCERS_ENABLED" && e.Value == "true" }) {
		t.Errorf("env %v: want the profile's HCLOUD_LOAD_BALANCERS_ENABLED=true", c.Env)
	}
	d, err := getDeployment(t, "native-ccm-lb-a")
	if err != nil {
		t.Fatal(err)
	}
	var gateArgs []string
	for _, c := range d.Spec.Template.Spec.InitContainers {
		if c.Name == gate.SidecarName {
			gateArgs = c.Args
		}
	}
	if !slices.Contains(gateArgs, "--load-balancer-class=hybridccm.io/lb-a") || !slices.Contains(gateArgs, "--default-load-balancer-class") {
		t.Errorf("ccm-gate args %v: want its class and the default", gateArgs)
	}
	var crb rbacv1.ClusterRoleBinding
	if err := k8s.Get(ctxT(t), client.ObjectKey{Name: "native-ccm-lb-a" + release.LoadBalancerSuffix}, &crb); err != nil {
		t.Fatalf("load balancer binding: %v", err)
	}
	if crb.RoleRef.Name != release.LoadBalancerClusterRole || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "native-ccm-lb-a" {
		t.Errorf("binding %+v", crb)
	}
	if g := gateStatus(t, "lb-a"); g == nil || !reflect.DeepEqual(g.LoadBalancers, &v1.GateLoadBalancers{Class: "hybridccm.io/lb-a", Default: true}) {
		t.Fatalf("status.gate %+v, want class hybridccm.io/lb-a and the default", g)
	}

	// lb-b also asks to be the default: it serves its own class only.
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "lb-b"},
		Spec: v1.NativeCCMSpec{Platform: "lb-b", LoadBalancers: &v1.LoadBalancers{Enabled: true, Default: true}}})
	obj := waitCondition(t, "lb-b", v1.ConflictCondition, metav1.ConditionTrue, v1.LoadBalancerClassConflictReason)
	if msg := conditions.GetMessage(obj, v1.ConflictCondition); !strings.Contains(msg, "NativeCCM lb-a is already the default") {
		t.Errorf("conflict message %q does not name lb-a", msg)
	}
	eventually(t, "lb-b serves its class, not the default", func() (bool, string) {
		g := gateStatus(t, "lb-b")
		return g != nil && reflect.DeepEqual(g.LoadBalancers, &v1.GateLoadBalancers{Class: "hybridccm.io/lb-b"}), fmt.Sprintf("%+v", g)
	})

	// lb-c asks for lb-a's class: it serves nothing, and runs no service controller.
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "lb-c"},
		Spec: v1.NativeCCMSpec{Platform: "lb-c", LoadBalancers: &v1.LoadBalancers{Enabled: true, Class: "hybridccm.io/lb-a"}}})
	obj = waitCondition(t, "lb-c", v1.ConflictCondition, metav1.ConditionTrue, v1.LoadBalancerClassConflictReason)
	if msg := conditions.GetMessage(obj, v1.ConflictCondition); !strings.Contains(msg, "NativeCCM lb-a already serves load balancer class hybridccm.io/lb-a") {
		t.Errorf("conflict message %q", msg)
	}
	waitCondition(t, "lb-c", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if g := gateStatus(t, "lb-c"); g == nil || g.LoadBalancers != nil {
		t.Fatalf("status.gate %+v, want no load balancers", g)
	}
	if c := ccmContainer(t, "native-ccm-lb-c"); !slices.Contains(c.Args, "--controllers=cloud-node-lifecycle") {
		t.Errorf("args %v: want no service controller", c.Args)
	}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Name: "native-ccm-lb-c" + release.LoadBalancerSuffix}, &rbacv1.ClusterRoleBinding{}); !apierrors.IsNotFound(err) {
		t.Errorf("load balancer binding of a CCM that serves none: %v", err)
	}

	// lb-a goes: lb-b becomes the default, lb-c gets the class.
	if err := k8s.Delete(ctxT(t), &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "lb-a"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "lb-b default, lb-c serving hybridccm.io/lb-a", func() (bool, string) {
		b, c := gateStatus(t, "lb-b"), gateStatus(t, "lb-c")
		return b != nil && c != nil && reflect.DeepEqual(b.LoadBalancers, &v1.GateLoadBalancers{Class: "hybridccm.io/lb-b", Default: true}) &&
				reflect.DeepEqual(c.LoadBalancers, &v1.GateLoadBalancers{Class: "hybridccm.io/lb-a"}),
			fmt.Sprintf("lb-b %+v, lb-c %+v", b, c)
	})
	waitCondition(t, "lb-b", v1.ConflictCondition, metav1.ConditionFalse, v1.NoConflictReason)
	eventually(t, "lb-c runs the service controller", func() (bool, string) {
		c := ccmContainer(t, "native-ccm-lb-c")
		return slices.Contains(c.Args, "--controllers=cloud-node-lifecycle,service"), fmt.Sprint(c.Args)
	})

	// A cloud whose CCM cannot: stalled, with the profile's reason.
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "lb-no"},
		Spec: v1.NativeCCMSpec{Platform: "lb-no", LoadBalancers: &v1.LoadBalancers{Enabled: true}}})
	obj = waitCondition(t, "lb-no", meta.StalledCondition, metav1.ConditionTrue, v1.LoadBalancersUnsupportedReason)
	if msg := conditions.GetMessage(obj, meta.StalledCondition); !strings.Contains(msg, "this test cloud has no load balancers") || !strings.Contains(msg, "spec.loadBalancers.enabled") {
		t.Errorf("stalled message %q", msg)
	}
	if _, err := getDeployment(t, "native-ccm-lb-no"); !apierrors.IsNotFound(err) {
		t.Errorf("installed anyway: %v", err)
	}
	for _, n := range []string{"lb-b", "lb-c", "lb-no"} {
		_ = k8s.Delete(ctxT(t), &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
}

// TestUninstallWaitsForLoadBalancerCleanup: a release that served load
// balancers is not uninstalled (install policy Never, then the NativeCCM
// deleted) while a Service of its class still carries the service
// controller's cleanup finalizer; the Services are named, and it goes once
// the finalizer does.
func TestUninstallWaitsForLoadBalancerCleanup(t *testing.T) {
	const name, rel = "lb-d", "native-ccm-lb-d"
	hcloudSecret(t)
	createNode(t, "lb-d-1", name, "hcloud://4401")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.NativeCCMSpec{Platform: name, LoadBalancers: &v1.LoadBalancers{Enabled: true}}})
	waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lb-d-tenant"}}
	create(t, ns)
	class := v1.LoadBalancerClassPrefix + name
	svc := func(n string, class *string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ns.Name, Finalizers: []string{gate.LoadBalancerCleanupFinalizer}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class,
				Ports: []corev1.ServicePort{{Port: 80}}},
		}
	}
	served := svc("served", &class)
	other := svc("other-class", ptr.To("example.com/other"))
	for _, s := range []*corev1.Service{served, other} {
		create(t, s)
	}
	release := func(s *corev1.Service) {
		t.Helper()
		if err := k8s.Get(ctxT(t), client.ObjectKeyFromObject(s), s); err != nil {
			t.Fatal(err)
		}
		s.Finalizers = nil
		if err := k8s.Update(ctxT(t), s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { release(other) })

	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Install = v1.InstallNever })
	waitMessage(t, name, meta.ReadyCondition, metav1.ConditionFalse, v1.LoadBalancersRemainReason,
		"1 Service(s)", "lb-d-tenant/served", gate.LoadBalancerCleanupFinalizer)
	if _, err := getDeployment(t, rel); err != nil {
		t.Fatalf("the release went while its Service held the finalizer: %v", err)
	}
	if ok, seen := hasEvent(t, name, v1.LoadBalancersRemainReason); !ok {
		t.Fatalf("no %s event: %s", v1.LoadBalancersRemainReason, seen)
	}
	// deleting the NativeCCM waits too
	if err := k8s.Delete(ctxT(t), &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	never(t, "the release uninstalled", quiet, func() (bool, string) {
		_, err := getDeployment(t, rel)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	release(served)
	eventually(t, "release and NativeCCM gone once the finalizer is", func() (bool, string) {
		_, derr := getDeployment(t, rel)
		err := k8s.Get(ctxT(t), client.ObjectKey{Name: name}, &v1.NativeCCM{})
		return apierrors.IsNotFound(derr) && apierrors.IsNotFound(err), fmt.Sprintf("deployment %v, NativeCCM %v", derr, err)
	})
}

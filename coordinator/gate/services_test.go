package gate_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestFenceServices: with load balancers on, a native CCM may change, through
// services/status, the status and the cleanup finalizer of Services of type
// LoadBalancer of its own class (and without a class when it is the granted
// default), and nothing else on any Service. Its RBAC here is broader than the
// coordinator grants, so that every request reaches the fence.
func TestFenceServices(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := e.Client
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns, svcNS = "kube-system", "lb-fence"
	if err := gatetest.InstallFence(ctx, c, ns); err != nil {
		t.Fatal(err)
	}
	ccms := confineLoadBalancerCCMs(ctx, t, e, c, ns, svcNS,
		lbCCM{"aws", "aws", &v1.LoadBalancers{Enabled: true, Default: true}},
		lbCCM{"hcloud", "hcloud", &v1.LoadBalancers{Enabled: true}},
		lbCCM{"gcp", "gcp", nil},
	)

	lbService := func(name string, class *string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svcNS},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class,
				Ports: []corev1.ServicePort{{Port: 80}}}}
	}
	for _, s := range []*corev1.Service{
		lbService("svc-aws", ptr.To("hybridccm.io/aws")),
		lbService("svc-hcloud", ptr.To("hybridccm.io/hcloud")),
		lbService("svc-none", nil),
		lbService("svc-other", ptr.To("example.com/other")),
		{ObjectMeta: metav1.ObjectMeta{Name: "svc-clusterip", Namespace: svcNS}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
		// was a LoadBalancer: its class is gone, the cleanup finalizer stays
		{ObjectMeta: metav1.ObjectMeta{Name: "svc-was-lb", Namespace: svcNS, Finalizers: []string{gate.LoadBalancerCleanupFinalizer}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
	} {
		if _, err := admin.CoreV1().Services(svcNS).Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = admin.CoreV1().Services(svcNS).Patch(context.Background(), "svc-was-lb", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		_ = admin.CoreV1().Namespaces().Delete(context.Background(), svcNS, metav1.DeleteOptions{})
	})

	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	// What the service controller sends: status and the finalizer, through
	// services/status.
	asController := `{"metadata":{"finalizers":["` + gate.LoadBalancerCleanupFinalizer + `"]},"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.10"}]}}}`
	statusPatch := func(ccm, svc, body string) func() error {
		return func() error {
			_, err := ccms[ccm].CoreV1().Services(svcNS).Patch(ctx, svc, types.StrategicMergePatchType, []byte(body), dry, "status")
			return err
		}
	}
	// Wait until the fence (and its parameters) are in force.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return apierrors.IsForbidden(statusPatch("aws", "svc-hcloud", asController)()), nil
	}); err != nil {
		t.Fatalf("the fence never denied aws a hcloud Service: %v", err)
	}

	checks := []struct {
		name  string
		do    func() error
		allow bool
		// the denial must name these
		want []string
	}{
		{name: "aws: its own class", do: statusPatch("aws", "svc-aws", asController), allow: true},
		{name: "aws: no class, it is the default", do: statusPatch("aws", "svc-none", asController), allow: true},
		{name: "aws: remove the finalizer and clear the status", do: statusPatch("aws", "svc-aws", `{"metadata":{"$deleteFromPrimitiveList/finalizers":["`+gate.LoadBalancerCleanupFinalizer+`"]},"status":{"loadBalancer":{}}}`), allow: true},
		{name: "hcloud: its own class", do: statusPatch("hcloud", "svc-hcloud", asController), allow: true},
		{name: "hcloud: clear the finalizer of a Service that stopped being a LoadBalancer",
			do: statusPatch("hcloud", "svc-was-lb", `{"metadata":{"$deleteFromPrimitiveList/finalizers":["`+gate.LoadBalancerCleanupFinalizer+`"]}}`), allow: true},
		{name: "gcp (load balancers off): the finalizer of a Service that stopped being a LoadBalancer",
			do: statusPatch("gcp", "svc-was-lb", `{"metadata":{"$deleteFromPrimitiveList/finalizers":["`+gate.LoadBalancerCleanupFinalizer+`"]}}`), want: []string{"NativeCCM gcp", "spec.loadBalancers is off"}},

		{name: "aws: hcloud's class", do: statusPatch("aws", "svc-hcloud", asController), want: []string{"NativeCCM aws", "lb-fence/svc-hcloud", "its load balancer class is hybridccm.io/hcloud, which its grant hybrid-ccm:fence:aws does not name"}},
		{name: "aws: a class nobody serves", do: statusPatch("aws", "svc-other", asController), want: []string{"lb-fence/svc-other", "example.com/other"}},
		{name: "aws: a ClusterIP Service", do: statusPatch("aws", "svc-clusterip", `{"metadata":{"finalizers":["`+gate.LoadBalancerCleanupFinalizer+`"]}}`), want: []string{"svc-clusterip", "not of type LoadBalancer"}},
		{name: "hcloud: no class, it is not the default", do: statusPatch("hcloud", "svc-none", asController), want: []string{"NativeCCM hcloud", "no load balancer class", "does not make it the default"}},
		{name: "gcp: load balancers off", do: statusPatch("gcp", "svc-none", asController), want: []string{"NativeCCM gcp", "spec.loadBalancers is off"}},
		{name: "aws: another finalizer", do: statusPatch("aws", "svc-aws", `{"metadata":{"finalizers":["example.com/keep"]}}`), want: []string{"finalizers of Service lb-fence/svc-aws"}},
		{name: "aws: a label through status", do: statusPatch("aws", "svc-aws", `{"metadata":{"labels":{"x":"y"}}}`), want: []string{"labels, annotations, owners or finalizers"}},
		{name: "aws: the Service itself", do: func() error {
			_, err := ccms["aws"].CoreV1().Services(svcNS).Patch(ctx, "svc-aws", types.StrategicMergePatchType, []byte(`{"metadata":{"finalizers":["`+gate.LoadBalancerCleanupFinalizer+`"]}}`), dry)
			return err
		}, want: []string{"only through services/status"}},
		{name: "aws: create a Service", do: func() error {
			_, err := ccms["aws"].CoreV1().Services(svcNS).Create(ctx, lbService("svc-new", ptr.To("hybridccm.io/aws")), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, want: []string{"may not create Service lb-fence/svc-new"}},
		{name: "aws: delete its own Service", do: func() error {
			return ccms["aws"].CoreV1().Services(svcNS).Delete(ctx, "svc-aws", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}, want: []string{"may not delete Service lb-fence/svc-aws"}},
		{name: "others are not fenced (admin labels a Service)", do: func() error {
			_, err := admin.CoreV1().Services(svcNS).Patch(ctx, "svc-aws", types.StrategicMergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), dry)
			return err
		}, allow: true},
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			checkFenceDecision(t, tc.do(), tc.allow, tc.want...)
		})
	}

	// The admin takes the default away (another NativeCCM is to serve
	// Services without a class): they are no longer aws's.
	t.Run("default taken away", func(t *testing.T) {
		if err := gatetest.FenceLoadBalancers(ctx, c, ns, "aws", v1.LoadBalancers{Enabled: true}); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return apierrors.IsForbidden(statusPatch("aws", "svc-none", asController)()), nil
		}); err != nil {
			t.Fatalf("aws still changes classless Services: %v", err)
		}
		if err := statusPatch("aws", "svc-aws", asController)(); err != nil {
			t.Fatalf("its own class: %v", err)
		}
	})
	// Nothing the coordinator writes widens a grant: a NativeCCM's status
	// claiming a class and the default changes nothing.
	t.Run("status cannot widen the grant", func(t *testing.T) {
		for _, name := range []string{"hcloud", "gcp"} {
			body := `{"status":{"gate":{"loadBalancers":{"class":"hybridccm.io/` + name + `","default":true}}}}`
			if err := c.Status().Patch(ctx, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second) // what the fence read would reach it within about a second; the requests must stay denied
		for _, ccm := range []string{"hcloud", "gcp"} {
			if err := statusPatch(ccm, "svc-none", asController)(); !apierrors.IsForbidden(err) {
				t.Errorf("%s changes a classless Service on the strength of status alone: %v", ccm, err)
			}
		}
	})
}

// lbCCM is a NativeCCM of the Service fence tests.
type lbCCM struct {
	name, platform string
	// lb is its spec.loadBalancers; nil: off.
	lb *v1.LoadBalancers
}

// confineLoadBalancerCCMs creates the Services' namespace svcNS and confines
// each NativeCCM with the fence of namespace ns, its grant and every Service
// right (so that each request reaches the fence), and returns a client per
// NativeCCM authenticated as its ServiceAccount.
func confineLoadBalancerCCMs(ctx context.Context, t *testing.T, e *testenv.Env, c client.Client, ns, svcNS string, specs ...lbCCM) map[string]kubernetes.Interface {
	t.Helper()
	admin := e.Client
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: svcNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	ccms := map[string]kubernetes.Interface{}
	for _, p := range specs {
		remove, err := gatetest.Confine(ctx, c, gate.Fence{Namespace: ns}, p.name, p.platform)
		if remove != nil {
			t.Cleanup(remove)
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.lb != nil {
			if err := gatetest.FenceLoadBalancers(ctx, c, ns, p.name, *p.lb); err != nil {
				t.Fatal(err)
			}
		}
		sa := "native-ccm-" + p.name
		if err := gatetest.GrantNativeCCM(ctx, admin, ns, sa); err != nil {
			t.Fatal(err)
		}
		if err := grantServices(ctx, admin, ns, sa); err != nil {
			t.Fatal(err)
		}
		cfg, err := gatetest.ServiceAccountUser(e, ns, sa)
		if err != nil {
			t.Fatal(err)
		}
		ccms[p.name] = kubernetes.NewForConfigOrDie(cfg)
	}
	return ccms
}

// grantServices gives a ServiceAccount every write on Services, so that each
// request reaches the fence.
func grantServices(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name + ":services"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "services/status"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

package gate_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
)

// TestReview38IngressShapes (review of issue 38, attacker: a compromised
// native CCM writing load-balancer status directly to the API server). The
// issue requires the fence to refuse node addresses; each case asserts the
// secure outcome (refused), a failure is a finding.
func TestReview38IngressShapes(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := e.Client
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns, svcNS = "kube-system", "r38-ingress"
	kube, err := admin.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cidrs, err := admin.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ccms := confineLoadBalancerCCMs(ctx, t, e, c, ns, svcNS, lbCCM{"aws", "aws", &v1.LoadBalancers{Enabled: true}})
	table, err := gate.BuiltinPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	fence := gate.Fence{Namespace: ns, ProviderIDPrefixes: table,
		// the chart's clusterNetwork: the Service and pod CIDRs, and the
		// nodes' networks (nodeCIDRs), which the fence refuses too
		Ingress: gate.Ingress{Reserved: append(cidrs.Spec.CIDRs, "10.244.0.0/16", "10.5.0.0/16", "198.51.100.0/24")}}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gatetest.InstallFence(context.Background(), c, ns) })
	// a node of the cluster, with its addresses
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "r38-cp-1"}}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), "r38-cp-1", metav1.DeleteOptions{}) })
	n, _ := admin.CoreV1().Nodes().Get(ctx, "r38-cp-1", metav1.GetOptions{})
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.5.0.11"}, {Type: corev1.NodeExternalIP, Address: "198.51.100.11"}}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc-r38", Namespace: svcNS},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To("hybridccm.io/aws"), Ports: []corev1.ServicePort{{Port: 6443}}}}
	if _, err := admin.CoreV1().Services(svcNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), svcNS, metav1.DeleteOptions{}) })
	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	merge := func(body string) func() error {
		return func() error {
			_, err := ccms["aws"].CoreV1().Services(svcNS).Patch(ctx, "svc-r38", types.MergePatchType, []byte(body), dry, "status")
			return err
		}
	}
	ing := func(ip string) string { return `{"status":{"loadBalancer":{"ingress":[{"ip":"` + ip + `"}]}}}` }
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return apierrors.IsForbidden(merge(ing(kube.Spec.ClusterIP))()), nil
	}); err != nil {
		t.Fatal("fence not in force")
	}
	for _, tc := range []struct{ name, body string }{
		{"a node's InternalIP", ing("10.5.0.11")},
		{"a node's ExternalIP", ing("198.51.100.11")},
		{"IPv4-mapped Service IP", ing("::ffff:" + kube.Spec.ClusterIP)},
		{"IPv4-mapped metadata IP", ing("::ffff:169.254.169.254")},
		{"Service IP with ipMode Proxy", `{"status":{"loadBalancer":{"ingress":[{"ip":"` + kube.Spec.ClusterIP + `","ipMode":"Proxy"}]}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := merge(tc.body)()
			t.Logf("%s -> %v", tc.body, err)
			if err == nil {
				t.Errorf("FINDING: the fence let the CCM announce %s", tc.body)
			}
		})
	}
	// JSON patch and server-side apply on the status subresource
	t.Run("json patch Service IP", func(t *testing.T) {
		_, err := ccms["aws"].CoreV1().Services(svcNS).Patch(ctx, "svc-r38", types.JSONPatchType,
			[]byte(`[{"op":"add","path":"/status/loadBalancer/ingress","value":[{"ip":"`+kube.Spec.ClusterIP+`"}]}]`), dry, "status")
		t.Logf("-> %v", err)
		if err == nil {
			t.Error("FINDING: JSON patch passed")
		}
	})
	t.Run("apply Service IP", func(t *testing.T) {
		_, err := ccms["aws"].CoreV1().Services(svcNS).Patch(ctx, "svc-r38", types.ApplyPatchType,
			[]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-r38","namespace":"`+svcNS+`"},"status":{"loadBalancer":{"ingress":[{"ip":"`+kube.Spec.ClusterIP+`"}]}}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "x", Force: ptr.To(true)}, "status")
		t.Logf("-> %v", err)
		if err == nil {
			t.Error("FINDING: apply passed")
		}
	})
}

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

// TestFenceIngressIPs (security round three, hole 4): a native CCM set
// status.loadBalancer.ingress[].ip of a Service of its class to the
// kubernetes Service IP, 8.8.8.8 and 169.254.169.254, and kube-proxy routed
// traffic for them into that Service (CVE-2020-8554). The fence, on a real
// API server, refuses an added ingress IP that is loopback, link-local,
// unspecified, multicast, in the cluster's Service or pod CIDRs (data in the
// policy), or, for a NativeCCM whose cloud's ranges are declared, outside
// them; an IP a Service already carries stays.
func TestFenceIngressIPs(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := e.Client
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns, svcNS = "kube-system", "lb-ingress"
	kube, err := admin.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cidrs, err := admin.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ccms := confineLoadBalancerCCMs(ctx, t, e, c, ns, svcNS,
		lbCCM{"aws", "aws", &v1.LoadBalancers{Enabled: true}}, lbCCM{"hcloud", "hcloud", &v1.LoadBalancers{Enabled: true}})
	// The fence as the chart renders it for this cluster: its Service CIDRs
	// and a pod CIDR; hcloud's cloud allocates from 203.0.113.0/24.
	table, err := gate.BuiltinPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	fence := gate.Fence{Namespace: ns, ProviderIDPrefixes: table,
		// and the nodes' networks (clusterNetwork.nodeCIDRs)
		Ingress: gate.Ingress{Reserved: append(cidrs.Spec.CIDRs, "10.244.0.0/16", "10.5.0.0/16", "198.51.100.0/24"),
			Ranges: map[string][]string{"hcloud": {"203.0.113.0/24", "2001:db8:113::/48"}}}}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}

	for _, s := range []struct{ name, class string }{{"svc-aws", "hybridccm.io/aws"}, {"svc-hcloud", "hybridccm.io/hcloud"}} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: svcNS},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(s.class), Ports: []corev1.ServicePort{{Port: 80}}}}
		if _, err := admin.CoreV1().Services(svcNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), svcNS, metav1.DeleteOptions{}) })
	// An ingress IP the Service had before (an admin's, or from before the
	// fence knew better) stays through the CCM's later writes.
	if _, err := admin.CoreV1().Services(svcNS).Patch(ctx, "svc-aws", types.MergePatchType,
		[]byte(`{"status":{"loadBalancer":{"ingress":[{"ip":"10.244.9.9"}]}}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}

	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	// Back to the fence the other tests expect, once it is in force (a
	// changed policy takes a moment to reach the admission chain).
	t.Cleanup(func() {
		if err := gatetest.InstallFence(context.Background(), c, ns); err != nil {
			t.Error(err)
			return
		}
		_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := ccms["hcloud"].CoreV1().Services(svcNS).Patch(ctx, "svc-hcloud", types.MergePatchType,
				[]byte(`{"status":{"loadBalancer":{"ingress":[{"ip":"8.8.8.8"}]}}}`), dry, "status")
			return err == nil, nil
		})
	})
	announce := func(ccm, svc string, ips ...string) func() error {
		return func() error {
			body := `{"status":{"loadBalancer":{"ingress":[`
			for i, ip := range ips {
				if i > 0 {
					body += ","
				}
				body += `{"ip":"` + ip + `"}`
			}
			body += `]}}}`
			_, err := ccms[ccm].CoreV1().Services(svcNS).Patch(ctx, svc, types.MergePatchType, []byte(body), dry, "status")
			return err
		}
	}
	// the new fence is in force once it refuses the kubernetes Service IP
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return apierrors.IsForbidden(announce("aws", "svc-aws", kube.Spec.ClusterIP)()), nil
	}); err != nil {
		t.Fatalf("the fence never refused the kubernetes Service IP: %v", announce("aws", "svc-aws", kube.Spec.ClusterIP)())
	}
	checks := []struct {
		name  string       // case
		do    func() error // the write
		allow bool         // whether the fence lets it
		want  []string     // what the denial names
	}{
		{name: "aws: a public address", do: announce("aws", "svc-aws", "10.244.9.9", "192.0.2.10"), allow: true},
		{name: "aws: 8.8.8.8, no ranges declared for aws", do: announce("aws", "svc-aws", "8.8.8.8"), allow: true},
		{name: "aws: the kubernetes Service IP", do: announce("aws", "svc-aws", kube.Spec.ClusterIP), want: []string{"NativeCCM aws", kube.Spec.ClusterIP, "lb-ingress/svc-aws", "CVE-2020-8554"}},
		{name: "aws: a pod IP", do: announce("aws", "svc-aws", "10.244.3.7"), want: []string{"10.244.3.7", "10.244.0.0/16"}},
		{name: "aws: the metadata address", do: announce("aws", "svc-aws", "192.0.2.10", "169.254.169.254"), want: []string{"169.254.169.254"}},
		{name: "aws: loopback", do: announce("aws", "svc-aws", "127.0.0.1"), want: []string{"127.0.0.1"}},
		{name: "aws: IPv6 loopback", do: announce("aws", "svc-aws", "::1"), want: []string{"::1"}},
		{name: "aws: IPv6 link-local", do: announce("aws", "svc-aws", "fe80::1"), want: []string{"fe80::1"}},
		{name: "aws: unspecified", do: announce("aws", "svc-aws", "0.0.0.0"), want: []string{"0.0.0.0"}},
		{name: "aws: multicast", do: announce("aws", "svc-aws", "224.0.0.251"), want: []string{"224.0.0.251"}},
		{name: "aws: a node's InternalIP", do: announce("aws", "svc-aws", "10.5.0.11"), want: []string{"10.5.0.11", "10.5.0.0/16"}},
		{name: "aws: a node's ExternalIP", do: announce("aws", "svc-aws", "198.51.100.11"), want: []string{"198.51.100.11"}},
		{name: "aws: the Service IP with ipMode Proxy", do: func() error {
			_, err := ccms["aws"].CoreV1().Services(svcNS).Patch(ctx, "svc-aws", types.MergePatchType,
				[]byte(`{"status":{"loadBalancer":{"ingress":[{"ip":"`+kube.Spec.ClusterIP+`","ipMode":"Proxy"}]}}}`), dry, "status")
			return err
		}, want: []string{kube.Spec.ClusterIP}},
		{name: "aws: the Service IP by JSON patch", do: func() error {
			_, err := ccms["aws"].CoreV1().Services(svcNS).Patch(ctx, "svc-aws", types.JSONPatchType,
				[]byte(`[{"op":"add","path":"/status/loadBalancer/ingress","value":[{"ip":"`+kube.Spec.ClusterIP+`"}]}]`), dry, "status")
			return err
		}, want: []string{kube.Spec.ClusterIP}},
		{name: "aws: the Service IP by server-side apply", do: func() error {
			_, err := ccms["aws"].CoreV1().Services(svcNS).Patch(ctx, "svc-aws", types.ApplyPatchType,
				[]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-aws","namespace":"`+svcNS+`"},"status":{"loadBalancer":{"ingress":[{"ip":"`+kube.Spec.ClusterIP+`"}]}}}`),
				metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "x", Force: ptr.To(true)}, "status")
			return err
		}, want: []string{kube.Spec.ClusterIP}},
		{name: "hcloud: inside its cloud's range", do: announce("hcloud", "svc-hcloud", "203.0.113.7", "2001:db8:113::7"), allow: true},
		{name: "hcloud: 8.8.8.8, outside its cloud's ranges", do: announce("hcloud", "svc-hcloud", "203.0.113.7", "8.8.8.8"),
			want: []string{"NativeCCM hcloud", "8.8.8.8", "outside 2001:db8:113::/48, 203.0.113.0/24"}},
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			checkFenceDecision(t, tc.do(), tc.allow, tc.want...)
		})
	}
}

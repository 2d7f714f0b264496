package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestCoordinatorNativeCCMNetworkPolicy: with the chart's
// nativeCCMNetworkPolicy on, the coordinator (the real binary, with the
// flags, RBAC and admission policy its chart renders) gives a native CCM a
// NetworkPolicy that selects its pods, lets nothing in and out only DNS and
// the configured CIDRs and ports, and removes it with the release. Its
// admission policy lets it write exactly such NetworkPolicies: not one that
// lets something in, reaches another address or port, selects other pods,
// or is not its own; and with the setting off (the chart's default), none.
func TestCoordinatorNativeCCMNetworkPolicy(t *testing.T) {
	ctx := context.Background()
	c, err := controllerClient()
	if err != nil {
		t.Fatal(err)
	}
	const rel = "ccm-coordinator-np"
	cfgValues := gate.NetworkPolicyConfig{
		APIServer: gate.Egress{CIDRs: []string{"10.0.0.0/8"}, Ports: []int32{6443}},
		CloudAPI:  gate.Egress{CIDRs: []string{"203.0.113.0/24", "2001:db8::/32"}, Ports: []int32{443, 8774}},
	}
	ns, cfg, objs := applyCoordinatorChartAs(t, c, rel, map[string]any{"nativeCCMNetworkPolicy": map[string]any{
		"enabled":   true,
		"apiServer": map[string]any{"cidrs": []any{"10.0.0.0/8"}, "ports": []any{6443}},
		"cloudAPI":  map[string]any{"cidrs": []any{"203.0.113.0/24", "2001:db8::/32"}, "ports": []any{443, 8774}},
	}})
	// the coordinator with the flags its chart renders
	var flags []string
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		args, _ := cs[0].(map[string]any)["args"].([]any)
		for _, a := range args {
			if s, _ := a.(string); strings.HasPrefix(s, "--native-ccm-") {
				flags = append(flags, s)
			}
		}
	}
	if len(flags) != 5 {
		t.Fatalf("chart renders native CCM network policy flags %q", flags)
	}
	logs := &testenv.Buffer{}
	cmd := exec.Command(filepath.Join(binaries, "ccm-coordinator"), append([]string{"--kubeconfig=" + kubeconfigFor(t, cfg),
		"--release-namespace=" + ns, "--metrics-addr=0", "--health-addr=0", "--helm-wait=false",
		"--uninstall-grace-period=1s", "--wait-interval=1s"}, flags...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("ccm-coordinator logs:\n%s", tail(logs.String(), 8000))
		}
	})
	// the profile's credentials Secret; gone after (the package's other tests make their own)
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hcloud", Namespace: ns}, StringData: map[string]string{"token": "t"}}
	if err := c.Create(ctx, creds); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), creds) })
	nccm := &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "np-hcloud"}, Spec: v1alpha1.NativeCCMSpec{Platform: "hcloud", Install: v1alpha1.InstallAlways}}
	if err := gate.EnsureGrant(ctx, c, gate.GrantFor(nccm, ns)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteGrant(context.Background(), c, nccm.Name) })
	if err := c.Create(ctx, nccm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), nccm) })
	var got v1alpha1.NativeCCM
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(nccm), &got); err != nil {
			return false, nil
		}
		i := apimeta.FindStatusCondition(got.Status.Conditions, v1alpha1.InstalledCondition)
		return i != nil && i.Status == metav1.ConditionTrue, nil
	}); err != nil {
		t.Fatalf("NativeCCM %s not installed: %+v", nccm.Name, got.Status.Conditions)
	}

	// its NetworkPolicy, as the gate renders it
	var np networkingv1.NetworkPolicy
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: got.ReleaseName()}, &np); err != nil {
		t.Fatalf("the release's NetworkPolicy: %v", err)
	}
	want := gate.NetworkPolicy{Release: got.ReleaseName(), Namespace: ns, Platform: "hcloud", NetworkPolicyConfig: cfgValues}.Object()
	if !equality.Semantic.DeepEqual(np.Spec, want.Spec) {
		t.Errorf("NetworkPolicy spec\n got  %+v\n want %+v", np.Spec, want.Spec)
	}
	if np.Spec.PodSelector.MatchLabels[release.NativeCCMLabel] != got.ReleaseName() || len(np.Spec.Ingress) != 0 || len(np.Spec.PolicyTypes) != 2 {
		t.Errorf("NetworkPolicy selects %v, ingress %v, types %v", np.Spec.PodSelector, np.Spec.Ingress, np.Spec.PolicyTypes)
	}
	if np.Labels[release.ManagedByLabel] != release.ManagedByValue {
		t.Errorf("NetworkPolicy labels %v", np.Labels)
	}

	// what its admission policy lets it write: exactly that shape
	coord, err := client.New(cfg, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	other := func(edit func(*networkingv1.NetworkPolicy)) *networkingv1.NetworkPolicy {
		o := gate.NetworkPolicy{Release: "native-ccm-other", Namespace: ns, Platform: "other", NetworkPolicyConfig: cfgValues}.Object()
		if edit != nil {
			edit(o)
		}
		return o
	}
	if err := coord.Create(ctx, other(nil), client.DryRunAll); err != nil {
		t.Errorf("the coordinator may not create another native CCM's NetworkPolicy of the same shape: %v", err)
	}
	for what, o := range map[string]*networkingv1.NetworkPolicy{
		"ingress from anywhere": other(func(o *networkingv1.NetworkPolicy) { o.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}} }),
		"egress anywhere": other(func(o *networkingv1.NetworkPolicy) {
			o.Spec.Egress = append(o.Spec.Egress, networkingv1.NetworkPolicyEgressRule{})
		}),
		"egress to an address not configured": other(func(o *networkingv1.NetworkPolicy) {
			o.Spec.Egress[2].To[0].IPBlock.CIDR = "0.0.0.0/0"
		}),
		"egress on a port not configured": other(func(o *networkingv1.NetworkPolicy) {
			p := o.Spec.Egress[2].Ports[0].Port
			*p = intstr.FromInt32(22)
		}),
		"egress to pods": other(func(o *networkingv1.NetworkPolicy) {
			o.Spec.Egress[1].To = append(o.Spec.Egress[1].To, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}})
		}),
		"every pod of the namespace": other(func(o *networkingv1.NetworkPolicy) { o.Spec.PodSelector = metav1.LabelSelector{} }),
		"another native CCM's pods": other(func(o *networkingv1.NetworkPolicy) {
			o.Spec.PodSelector.MatchLabels[release.NativeCCMLabel] = got.ReleaseName()
		}),
		"egress only": other(func(o *networkingv1.NetworkPolicy) {
			o.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		}),
		"not a native CCM's name": other(func(o *networkingv1.NetworkPolicy) {
			o.Name = "allow-all"
		}),
		"unlabelled": other(func(o *networkingv1.NetworkPolicy) { o.Labels = nil }),
	} {
		err := coord.Create(ctx, o, client.DryRunAll)
		if !apierrors.IsForbidden(err) || (what != "unlabelled" && !strings.Contains(err.Error(), "may not write NetworkPolicy")) {
			t.Errorf("%s: the coordinator's write %v, want refused by its admission policy", what, err)
		}
	}
	elsewhere := other(nil)
	elsewhere.Namespace = "default"
	if err := coord.Create(ctx, elsewhere, client.DryRunAll); !apierrors.IsForbidden(err) {
		t.Errorf("a NetworkPolicy in namespace default: %v, want forbidden (RBAC)", err)
	}
	// the chart's default: off, the coordinator may write none
	_, offCfg := applyCoordinatorChart(t, c)
	off, err := client.New(offCfg, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.Create(ctx, other(nil), client.DryRunAll); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "is off") {
		t.Errorf("nativeCCMNetworkPolicy off: the coordinator's write %v, want refused saying it is off", err)
	}

	// removed with the release
	if err := c.Delete(ctx, nccm); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(nccm), &got)), nil
	}); err != nil {
		t.Fatalf("NativeCCM not removed: %+v", got.Status.Conditions)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: np.Name}, &np); !apierrors.IsNotFound(err) {
		t.Errorf("NetworkPolicy left behind: %v", err)
	}
}

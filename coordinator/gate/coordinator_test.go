package gate_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/runtime/conditions"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestCoordinatorMutators is the reconciler's hook: for a NativeCCM it checks
// that the chart's fence is there and current and that the release's
// ServiceAccount holds the NativeCCM's grant, writes status.gate (what the
// fence enforces), marks Gated, and hands back the sidecar mutator. The fence
// then holds for the release's ServiceAccount.
func TestCoordinatorMutators(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "kube-system"
	fence := gate.Fence{Namespace: ns}
	if err := gate.DeleteFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "hcloud"}, Spec: v1.NativeCCMSpec{Platform: "hcloud"}}
	if err := c.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), obj) })
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	req, err := release.FromProfile(p, release.Instance{ReleaseName: obj.ReleaseName(), Namespace: ns, Platform: "hcloud"})
	if err != nil {
		t.Fatal(err)
	}
	g := gate.Coordinator{Client: c, Image: gateImage}

	// No fence: nothing may be installed, and the reason says where it comes from.
	if _, err := g.Mutators(ctx, obj, p, req.Lifecycle); !errors.Is(err, gate.ErrFenceNotInstalled) || errors.Is(err, gate.ErrConfig) ||
		!strings.Contains(err.Error(), "ccm-coordinator chart") {
		t.Fatalf("without a fence: %v, want ErrFenceNotInstalled naming the chart (and worth a retry)", err)
	}
	if cond := conditions.Get(obj, v1.GatedCondition); cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != gate.GateFailedReason {
		t.Fatalf("Gated condition without a fence: %+v", cond)
	}
	if obj.Status.Gate != nil {
		t.Fatalf("status.gate written without a fence: %+v", obj.Status.Gate)
	}

	// A fence of another version is not this coordinator's.
	if err := gatetest.InstallFence(ctx, c, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteFence(context.Background(), c, fence) })
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: gate.DefaultFenceName}, &policy); err != nil {
		t.Fatal(err)
	}
	policy.Annotations[gate.DigestAnnotation] = "0000"
	if err := c.Update(ctx, &policy); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Mutators(ctx, obj, p, req.Lifecycle); !errors.Is(err, gate.ErrFenceNotInstalled) || !strings.Contains(err.Error(), `"0000"`) {
		t.Fatalf("with a fence of another version: %v", err)
	}
	// A fence for another namespace does not confine this release.
	other := gate.Fence{Namespace: "elsewhere"}
	if _, err := gate.EnsureFence(ctx, c, other); err != nil {
		t.Fatal(err)
	}
	if err := gate.CheckFence(ctx, c, fence); !errors.Is(err, gate.ErrFenceNotInstalled) {
		t.Fatalf("a fence for namespace elsewhere passed the check for %s: %v", ns, err)
	}

	if err := gatetest.InstallFence(ctx, c, ns); err != nil {
		t.Fatal(err)
	}
	// No grant (whoever created the NativeCCM did not create it): nothing
	// may be installed, and the reason names the grant.
	if _, err := g.Mutators(ctx, obj, p, req.Lifecycle); !errors.Is(err, gate.ErrFenceNotGranted) || errors.Is(err, gate.ErrConfig) ||
		!strings.Contains(err.Error(), "hybrid-ccm:fence:hcloud") || !strings.Contains(err.Error(), "NativeCCM hcloud, platform hcloud") {
		t.Fatalf("without a grant: %v, want ErrFenceNotGranted naming what is missing", err)
	}
	// A grant of another platform is not the NativeCCM's.
	if err := gate.EnsureGrant(ctx, c, gate.Grant{NativeCCM: "hcloud", Namespace: ns, Platform: "aws"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteGrant(context.Background(), c, "hcloud") })
	if _, err := g.Mutators(ctx, obj, p, req.Lifecycle); !errors.Is(err, gate.ErrFenceNotGranted) || !strings.Contains(err.Error(), "not granted platform hcloud") {
		t.Fatalf("with a grant of platform aws: %v", err)
	}
	// A fence that does not know the profile's prefixes would refuse the CCM.
	if _, err := gate.EnsureFence(ctx, c, gate.Fence{Namespace: ns, ProviderIDPrefixes: map[string][]string{"hcloud": {"hcloud://"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Mutators(ctx, obj, p, req.Lifecycle); !errors.Is(err, gate.ErrFenceNotInstalled) || !strings.Contains(err.Error(), "[hrobot://]") {
		t.Fatalf("with a fence without the Robot prefix: %v", err)
	}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	if err := gate.EnsureGrant(ctx, c, gate.GrantFor(obj, ns)); err != nil {
		t.Fatal(err)
	}
	muts, err := g.Mutators(ctx, obj, p, req.Lifecycle)
	if err != nil {
		t.Fatal(err)
	}
	if len(muts) != 1 {
		t.Fatalf("mutators %v", muts)
	}
	if s, ok := muts[0].(gate.Sidecar); !ok || s.Platform != "hcloud" || s.Image != gateImage || s.Release != "native-ccm-hcloud" {
		t.Fatalf("mutator %#v", muts[0])
	}
	if !conditions.IsTrue(obj, v1.GatedCondition) {
		t.Fatalf("Gated condition: %+v", conditions.Get(obj, v1.GatedCondition))
	}
	// status.gate is on the server already, before any release exists.
	var stored v1.NativeCCM
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &stored); err != nil {
		t.Fatal(err)
	}
	want := &v1.GateStatus{Policy: gate.DefaultFenceName, ServiceAccount: ns + "/native-ccm-hcloud", ProviderIDPrefixes: p.ProviderIDPrefixes}
	if !reflect.DeepEqual(stored.Status.Gate, want) {
		t.Fatalf("stored status.gate %+v, want %+v", stored.Status.Gate, want)
	}

	// The fence holds for the release's ServiceAccount.
	if err := gatetest.GrantNativeCCM(ctx, e.Client, ns, "native-ccm-hcloud"); err != nil {
		t.Fatal(err)
	}
	if err := gatetest.CreateNodes(ctx, e.Client, gatetest.NodeSpec{Name: "wiring-aws", Platform: "aws", ProviderID: "aws:///a/i-1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.Client.CoreV1().Nodes().Delete(context.Background(), "wiring-aws", metav1.DeleteOptions{})
	})
	cfg, err := gatetest.ServiceAccountUser(e, ns, "native-ccm-hcloud")
	if err != nil {
		t.Fatal(err)
	}
	if err := gatetest.WaitFence(ctx, kubernetes.NewForConfigOrDie(cfg), "wiring-aws", true); err != nil {
		t.Fatalf("fence of the wired release not active: %v", err)
	}
}

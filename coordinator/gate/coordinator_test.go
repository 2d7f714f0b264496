package gate_test

import (
	"context"
	"testing"
	"time"

	"github.com/fluxcd/pkg/runtime/conditions"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestCoordinatorMutators is the reconciler's hook: for a NativeCCM it writes
// the fence (owned by the NativeCCM, enforced for the release's
// ServiceAccount), marks Gated, and hands back the sidecar mutator.
func TestCoordinatorMutators(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1.AddToScheme(scheme))
	c, err := client.New(e.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "hcloud"}, Spec: v1.NativeCCMSpec{Platform: "hcloud"}}
	if err := c.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), obj)
		_ = gate.DeletePolicy(context.Background(), c, "hcloud")
	})
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	req, err := release.FromProfile(p, release.Instance{ReleaseName: obj.ReleaseName(), Namespace: "kube-system", Platform: "hcloud"})
	if err != nil {
		t.Fatal(err)
	}

	muts, err := gate.Coordinator{Client: c, Image: gateImage}.Mutators(ctx, obj, p, req.Lifecycle)
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

	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: gate.PolicyName("hcloud")}, &policy); err != nil {
		t.Fatal(err)
	}
	if refs := policy.OwnerReferences; len(refs) != 1 || refs[0].UID != obj.UID || refs[0].Kind != v1.NativeCCMKind {
		t.Fatalf("policy owners %+v, want the NativeCCM", refs)
	}

	// The fence holds for the release's ServiceAccount.
	if err := gatetest.GrantNativeCCM(ctx, e.Client, "kube-system", "native-ccm-hcloud"); err != nil {
		t.Fatal(err)
	}
	if err := gatetest.CreateNodes(ctx, e.Client, gatetest.NodeSpec{Name: "wiring-aws", Platform: "aws", ProviderID: "aws:///a/i-1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.Client.CoreV1().Nodes().Delete(context.Background(), "wiring-aws", metav1.DeleteOptions{})
	})
	cfg, err := gatetest.ServiceAccountUser(e, "kube-system", "native-ccm-hcloud")
	if err != nil {
		t.Fatal(err)
	}
	if err := gatetest.WaitFence(ctx, kubernetes.NewForConfigOrDie(cfg), "wiring-aws", true); err != nil {
		t.Fatalf("fence of the wired release not active: %v", err)
	}
}

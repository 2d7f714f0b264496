package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
)

// TestTakeOverReleaseRemovedByHand: a NativeCCM with spec.takeOver was
// installed (the previous CCM gone); later someone reinstalls the previous
// CCM and removes the native release by hand (helm uninstall
// native-ccm-<name>, going back the wrong way). status.release still records
// the release, so the release step saw a missing release and installed it
// again at once, beside the previous CCM that leads its Lease: two CCMs
// deleting nodes, which spec.takeOver exists to prevent. With the release
// gone, the install waits for the previous CCM as a first install does.
func TestTakeOverReleaseRemovedByHand(t *testing.T) {
	const (
		name      = "takeover-byhand"
		leaseName = "takeover-byhand-previous-ccm"
		durationS = 3
	)
	hcloudSecret(t)
	createNode(t, "tbh-1", name, "hcloud://9411")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NativeCCMSpec{Platform: name, TakeOver: &v1.TakeOver{Lease: "kube-system/" + leaseName}},
	})
	// no such Lease: installed at once
	waitCondition(t, name, v1.InstalledCondition, metav1.ConditionTrue, "")

	previous := previousLeadsThenRemoveByHand(t, leaseName, "aws-cloud-controller-manager-b7r4_9e0f", durationS, "native-ccm-"+name)
	if _, err := getDeployment(t, "native-ccm-"+name); err == nil {
		t.Fatal("the Deployment survived helm uninstall")
	}
	requestReconcile(t, name)
	never(t, "the release installed again beside the previous CCM", 3*durationS*time.Second, func() (bool, string) {
		_, err := getDeployment(t, "native-ccm-"+name)
		o := getNativeCCM(t, name)
		return err == nil, fmt.Sprintf("Deployment native-ccm-%s exists; Ready %s: %s; release %+v", name,
			conditions.GetReason(o, meta.ReadyCondition), conditions.GetMessage(o, meta.ReadyCondition), o.Status.Release)
	})
	if o := getNativeCCM(t, name); !conditions.HasAnyReason(o, meta.ReadyCondition, v1.WaitingForPreviousCCMReason) {
		t.Errorf("Ready %q: %s, want %s", conditions.GetReason(o, meta.ReadyCondition), conditions.GetMessage(o, meta.ReadyCondition), v1.WaitingForPreviousCCMReason)
	}
	previous.stop()
	waitCondition(t, name, v1.InstalledCondition, metav1.ConditionTrue, "")
	eventually(t, "the release installed again once the previous CCM stopped", func() (bool, string) {
		_, err := getDeployment(t, "native-ccm-"+name)
		return err == nil, fmt.Sprint(err)
	})
}

// TestTakeOverMembersRemovedByHand: as TestTakeOverReleaseRemovedByHand for
// a split NativeCCM: its only member removed by hand while the previous CCM
// leads again. status.members still records it, so it counted as installed
// and the member was installed again at once beside the previous CCM.
func TestTakeOverMembersRemovedByHand(t *testing.T) {
	const (
		name      = "takeover-split-byhand"
		leaseName = "takeover-split-byhand-previous-ccm"
		member    = "native-ccm-" + name + "--eu-west-1"
		durationS = 3
	)
	awsSplitSecret(t, "takeover-split-byhand-credentials")
	createRegionNode(t, "tsbh-eu-1", name, "eu-west-1", "aws:///eu-west-1a/i-0c11")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{
		Platform:    name,
		Credentials: &v1.Credentials{SecretRef: meta.LocalObjectReference{Name: "takeover-split-byhand-credentials"}},
		Domain:      &v1.Domain{SplitBy: regionLabel},
		TakeOver:    &v1.TakeOver{Lease: "kube-system/" + leaseName},
	}})
	eventually(t, "the member installed", func() (bool, string) {
		_, err := getDeployment(t, member)
		return err == nil, fmt.Sprint(err)
	})
	previous := previousLeadsThenRemoveByHand(t, leaseName, "aws-cloud-controller-manager-q1_9e0f", durationS, member)
	requestReconcile(t, name)
	never(t, "the member installed again beside the previous CCM", 3*durationS*time.Second, func() (bool, string) {
		_, err := getDeployment(t, member)
		o := getNativeCCM(t, name)
		return err == nil, fmt.Sprintf("Deployment %s exists; Ready %s: %s", member,
			conditions.GetReason(o, meta.ReadyCondition), conditions.GetMessage(o, meta.ReadyCondition))
	})
	previous.stop()
	eventually(t, "the member installed again once the previous CCM stopped", func() (bool, string) {
		_, err := getDeployment(t, member)
		return err == nil, fmt.Sprint(err)
	})
}

// previousLeadsThenRemoveByHand starts a previous CCM leading
// kube-system/leaseName (stopped at the test's end) and, once its Lease is
// held, uninstalls release with Helm as a person would (helm uninstall).
func previousLeadsThenRemoveByHand(t *testing.T, leaseName, holder string, durationS int32, release string) *leader {
	t.Helper()
	previous := lead("kube-system", leaseName, holder, durationS)
	t.Cleanup(previous.stop)
	eventually(t, "the previous CCM's Lease held", func() (bool, string) {
		var l coordinationv1.Lease
		err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: "kube-system", Name: leaseName}, &l)
		return err == nil && l.Spec.HolderIdentity != nil, fmt.Sprint(err)
	})
	engine := helm.NewEngine(rest.CopyConfig(env.Config), helm.Options{Timeout: time.Minute, Log: ctrl.Log.WithName("helm-by-hand")})
	if err := engine.Uninstall(context.Background(), releaseNamespace, release); err != nil {
		t.Fatal(err)
	}
	return previous
}

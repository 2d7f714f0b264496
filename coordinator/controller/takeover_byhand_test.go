package controller

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
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
	if _, err := getDeployment(t, member); err == nil {
		t.Fatal("the member's Deployment survived helm uninstall")
	}
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

// TestMemberTakeOverCheckReadsLive: the check a member's install of a split
// NativeCCM with spec.takeOver asks when its pass did not wait before the
// members. It reads Helm's records from the API server, so a record the
// cache still shows (a helm uninstall by hand a moment ago) does not let the
// member in beside the previous CCM. Only another member's record that is
// not uninstalled lets it in without looking at the previous CCM; its own
// never does.
func TestMemberTakeOverCheckReadsLive(t *testing.T) {
	const (
		name      = "takeover-live-check"
		leaseName = "takeover-live-check-previous-ccm"
	)
	previous := lead("kube-system", leaseName, "aws-cloud-controller-manager-l5_9e0f", 3)
	t.Cleanup(previous.stop)
	eventually(t, "the previous CCM's Lease held", func() (bool, string) {
		var l coordinationv1.Lease
		err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: "kube-system", Name: leaseName}, &l)
		return err == nil && l.Spec.HolderIdentity != nil, fmt.Sprint(err)
	})
	// a reconciler with no cache at all: whatever the check decides, it read
	r := &NativeCCMReconciler{APIReader: k8s, Namespace: releaseNamespace, RetryInterval: time.Second, now: time.Now}
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{
		Platform: name, Domain: &v1.Domain{SplitBy: regionLabel}, TakeOver: &v1.TakeOver{Lease: "kube-system/" + leaseName}}}
	record := func(release, status string) {
		t.Helper()
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1." + release + ".v1", Namespace: releaseNamespace,
			Labels: map[string]string{"owner": "helm", "name": release, "status": status, "version": "1"}},
			Type: "helm.sh/release.v1"}
		if err := k8s.Create(ctxT(t), s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), s) })
	}
	check := func(what string, wantWait bool) {
		t.Helper()
		err := r.memberTakeOverCheck(ctxT(t), obj, "eu-west-1")
		var wait *waitError
		switch {
		case wantWait && !errors.As(err, &wait):
			t.Errorf("%s: %v, want a wait for the previous CCM", what, err)
		case wantWait && wait.reason != v1.WaitingForPreviousCCMReason:
			t.Errorf("%s: waits with reason %s, want %s", what, wait.reason, v1.WaitingForPreviousCCMReason)
		case !wantWait && err != nil:
			t.Errorf("%s: %v, want the install to go on", what, err)
		}
	}
	check("no member recorded", true)
	record("native-ccm-"+name+"--eu-west-1", "deployed")
	check("only the member's own record", true)
	record("native-ccm-"+name+"--eu-west-2", "uninstalling")
	check("another member being uninstalled", true)
	record("native-ccm-"+name+"x--eu-west-3", "deployed")
	check("a record of another NativeCCM's member", true)
	record("native-ccm-"+name+"--eu-central-1", "deployed")
	check("another member deployed", false)
}

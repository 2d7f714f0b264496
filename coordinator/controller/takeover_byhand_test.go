package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
//
// keepHistory: the release was upgraded once and is removed with helm
// uninstall --keep-history, so its latest revision is uninstalled and the
// one before superseded. An upgrade of it fails (nothing deployed) and used
// to roll back to the superseded revision, putting the CCM back beside the
// previous one without that wait.
func TestTakeOverReleaseRemovedByHand(t *testing.T) {
	const durationS = 3
	for _, c := range []struct {
		name, node, providerID string
		keepHistory            bool
	}{
		{name: "takeover-byhand", node: "tbh-1", providerID: "hcloud://9411"},
		{name: "takeover-keephistory", node: "tkh-1", providerID: "hcloud://9421", keepHistory: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			name, release, leaseName := c.name, "native-ccm-"+c.name, c.name+"-previous-ccm"
			hcloudTakeOver(t, name, c.node, c.providerID, "kube-system/"+leaseName)
			// no such Lease: installed at once
			waitCondition(t, name, v1.InstalledCondition, metav1.ConditionTrue, "")
			if c.keepHistory {
				upgradeOnce(t, name)
			}

			previous := previousLeads(t, leaseName, "hcloud-cloud-controller-manager-b7r4_9e0f", durationS)
			if c.keepHistory {
				if err := uninstallKeepHistory(release); err != nil {
					t.Fatal(err)
				}
			} else {
				removeByHand(t, release)
			}
			if _, err := getDeployment(t, release); err == nil {
				t.Fatal("the Deployment survived helm uninstall")
			}
			requestReconcile(t, name)
			neverDeployment(t, "the release installed again beside the previous CCM", 3*durationS*time.Second, name, release)
			if o := getNativeCCM(t, name); !conditions.HasAnyReason(o, meta.ReadyCondition, v1.WaitingForPreviousCCMReason) {
				t.Errorf("Ready %q: %s, want %s", conditions.GetReason(o, meta.ReadyCondition), conditions.GetMessage(o, meta.ReadyCondition), v1.WaitingForPreviousCCMReason)
			}
			previous.stop()
			waitCondition(t, name, v1.InstalledCondition, metav1.ConditionTrue, "")
			waitDeployment(t, "the release installed again once the previous CCM stopped", release)
		})
	}
}

// TestTakeOverMembersRemovedByHand: as TestTakeOverReleaseRemovedByHand
// for a split NativeCCM, its two members removed by hand one after the other
// (helm uninstall A, then B) while the previous CCM leads again. While B is
// still there, A's install is not a first install as Helm's records tell
// it, yet it is one beside the previous CCM; once both are gone,
// status.members still records them (and the cache may not yet have seen
// the uninstall). Neither comes back while the previous CCM leads; both do
// once it stops.
func TestTakeOverMembersRemovedByHand(t *testing.T) {
	const (
		name      = "takeover-split-byhand"
		leaseName = "takeover-split-byhand-previous-ccm"
		durationS = 3
	)
	members := []string{"native-ccm-" + name + "--eu-west-1", "native-ccm-" + name + "--eu-west-2"}
	awsSplitSecret(t, "takeover-split-byhand-credentials")
	createRegionNode(t, "tsbh-eu-1", name, "eu-west-1", "aws:///eu-west-1a/i-0c11")
	createRegionNode(t, "tsbh-eu-2", name, "eu-west-2", "aws:///eu-west-2a/i-0c12")
	createNativeCCM(t, splitTakeOver(name, "takeover-split-byhand-credentials", "kube-system/"+leaseName))
	for _, m := range members {
		waitDeployment(t, "member installed", m)
	}
	previous := previousLeadsThenRemoveByHand(t, leaseName, "aws-cloud-controller-manager-q1_9e0f", durationS, members[0])
	if _, err := getDeployment(t, members[0]); err == nil {
		t.Fatal("the member's Deployment survived helm uninstall")
	}
	requestReconcile(t, name)
	neverDeployment(t, "the first member installed again beside the previous CCM, the second still there", 3*durationS*time.Second, name, members[0])
	if o := getNativeCCM(t, name); !conditions.HasAnyReason(o, meta.ReadyCondition, v1.WaitingForPreviousCCMReason) ||
		!strings.Contains(conditions.GetMessage(o, meta.ReadyCondition), "its member releases (native-ccm-"+name+"--<"+regionLabel+">) are installed") {
		t.Errorf("Ready %q: %s, want %s naming the member releases", conditions.GetReason(o, meta.ReadyCondition), conditions.GetMessage(o, meta.ReadyCondition), v1.WaitingForPreviousCCMReason)
	}
	removeByHand(t, members[1])
	requestReconcile(t, name)
	neverDeployment(t, "a member installed again beside the previous CCM, both removed", 3*durationS*time.Second, name, members...)
	previous.stop()
	for _, m := range members {
		waitDeployment(t, "member installed again once the previous CCM stopped", m)
	}
}

// TestTakeOverWaitingMemberLeaseRemoved: a member removed by hand while
// another is installed waits for the previous CCM with no release left, so
// status.members lists it uninstalled. The Lease the coordinator created
// for it is still there; when the NativeCCM is deleted meanwhile, it goes
// with the NativeCCM.
func TestTakeOverWaitingMemberLeaseRemoved(t *testing.T) {
	const (
		name      = "takeover-split-lease"
		leaseName = "takeover-split-lease-previous-ccm"
		member    = "native-ccm-" + name + "--eu-west-1"
	)
	awsSplitSecret(t, "takeover-split-lease-credentials")
	createRegionNode(t, "tsl-eu-1", name, "eu-west-1", "aws:///eu-west-1a/i-0c31")
	createRegionNode(t, "tsl-eu-2", name, "eu-west-2", "aws:///eu-west-2a/i-0c32")
	obj := splitTakeOver(name, "takeover-split-lease-credentials", "kube-system/"+leaseName)
	createNativeCCM(t, obj)
	waitDeployment(t, "member installed", member)
	waitDeployment(t, "member installed", "native-ccm-"+name+"--eu-west-2")
	previousLeadsThenRemoveByHand(t, leaseName, "aws-cloud-controller-manager-l3_9e0f", 3, member)
	requestReconcile(t, name)
	eventually(t, "the member waiting, recorded uninstalled", func() (bool, string) {
		o := getNativeCCM(t, name)
		for _, m := range o.Status.Members {
			if m.Release == member {
				return m.Revision == 0 && m.Reason == v1.WaitingForPreviousCCMReason, fmt.Sprintf("%+v", m)
			}
		}
		return false, fmt.Sprintf("members %+v", o.Status.Members)
	})
	memberLease := func() error {
		return k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: member}, &coordinationv1.Lease{})
	}
	if err := memberLease(); err != nil {
		t.Fatalf("the waiting member's Lease: %v", err)
	}
	if err := k8s.Delete(ctxT(t), obj); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NativeCCM and the member's Lease gone", func() (bool, string) {
		err := k8s.Get(ctxT(t), client.ObjectKey{Name: name}, &v1.NativeCCM{})
		lerr := memberLease()
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(lerr), fmt.Sprintf("nativeccm: %v, lease: %v", err, lerr)
	})
}

// hcloudTakeOver creates NativeCCM name of its own platform (an hcloud
// profile), with one node, that takes over from the CCM leading lease.
func hcloudTakeOver(t *testing.T, name, node, providerID, lease string) {
	t.Helper()
	hcloudSecret(t)
	createNode(t, node, name, providerID)
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NativeCCMSpec{Platform: name, TakeOver: &v1.TakeOver{Lease: lease}},
	})
}

// upgradeOnce changes NativeCCM name's spec and waits for its release's
// revision 2.
func upgradeOnce(t *testing.T, name string) {
	t.Helper()
	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Overrides = &v1.Overrides{Args: []string{"--v=4"}} })
	eventually(t, "revision 2 deployed", func() (bool, string) {
		o := getNativeCCM(t, name)
		return o.Status.Release != nil && o.Status.Release.Revision == 2, fmt.Sprintf("release %+v", o.Status.Release)
	})
}

// splitTakeOver is a NativeCCM of its own platform split by region that
// takes over from the CCM leading lease.
func splitTakeOver(name, credentials, lease string) *v1.NativeCCM {
	return &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{
		Platform:    name,
		Credentials: &v1.Credentials{SecretRef: meta.LocalObjectReference{Name: credentials}},
		Domain:      &v1.Domain{SplitBy: regionLabel},
		TakeOver:    &v1.TakeOver{Lease: lease},
	}}
}

// waitDeployment waits for a release's Deployment.
func waitDeployment(t *testing.T, what, deployment string) {
	t.Helper()
	eventually(t, what+": Deployment "+deployment, func() (bool, string) {
		_, err := getDeployment(t, deployment)
		return err == nil, fmt.Sprint(err)
	})
}

// neverDeployment fails if any of the Deployments exists within d, naming
// what NativeCCM name's Ready says.
func neverDeployment(t *testing.T, what string, d time.Duration, name string, deployments ...string) {
	t.Helper()
	never(t, what, d, func() (bool, string) {
		for _, dep := range deployments {
			if _, err := getDeployment(t, dep); err == nil {
				o := getNativeCCM(t, name)
				return true, fmt.Sprintf("Deployment %s exists; Ready %s: %s; release %+v", dep,
					conditions.GetReason(o, meta.ReadyCondition), conditions.GetMessage(o, meta.ReadyCondition), o.Status.Release)
			}
		}
		return false, ""
	})
}

// previousLeads starts a previous CCM leading kube-system/leaseName
// (stopped at the test's end) and waits until its Lease is held.
func previousLeads(t *testing.T, leaseName, holder string, durationS int32) *leader {
	t.Helper()
	previous := lead("kube-system", leaseName, holder, durationS)
	t.Cleanup(previous.stop)
	eventually(t, "the previous CCM's Lease held", func() (bool, string) {
		var l coordinationv1.Lease
		err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: "kube-system", Name: leaseName}, &l)
		return err == nil && l.Spec.HolderIdentity != nil, fmt.Sprint(err)
	})
	return previous
}

// previousLeadsThenRemoveByHand: previousLeads, then release uninstalled
// with Helm as a person would (helm uninstall).
func previousLeadsThenRemoveByHand(t *testing.T, leaseName, holder string, durationS int32, release string) *leader {
	t.Helper()
	previous := previousLeads(t, leaseName, holder, durationS)
	removeByHand(t, release)
	return previous
}

// removeByHand uninstalls release with Helm as a person would (helm uninstall).
func removeByHand(t *testing.T, release string) {
	t.Helper()
	engine := helm.NewEngine(rest.CopyConfig(env.Config), helm.Options{Timeout: time.Minute, Log: ctrl.Log.WithName("helm-by-hand")})
	if err := engine.Uninstall(context.Background(), releaseNamespace, release); err != nil {
		t.Fatal(err)
	}
}

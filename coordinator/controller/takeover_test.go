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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// TestTakeOverWaitsForThePreviousCCM: a NativeCCM that takes over from a CCM
// the cluster runs (spec.takeOver.lease, a Lease in kube-system as every
// CCM built on k8s.io/cloud-provider keeps by default) is not installed
// while that CCM renews its Lease: Ready=False WaitingForPreviousCCM naming
// the Lease, its holder and what to do, and a Warning event. The CCM stops
// (it does not release its Lease, as upstream CCMs do not): the Lease runs
// out and the release is installed, with a PreviousCCMStopped event. The
// previous CCM started again beside the installed one is a Conflict
// (PreviousCCMLive); the release stays.
func TestTakeOverWaitsForThePreviousCCM(t *testing.T) {
	const (
		name       = "takeover-a"
		leaseNS    = "kube-system"
		leaseName  = "takeover-a-previous-ccm"
		holder     = "aws-cloud-controller-manager-x7k2p_5c1e0f3a-8d2b-4f6e-9a7c-1b3d5e7f9a0c"
		durationS  = 3
		leaseValue = leaseNS + "/" + leaseName
	)
	hcloudSecret(t)
	previous := lead(leaseNS, leaseName, holder, durationS)
	t.Cleanup(previous.stop)
	createNode(t, "ta-1", name, "hcloud://9401")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NativeCCMSpec{Platform: name, TakeOver: &v1.TakeOver{Lease: leaseValue}},
	})
	obj := waitMessage(t, name, meta.ReadyCondition, metav1.ConditionFalse, v1.WaitingForPreviousCCMReason,
		"Lease "+leaseValue+" is held by \""+holder+"\", renewed", "(spec.takeOver.lease)", "uninstall it", "then native-ccm-"+name+" is installed")
	if obj.Status.Release != nil {
		t.Fatalf("release recorded while waiting: %+v", obj.Status.Release)
	}
	if ok, state := hasEvent(t, name, v1.WaitingForPreviousCCMReason); !ok {
		t.Errorf("no WaitingForPreviousCCM event: %s", state)
	} else if msg := warningEvent(t, name, v1.WaitingForPreviousCCMReason); !strings.Contains(msg, leaseValue) {
		t.Errorf("WaitingForPreviousCCM event %q, want a Warning naming %s", msg, leaseValue)
	}
	// Several lease durations: the coordinator looks again each time the
	// Lease would run out, finds it renewed, and installs nothing.
	never(t, "an install while the previous CCM renews its Lease", 3*durationS*time.Second, func() (bool, string) {
		o := getNativeCCM(t, name)
		_, err := getDeployment(t, "native-ccm-"+name)
		return o.Status.Release != nil || err == nil || !conditions.HasAnyReason(o, meta.ReadyCondition, v1.WaitingForPreviousCCMReason),
			fmt.Sprintf("release %+v, deployment err %v, ready %q", o.Status.Release, err, conditions.GetReason(o, meta.ReadyCondition))
	})

	// The previous CCM stops; its Lease stays held and runs out.
	previous.stop()
	waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if ok, state := hasEvent(t, name, v1.PreviousCCMStoppedReason); !ok {
		t.Errorf("no PreviousCCMStopped event: %s", state)
	}

	// Someone installs the previous CCM again: reported, the release stays.
	again := lead(leaseNS, leaseName, holder, durationS)
	t.Cleanup(again.stop)
	requestReconcile(t, name)
	waitMessage(t, name, v1.ConflictCondition, metav1.ConditionTrue, v1.PreviousCCMLiveReason, "the previous CCM runs again beside this one", leaseValue)
	waitCondition(t, name, v1.InstalledCondition, metav1.ConditionTrue, "")
	again.stop()
	eventually(t, "the previous CCM's Lease run out", func() (bool, string) {
		var l coordinationv1.Lease
		if err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: leaseNS, Name: leaseName}, &l); err != nil {
			return false, err.Error()
		}
		return time.Since(l.Spec.RenewTime.Time) > durationS*time.Second, l.Spec.RenewTime.String()
	})
	requestReconcile(t, name)
	waitCondition(t, name, v1.ConflictCondition, metav1.ConditionFalse, v1.NoConflictReason)
}

// TestTakeOverWaitsBeforeTheFirstMember: a split NativeCCM that takes over
// installs no member while the previous CCM renews its Lease, and its
// members once it stopped.
func TestTakeOverWaitsBeforeTheFirstMember(t *testing.T) {
	const (
		name      = "takeover-split"
		leaseName = "takeover-split-previous-ccm"
	)
	awsSplitSecret(t, "takeover-split-credentials")
	previous := lead("kube-system", leaseName, "aws-cloud-controller-manager-q9w8e_0b1c", 3)
	t.Cleanup(previous.stop)
	createRegionNode(t, "tsplit-eu-1", name, "eu-west-1", "aws:///eu-west-1a/i-0c01")
	createNativeCCM(t, splitTakeOver(name, "takeover-split-credentials", "kube-system/"+leaseName))
	waitMessage(t, name, meta.ReadyCondition, metav1.ConditionFalse, v1.WaitingForPreviousCCMReason, "Lease kube-system/"+leaseName)
	never(t, "a member while the previous CCM renews its Lease", 2*3*time.Second, func() (bool, string) {
		_, err := getDeployment(t, "native-ccm-"+name+"--eu-west-1")
		return err == nil, "member Deployment exists"
	})
	previous.stop()
	waitMessage(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.UpToDateReason, "native-ccm-"+name+"--eu-west-1 (eu-west-1, 1 node(s))")
}

// TestTakeOverMemberAsksAgainAfterAnInstall: a split NativeCCM waits for
// the previous CCM with three members to install. The CCM stops, and starts
// again while the first member's install waits for its pods. The other two
// are not installed beside it: the look made before the first install is
// not taken for them, and a Warning event says the previous CCM runs
// (Ready said the pass began waiting). Once it stops for good both are
// installed, and each stop is said by one PreviousCCMStopped event, not
// one per member.
func TestTakeOverMemberAsksAgainAfterAnInstall(t *testing.T) {
	const (
		name      = "takeover-split-again"
		leaseName = "takeover-split-again-previous-ccm"
		durationS = 3
	)
	rel := func(region string) string { return "native-ccm-" + name + "--" + region }
	awsSplitSecret(t, name+"-credentials")
	for i, region := range []string{"eu-west-1", "eu-west-2", "eu-west-3"} {
		createRegionNode(t, fmt.Sprintf("tsa-eu-%d", i+1), name, region, fmt.Sprintf("aws:///%sa/i-0c4%d", region, i+1))
	}
	first := previousLeads(t, leaseName, "aws-cloud-controller-manager-g4_9e0f", durationS)
	createNativeCCM(t, splitTakeOver(name, name+"-credentials", "kube-system/"+leaseName))
	waitMessage(t, name, meta.ReadyCondition, metav1.ConditionFalse, v1.WaitingForPreviousCCMReason, "Lease kube-system/"+leaseName)

	again := make(chan *leader, 1)
	engine.duringInstall.Store(rel("eu-west-1"), func() {
		l := lead("kube-system", leaseName, "aws-cloud-controller-manager-h5_9e0f", durationS)
		if ok, msg := poll(30*time.Second, func() (bool, string) {
			var lease coordinationv1.Lease
			err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: leaseName}, &lease)
			return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == "aws-cloud-controller-manager-h5_9e0f", fmt.Sprint(err)
		}); !ok {
			t.Errorf("the previous CCM's Lease not taken again: %s", msg)
		}
		again <- l
	})
	t.Cleanup(func() {
		engine.duringInstall.Delete(rel("eu-west-1"))
		select {
		case l := <-again:
			l.stop()
		default:
		}
	})
	var warnings int
	eventually(t, "the Warning event of the wait", func() (bool, string) {
		warnings = countEvents(t, name, corev1.EventTypeWarning, v1.WaitingForPreviousCCMReason)
		return warnings > 0, "none"
	})
	first.stop()
	waitDeployment(t, "the first member installed once the previous CCM stopped", rel("eu-west-1"))
	var l *leader
	select {
	case l = <-again:
	case <-time.After(90 * time.Second):
		t.Fatal("the first member's install did not start the previous CCM again")
	}
	neverDeployment(t, "a member installed beside the previous CCM, which started again during the first member's install",
		3*durationS*time.Second, name, rel("eu-west-2"), rel("eu-west-3"))
	if ok, msg := poll(20*time.Second, func() (bool, string) {
		n := countEvents(t, name, corev1.EventTypeWarning, v1.WaitingForPreviousCCMReason)
		return n > warnings, fmt.Sprintf("%d before it started again, %d now", warnings, n)
	}); !ok {
		t.Errorf("no Warning event saying the previous CCM runs again: %s", msg)
	}
	l.stop()
	waitDeployment(t, "the second member installed once the previous CCM stopped again", rel("eu-west-2"))
	waitDeployment(t, "the third member installed once the previous CCM stopped again", rel("eu-west-3"))
	stopped := func() int { return countEvents(t, name, corev1.EventTypeNormal, v1.PreviousCCMStoppedReason) }
	eventually(t, "a PreviousCCMStopped event for each stop", func() (bool, string) { return stopped() >= 2, fmt.Sprint(stopped()) })
	if n := stopped(); n != 2 {
		t.Errorf("%d PreviousCCMStopped events, want 2 (the previous CCM stopped twice)", n)
	}
}

// countEvents counts object's events of type and reason, each as often as
// it occurred.
func countEvents(t *testing.T, object, typ, reason string) int {
	t.Helper()
	n := 0
	for _, e := range eventsOf(t, object) {
		if e.Type == typ && e.Reason == reason {
			n += max(int(e.Count), 1)
		}
	}
	return n
}

// TestTakeOverLeaseMustNameNamespaceAndLease: the API server refuses a
// spec.takeOver.lease that is not <namespace>/<name>, naming the field.
func TestTakeOverLeaseMustNameNamespaceAndLease(t *testing.T) {
	for _, lease := range []string{"cloud-controller-manager", "kube-system/", "/cloud-controller-manager", "Kube-System/ccm", "kube-system/ccm/x",
		strings.Repeat("n", 64) + "/ccm", "kube-system/" + strings.Repeat("a", 254)} {
		obj := &v1.NativeCCM{
			ObjectMeta: metav1.ObjectMeta{Name: "takeover-invalid"},
			Spec:       v1.NativeCCMSpec{Platform: "takeover-invalid", TakeOver: &v1.TakeOver{Lease: lease}},
		}
		err := k8s.Create(ctxT(t), obj)
		if err == nil {
			_ = k8s.Delete(ctxT(t), obj)
			t.Errorf("spec.takeOver.lease %q accepted", lease)
			continue
		}
		if !strings.Contains(err.Error(), "spec.takeOver.lease") || !strings.Contains(err.Error(), "<namespace>/<name>") {
			t.Errorf("spec.takeOver.lease %q: %v, want an error naming the field and its form", lease, err)
		}
	}
}

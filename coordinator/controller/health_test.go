package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// forbidden is what the hcloud CCM says when it exits at start because it may
// not read the authentication configmap.
const forbidden = `unable to load configmap based request-header-client-ca-file: configmaps "extension-apiserver-authentication" is forbidden: User "system:serviceaccount:hybrid-ccm-system:native-ccm-health-a" cannot get resource "configmaps" in API group "" in the namespace "kube-system"`

// installedDeployment waits for the release's Deployment.
func installedDeployment(t *testing.T, rel string) *appsv1.Deployment {
	t.Helper()
	var d *appsv1.Deployment
	eventually(t, "deployment "+rel, func() (bool, string) {
		var err error
		d, err = getDeployment(t, rel)
		return err == nil, fmt.Sprint(err)
	})
	return d
}

// releasePod creates (or rewrites the status of) pod name of the release, as
// its ReplicaSet and kubelet would, and deletes it when the test ends.
func releasePod(t *testing.T, d *appsv1.Deployment, name string, status corev1.PodStatus) {
	t.Helper()
	if err := ensurePod(ctxT(t), k8s, d, name, status, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNamespace, Name: name}})
	})
}

// crashLoopStatus is what a kubelet reports for a pod whose CCM container
// exited with msg three times (the ccm-gate sidecar runs).
func crashLoopStatus(d *appsv1.Deployment, pod, msg string) corev1.PodStatus {
	s := runningStatus(d)
	ccm := &s.ContainerStatuses[0]
	ccm.Ready, ccm.Started, ccm.RestartCount = false, nil, 3
	ccm.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason:  "CrashLoopBackOff",
		Message: fmt.Sprintf("back-off 40s restarting failed container=%s pod=%s_%s", ccm.Name, pod, releaseNamespace),
	}}
	ccm.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: 1, Reason: "Error", Message: msg,
		StartedAt: metav1.Now(), FinishedAt: metav1.Now(),
	}}
	return s
}

// eventuallyWithin fails the test unless cond holds within d.
func eventuallyWithin(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if ok, last := poll(d, cond); !ok {
		t.Fatalf("no %s within %s; last state: %s", what, d, last)
	}
}

// poll calls cond until it returns true or d has passed, and returns its
// last answer.
func poll(d time.Duration, cond func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok || time.Now().After(deadline) {
			return ok, state
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readyState(o *v1.NativeCCM) string {
	var b strings.Builder
	for _, c := range o.Status.Conditions {
		fmt.Fprintf(&b, "%s=%s(%s: %s) ", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}

// TestCrashLoopingCCMIsNotReady: the release is installed (Helm is content),
// but its CCM exits at start, again and again. While no pod runs the
// NativeCCM is Reconciling, not Ready; once the kubelet reports the crash
// loop it is Ready=False CrashLooping within one lease duration, with the
// container's own last words, a Warning event, and neither Reconciling nor
// Stalled.
func TestCrashLoopingCCMIsNotReady(t *testing.T) {
	const name, rel = "health-a", "native-ccm-health-a"
	hcloudSecret(t)
	createNode(t, "ha-1", name, "hcloud://9501")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{Platform: name}})

	obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, v1.NoRunningPodsReason)
	if !conditions.IsTrue(obj, v1.InstalledCondition) || !conditions.IsReconciling(obj) || conditions.IsStalled(obj) {
		t.Fatalf("starting CCM: want Installed, Reconciling, not Stalled: %s", readyState(obj))
	}

	d := installedDeployment(t, rel)
	pod := rel + "-6d4b7c9f8-kx7vq"
	releasePod(t, d, pod, crashLoopStatus(d, pod, forbidden))
	eventuallyWithin(t, testLeaseDuration, "Ready=False CrashLooping", func() (bool, string) {
		obj = getNativeCCM(t, name)
		return conditions.HasAnyReason(obj, meta.ReadyCondition, v1.CrashLoopingReason) && conditions.IsFalse(obj, meta.ReadyCondition), readyState(obj)
	})
	for _, ct := range []string{meta.ReadyCondition, v1.HealthyCondition} {
		msg := conditions.GetMessage(obj, ct)
		for _, want := range []string{`configmaps "extension-apiserver-authentication" is forbidden`, "pod " + pod, "restarted 3 time(s)", "CrashLoopBackOff"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s message %q lacks %q", ct, msg, want)
			}
		}
	}
	eventually(t, "crash loop summarized", func() (bool, string) {
		obj = getNativeCCM(t, name)
		return !conditions.Has(obj, meta.ReconcilingCondition) && obj.Status.ObservedGeneration == obj.Generation, readyState(obj)
	})
	if conditions.IsStalled(obj) || !conditions.IsTrue(obj, v1.InstalledCondition) {
		t.Errorf("crash loop: want not Stalled, Installed: %s", readyState(obj))
	}
	if ok, state := hasEvent(t, name, v1.CrashLoopingReason); !ok {
		t.Errorf("no CrashLooping event: %s", state)
	}
	if ev := warningEvent(t, name, v1.CrashLoopingReason); !strings.Contains(ev, "extension-apiserver-authentication") {
		t.Errorf("CrashLooping event %q lacks the container's message", ev)
	}
}

// warningEvent returns the message of the object's Warning event with reason.
func warningEvent(t *testing.T, object, reason string) string {
	t.Helper()
	for _, e := range eventsOf(t, object) {
		if e.Reason == reason && e.Type == corev1.EventTypeWarning {
			return e.Message
		}
	}
	return ""
}

// TestLeaseDecidesReady: Ready follows the release's lease. A pod of the
// release leads and renews → Ready=True (Healthy LeaseRenewed, status.leader
// and the Leader/Renewed columns); the leader pod goes and nobody renews →
// Ready=False LeaseNotRenewed; another pod of the release takes the lease →
// True again; a foreign identity holds it → Ready=False
// LeaseHeldByForeignIdentity.
func TestLeaseDecidesReady(t *testing.T) {
	const name, rel = "health-b", "native-ccm-health-b"
	const leaseSeconds = 5
	hcloudSecret(t)
	createNode(t, "hb-1", name, "hcloud://9601")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{Platform: name}})
	d := installedDeployment(t, rel)
	first, second := rel+"-6d4b7c9f8-a1b2c", rel+"-6d4b7c9f8-d3e4f"
	releasePod(t, d, first, runningStatus(d))
	releasePod(t, d, second, runningStatus(d))

	// Pods run, nobody leads yet: starting.
	waitCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, v1.LeaseNotFoundReason)

	// The first pod leads.
	l := lead(releaseNamespace, rel, first+"_8e1f5a0c-1d2b-4c3d-9e8f-0a1b2c3d4e5f", leaseSeconds)
	obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	obj = waitLeaderPod(t, name, first)
	if !conditions.IsTrue(obj, v1.HealthyCondition) || conditions.GetReason(obj, v1.HealthyCondition) != v1.LeaseRenewedReason {
		t.Errorf("leading pod: %s", readyState(obj))
	}
	ld := obj.Status.Leader
	if ld == nil || ld.Pod != first || !strings.HasPrefix(ld.Holder, first+"_") || ld.RenewTime == nil ||
		ld.LeaseDurationSeconds != leaseSeconds || ld.Lease != releaseNamespace+"/"+rel {
		t.Errorf("status.leader = %+v", ld)
	}
	cells := tableRow(t, name)
	if cells["Leader"] != ld.Holder || cells["Renewed"] == nil || cells["Ready"] != "True" {
		t.Errorf("columns Leader=%v Renewed=%v Ready=%v", cells["Leader"], cells["Renewed"], cells["Ready"])
	}

	// The leader pod goes; the other runs but does not take over.
	l.stop()
	if err := k8s.Delete(ctxT(t), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNamespace, Name: first}}); err != nil {
		t.Fatal(err)
	}
	obj = waitCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, v1.LeaseNotRenewedReason)
	if msg := conditions.GetMessage(obj, meta.ReadyCondition); !strings.Contains(msg, first) {
		t.Errorf("Ready message %q does not name the last holder", msg)
	}
	if conditions.IsReconciling(obj) || conditions.IsStalled(obj) {
		t.Errorf("lease not renewed: want neither Reconciling nor Stalled: %s", readyState(obj))
	}
	if ok, state := hasEvent(t, name, v1.LeaseNotRenewedReason); !ok {
		t.Errorf("no LeaseNotRenewed event: %s", state)
	}

	// The second pod takes the lease: Ready again.
	l = lead(releaseNamespace, rel, second+"_3c2b1a09-8f7e-4d6c-b5a4-938271605f4e", leaseSeconds)
	waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, "")
	waitLeaderPod(t, name, second)
	if ok, state := hasEvent(t, name, v1.LeaseRenewedReason); !ok {
		t.Errorf("no LeaseRenewed (recovered) event: %s", state)
	}
	l.stop()

	// Someone else's CCM holds the lease.
	l = lead(releaseNamespace, rel, "someones-ccm-5d8f9_1f2e3d4c", leaseSeconds)
	defer l.stop()
	obj = waitCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, v1.LeaseHeldByForeignIdentityReason)
	if msg := conditions.GetMessage(obj, meta.ReadyCondition); !strings.Contains(msg, `"someones-ccm-5d8f9_1f2e3d4c"`) {
		t.Errorf("Ready message %q does not name the foreign holder", msg)
	}
	if ok, state := hasEvent(t, name, v1.LeaseHeldByForeignIdentityReason); !ok {
		t.Errorf("no LeaseHeldByForeignIdentity event: %s", state)
	}
}

// waitLeaderPod waits until status.leader names pod. The patch helper writes
// the conditions before the rest of the status, so a Ready condition can be
// seen a moment before the leader it describes.
func waitLeaderPod(t *testing.T, name, pod string) *v1.NativeCCM {
	t.Helper()
	var obj *v1.NativeCCM
	eventually(t, name+" status.leader.pod="+pod, func() (bool, string) {
		obj = getNativeCCM(t, name)
		return obj.Status.Leader != nil && obj.Status.Leader.Pod == pod, fmt.Sprintf("status.leader = %+v", obj.Status.Leader)
	})
	return obj
}

// tableRow returns the printer columns of a NativeCCM as the API server shows them.
func tableRow(t *testing.T, name string) map[string]any {
	t.Helper()
	raw, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/apis/hybridccm.io/v1alpha1/nativeccms/"+name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	cells := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		cells[c.Name] = table.Rows[0].Cells[i]
	}
	return cells
}

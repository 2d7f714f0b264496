package controller

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// leaseReader answers Lease reads with lease, or err.
type leaseReader struct {
	lease *coordinationv1.Lease
	err   error
}

func (r leaseReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if r.err != nil {
		return r.err
	}
	if r.lease == nil {
		return apierrors.NewNotFound(coordinationv1.Resource("leases"), key.Name)
	}
	r.lease.DeepCopyInto(obj.(*coordinationv1.Lease))
	return nil
}

func (leaseReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("not a list")
}

// TestPreviousCCMLease: what the previous CCM's Lease says decides the
// hold, as client-go's leader election judges a Lease it does not hold: live
// while it has a holder, until the coordinator has seen it unchanged for the
// Lease's duration by its own clock (the first look counts as a change; the
// holder's renewTime, by the holder's clock, decides nothing). A held Lease
// is looked at once more, a duration later, unchanged: then it ran out.
func TestPreviousCCMLease(t *testing.T) {
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) *metav1.MicroTime { return &metav1.MicroTime{Time: now.Add(-ago)} }
	cases := []struct {
		name  string                // case
		lease *coordinationv1.Lease // nil: no Lease
		err   error                 // the read's error
		// reason is Ready's reason after the check ("" for no hold)
		reason string
		// want are parts of Ready's message
		want []string
		// after is when the coordinator looks again (0: not asked)
		after time.Duration
	}{
		{name: "no Lease: the previous CCM never ran or is gone"},
		{name: "released (no holder)", lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: at(time.Second), LeaseDurationSeconds: ptr.To(int32(15))}}},
		{name: "held, renewed 3s ago, 15s lease", lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old_1"), RenewTime: at(3 * time.Second), LeaseDurationSeconds: ptr.To(int32(15))}},
			reason: v1.WaitingForPreviousCCMReason, want: []string{`Lease kube-system/cloud-controller-manager is held by "old_1", renewed 3s ago (lease duration 15s)`, "uninstall it"},
			after: 8 * time.Second},
		{name: "held, renewed 16s ago, 15s lease: held for a duration, as the holder's clock may be behind", lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old_1"), RenewTime: at(16 * time.Second), LeaseDurationSeconds: ptr.To(int32(15))}},
			reason: v1.WaitingForPreviousCCMReason, want: []string{"renewed 16s ago (lease duration 15s)"}, after: 8 * time.Second},
		{name: "held, never renewed", lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old_1")}},
			reason: v1.WaitingForPreviousCCMReason, want: []string{`held by "old_1", never renewed`}, after: 8 * time.Second},
		{name: "a 5s lease", lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old_1"), RenewTime: at(time.Second), LeaseDurationSeconds: ptr.To(int32(5))}},
			reason: v1.WaitingForPreviousCCMReason, want: []string{"renewed 1s ago (lease duration 5s)"}, after: 3 * time.Second},
		{name: "no duration: the k8s.io/cloud-provider default (15s)", lease: &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old_1"), RenewTime: at(10 * time.Second)}},
			reason: v1.WaitingForPreviousCCMReason, want: []string{"renewed 10s ago (lease duration 15s)"}, after: 8 * time.Second},
		{name: "forbidden: unknown, so held", err: apierrors.NewForbidden(coordinationv1.Resource("leases"), "cloud-controller-manager", errors.New("no RBAC")),
			reason: v1.PreviousCCMLeaseUnreadableReason, want: []string{"reading Lease kube-system/cloud-controller-manager", "forbidden", "clouds.aws.takeOver.lease", "takeOverLeases"}, after: 30 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := now
			r := &NativeCCMReconciler{APIReader: leaseReader{lease: c.lease, err: c.err}, RetryInterval: 30 * time.Second, now: func() time.Time { return clock }}
			obj := takeOverObj("kube-system/cloud-controller-manager")
			err := r.waitForPreviousCCM(context.Background(), obj)
			if c.reason == "" {
				if err != nil || conditions.Get(obj, meta.ReadyCondition) != nil {
					t.Fatalf("held: %v, Ready %+v", err, conditions.Get(obj, meta.ReadyCondition))
				}
				return
			}
			var wait *waitError
			if !errors.As(err, &wait) || wait.reason != c.reason || wait.after != c.after {
				t.Fatalf("got %#v, want a wait %s looked at again after %s", err, c.reason, c.after)
			}
			if got := conditions.GetReason(obj, meta.ReadyCondition); got != c.reason || !conditions.IsFalse(obj, meta.ReadyCondition) {
				t.Errorf("Ready reason %q, want False %s", got, c.reason)
			}
			msg := conditions.GetMessage(obj, meta.ReadyCondition)
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("Ready message %q lacks %q", msg, w)
				}
			}
			if c.err != nil {
				return
			}
			// looked at again when asked, the Lease unchanged: it runs out
			// one duration (and half a second) after the first look
			start, looks := now, 1
			for ; err != nil && looks < 5; looks++ {
				if !errors.As(err, &wait) {
					t.Fatalf("look %d: %v", looks, err)
				}
				clock = clock.Add(wait.after)
				err = r.waitForPreviousCCM(context.Background(), obj)
			}
			if err != nil || clock.Sub(start) > 2*c.after {
				t.Errorf("the Lease unchanged: after %d looks, %s: %v", looks, clock.Sub(start), err)
			}
		})
	}
}

// takeOverClock is a reconciler reading one previous CCM's Lease, with a
// clock the test moves.
type takeOverClock struct {
	r     *NativeCCMReconciler
	lease *coordinationv1.Lease
	now   time.Time
}

func newTakeOverClock(lease *coordinationv1.Lease) *takeOverClock {
	c := &takeOverClock{lease: lease, now: time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)}
	c.r = &NativeCCMReconciler{APIReader: leaseReader{lease: lease}, RetryInterval: 30 * time.Second, Namespace: "hybrid-ccm-system",
		now: func() time.Time { return c.now }}
	return c
}

// renew is the holder renewing its Lease, writing renewTime from its own
// clock, skew ahead of the coordinator's.
func (c *takeOverClock) renew(skew time.Duration) {
	c.lease.Spec.RenewTime = &metav1.MicroTime{Time: c.now.Add(skew)}
	c.lease.ResourceVersion = c.now.Format(time.RFC3339Nano)
}

func takeOverObj(lease string) *v1.NativeCCM {
	return &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "aws"},
		Spec: v1.NativeCCMSpec{Platform: "aws", TakeOver: &v1.TakeOver{Lease: lease}}}
}

// TestTakeOverHolderClockBehind: the previous CCM runs on a node whose
// clock is 30 s behind the coordinator's and renews its 15 s Lease every
// 2 s, as client-go's leader election does. Every renewTime it writes looks
// 30 s old to the coordinator. It still runs: nothing may be installed
// beside it (client-go's own candidates judge a Lease by when they saw it
// change, not by its renewTime, for this reason).
func TestTakeOverHolderClockBehind(t *testing.T) {
	c := newTakeOverClock(&coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To("aws-cloud-controller-manager-x7k2p_5c1e"), LeaseDurationSeconds: ptr.To(int32(15))}})
	obj := takeOverObj("kube-system/cloud-controller-manager")
	for i := range 10 {
		c.renew(-30 * time.Second)
		if err := c.r.waitForPreviousCCM(context.Background(), obj); err == nil {
			t.Fatalf("look %d: installing while the previous CCM renews its Lease every 2 s (its clock 30 s behind)", i)
		}
		c.now = c.now.Add(2 * time.Second)
	}
}

// TestTakeOverRenewTimeInTheFuture: a Lease whose renewTime is ahead of the
// coordinator's clock (a holder's clock a day ahead, or a forged value) and
// that is never renewed again. Its holder has stopped: the hold ends one
// lease duration after the coordinator saw it last change, not a day (or, for
// year 9999, never); Ready's message says the renewTime is ahead.
func TestTakeOverRenewTimeInTheFuture(t *testing.T) {
	for _, ahead := range []time.Duration{24 * time.Hour, time.Until(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC))} {
		c := newTakeOverClock(&coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("old_1"), LeaseDurationSeconds: ptr.To(int32(15))}})
		c.renew(ahead)
		obj := takeOverObj("kube-system/cloud-controller-manager")
		err := c.r.waitForPreviousCCM(context.Background(), obj)
		var wait *waitError
		if !errors.As(err, &wait) {
			t.Fatalf("renewTime %s ahead, first look: %v, want a wait", ahead, err)
		}
		if wait.after > time.Minute {
			t.Errorf("renewTime %s ahead: looked at again after %s, want within a lease duration", ahead, wait.after)
		}
		// described as ahead, not as "renewed -24h0m0s ago" (or, for year
		// 9999, a saturated "-2562047h47m16.85s ago")
		if msg := conditions.GetMessage(obj, meta.ReadyCondition); strings.Contains(msg, "renewed -") || !strings.Contains(msg, "ahead of the coordinator's clock") {
			t.Errorf("renewTime %s ahead: Ready %q, want it to say the renewTime is ahead of the coordinator's clock", ahead, msg)
		}
		// the Lease is never renewed again
		c.now = c.now.Add(16 * time.Second)
		if err := c.r.waitForPreviousCCM(context.Background(), obj); err != nil {
			t.Errorf("renewTime %s ahead, unchanged for 16 s of a 15 s Lease: still held: %v", ahead, err)
		}
	}
}

// TestTakeOverHugeHolderIdentity: a Lease's holderIdentity has no length
// limit in the API server. The coordinator quotes it in Ready's (and
// Conflict's) message, which the CRD limits to 32768 characters: a longer
// one makes every status patch fail, so the NativeCCM's status freezes.
func TestTakeOverHugeHolderIdentity(t *testing.T) {
	holder := strings.Repeat("h", 100_000) + "\x1b[2K\n"
	c := newTakeOverClock(&coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(int32(15))}})
	c.renew(0)
	obj := takeOverObj("kube-system/cloud-controller-manager")
	if err := c.r.waitForPreviousCCM(context.Background(), obj); err == nil {
		t.Fatal("no wait")
	}
	if msg := conditions.GetMessage(obj, meta.ReadyCondition); len(msg) > 4096 {
		t.Errorf("Ready message of %d bytes (the CRD refuses more than 32768; a holder identity is not bounded)", len(msg))
	}
	obj.Status.Release = &v1.ReleaseStatus{}
	for _, cf := range c.r.previousCCMConflict(context.Background(), obj) {
		if len(cf.Message) > 4096 {
			t.Errorf("Conflict message of %d bytes", len(cf.Message))
		}
	}
}

// TestPreviousCCMConflictMessageStable: while the previous CCM runs beside
// the installed release, each look finds the Lease renewed at another time.
// The Conflict message must not change with it: a changed message is a
// status patch and a Warning event at every look (docs/coordinator.md,
// "What a quiet coordinator costs": conditions do not carry renew times).
func TestPreviousCCMConflictMessageStable(t *testing.T) {
	c := newTakeOverClock(&coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To("old_1"), LeaseDurationSeconds: ptr.To(int32(15))}})
	obj := takeOverObj("kube-system/cloud-controller-manager")
	obj.Status.Release = &v1.ReleaseStatus{}
	var msgs []string
	for _, ago := range []time.Duration{time.Second, 7 * time.Second} {
		c.renew(-ago)
		found := c.r.previousCCMConflict(context.Background(), obj)
		if len(found) != 1 {
			t.Fatalf("renewed %s ago: conflicts %+v, want PreviousCCMLive", ago, found)
		}
		msgs = append(msgs, found[0].Message)
		c.now = c.now.Add(150 * time.Second)
	}
	if msgs[0] != msgs[1] {
		t.Errorf("the Conflict message changes from look to look:\n%s\n%s", msgs[0], msgs[1])
	}
}

// TestTakeOverOwnLease: spec.takeOver.lease naming the NativeCCM's own Lease
// (native-ccm-<name> in the coordinator's namespace, or a member's) makes it
// wait for itself after an uninstall and report itself as the previous CCM
// running beside it for as long as it runs. It is a configuration error.
func TestTakeOverOwnLease(t *testing.T) {
	for _, name := range []string{"native-ccm-aws", "native-ccm-aws--eu-west-1"} {
		c := newTakeOverClock(&coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(name + "-5d8f9_1"), LeaseDurationSeconds: ptr.To(int32(15))}})
		c.renew(0)
		obj := takeOverObj("hybrid-ccm-system/" + name)
		err := c.r.waitForPreviousCCM(context.Background(), obj)
		var stall *stallError
		if !errors.As(err, &stall) || stall.reason != v1.InvalidTakeOverReason {
			t.Errorf("spec.takeOver.lease %s (its own): %v, want a stall %s", obj.Spec.TakeOver.Lease, err, v1.InvalidTakeOverReason)
		}
		obj.Status.Release = &v1.ReleaseStatus{}
		if found := c.r.previousCCMConflict(context.Background(), obj); len(found) != 0 {
			t.Errorf("spec.takeOver.lease %s (its own): itself reported as the previous CCM: %+v", obj.Spec.TakeOver.Lease, found)
		}
	}
}

// TestTakeOverLeaseDeletedWhileHeld: someone deletes the previous CCM's
// Lease while it runs (thinking it stale). The CCM creates it again at its
// next renewal, within seconds: the coordinator, looking in between, must
// not take the missing Lease for a stopped CCM. A Lease deleted after its
// CCM stopped ends the hold one duration later.
func TestTakeOverLeaseDeletedWhileHeld(t *testing.T) {
	for _, recreated := range []bool{true, false} {
		c := newTakeOverClock(&coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("old_1"), LeaseDurationSeconds: ptr.To(int32(15))}})
		c.renew(0)
		obj := takeOverObj("kube-system/cloud-controller-manager")
		if err := c.r.waitForPreviousCCM(context.Background(), obj); err == nil {
			t.Fatal("no wait while held")
		}
		// deleted, looked at 10 s later (a node event)
		c.r.APIReader = leaseReader{}
		c.now = c.now.Add(10 * time.Second)
		if err := c.r.waitForPreviousCCM(context.Background(), obj); err == nil {
			t.Fatal("installing as soon as the held Lease is deleted")
		} else if !strings.Contains(err.Error(), `was deleted while held by "old_1"`) {
			t.Errorf("wait %v, want it to say the Lease was deleted while held", err)
		}
		c.now = c.now.Add(2 * time.Second)
		if recreated {
			c.renew(0)
			c.r.APIReader = leaseReader{lease: c.lease}
		}
		c.now = c.now.Add(14 * time.Second)
		err := c.r.waitForPreviousCCM(context.Background(), obj)
		if recreated && err == nil {
			t.Error("installing although the holder created its Lease again")
		}
		if !recreated && err != nil {
			t.Errorf("the Lease gone for 16 s of a 15 s duration: still held: %v", err)
		}
	}
}

// TestTakeOverLeaseNameTooLong: the CRD's rule bounds spec.takeOver.lease
// to 317 characters and each part's form, not the Lease name to a DNS
// subdomain's 253: kube-system/<300 characters> is accepted, no Lease can be
// named so, the read finds none and the release was installed beside the
// CCM whose Lease the user meant. It is refused as invalid instead.
func TestTakeOverLeaseNameTooLong(t *testing.T) {
	for _, lease := range []string{"kube-system/" + strings.Repeat("a", 300), strings.Repeat("n", 64) + "/ccm", "kube-system/a..b", "kube-system/-a"} {
		c := newTakeOverClock(nil)
		obj := takeOverObj(lease)
		err := c.r.waitForPreviousCCM(context.Background(), obj)
		var stall *stallError
		if !errors.As(err, &stall) || stall.reason != v1.InvalidTakeOverReason {
			t.Errorf("spec.takeOver.lease %q: %v, want a stall %s", lease, err, v1.InvalidTakeOverReason)
		}
	}
}

// TestTakeOverLeaseDeletedWhileHeldAcrossRestart: the coordinator waited for
// a held Lease (Ready=False WaitingForPreviousCCM), someone deletes the Lease
// while its CCM runs, and the coordinator restarts (or another replica takes
// over) before the CCM creates it again: the new process never saw the Lease
// held, so the missing Lease looked like a CCM never run, and it installed
// at once. The NativeCCM's own status says it waited: a missing Lease then
// holds one (default) lease duration, as it does without the restart.
func TestTakeOverLeaseDeletedWhileHeldAcrossRestart(t *testing.T) {
	c := newTakeOverClock(&coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To("old_1"), LeaseDurationSeconds: ptr.To(int32(15))}})
	c.renew(0)
	obj := takeOverObj("kube-system/cloud-controller-manager")
	if err := c.r.waitForPreviousCCM(context.Background(), obj); err == nil {
		t.Fatal("no wait while held")
	}
	// restarted: a new reconciler (no sightings); the Lease deleted
	restarted := newTakeOverClock(nil)
	restarted.now = c.now.Add(time.Second)
	err := restarted.r.waitForPreviousCCM(context.Background(), obj)
	if err == nil {
		t.Fatal("installing after a restart because the Lease it waited for was deleted")
	}
	if !strings.Contains(err.Error(), "kube-system/cloud-controller-manager") {
		t.Errorf("wait %v, want it to name the Lease", err)
	}
	// nobody creates it again: one duration later it ran out
	restarted.now = restarted.now.Add(previousLeaseDuration)
	if err := restarted.r.waitForPreviousCCM(context.Background(), obj); err != nil {
		t.Errorf("the Lease gone for a duration after the restart: still held: %v", err)
	}
	// the wait was for an earlier spec (the condition's observedGeneration
	// behind, e.g. takeOver.lease changed since): a missing Lease installs
	edited := takeOverObj("kube-system/cloud-controller-manager")
	if err := c.r.waitForPreviousCCM(context.Background(), edited); err == nil {
		t.Fatal("no wait while held")
	}
	edited.Generation++
	if err := newTakeOverClock(nil).r.waitForPreviousCCM(context.Background(), edited); err != nil {
		t.Errorf("no Lease, the wait recorded for an earlier generation: %v", err)
	}
	// a NativeCCM that never waited installs when there is no Lease (as before)
	fresh := newTakeOverClock(nil)
	if err := fresh.r.waitForPreviousCCM(context.Background(), takeOverObj("kube-system/cloud-controller-manager")); err != nil {
		t.Errorf("no Lease, never waited: %v", err)
	}
}

// TestTakeOverCoordinatorsOwnLease: spec.takeOver.lease naming the
// coordinator's own leader-election Lease (ccm-coordinator.hybridccm.io in
// its namespace, which it may read) held the NativeCCM for as long as the
// coordinator runs, "waiting for the previous CCM to stop" with the
// coordinator's pod as the holder, and once installed reported the
// coordinator as a previous CCM running beside it. A configuration error.
func TestTakeOverCoordinatorsOwnLease(t *testing.T) {
	c := newTakeOverClock(&coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To("ccm-coordinator-6c9f_1"), LeaseDurationSeconds: ptr.To(int32(15))}})
	c.renew(0)
	obj := takeOverObj("hybrid-ccm-system/" + names.CoordinatorLease)
	err := c.r.waitForPreviousCCM(context.Background(), obj)
	var stall *stallError
	if !errors.As(err, &stall) || stall.reason != v1.InvalidTakeOverReason {
		t.Errorf("spec.takeOver.lease %s: %v, want a stall %s", obj.Spec.TakeOver.Lease, err, v1.InvalidTakeOverReason)
	}
	// the same name in another namespace is some other CCM's
	other := takeOverObj("kube-system/" + names.CoordinatorLease)
	if err := c.r.waitForPreviousCCM(context.Background(), other); errors.As(err, &stall) {
		t.Errorf("spec.takeOver.lease %s refused: %v", other.Spec.TakeOver.Lease, err)
	}
}

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
			obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "aws"},
				Spec: v1.NativeCCMSpec{Platform: "aws", TakeOver: &v1.TakeOver{Lease: "kube-system/cloud-controller-manager"}}}
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

package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/safetext"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
)

// The take-over: a NativeCCM with spec.takeOver replaces a cloud CCM the
// cluster already runs on its own, cluster-wide (its own Deployment or
// DaemonSet, its own Lease, all its controllers, the Services without a
// class). The two must never run at once: both would delete nodes, and both
// would serve the same Services (each the other's load balancer changes).
// Their Leases cannot keep them apart: a native CCM's Lease lives in the
// coordinator's namespace under its own name. So the coordinator reads the
// previous CCM's Lease, the one thing every CCM built on k8s.io/cloud-provider
// keeps up to date while it runs, and installs nothing for the NativeCCM
// while a holder renews it. Upstream CCMs do not release their Lease when
// they stop: it runs out leaseDurationSeconds after the last renewal, and the
// coordinator looks again at that moment.

// previousLeaseDuration is assumed for a Lease that says none: the default
// of every CCM built on k8s.io/cloud-provider (component-base).
const previousLeaseDuration = 15 * time.Second

// maxHolderQuoted bounds the holderIdentity quoted in conditions and events:
// the API server does not bound it (a pod's is <pod>_<uuid>).
const maxHolderQuoted = 320

// previousCCM is the previous CCM as its Lease says, and as the coordinator
// saw that Lease change.
type previousCCM struct {
	// lease is spec.takeOver.lease, <namespace>/<name>.
	lease string
	// found: the Lease exists.
	found bool
	// holder is its holderIdentity ("" for none), clipped (maxHolderQuoted).
	holder string
	// renewed is its renewTime (zero for none), by the holder's clock.
	renewed time.Time
	// duration is its leaseDurationSeconds (or previousLeaseDuration).
	duration time.Duration
	// seen is how the coordinator saw the Lease change.
	seen leaseSighting
}

// expires is when the previous CCM counts as stopped unless its Lease
// changes again (zero: it is not held). As client-go's leader election
// judges a Lease it does not hold, by the coordinator's own clock: a held
// Lease is live until it has been seen unchanged for its duration (a first
// look counts as a change). Its renewTime, written by the holder's clock,
// decides nothing: a holder whose clock is behind would look stopped while
// it renews, one ahead (or a forged renewTime) live for as long as it is
// ahead.
func (p previousCCM) expires() time.Time {
	if !p.seen.held {
		return time.Time{}
	}
	return p.seen.since.Add(p.seen.duration)
}

// live: the previous CCM counts as running.
func (p previousCCM) live(now time.Time) bool { return now.Before(p.expires()) }

// describe says what the Lease says, for conditions and events.
func (p previousCCM) describe(now time.Time) string {
	switch {
	case !p.found && p.seen.held && p.seen.holder == "":
		return fmt.Sprintf("Lease %s does not exist; it was held when this NativeCCM last waited for it", p.lease)
	case !p.found && p.seen.held:
		return fmt.Sprintf("Lease %s was deleted while held by %q", p.lease, p.seen.holder)
	case !p.found:
		return fmt.Sprintf("Lease %s does not exist", p.lease)
	case p.holder == "":
		return fmt.Sprintf("Lease %s has no holder", p.lease)
	case p.renewed.IsZero():
		return fmt.Sprintf("Lease %s is held by %q, never renewed", p.lease, p.holder)
	case p.renewed.After(now):
		// its holder's clock is ahead (or the value forged): a negative,
		// perhaps saturated "ago" says nothing
		return fmt.Sprintf("Lease %s is held by %q, renewed at %s, ahead of the coordinator's clock (lease duration %s)", p.lease, p.holder,
			p.renewed.UTC().Format(time.RFC3339), p.duration)
	}
	return fmt.Sprintf("Lease %s is held by %q, renewed %s ago (lease duration %s)", p.lease, p.holder,
		now.Sub(p.renewed).Round(time.Second), p.duration)
}

// leaseSightings are the previous CCMs' Leases as the coordinator last saw
// them, by spec.takeOver.lease (shared by the NativeCCMs naming the same).
type leaseSightings struct {
	mu   sync.Mutex
	seen map[string]leaseSighting
}

// leaseSighting is one Lease's record as last seen.
type leaseSighting struct {
	// record is what the Lease said ("" while it does not exist).
	record string
	// since is when the coordinator first saw it say that.
	since time.Time
	// held: it names a holder, or it was deleted while it did.
	held bool
	// holder and duration are the holder's and the Lease's duration (the last
	// ones seen, for a deleted Lease).
	holder   string
	duration time.Duration
	// changed: the record replaced another one the coordinator saw.
	changed bool
}

// see records what the Lease says now and returns its sighting. waited: the
// NativeCCM's status says it waited for this Lease held, which a coordinator
// that restarted since (or another replica) never saw.
func (s *leaseSightings) see(lease string, cur leaseSighting, now time.Time, waited bool) leaseSighting {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string]leaseSighting{}
	}
	prev, ok := s.seen[lease]
	if ok && prev.record == cur.record {
		return prev
	}
	if cur.record == "" && ok && prev.held {
		// deleted while held: its holder may run still (it creates the Lease
		// again); one more duration unchanged tells
		cur.held, cur.holder, cur.duration = true, prev.holder, prev.duration
	}
	if cur.record == "" && !ok && waited {
		// gone at the first look, and held when the NativeCCM last waited
		// (before a restart): deleted while held, as above, holder unknown
		cur.held, cur.duration = true, previousLeaseDuration
	}
	cur.since, cur.changed = now, ok
	s.seen[lease] = cur
	return cur
}

// ownReleaseName: name is the NativeCCM's release or one of its split
// members' (<release>--<value>); a release's Lease has its name.
func ownReleaseName(obj *v1.NativeCCM, name string) bool {
	return name == obj.ReleaseName() || strings.HasPrefix(name, obj.ReleaseName()+domain.SplitSeparator)
}

// ownLease: spec.takeOver.lease names a Lease of this NativeCCM's own
// releases (its own or a member's).
func (r *NativeCCMReconciler) ownLease(obj *v1.NativeCCM, ns, name string) bool {
	return ns == r.Namespace && ownReleaseName(obj, name)
}

// observePreviousCCM reads the Lease spec.takeOver names (one GET, shared
// with the reconcile's other Lease reads).
func (r *NativeCCMReconciler) observePreviousCCM(ctx context.Context, obj *v1.NativeCCM) (previousCCM, error) {
	ns, name, ok := obj.Spec.TakeOver.LeaseKey()
	p := previousCCM{lease: obj.Spec.TakeOver.Lease, duration: previousLeaseDuration}
	if !ok {
		// the CRD refuses it; an object stored before that rule is refused here
		return p, &stallError{reason: v1.InvalidTakeOverReason,
			err: fmt.Errorf("spec.takeOver.lease %q is not <namespace>/<name> of a Lease (e.g. kube-system/cloud-controller-manager)", p.lease)}
	}
	if r.ownLease(obj, ns, name) {
		return p, &stallError{reason: v1.InvalidTakeOverReason,
			err: fmt.Errorf("spec.takeOver.lease %q is the Lease of this NativeCCM's own CCM: name the Lease of the CCM it replaces (e.g. kube-system/cloud-controller-manager)", p.lease)}
	}
	if ns == r.Namespace && name == names.CoordinatorLease {
		return p, &stallError{reason: v1.InvalidTakeOverReason,
			err: fmt.Errorf("spec.takeOver.lease %q is the coordinator's own leader-election Lease: name the Lease of the CCM this NativeCCM replaces (e.g. kube-system/cloud-controller-manager)", p.lease)}
	}
	var l coordinationv1.Lease
	err := r.getLease(ctx, client.ObjectKey{Namespace: ns, Name: name}, &l)
	switch {
	case apierrors.IsNotFound(err):
		// Ready says it waited, written for this spec (this takeOver.lease):
		// the condition's observedGeneration, not its message, tells
		ready := conditions.Get(obj, meta.ReadyCondition)
		waited := ready != nil && ready.Reason == v1.WaitingForPreviousCCMReason && ready.ObservedGeneration == obj.Generation
		p.seen = r.previousLeases.see(p.lease, leaseSighting{}, r.now(), waited)
		return p, nil
	case err != nil:
		return p, err
	}
	p.found = true
	s := l.Spec
	var full string
	if s.HolderIdentity != nil {
		full = *s.HolderIdentity
		p.holder = safetext.Clip(full, maxHolderQuoted)
	}
	if s.RenewTime != nil {
		p.renewed = s.RenewTime.Time
	}
	if s.LeaseDurationSeconds != nil && *s.LeaseDurationSeconds > 0 {
		p.duration = time.Duration(*s.LeaseDurationSeconds) * time.Second
	}
	p.seen = r.previousLeases.see(p.lease, leaseSighting{
		record:   fmt.Sprintf("%s|%q|%s|%s", l.ResourceVersion, full, p.renewed.Format(time.RFC3339Nano), p.duration),
		held:     full != "",
		holder:   p.holder,
		duration: p.duration,
	}, r.now(), false)
	return p, nil
}

// waitForPreviousCCM holds a NativeCCM with spec.takeOver whose release is
// not installed yet while the previous CCM is live: Ready=False
// WaitingForPreviousCCM (a Warning event when that starts), looked at again
// when its Lease would run out. When the Lease cannot be read nothing is
// installed either (PreviousCCMLeaseUnreadable). A NativeCCM that waited
// and goes on gets a Normal PreviousCCMStopped event.
func (r *NativeCCMReconciler) waitForPreviousCCM(ctx context.Context, obj *v1.NativeCCM) error {
	return r.checkPreviousCCM(ctx, obj, false)
}

// checkPreviousCCM is waitForPreviousCCM. again: a look later in a pass
// whose earlier look let members be installed (takeOverCheck, after a
// member's Helm action). Ready may still say the pass began waiting, so a
// previous CCM running again (or its Lease unreadable) is said at once, and
// its stop, said by the earlier look, is not said twice.
func (r *NativeCCMReconciler) checkPreviousCCM(ctx context.Context, obj *v1.NativeCCM, again bool) error {
	if obj.Spec.TakeOver == nil {
		return nil
	}
	waitFor := func(reason string, err error) error {
		if again && conditions.HasAnyReason(obj, meta.ReadyCondition, reason) {
			r.event(obj, corev1.EventTypeWarning, reason, err.Error())
		}
		return r.waitFor(obj, reason, err)
	}
	now := r.now()
	p, err := r.observePreviousCCM(ctx, obj)
	if err != nil {
		if stall := (*stallError)(nil); errors.As(err, &stall) {
			return err
		}
		return waitFor(v1.PreviousCCMLeaseUnreadableReason, fmt.Errorf(
			"waiting: cannot tell whether the previous CCM runs: reading Lease %s (spec.takeOver.lease): %w; the coordinator must be allowed to get it: "+
				"the hybrid-ccm chart grants it from clouds.%s.takeOver.lease, the ccm-coordinator chart alone from takeOverLeases", p.lease, err, obj.Name))
	}
	if p.live(now) {
		msg := fmt.Sprintf("waiting for the previous CCM to stop: %s (spec.takeOver.lease), so it still runs and would initialize and delete nodes and serve "+
			"Services beside this one; uninstall it (docs/migrating-from-a-cloud-ccm.md): its Lease runs out %s after its last renewal, then %s",
			p.describe(now), p.seen.duration, installedWhat(obj, "is installed", "are installed"))
		wait := waitFor(v1.WaitingForPreviousCCMReason, fmt.Errorf("%s", msg))
		// looked at again when the Lease would run out unless renewed (seen
		// unchanged for its duration), and at least every half duration: the
		// last renewal is first seen at most half a duration late, so the
		// Lease runs out at most one and a half durations after it
		wait.(*waitError).after = max(min(p.expires().Sub(now), p.seen.duration/2)+500*time.Millisecond, time.Second)
		return wait
	}
	if !again && conditions.HasAnyReason(obj, meta.ReadyCondition, v1.WaitingForPreviousCCMReason, v1.PreviousCCMLeaseUnreadableReason) {
		r.event(obj, corev1.EventTypeNormal, v1.PreviousCCMStoppedReason,
			fmt.Sprintf("the previous CCM is not running: %s (spec.takeOver.lease); installing %s", p.describe(now), installedWhat(obj, "", "")))
	}
	return nil
}

// installedWhat names what a NativeCCM waiting for the previous CCM
// installs once it stops: its release, or its members' (split), followed
// by one or many.
func installedWhat(obj *v1.NativeCCM, one, many string) string {
	if obj.Spec.Domain != nil && obj.Spec.Domain.SplitBy != "" {
		return strings.TrimSpace(fmt.Sprintf("its member releases (%s%s<%s>) %s", obj.ReleaseName(), domain.SplitSeparator, obj.Spec.Domain.SplitBy, many))
	}
	return strings.TrimSpace(obj.ReleaseName() + " " + one)
}

// memberTakeOverCheck is asked just before a member of a split NativeCCM
// with spec.takeOver is installed (or a failed one reinstalled), in a pass
// that did not wait for the previous CCM before its members (some were
// recorded, and Helm's storage as cached held one). Whatever other members
// run, no member is installed while the CCM it replaces runs: members
// removed by hand one after the other (helm uninstall), the cache behind or
// a pass begun before the uninstall all come here, and a member for a new
// value would run beside the previous CCM as surely. The Lease is read again
// (the pass may have read it before it was taken). again: checkPreviousCCM.
func (r *NativeCCMReconciler) memberTakeOverCheck(ctx context.Context, obj *v1.NativeCCM, again bool) error {
	forgetLeases(ctx)
	return r.checkPreviousCCM(ctx, obj, again)
}

// previousCCMRuns reads the Lease of a NativeCCM with spec.takeOver again and
// says whether the previous CCM runs (or whether that cannot be told: the
// Lease unreadable), and why, before a failed upgrade is rolled back. A
// rollback puts the last deployed revision's objects back, the CCM among
// them when they are gone (a person's helm uninstall during the upgrade):
// while the previous CCM runs that is a second CCM beside it. The release
// is left failed; the next pass's upgrade waits for the previous CCM
// (runReleaseAction, a member's takeOverCheck).
func (r *NativeCCMReconciler) previousCCMRuns(ctx context.Context, obj *v1.NativeCCM) (bool, string) {
	if obj.Spec.TakeOver == nil {
		return false, ""
	}
	forgetLeases(ctx)
	now := r.now()
	p, err := r.observePreviousCCM(ctx, obj)
	if err != nil {
		return true, fmt.Sprintf("cannot tell whether the previous CCM runs: %v", err)
	}
	if p.live(now) {
		return true, "the previous CCM runs: " + p.describe(now) + " (spec.takeOver.lease)"
	}
	return false, ""
}

// rollbackHeld is the event of a failed upgrade of release not rolled back
// because of why (previousCCMRuns).
func rollbackHeld(release, why string) string {
	return fmt.Sprintf("release %s not rolled back after its failed upgrade: %s; a rollback would put this CCM back beside it. "+
		"The upgrade is tried again once the previous CCM is known to have stopped", release, why)
}

// PreviousCCMLiveMessage starts the Conflict message part of a previous CCM
// that runs again beside the installed release (PreviousCCMLive; the
// Conflict condition's reason is its first conflict's).
const PreviousCCMLiveMessage = "the previous CCM runs again beside this one"

// previousCCMConflict reports a previous CCM that is live again while this
// NativeCCM's release is installed (someone installed it again): both run.
// The coordinator uninstalls neither; a Lease it cannot read reports
// nothing here (the hold before the install said why).
func (r *NativeCCMReconciler) previousCCMConflict(ctx context.Context, obj *v1.NativeCCM) []Conflict {
	if obj.Spec.TakeOver == nil || (obj.Status.Release == nil && len(obj.Status.Members) == 0) {
		return nil
	}
	now := r.now()
	p, err := r.observePreviousCCM(ctx, obj)
	if err != nil {
		log.FromContext(ctx).V(1).Info("cannot read the previous CCM's Lease", "lease", p.lease, "error", err.Error())
		return nil
	}
	// Renewed within its duration by the coordinator's clock (a renewTime
	// ahead of it by more than a duration is not believed), or seen to change
	// since the last look and not yet run out (a holder whose clock is behind).
	// The first look after the coordinator starts is no change: a Lease left
	// by a previous CCM long gone is not reported for one duration each time.
	renewed := p.holder != "" && !p.renewed.IsZero() && p.renewed.After(now.Add(-p.duration)) && !p.renewed.After(now.Add(p.duration))
	if !renewed && !(p.found && p.seen.changed && p.live(now)) {
		return nil
	}
	// Nothing in the message moves from look to look (no renew time): a new
	// message is a status patch and a Warning event.
	return []Conflict{{v1.PreviousCCMLiveReason, fmt.Sprintf("%s: Lease %s is held by %q and renewed within its lease duration (%s) (spec.takeOver.lease); uninstall it",
		PreviousCCMLiveMessage, p.lease, p.holder, p.duration)}}
}

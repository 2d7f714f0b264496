package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// releaseAction is what the release step does, chosen by nextAction from
// whether the release is wanted and the state of its latest revision.
type releaseAction int

const (
	// actionNone: deployed from the desired state (same digest), or neither
	// wanted nor there.
	actionNone releaseAction = iota
	// actionInstall: wanted, and there is no release.
	actionInstall
	// actionReinstall: wanted, and no revision was ever deployed (a failed
	// first install), or the latest is uninstalled or being uninstalled
	// (helm uninstall --keep-history by hand, or one under way): remove it,
	// then install, as a first install (spec.takeOver waits for the CCM it
	// replaces). An upgrade would fail and roll back to an older revision,
	// putting the removed CCM back without that check.
	actionReinstall
	// actionUpgrade: wanted and out of date (or failed) with a revision that
	// was deployed once; a failed upgrade is rolled back to it at once and
	// retried with backoff.
	actionUpgrade
	// actionUninstall: there, and not wanted.
	actionUninstall
)

// nextAction chooses the release action. info is the latest revision (nil:
// no release), digest the desired state's (Request.Digest).
func nextAction(want bool, info *release.Info, digest string) releaseAction {
	switch {
	case !want && info == nil:
		return actionNone
	case !want:
		return actionUninstall
	case info.Deployed() && info.Digest == digest:
		return actionNone
	case info == nil:
		return actionInstall
	case info.LastDeployed == 0 || info.Status == release.StatusUninstalled || info.Status == release.StatusUninstalling:
		return actionReinstall
	default:
		return actionUpgrade
	}
}

// errStatusBehind: Install found the release there although the status
// said there was none (an earlier reconcile installed it, and the status read
// here predates that). Not a failure: the action is chosen again from the
// release's history.
var errStatusBehind = errors.New("release installed since the status was read")

// reconcileRelease makes a wanted release what req describes: its Lease
// first (created ahead: the CCM may not create leases), then the action
// nextAction chooses from the release's state.
//
// forced (a reconcile requested with the reconcile.fluxcd.io/requestedAt
// annotation) reads the release history even when nothing changed.
func (r *NativeCCMReconciler) reconcileRelease(ctx context.Context, obj *v1.NativeCCM, req release.Request, forced bool) error {
	if err := r.ensureLease(ctx, req.Lifecycle); err != nil {
		return err
	}
	// With no release recorded and no failure since, there is none: go
	// straight to Install, which refuses a name in use. This saves a
	// release-history read on the path that matters most (the first node of
	// a platform appears).
	assumeAbsent := obj.Status.Release == nil && obj.Status.Failures == 0
	// A release the status records as deployed from the desired state, whose
	// latest revision Helm's storage (the cached labels of its Secrets) still
	// says is that one: nothing to do, and no history read.
	if info, ok := r.unchangedRelease(ctx, obj, req.Digest()); ok && !forced {
		r.upToDate(obj, info)
		return nil
	}
	info, err := r.observeRelease(ctx, req, !assumeAbsent)
	if err != nil {
		return err
	}
	err = r.runReleaseAction(ctx, obj, req, info, assumeAbsent)
	if !errors.Is(err, errStatusBehind) {
		return err
	}
	ctrl.LoggerFrom(ctx).V(1).Info("release already installed; reading its history")
	if info, err = r.observeRelease(ctx, req, true); err != nil {
		return err
	}
	return r.runReleaseAction(ctx, obj, req, info, false)
}

// unchangedRelease returns the release status.release records when that is
// the deployed latest revision, made from digest, and the labels of Helm's
// release Secrets in the manager's cache agree: no revision after it, and it
// is still deployed with that digest. Then the release step has nothing to
// do and needs no read of the release history (which fetches and decodes
// every revision kept). Anything else, or any doubt (the cache behind an
// action just taken), is false: the caller reads the history.
func (r *NativeCCMReconciler) unchangedRelease(ctx context.Context, obj *v1.NativeCCM, digest string) (*release.Info, bool) {
	st := obj.Status.Release
	if st == nil || obj.Status.Failures != 0 || st.Status != release.StatusDeployed || st.Digest != digest || st.Namespace != r.Namespace {
		return nil, false
	}
	if !r.deployedLatest(ctx, st.Name, st.Revision, digest) {
		return nil, false
	}
	return &release.Info{
		Name: st.Name, Namespace: st.Namespace, Revision: st.Revision, Status: st.Status,
		Chart: st.Chart, Digest: st.Digest, LastDeployed: st.Revision,
	}, true
}

// deployedLatest reports whether the labels of Helm's release Secrets of
// release name in the manager's cache say its latest revision is revision,
// deployed, made from digest.
func (r *NativeCCMReconciler) deployedLatest(ctx context.Context, name string, revision int, digest string) bool {
	var secrets corev1.SecretList
	if err := r.List(ctx, &secrets, client.InNamespace(r.Namespace), client.MatchingLabels{
		release.StorageOwnerLabel: release.StorageOwner, release.StorageNameLabel: name,
	}); err != nil {
		return false
	}
	latest, status, latestDigest := 0, "", ""
	for i := range secrets.Items {
		s := &secrets.Items[i]
		if s.Type != release.HelmStorageType {
			continue
		}
		v, err := strconv.Atoi(s.Labels[release.StorageVersionLabel])
		if err != nil {
			return false
		}
		if v > latest {
			latest, status, latestDigest = v, s.Labels[release.StorageStatusLabel], s.Labels[release.DigestLabel]
		}
	}
	return revision > 0 && latest == revision && status == release.StatusDeployed && latestDigest == digest
}

// observeRelease reads the release's latest revision (nil: none) unless
// readHistory is false. A release left pending by an interrupted action (a
// restart) is marked failed first, so that the next action can run.
func (r *NativeCCMReconciler) observeRelease(ctx context.Context, req release.Request, readHistory bool) (*release.Info, error) {
	if !readHistory {
		return nil, nil
	}
	info, err := r.Engine.Get(ctx, req.Namespace, req.Name)
	if err != nil || !info.Pending() {
		return info, err
	}
	ctrl.LoggerFrom(ctx).Info("release stuck in a pending state; marking it failed", "status", info.Status)
	if err := r.Engine.Unlock(ctx, req.Namespace, req.Name); err != nil {
		return nil, err
	}
	return r.Engine.Get(ctx, req.Namespace, req.Name)
}

// runReleaseAction runs the action nextAction chooses for a wanted release.
// assumeAbsent says info is nil because the history was not read.
func (r *NativeCCMReconciler) runReleaseAction(ctx context.Context, obj *v1.NativeCCM, req release.Request, info *release.Info, assumeAbsent bool) error {
	action := nextAction(true, info, req.Digest())
	if action != actionNone {
		defer forgetLeases(ctx)
	}
	switch action {
	case actionNone:
		r.upToDate(obj, info)
		return nil
	case actionInstall, actionReinstall:
		if obj.Spec.TakeOver != nil && obj.Status.Release != nil {
			// recorded, and gone from Helm's storage or never deployed
			// (helm uninstall by hand, also caught half-way): a first
			// install again, which waits for the CCM it replaces as the
			// first one did (takeover.go; a status without a release waited
			// before the gate step)
			obj.Status.Release, obj.Status.Leader = nil, nil
			forgetLeases(ctx) // the pass may have read the Lease before it was taken
			if err := r.waitForPreviousCCM(ctx, obj); err != nil {
				return err
			}
		}
	}
	if action == actionUpgrade && obj.Spec.TakeOver != nil && !info.Deployed() {
		// The latest revision failed (an upgrade or a rollback that did not
		// finish, a person's helm uninstall during one): the CCM's objects
		// may be gone, and an upgrade creates them again as an install
		// does, so it waits for the previous CCM as an install does.
		forgetLeases(ctx)
		if err := r.waitForPreviousCCM(ctx, obj); err != nil {
			return err
		}
	}
	switch action {
	case actionInstall:
		return r.install(ctx, obj, req, assumeAbsent)
	case actionReinstall:
		ctrl.LoggerFrom(ctx).Info("removing the release's records before installing it again (a failed first install, or uninstalled by hand keeping its history)", "revision", info.Revision, "status", info.Status)
		if err := r.Engine.Uninstall(ctx, req.Namespace, req.Name); err != nil {
			return err
		}
		return r.install(ctx, obj, req, false)
	default:
		return r.upgrade(ctx, obj, req)
	}
}

// upToDate records a release deployed from the desired state.
func (r *NativeCCMReconciler) upToDate(obj *v1.NativeCCM, info *release.Info) {
	r.recordRelease(obj, info)
	obj.Status.Failures = 0
	// Keep the reason of the action that made this revision while nothing changes.
	if !conditions.IsTrue(obj, v1.InstalledCondition) {
		conditions.MarkTrue(obj, v1.InstalledCondition, v1.UpToDateReason, "release %s revision %d is up to date", info.Name, info.Revision)
	}
	reason, msg := readyReason(obj), readyMessage(obj, info)
	if reason != v1.UpToDateReason || !conditions.IsTrue(obj, meta.ReadyCondition) ||
		!conditions.HasAnyReason(obj, meta.ReadyCondition, v1.InstallSucceededReason, v1.UpgradeSucceededReason, v1.UpToDateReason) {
		// Ready comes back (e.g. the CCM is healthy again): with the
		// reason of the action that made this revision, as Installed says.
		if c := conditions.Get(obj, v1.InstalledCondition); reason == v1.UpToDateReason && c != nil &&
			c.Status == metav1.ConditionTrue && (c.Reason == v1.InstallSucceededReason || c.Reason == v1.UpgradeSucceededReason) {
			reason, msg = c.Reason, c.Message
		}
		conditions.MarkTrue(obj, meta.ReadyCondition, reason, "%s", msg)
	}
}

// install installs the release. assumeAbsent: the history was not read, so
// a name in use means the status is behind (errStatusBehind), not a failure.
func (r *NativeCCMReconciler) install(ctx context.Context, obj *v1.NativeCCM, req release.Request, assumeAbsent bool) error {
	info, err := r.Engine.Install(ctx, req)
	switch {
	case errors.Is(err, release.ErrNameInUse) && assumeAbsent:
		return errStatusBehind
	case err != nil:
		return r.actionFailed(obj, info, v1.InstallFailedReason, err)
	}
	r.actionSucceeded(obj, info, v1.InstallSucceededReason, fmt.Sprintf("installed release %s revision %d (%s)", info.Name, info.Revision, info.Chart))
	return nil
}

// upgrade upgrades the release; a failed upgrade that changed the cluster is
// rolled back to the last deployed revision at once (and retried with
// backoff as the error is returned).
func (r *NativeCCMReconciler) upgrade(ctx context.Context, obj *v1.NativeCCM, req release.Request) error {
	info, err := r.Engine.Upgrade(ctx, req)
	if err == nil {
		r.actionSucceeded(obj, info, v1.UpgradeSucceededReason, fmt.Sprintf("upgraded release %s to revision %d (%s)", info.Name, info.Revision, info.Chart))
		return nil
	}
	uerr := r.actionFailed(obj, info, v1.UpgradeFailedReason, err)
	var chartErr *release.ChartError
	if errors.As(err, &chartErr) || errors.As(err, new(*release.RefusedError)) {
		return uerr // nothing was changed in the cluster
	}
	if runs, why := r.previousCCMRuns(ctx, obj); runs {
		r.event(obj, corev1.EventTypeWarning, v1.WaitingForPreviousCCMReason, rollbackHeld(req.Name, why))
		return uerr
	}
	rb, rerr := r.Engine.Rollback(ctx, req.Namespace, req.Name)
	if rerr != nil {
		r.event(obj, corev1.EventTypeWarning, v1.RollbackFailedReason, rerr.Error())
		return errors.Join(uerr, rerr)
	}
	r.recordRelease(obj, rb)
	r.event(obj, corev1.EventTypeNormal, v1.RollbackSucceededReason, fmt.Sprintf("rolled back release %s to revision %d (now revision %d)", rb.Name, rb.LastDeployed, rb.Revision))
	return uerr
}

// reconcileAbsent makes a release that is not wanted absent: uninstalled if
// it is there (nextAction), its Lease removed, and the status saying why
// (reason: InstallDisabled or NoNodes). The gate is not looked at for a
// release that is not wanted, so Gated goes, as Healthy does.
func (r *NativeCCMReconciler) reconcileAbsent(ctx context.Context, obj *v1.NativeCCM, reason string) error {
	r.gateChecks.forget(obj.UID)
	name := obj.ReleaseName()
	info, err := r.Engine.Get(ctx, r.Namespace, name)
	if err != nil {
		return err
	}
	msg := fmt.Sprintf("no node has %s=%s", names.PlatformLabel, obj.Spec.Platform)
	if reason == v1.InstallDisabledReason {
		msg = "install policy is Never"
	}
	if nextAction(false, info, "") == actionUninstall {
		if err := r.holdForLoadBalancers(ctx, obj); err != nil {
			return err
		}
		if err := r.uninstall(ctx, obj, msg); err != nil {
			return err
		}
	}
	if err := r.deleteLease(ctx, name); err != nil {
		return err
	}
	obj.Status.Release = nil
	obj.Status.Failures = 0
	obj.Status.Leader = nil
	conditions.Delete(obj, v1.HealthyCondition)
	conditions.Delete(obj, v1.GatedCondition)
	conditions.MarkFalse(obj, v1.InstalledCondition, reason, "%s", msg)
	conditions.MarkTrue(obj, meta.ReadyCondition, reason, "not installed: %s", msg)
	return nil
}

// uninstall removes the release; why ends the event's message.
func (r *NativeCCMReconciler) uninstall(ctx context.Context, obj *v1.NativeCCM, why string) error {
	name := obj.ReleaseName()
	if err := r.Engine.Uninstall(ctx, r.Namespace, name); err != nil {
		conditions.MarkFalse(obj, meta.ReadyCondition, v1.UninstallFailedReason, "%s", err)
		r.event(obj, corev1.EventTypeWarning, v1.UninstallFailedReason, err.Error())
		return err
	}
	r.event(obj, corev1.EventTypeNormal, v1.UninstallSucceededReason, fmt.Sprintf("release %s/%s uninstalled: %s", r.Namespace, name, why))
	return nil
}

// ensureLease creates the release's leader-election Lease, with no holder,
// unless it exists: native CCMs may only get and update their own Lease
// (a CCM that could create leases could squat any lease of the namespace).
// client-go's leader election takes an existing Lease with a Get and an Update.
// A Lease someone else holds is reported by the health check.
func (r *NativeCCMReconciler) ensureLease(ctx context.Context, l release.Lifecycle) error {
	lease := l.Lease()
	err := r.getLease(ctx, client.ObjectKeyFromObject(lease), &coordinationv1.Lease{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	forgetLeases(ctx)
	if err := r.Create(ctx, lease, client.FieldOwner(names.CoordinatorController)); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create lease %s/%s: %w", lease.Namespace, lease.Name, err)
	}
	return nil
}

// deleteLease removes the Lease ensureLease created for a release (only if
// it carries the coordinator's label: a Lease of that name it did not create
// is not its to delete).
func (r *NativeCCMReconciler) deleteLease(ctx context.Context, releaseName string) error {
	var lease coordinationv1.Lease
	err := r.getLease(ctx, client.ObjectKey{Namespace: r.Namespace, Name: releaseName}, &lease)
	if apierrors.IsNotFound(err) || (err == nil && lease.Labels[release.ManagedByLabel] != release.ManagedByValue) {
		return nil
	}
	forgetLeases(ctx)
	if err == nil {
		err = r.Delete(ctx, &lease, client.Preconditions{UID: &lease.UID})
	}
	if client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete lease %s/%s: %w", r.Namespace, releaseName, err)
	}
	return nil
}

func (r *NativeCCMReconciler) actionSucceeded(obj *v1.NativeCCM, info *release.Info, reason, msg string) {
	r.recordRelease(obj, info)
	obj.Status.Failures = 0
	conditions.MarkTrue(obj, v1.InstalledCondition, reason, "%s", msg)
	conditions.MarkTrue(obj, meta.ReadyCondition, reason, "%s", msg)
	r.event(obj, corev1.EventTypeNormal, reason, msg)
}

func (r *NativeCCMReconciler) actionFailed(obj *v1.NativeCCM, info *release.Info, reason string, err error) error {
	if info != nil {
		r.recordRelease(obj, info)
	}
	obj.Status.Failures++
	refused := errors.As(err, new(*release.RefusedError))
	switch {
	case errors.As(err, new(*release.ChartError)):
		reason = v1.ChartLoadFailedReason
	case refused:
		reason = v1.UnsafePodSpecReason
	}
	conditions.MarkFalse(obj, meta.ReadyCondition, reason, "%s", err)
	if reason != v1.UpgradeFailedReason {
		conditions.MarkFalse(obj, v1.InstalledCondition, reason, "%s", err)
	}
	r.event(obj, corev1.EventTypeWarning, reason, err.Error())
	if refused {
		// nothing was sent to the cluster; only a change of the profile, the
		// overrides or the chart can help
		return &stallError{reason: reason, err: err}
	}
	return err
}

func (r *NativeCCMReconciler) recordRelease(obj *v1.NativeCCM, info *release.Info) {
	if info == nil {
		return
	}
	obj.Status.Release = &v1.ReleaseStatus{
		Name: info.Name, Namespace: info.Namespace, Revision: info.Revision,
		Chart: info.Chart, Status: info.Status, Digest: info.Digest,
	}
}

func readyReason(obj *v1.NativeCCM) string {
	if obj.Status.Nodes == 0 && obj.InstallPolicy() == v1.InstallAuto {
		return v1.UninstallPendingReason
	}
	return v1.UpToDateReason
}

func readyMessage(obj *v1.NativeCCM, info *release.Info) string {
	if obj.Status.Nodes == 0 && obj.InstallPolicy() == v1.InstallAuto && obj.Status.NoNodesSince != nil {
		return fmt.Sprintf("release %s revision %d deployed; no nodes since %s, uninstalling after the grace period", info.Name, info.Revision, obj.Status.NoNodesSince.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("release %s revision %d deployed for %d node(s)", info.Name, info.Revision, obj.Status.Nodes)
}

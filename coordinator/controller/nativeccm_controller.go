package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	runtimectrl "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/patch"
	"github.com/fluxcd/pkg/runtime/predicates"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kuberecorder "k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/yaml"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// ControllerName names the controller in events, logs and field ownership.
const ControllerName = "ccm-coordinator"

// ReleaseEngine runs one Helm action per call (coordinator/release/helm.Engine).
type ReleaseEngine interface {
	Get(ctx context.Context, namespace, name string) (*release.Info, error)
	Install(ctx context.Context, req release.Request) (*release.Info, error)
	Upgrade(ctx context.Context, req release.Request) (*release.Info, error)
	Rollback(ctx context.Context, namespace, name string) (*release.Info, error)
	Uninstall(ctx context.Context, namespace, name string) error
	Unlock(ctx context.Context, namespace, name string) error
}

// Profiles resolves profile names (profile.Set).
type Profiles interface {
	Get(name string) (*profile.Profile, bool)
}

// MutatorsFunc returns extra post-render mutators for a release (the gate's
// sidecar, kubeconfig and policy). It may set conditions on the NativeCCM (e.g.
// Gated). Nil means none.
type MutatorsFunc func(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile, l release.Lifecycle) ([]release.Mutator, error)

// NativeCCMReconciler reconciles NativeCCM objects.
type NativeCCMReconciler struct {
	client.Client
	// APIReader reads objects the manager does not cache (Leases).
	APIReader client.Reader
	// EventRecorder records Kubernetes events (and forwards them when configured).
	EventRecorder kuberecorder.EventRecorder
	runtimectrl.Metrics

	Engine   ReleaseEngine
	Profiles Profiles
	// Mutators is the hook for the gate; nil for none.
	Mutators MutatorsFunc

	// Namespace holds the releases, their ServiceAccounts, leases and the
	// credentials Secrets.
	Namespace string
	// UninstallGracePeriod is the default time Auto keeps a release after the
	// last node of its platform is gone.
	UninstallGracePeriod time.Duration
	// RetryInterval is how often a waiting NativeCCM (credentials missing) is
	// looked at again, besides Secret events.
	RetryInterval time.Duration
	// Interval re-checks a Ready NativeCCM (drift, conflicts).
	Interval time.Duration
	// Health says how the installed CCM is judged (lease duration, restarts).
	Health HealthOptions

	now func() time.Time
}

// Options of the controller.
type Options struct {
	MaxConcurrentReconciles int
	RateLimiter             runtimectrl.RateLimiterOptions
}

// owned are the condition types this reconciler writes.
var owned = []string{
	meta.ReadyCondition, meta.ReconcilingCondition, meta.StalledCondition,
	v1.ProfileResolvedCondition, v1.InstalledCondition, v1.ConflictCondition,
	v1.HealthyCondition, v1.GatedCondition,
}

// SetupWithManager registers the reconciler and its watches.
func (r *NativeCCMReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if r.now == nil {
		r.now = time.Now
	}
	if r.RetryInterval == 0 {
		r.RetryInterval = 30 * time.Second
	}
	if r.Interval == 0 {
		r.Interval = 10 * time.Minute
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1.NativeCCM{}, platformIndex, func(o client.Object) []string {
		return []string{o.(*v1.NativeCCM).Spec.Platform}
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.NativeCCM{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicates.ReconcileRequestedPredicate{}))).
		Watches(&corev1.Node{}, nodeHandler{r}).
		Watches(&corev1.Secret{}, secretHandler{r}).
		Watches(&corev1.Pod{}, podHandler{}).
		Watches(&v1.NativeCCM{}, loadBalancerHandler{r}).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: opts.MaxConcurrentReconciles,
			RateLimiter:             runtimectrl.GetRateLimiter(opts.RateLimiter),
		}).
		Named("nativeccm").
		Complete(r)
}

// waitError is a wait that is not a failure: the reconciler requeues after it.
type waitError struct {
	reason string
	after  time.Duration
	err    error
}

func (w *waitError) Error() string { return w.err.Error() }

// stallError is a configuration error: retrying cannot help until the spec or
// the profiles change.
type stallError struct {
	reason string
	err    error
}

func (s *stallError) Error() string { return s.err.Error() }

// Reconcile implements reconcile.Reconciler.
func (r *NativeCCMReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	start := time.Now()
	log := ctrl.LoggerFrom(ctx)

	obj := &v1.NativeCCM{}
	if err := r.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	patcher := patch.NewSerialPatcher(obj, r.Client)

	defer func() {
		// A NativeCCM whose finalizer we just removed is gone: nothing to patch.
		if !obj.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(obj, v1.Finalizer) {
			r.Metrics.RecordDuration(ctx, obj, start)
			return
		}
		result, retErr = r.summarize(ctx, obj, patcher, result, retErr)
		r.Metrics.RecordDuration(ctx, obj, start)
		r.Metrics.RecordReadiness(ctx, obj)
		r.Metrics.RecordStalled(ctx, obj)
		r.Metrics.RecordReconciling(ctx, obj)
	}()

	if !obj.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, obj)
	}
	if !controllerutil.ContainsFinalizer(obj, v1.Finalizer) {
		// Persist the finalizer before anything is installed.
		controllerutil.AddFinalizer(obj, v1.Finalizer)
		if err := patcher.Patch(ctx, obj, patch.WithFieldOwner(ControllerName)); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.Metrics.RecordSuspend(ctx, obj, obj.Spec.Suspend)
	if obj.Spec.Suspend {
		log.Info("reconciliation is suspended")
		return ctrl.Result{}, nil
	}
	if v, ok := meta.ReconcileAnnotationValue(obj.GetAnnotations()); ok {
		obj.Status.SetLastHandledReconcileRequest(v)
	}
	return r.reconcile(ctx, obj)
}

// summarize derives Reconciling/Stalled from the outcome, writes the status
// once, and bumps observedGeneration only when the generation was fully handled.
func (r *NativeCCMReconciler) summarize(ctx context.Context, obj *v1.NativeCCM, patcher *patch.SerialPatcher, result ctrl.Result, retErr error) (ctrl.Result, error) {
	var wait *waitError
	var stall *stallError
	done := false
	switch {
	case errors.As(retErr, &stall):
		conditions.MarkStalled(obj, stall.reason, "%s", stall.err)
		conditions.Delete(obj, meta.ReconcilingCondition)
		retErr, done = nil, true
		result = ctrl.Result{}
	case errors.As(retErr, &wait):
		conditions.Delete(obj, meta.StalledCondition)
		conditions.MarkReconciling(obj, meta.ProgressingWithRetryReason, "%s", wait.err)
		result, retErr = ctrl.Result{RequeueAfter: wait.after}, nil
	case retErr != nil:
		conditions.Delete(obj, meta.StalledCondition)
		conditions.MarkReconciling(obj, meta.ProgressingWithRetryReason, "%s", retErr)
	default:
		conditions.Delete(obj, meta.StalledCondition)
		conditions.Delete(obj, meta.ReconcilingCondition)
		done = true
	}
	opts := []patch.Option{patch.WithOwnedConditions{Conditions: owned}, patch.WithFieldOwner(ControllerName)}
	if done {
		opts = append(opts, patch.WithStatusObservedGeneration{})
	}
	if err := patcher.Patch(ctx, obj, opts...); err != nil {
		if !obj.DeletionTimestamp.IsZero() && apierrors.IsNotFound(err) {
			return result, retErr
		}
		return result, errors.Join(retErr, fmt.Errorf("patch status: %w", err))
	}
	return result, retErr
}

func (r *NativeCCMReconciler) reconcileDelete(ctx context.Context, obj *v1.NativeCCM) (ctrl.Result, error) {
	name := obj.ReleaseName()
	if err := r.Engine.Uninstall(ctx, r.Namespace, name); err != nil {
		conditions.MarkFalse(obj, meta.ReadyCondition, v1.UninstallFailedReason, "%s", err)
		r.event(obj, corev1.EventTypeWarning, v1.UninstallFailedReason, err.Error())
		return ctrl.Result{}, err
	}
	r.event(obj, corev1.EventTypeNormal, v1.UninstallSucceededReason, fmt.Sprintf("release %s/%s uninstalled: NativeCCM deleted", r.Namespace, name))
	if err := r.deleteLease(ctx, name); err != nil {
		return ctrl.Result{}, err
	}
	// The fence needs no clean-up: its parameter for this CCM is the
	// NativeCCM itself, which goes once the finalizer is removed, after the
	// uninstall has taken the CCM's RBAC.
	controllerutil.RemoveFinalizer(obj, v1.Finalizer)
	// Only the finalizer changes; the deferred summary skips the status.
	return ctrl.Result{}, r.Update(ctx, obj)
}

func (r *NativeCCMReconciler) reconcile(ctx context.Context, obj *v1.NativeCCM) (ctrl.Result, error) {
	if obj.Generation != obj.Status.ObservedGeneration {
		conditions.MarkReconciling(obj, meta.ProgressingReason, "reconciling generation %d", obj.Generation)
	}

	// 1. Profile + overrides → the desired release.
	p, req, err := r.resolve(ctx, obj)
	if err != nil {
		return ctrl.Result{}, err
	}

	// 2. Nodes of the platform.
	nodes, err := r.observeNodes(ctx, obj)
	if err != nil {
		return ctrl.Result{}, err
	}

	// 3. Conflicts in the cluster (reported, never blocking).
	if err := r.detectConflicts(ctx, obj, nodes); err != nil {
		return ctrl.Result{}, err
	}

	// 4. Should the release exist?
	want, reason, requeue := r.wanted(obj)
	if !want {
		return ctrl.Result{RequeueAfter: r.Interval}, r.ensureAbsent(ctx, obj, reason)
	}

	// 5. Credentials.
	if err := r.checkCredentials(ctx, obj, p); err != nil {
		return ctrl.Result{}, err
	}

	// 6. Its Lease, created ahead (the CCM may not create leases), then
	// install, upgrade or leave alone.
	if err := r.ensureLease(ctx, req.Lifecycle); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.ensureRelease(ctx, obj, req); err != nil {
		return ctrl.Result{}, err
	}

	// 7. Is the installed CCM working? (Ready says so.)
	again, err := r.checkHealth(ctx, obj, req.Lifecycle)
	if err != nil {
		return ctrl.Result{}, err
	}
	after := r.Interval
	for _, d := range []time.Duration{requeue, again} {
		if d > 0 && d < after {
			after = d
		}
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// resolve finds the profile and builds the release request.
func (r *NativeCCMReconciler) resolve(ctx context.Context, obj *v1.NativeCCM) (*profile.Profile, release.Request, error) {
	stall := func(reason string, err error) (*profile.Profile, release.Request, error) {
		conditions.MarkFalse(obj, v1.ProfileResolvedCondition, reason, "%s", err)
		conditions.MarkFalse(obj, meta.ReadyCondition, reason, "%s", err)
		r.event(obj, corev1.EventTypeWarning, reason, err.Error())
		return nil, release.Request{}, &stallError{reason: reason, err: err}
	}
	p, ok := r.Profiles.Get(obj.ProfileName())
	if !ok {
		return stall(v1.ProfileNotFoundReason, fmt.Errorf("profile %q not found", obj.ProfileName()))
	}
	if !p.Routes(obj.Spec.Platform) {
		return stall(v1.PlatformNotRoutedReason, fmt.Errorf("profile %q routes platforms %v, not %q", p.Name, p.Platforms, obj.Spec.Platform))
	}
	in := release.Instance{
		ReleaseName: obj.ReleaseName(),
		Namespace:   r.Namespace,
		Platform:    obj.Spec.Platform,
	}
	if c := obj.Spec.Credentials; c != nil {
		in.SecretName = c.SecretRef.Name
	}
	if o := obj.Spec.Overrides; o != nil {
		if o.Image != nil {
			in.ImageRepository, in.ImageTag = o.Image.Repository, o.Image.Tag
		}
		in.Args, in.Env = o.Args, o.Env
		if o.Values != nil && len(o.Values.Raw) > 0 {
			var vals map[string]any
			if err := yaml.Unmarshal(o.Values.Raw, &vals); err != nil {
				return stall(v1.InvalidOverridesReason, fmt.Errorf("spec.overrides.values: %w", err))
			}
			in.Values = vals
		}
	}
	lb, _, err := r.loadBalancers(ctx, obj)
	if err != nil {
		return nil, release.Request{}, err
	}
	in.LoadBalancers = lb
	req, err := release.FromProfile(p, in)
	switch {
	case errors.Is(err, release.ErrLoadBalancersUnsupported):
		return stall(v1.LoadBalancersUnsupportedReason, err)
	case err != nil:
		return stall(v1.InvalidOverridesReason, err)
	}
	conditions.MarkTrue(obj, v1.ProfileResolvedCondition, v1.ProfileResolvedReason, "profile %s, chart source %s", p.Name, p.Chart.Source)
	if r.Mutators != nil {
		muts, err := r.Mutators(ctx, obj, p, req.Lifecycle)
		switch {
		case errors.Is(err, gate.ErrConfig):
			// only a change of the NativeCCM or its profile can fix it
			return stall(v1.InvalidProfileReason, err)
		case err != nil:
			// the API server (the fence could not be written): retried with
			// backoff; nothing is installed or upgraded until it is written
			conditions.MarkFalse(obj, meta.ReadyCondition, gate.GateFailedReason, "%s", err)
			r.event(obj, corev1.EventTypeWarning, gate.GateFailedReason, err.Error())
			return nil, release.Request{}, err
		}
		req.Mutators = muts
	}
	return p, req, nil
}

// observeNodes counts the platform's nodes and tracks when the last one went.
func (r *NativeCCMReconciler) observeNodes(ctx context.Context, obj *v1.NativeCCM) ([]corev1.Node, error) {
	var list corev1.NodeList
	if err := r.List(ctx, &list, client.MatchingLabels{v1.PlatformLabel: obj.Spec.Platform}); err != nil {
		return nil, fmt.Errorf("list nodes of platform %s: %w", obj.Spec.Platform, err)
	}
	obj.Status.Nodes = int32(len(list.Items))
	var empty int32
	for _, n := range list.Items {
		if n.Spec.ProviderID == "" {
			empty++
		}
	}
	obj.Status.NodesWithoutProviderID = empty
	switch {
	case len(list.Items) > 0:
		obj.Status.NoNodesSince = nil
	case obj.Status.NoNodesSince == nil:
		now := metav1.NewTime(r.now())
		obj.Status.NoNodesSince = &now
	}
	return list.Items, nil
}

// wanted applies the install policy. requeue > 0 asks for a look again when a
// grace period ends.
func (r *NativeCCMReconciler) wanted(obj *v1.NativeCCM) (want bool, reason string, requeue time.Duration) {
	switch obj.InstallPolicy() {
	case v1.InstallNever:
		return false, v1.InstallDisabledReason, 0
	case v1.InstallAlways:
		return true, "", 0
	}
	if obj.Status.Nodes > 0 {
		return true, "", 0
	}
	if obj.Status.Release == nil {
		return false, v1.NoNodesReason, 0
	}
	grace := r.UninstallGracePeriod
	if obj.Spec.UninstallGracePeriod != nil {
		grace = obj.Spec.UninstallGracePeriod.Duration
	}
	left := obj.Status.NoNodesSince.Add(grace).Sub(r.now())
	if left > 0 {
		return true, v1.UninstallPendingReason, left
	}
	return false, v1.NoNodesReason, 0
}

// ensureAbsent uninstalls the release if there is one.
func (r *NativeCCMReconciler) ensureAbsent(ctx context.Context, obj *v1.NativeCCM, reason string) error {
	name := obj.ReleaseName()
	info, err := r.Engine.Get(ctx, r.Namespace, name)
	if err != nil {
		return err
	}
	msg := fmt.Sprintf("no node has %s=%s", v1.PlatformLabel, obj.Spec.Platform)
	if reason == v1.InstallDisabledReason {
		msg = "install policy is Never"
	}
	if info != nil {
		if err := r.Engine.Uninstall(ctx, r.Namespace, name); err != nil {
			conditions.MarkFalse(obj, meta.ReadyCondition, v1.UninstallFailedReason, "%s", err)
			r.event(obj, corev1.EventTypeWarning, v1.UninstallFailedReason, err.Error())
			return err
		}
		r.event(obj, corev1.EventTypeNormal, v1.UninstallSucceededReason, fmt.Sprintf("release %s/%s uninstalled: %s", r.Namespace, name, msg))
	}
	if err := r.deleteLease(ctx, name); err != nil {
		return err
	}
	obj.Status.Release = nil
	obj.Status.Failures = 0
	obj.Status.Leader = nil
	conditions.Delete(obj, v1.HealthyCondition)
	conditions.MarkFalse(obj, v1.InstalledCondition, reason, "%s", msg)
	conditions.MarkTrue(obj, meta.ReadyCondition, reason, "not installed: %s", msg)
	return nil
}

// ensureLease creates the release's leader-election Lease, with no holder,
// unless it exists: native CCMs may only get and update their own Lease
// (a CCM that could create leases could squat any lease of the namespace).
// client-go's leader election takes an existing Lease with a Get and an Update.
// A Lease someone else holds is reported by the health check.
func (r *NativeCCMReconciler) ensureLease(ctx context.Context, l release.Lifecycle) error {
	lease := l.Lease()
	err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(lease), &coordinationv1.Lease{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	if err := r.Create(ctx, lease, client.FieldOwner(ControllerName)); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create lease %s/%s: %w", lease.Namespace, lease.Name, err)
	}
	return nil
}

// deleteLease removes the Lease ensureLease created for a release (only if
// it carries the coordinator's label: a Lease of that name it did not create
// is not its to delete).
func (r *NativeCCMReconciler) deleteLease(ctx context.Context, releaseName string) error {
	var lease coordinationv1.Lease
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: releaseName}, &lease)
	if apierrors.IsNotFound(err) || (err == nil && lease.Labels[release.ManagedByLabel] != release.ManagedByValue) {
		return nil
	}
	if err == nil {
		err = r.Delete(ctx, &lease, client.Preconditions{UID: &lease.UID})
	}
	if client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete lease %s/%s: %w", r.Namespace, releaseName, err)
	}
	return nil
}

// checkCredentials waits until the credentials Secret has every required key.
func (r *NativeCCMReconciler) checkCredentials(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile) error {
	if !p.NeedsSecret() {
		return nil
	}
	name := r.secretName(obj, p)
	var s corev1.Secret
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, &s)
	var missing []string
	switch {
	case apierrors.IsNotFound(err):
		missing = []string{"Secret " + r.Namespace + "/" + name}
	case err != nil:
		return err
	default:
		for _, k := range p.SecretKeys() {
			if _, ok := s.Data[k]; !ok {
				missing = append(missing, "key "+k)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	werr := fmt.Errorf("waiting for credentials: missing %s", strings.Join(missing, ", "))
	if !conditions.HasAnyReason(obj, meta.ReadyCondition, v1.CredentialsNotFoundReason) {
		r.event(obj, corev1.EventTypeWarning, v1.CredentialsNotFoundReason, werr.Error())
	}
	conditions.MarkFalse(obj, meta.ReadyCondition, v1.CredentialsNotFoundReason, "%s", werr)
	return &waitError{reason: v1.CredentialsNotFoundReason, after: r.RetryInterval, err: werr}
}

func (r *NativeCCMReconciler) secretName(obj *v1.NativeCCM, p *profile.Profile) string {
	if c := obj.Spec.Credentials; c != nil && c.SecretRef.Name != "" {
		return c.SecretRef.Name
	}
	if p == nil {
		return ""
	}
	return p.Credentials.SecretName
}

// ensureRelease installs, upgrades (rolling back a failed upgrade) or confirms
// the release.
func (r *NativeCCMReconciler) ensureRelease(ctx context.Context, obj *v1.NativeCCM, req release.Request) error {
	return r.ensureReleaseWith(ctx, obj, req, false)
}

// ensureReleaseWith is ensureRelease; readHistory forces the history read.
func (r *NativeCCMReconciler) ensureReleaseWith(ctx context.Context, obj *v1.NativeCCM, req release.Request, readHistory bool) error {
	log := ctrl.LoggerFrom(ctx)
	digest := req.Digest()
	// With no release recorded and no failure since, go straight to Install:
	// Helm's install refuses a name in use, and the failure sends the next
	// attempt through Get. This saves a release-history read on the path that
	// matters most (the first node of a platform appears).
	var info *release.Info
	var err error
	if readHistory || obj.Status.Release != nil || obj.Status.Failures > 0 {
		if info, err = r.Engine.Get(ctx, req.Namespace, req.Name); err != nil {
			return err
		}
	}
	if info.Pending() {
		log.Info("release stuck in a pending state; marking it failed", "status", info.Status)
		if err := r.Engine.Unlock(ctx, req.Namespace, req.Name); err != nil {
			return err
		}
		if info, err = r.Engine.Get(ctx, req.Namespace, req.Name); err != nil {
			return err
		}
	}

	switch {
	case info != nil && info.Deployed() && info.Digest == digest:
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
		return nil

	case info == nil || info.LastDeployed == 0:
		if info != nil {
			// A failed first install: start over.
			log.Info("removing failed install before retrying", "revision", info.Revision)
			if err := r.Engine.Uninstall(ctx, req.Namespace, req.Name); err != nil {
				return err
			}
		}
		info, err = r.Engine.Install(ctx, req)
		if errors.Is(err, release.ErrNameInUse) && !readHistory {
			// An earlier reconcile installed it and the status read here predates
			// that (the history read is skipped for speed): not a failure, look
			// again with the history.
			log.V(1).Info("release already installed; reading its history")
			return r.ensureReleaseWith(ctx, obj, req, true)
		}
		if err != nil {
			return r.actionFailed(obj, info, v1.InstallFailedReason, err)
		}
		r.actionSucceeded(obj, info, v1.InstallSucceededReason, fmt.Sprintf("installed release %s revision %d (%s)", info.Name, info.Revision, info.Chart))
		return nil

	default:
		info, err = r.Engine.Upgrade(ctx, req)
		if err != nil {
			uerr := r.actionFailed(obj, info, v1.UpgradeFailedReason, err)
			var chartErr *release.ChartError
			if errors.As(err, &chartErr) || errors.As(err, new(*release.RefusedError)) {
				return uerr // nothing was changed in the cluster
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
		r.actionSucceeded(obj, info, v1.UpgradeSucceededReason, fmt.Sprintf("upgraded release %s to revision %d (%s)", info.Name, info.Revision, info.Chart))
		return nil
	}
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

func (r *NativeCCMReconciler) event(obj *v1.NativeCCM, eventType, reason, msg string) {
	if r.EventRecorder != nil {
		r.EventRecorder.Event(obj, eventType, reason, msg)
	}
}

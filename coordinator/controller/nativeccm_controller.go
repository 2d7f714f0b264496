package controller

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	runtimectrl "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/patch"
	"github.com/fluxcd/pkg/runtime/predicates"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/discovery"
	kubeevents "k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

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
// sidecar, kubeconfig and policy). The gate step calls it only for a release
// that is wanted, before it is installed or upgraded. It may set conditions
// on the NativeCCM (e.g. Gated). Nil means none.
type MutatorsFunc func(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile, l release.Lifecycle) ([]release.Mutator, error)

// NativeCCMReconciler reconciles NativeCCM objects.
type NativeCCMReconciler struct {
	client.Client
	// APIReader reads objects the manager does not cache (Leases).
	APIReader client.Reader
	// EventRecorder records Kubernetes events (and forwards them when configured).
	EventRecorder kubeevents.EventRecorder
	// nodesOwnedWarned: the NodesOwned warning last recorded per NativeCCM
	// and reason (nodesOwnedFalse).
	nodesOwnedWarned sync.Map
	runtimectrl.Metrics

	Engine   ReleaseEngine
	Profiles Profiles
	// Mutators is the hook for the gate; nil for none.
	Mutators MutatorsFunc

	// Namespace holds the releases, their ServiceAccounts, leases and the
	// credentials and image pull Secrets.
	Namespace string
	// ImagePullSecrets name Secrets in Namespace every native CCM's pods pull
	// their images with (the ccm-gate image comes from the product's
	// registry), before those of the NativeCCM's spec.imagePullSecrets.
	ImagePullSecrets []string
	// UninstallGracePeriod is the default time Auto keeps a release after the
	// last node of its platform is gone.
	UninstallGracePeriod time.Duration
	// DomainLabels are the node label keys a NativeCCM's domain may restrict
	// (the fence's domain labels); the controller keeps every node's values
	// of them. Nil: domain.BuiltinKeys.
	DomainLabels []string
	// RetryInterval is how often a waiting NativeCCM (credentials missing) is
	// looked at again, besides Secret events.
	RetryInterval time.Duration
	// Interval re-checks a Ready NativeCCM (drift, conflicts).
	Interval time.Duration
	// Health says how the installed CCM is judged (lease duration, restarts).
	Health HealthOptions
	// ServerVersion is the API server's version, for which the profile's
	// upstream CCM release is chosen. Nil: discovery of the manager's API
	// server, cached for Interval.
	ServerVersion ServerVersion

	now func() time.Time
	// nodes is what the controller knows of the cluster's Nodes.
	nodes *nodeStore
	// gateChecks are the gate checks that passed, reused for Interval.
	gateChecks gateChecks
	// previousLeases are the Leases of the CCMs NativeCCMs take over from as
	// last seen (takeover.go).
	previousLeases leaseSightings
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
	v1.HealthyCondition, v1.GatedCondition, v1.NodesOwnedCondition,
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
	if r.ServerVersion == nil {
		dc, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
		if err != nil {
			return err
		}
		r.ServerVersion = &CachedServerVersion{Discovery: dc, TTL: r.Interval}
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1.NativeCCM{}, platformIndex, func(o client.Object) []string {
		return []string{o.(*v1.NativeCCM).Spec.Platform}
	}); err != nil {
		return err
	}
	if r.DomainLabels == nil {
		r.DomainLabels = domain.BuiltinKeys
	}
	nodes, err := newNodeStore(mgr.GetConfig(), mgr.GetCache(), r.DomainLabels)
	if err != nil {
		return err
	}
	r.nodes = nodes
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.NativeCCM{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicates.ReconcileRequestedPredicate{}))).
		WatchesRawSource(nodes).
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
		// Healthy: a pod of the release leads (the NativeCCMNoLeader alert);
		// Unknown while nothing is installed.
		if r.Metrics.IsDelete(obj) {
			r.Metrics.DeleteCondition(ctx, obj, v1.HealthyCondition)
		} else {
			r.Metrics.RecordCondition(ctx, obj, v1.HealthyCondition)
		}
		// NodesOwned: nodes of the platform no native CCM manages.
		if r.Metrics.IsDelete(obj) {
			r.Metrics.DeleteCondition(ctx, obj, v1.NodesOwnedCondition)
		} else {
			r.Metrics.RecordCondition(ctx, obj, v1.NodesOwnedCondition)
		}
	}()

	if !obj.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, obj)
	}
	if !controllerutil.ContainsFinalizer(obj, v1.Finalizer) {
		// Persist the finalizer before anything is installed.
		controllerutil.AddFinalizer(obj, v1.Finalizer)
		if err := patcher.Patch(ctx, obj, patch.WithFieldOwner(names.CoordinatorController)); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.Metrics.RecordSuspend(ctx, obj, obj.Spec.Suspend)
	if obj.Spec.Suspend {
		log.Info("reconciliation is suspended")
		return ctrl.Result{}, nil
	}
	// A reconcile asked for with reconcile.fluxcd.io/requestedAt checks
	// everything again, even what nothing has changed since it was last
	// checked (the release history, the gate).
	forced := false
	if v, ok := meta.ReconcileAnnotationValue(obj.GetAnnotations()); ok {
		forced = v != obj.Status.GetLastHandledReconcileRequest()
		obj.Status.SetLastHandledReconcileRequest(v)
	}
	return r.reconcile(ctx, obj, forced)
}

// reconcileDelete uninstalls the release (taking the CCM's RBAC with it) and
// its Lease, and only then lets the NativeCCM go.
func (r *NativeCCMReconciler) reconcileDelete(ctx context.Context, obj *v1.NativeCCM) (ctrl.Result, error) {
	r.gateChecks.forget(obj.UID)
	if err := r.holdForLoadBalancers(ctx, obj); err != nil {
		var wait *waitError
		if errors.As(err, &wait) {
			// looked at again; the NativeCCM stays until its Services are clean
			return ctrl.Result{RequeueAfter: wait.after}, nil
		}
		return ctrl.Result{}, err
	}
	if err := r.uninstall(ctx, obj, "NativeCCM deleted"); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.removeMembers(ctx, obj, "NativeCCM deleted"); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.deleteLease(ctx, obj.ReleaseName()); err != nil {
		return ctrl.Result{}, err
	}
	// The fence needs no clean-up: its parameter for this CCM is the
	// NativeCCM itself, which goes once the finalizer is removed, after the
	// uninstall has taken the CCM's RBAC.
	controllerutil.RemoveFinalizer(obj, v1.Finalizer)
	// Only the finalizer changes; the deferred summary skips the status.
	return ctrl.Result{}, r.Update(ctx, obj)
}

// reconcile runs the steps for a NativeCCM that is not being deleted or
// suspended; Reconcile's deferred summarize records the outcome.
//
//  1. observe: the desired release (profile and overrides), the platform's
//     nodes, conflicts around the CCM (reported, never blocking);
//  2. decide: is the release wanted (install policy), are its credentials
//     and image pull Secrets there, and, for a first install, is the CCM it
//     takes over from (spec.takeOver) gone?
//  3. gate: for a wanted release, the fence checked, status.gate written and
//     the view's mutators, before anything is installed or upgraded;
//  4. release: the action chosen from the release's state (install,
//     upgrade with rollback and retry, uninstall, or nothing);
//  5. health: is the installed CCM working? (Ready says so.)
func (r *NativeCCMReconciler) reconcile(ctx context.Context, obj *v1.NativeCCM, forced bool) (ctrl.Result, error) {
	ctx = withLeaseReads(ctx)
	if obj.Generation != obj.Status.ObservedGeneration {
		conditions.MarkReconciling(obj, meta.ProgressingReason, "reconciling generation %d", obj.Generation)
	}

	// 1. Observe.
	p, req, in, err := r.resolveProfile(ctx, obj)
	if err != nil {
		return ctrl.Result{}, err
	}
	dom, boundary, splitBy, err := r.resolveDomain(obj, p)
	if err != nil {
		return ctrl.Result{}, err
	}
	req.Lifecycle.DomainSelector = dom.Selector()
	if splitBy != "" {
		// counted by the split label: one member per value
		boundary = splitBy
	}
	nodes := r.observeNodes(obj, dom, boundary)
	// the platform's NativeCCMs, once: the domains they own between them
	platformCCMs, err := r.platformNativeCCMs(ctx, obj.Spec.Platform)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.reportUnowned(obj, platformCCMs)
	if err := r.detectConflicts(ctx, obj, nodes.platformView); err != nil {
		return ctrl.Result{}, err
	}
	spanning := boundary
	if splitBy != "" {
		spanning = "" // the members each serve one value
	}
	refusal, narrowed := r.checkDomain(obj, platformCCMs, dom, spanning, nodes)
	if refusal != nil {
		return ctrl.Result{}, r.refuse(ctx, obj, refusal)
	}
	if splitBy != "" {
		// 2.-5. for each member (split.go)
		return r.reconcileSplit(ctx, obj, p, in, dom, splitBy, nodes, forced)
	}
	if len(obj.Status.Members) > 0 {
		// no longer split: the members go before the NativeCCM's own release comes
		if err := r.removeMembers(ctx, obj, "the NativeCCM is no longer split (spec.domain.splitBy)"); err != nil {
			return ctrl.Result{}, err
		}
	}
	if narrowed != nil {
		// an installed CCM kept to the value it served: its view narrowed
		req.Lifecycle.DomainSelector = narrowed.Selector()
		nodes = r.observeNodes(obj, *narrowed, boundary)
	}

	// 2. Decide.
	d := r.decide(obj)
	if !d.want {
		// 4. Release: uninstall, or nothing.
		return ctrl.Result{RequeueAfter: r.Interval}, r.reconcileAbsent(ctx, obj, d.reason)
	}
	if err := r.checkCredentials(ctx, obj, p); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.checkImagePullSecrets(ctx, obj, req.Lifecycle.ImagePullSecrets); err != nil {
		return ctrl.Result{}, err
	}
	if obj.Status.Release == nil {
		// not installed yet: not while the CCM it replaces runs (takeover.go)
		if err := r.waitForPreviousCCM(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
	}

	// 3. Gate.
	if req.Mutators, err = r.reconcileGate(ctx, obj, p, req.Lifecycle, forced); err != nil {
		return ctrl.Result{}, err
	}

	// 4. Release: install, upgrade, or nothing.
	if err := r.reconcileRelease(ctx, obj, req, forced); err != nil {
		return ctrl.Result{}, err
	}

	// 5. Health.
	again, err := r.checkHealth(ctx, obj, req.Lifecycle)
	if err != nil {
		return ctrl.Result{}, err
	}
	after := r.Interval
	for _, t := range []time.Duration{d.requeue, again} {
		if t > 0 && t < after {
			after = t
		}
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

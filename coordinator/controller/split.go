package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// The split: a NativeCCM with spec.domain.splitBy (its profile's boundary
// label, the region for aws) runs one release per value of that label among
// its nodes, a member: release, ServiceAccount and Lease
// native-ccm-<name>--<value>, its view narrowed to the nodes with that value,
// the credentials Secret's cloud config with the value set where the profile
// says (domain.cloudConfigRegion). The fence admits a member's ServiceAccount
// for nodes with exactly its value, when the NativeCCM's grant names the
// split label. A value whose nodes are all gone keeps its member through the
// uninstall grace period, as a NativeCCM keeps its release. status.members
// reports each member; the NativeCCM's conditions sum them up.

// member is one wanted member in a reconcile.
type member struct {
	value string
	// req is the member's release request.
	req release.Request
	// status is what is reported (status.members[value]).
	status v1.MemberStatus
	// takeOver, when set, is asked before the member's release is
	// installed or reinstalled (spec.takeOver: memberTakeOverCheck).
	takeOver *takeOverCheck
}

// takeOverCheck asks memberTakeOverCheck before a member's install: once
// for the members of a pass while no Helm action runs between them (one
// Lease read, one event), and again after a member's action, because an
// install or upgrade may wait a Helm timeout for its pods, time in which
// the previous CCM may have started again.
type takeOverCheck struct {
	ask   func(again bool) error
	asked bool // since the last member's action
	again bool // asked before in this pass (checkPreviousCCM)
	err   error
}

func (c *takeOverCheck) before() error {
	if !c.asked {
		c.err, c.asked = c.ask(c.again), true
		c.again = true
	}
	return c.err
}

// acted: a member's Helm action ran; the next member asks again.
func (c *takeOverCheck) acted() {
	if c != nil {
		c.asked = false
	}
}

// reconcileSplit runs the members of a split NativeCCM: the release steps
// (gate, lease, Helm action, health) for each wanted value, the uninstall
// of members no longer wanted, and the summary in the NativeCCM's status.
// maxMembers bounds the members of one split NativeCCM (status.members holds
// at most 64): the values come from node labels, which kubelets may set on
// their own Nodes. A variable for the tests only.
var maxMembers atomic.Int32

func init() { maxMembers.Store(32) }

func (r *NativeCCMReconciler) reconcileSplit(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile, in release.Instance, dom domain.Domain, splitBy string, nodes domainView, forced bool) (ctrl.Result, error) {
	// The NativeCCM's own release from before the split goes: its CCM sees
	// every value, the members one each.
	if obj.Status.Release != nil {
		// the Services it served keep it until their load balancers are gone
		if err := r.holdForLoadBalancers(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.uninstall(ctx, obj, "the NativeCCM is split by "+splitBy+" (spec.domain.splitBy): its members replace it"); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.deleteLease(ctx, obj.ReleaseName()); err != nil {
			return ctrl.Result{}, err
		}
		r.gateChecks.forget(obj.UID)
		obj.Status.Release, obj.Status.Leader, obj.Status.Failures = nil, nil, 0
	}
	obj.Status.BoundaryValue = ""

	previous := map[string]v1.MemberStatus{}
	for _, m := range obj.Status.Members {
		previous[m.Value] = m
	}
	installed, err := r.memberReleases(ctx, obj)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := r.now()
	grace := r.UninstallGracePeriod
	if obj.Spec.UninstallGracePeriod != nil {
		grace = obj.Spec.UninstallGracePeriod.Duration
	}

	// Which values have a member: every valid value with nodes, and an
	// installed one without nodes through the grace period (Auto) or for
	// good (Always); none with Never.
	var wanted []string
	var unserved []string
	requeue := r.Interval
	candidates := map[string]bool{}
	for v := range nodes.Values {
		candidates[v] = true
	}
	for v := range installed {
		candidates[v] = true
	}
	for _, v := range slices.Sorted(maps.Keys(candidates)) {
		count := nodes.Values[v]
		if v == "" {
			unserved = append(unserved, fmt.Sprintf("%d node(s) without %s (e.g. %s) are in no member's view", count, splitBy, r.firstNode(obj, dom, splitBy, v)))
			continue
		}
		if why := domain.ValidMember(obj.Name, v); why != "" {
			if count > 0 {
				unserved = append(unserved, fmt.Sprintf("node %s has %s=%q, which cannot name a member (%s), so no member serves its %d node(s)", r.firstNode(obj, dom, splitBy, v), splitBy, v, why, count))
			}
			continue
		}
		ms := previous[v]
		ms.Value, ms.Release, ms.Nodes = v, obj.MemberReleaseName(v), int32(count)
		switch {
		case obj.InstallPolicy() == v1.InstallNever:
			continue
		case count > 0:
			ms.NoNodesSince = nil
		case obj.InstallPolicy() == v1.InstallAlways:
		case !installed[v]:
			continue
		default:
			if ms.NoNodesSince == nil {
				t := metav1.NewTime(now)
				ms.NoNodesSince = &t
			}
			left := ms.NoNodesSince.Add(grace).Sub(now)
			if left <= 0 {
				continue
			}
			requeue = min(requeue, left)
		}
		previous[v] = ms
		wanted = append(wanted, v)
	}
	// A kubelet may set its own region label: the members nodes can ask for
	// are bounded. Installed members keep their place; new values beyond the
	// bound get none and are reported.
	if limit := int(maxMembers.Load()); len(wanted) > limit {
		slices.SortStableFunc(wanted, func(a, b string) int {
			switch ia, ib := installed[a], installed[b]; {
			case ia && !ib:
				return -1
			case ib && !ia:
				return 1
			}
			return 0
		})
		for _, v := range wanted[limit:] {
			unserved = append(unserved, fmt.Sprintf("%s=%s (node %s) gets no member: NativeCCM %s has %d already, the most a split may have",
				splitBy, v, r.firstNode(obj, dom, splitBy, v), obj.Name, limit))
		}
		wanted = wanted[:limit]
		slices.Sort(wanted)
	}

	// Members no longer wanted go (holdForLoadBalancers as for the whole
	// NativeCCM: a split one serves none, so it never holds).
	for _, v := range slices.Sorted(maps.Keys(installed)) {
		if slices.Contains(wanted, v) {
			continue
		}
		why := fmt.Sprintf("no node of NativeCCM %s has %s=%s", obj.Name, splitBy, v)
		if obj.InstallPolicy() == v1.InstallNever {
			why = "install policy is Never"
		}
		if err := r.removeMember(ctx, obj, v, why); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.forgetUninstalledMembers(ctx, obj, installed, wanted); err != nil {
		return ctrl.Result{}, err
	}

	var members []v1.MemberStatus
	var errs []error
	var wait error // a member held for the previous CCM (memberTakeOverCheck)
	if len(wanted) > 0 {
		if err := r.checkCredentials(ctx, obj, p); err != nil {
			return ctrl.Result{}, err
		}
		checked := false
		if len(installed) == 0 {
			// no member yet: not while the CCM it replaces runs (takeover.go;
			// one removed by hand since: memberTakeOverCheck)
			if err := r.waitForPreviousCCM(ctx, obj); err != nil {
				return ctrl.Result{}, err
			}
			checked = true
		}
		base, err := r.cloudConfigBase(ctx, obj, p)
		if err != nil {
			return ctrl.Result{}, err
		}
		// spec.takeOver: no member is installed while the CCM it replaces
		// runs (asked just now when no member was installed)
		var check *takeOverCheck
		if obj.Spec.TakeOver != nil {
			check = &takeOverCheck{ask: func(again bool) error { return r.memberTakeOverCheck(ctx, obj, again) }, asked: checked, again: checked}
		}
		for _, v := range wanted {
			m := member{value: v, status: previous[v], takeOver: check}
			again, err := r.reconcileMember(ctx, obj, p, in, dom, splitBy, base, &m, forced)
			switch {
			case errors.As(err, new(*waitError)):
				// held for the previous CCM: looked at again as a wait,
				// unless another member failed
				if wait == nil {
					wait = err
				}
			case err != nil:
				errs = append(errs, fmt.Errorf("member %s: %w", m.status.Release, err))
			}
			if again > 0 {
				requeue = min(requeue, again)
			}
			members = append(members, m.status)
		}
	}
	obj.Status.Members = members
	r.summarizeMembers(obj, splitBy, unserved)
	if w := (*waitError)(nil); errors.As(wait, &w) {
		// Ready says the NativeCCM waits for the previous CCM, whichever
		// member comes first: its events, and a restarted coordinator's
		// count of the wait, go by that reason
		conditions.MarkFalse(obj, meta.ReadyCondition, w.reason, "%s", w.err)
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	if w := (*waitError)(nil); errors.As(wait, &w) {
		// the members' own next looks (health, grace periods) still count
		w.after = min(w.after, requeue)
		return ctrl.Result{}, w
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// reconcileMember makes one member's release what its request says and
// reports it in m.status. It returns how soon to look again.
func (r *NativeCCMReconciler) reconcileMember(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile, in release.Instance, dom domain.Domain, splitBy, base string, m *member, forced bool) (time.Duration, error) {
	st := &m.status
	fail := func(reason string, err error) (time.Duration, error) {
		st.Ready, st.Reason, st.Message = false, reason, err.Error()
		return 0, err
	}
	in.ReleaseName = st.Release
	in.CloudConfig = &release.CloudConfigFile{Base: base, Set: []release.CloudConfigSetting{release.SettingOf(p.Domain.CloudConfigRegion, m.value)}}
	req, err := release.FromProfile(p, in)
	if err != nil {
		return fail(v1.InvalidOverridesReason, err)
	}
	view, ok := dom.With(splitBy, m.value)
	if !ok {
		return fail(v1.InvalidDomainReason, fmt.Errorf("the domain %s excludes %s=%s", dom, splitBy, m.value))
	}
	req.Lifecycle.DomainSelector = view.Selector()
	m.req = req

	// Gate, lease, Helm action: as for a NativeCCM's own release.
	if r.Mutators != nil {
		id := memberGateID(obj, m.value)
		key := fmt.Sprintf("%d %s %q", obj.Generation, req.Lifecycle.Fingerprint(), p.ProviderIDPrefixes)
		muts, ok := r.gateChecks.get(id, key, r.now(), r.Interval)
		if !ok || forced || !conditions.IsTrue(obj, v1.GatedCondition) {
			if muts, err = r.Mutators(ctx, obj, p, req.Lifecycle); err != nil {
				r.gateChecks.forget(id)
				return fail(gate.GateFailedReason, err)
			}
			r.gateChecks.put(id, key, r.now(), muts)
		}
		req.Mutators = muts
	}
	if err := r.ensureLease(ctx, req.Lifecycle); err != nil {
		return fail(v1.InstallFailedReason, err)
	}
	// Deployed from this request when last looked at, and Helm's storage
	// still says so: no history read (as for a NativeCCM's own release).
	action, info := actionNone, &release.Info{Name: st.Release, Namespace: r.Namespace, Revision: st.Revision}
	if forced || !r.deployedLatest(ctx, st.Release, st.Revision, req.Digest()) {
		if info, err = r.observeRelease(ctx, req, true); err != nil {
			return fail(v1.InstallFailedReason, err)
		}
		action = nextAction(true, info, req.Digest())
	}
	if (action == actionInstall || action == actionReinstall || (action == actionUpgrade && !info.Deployed())) && m.takeOver != nil {
		// before a failed release is removed too, and before an upgrade of
		// one whose latest revision failed (its objects may be gone), as for
		// a NativeCCM's own release (runReleaseAction)
		if err := m.takeOver.before(); err != nil {
			if action != actionUpgrade {
				// not installed; a failed release held before its upgrade
				// is still there (status.members says its revision)
				st.Revision = 0
			}
			var wait *waitError
			if errors.As(err, &wait) {
				st.Ready, st.Reason, st.Message = false, wait.reason, err.Error()
				return 0, err
			}
			return fail(v1.InstallFailedReason, err)
		}
	}
	if action != actionNone {
		defer m.takeOver.acted()
	}
	install := func() (time.Duration, error) {
		if info, err = r.Engine.Install(ctx, req); err != nil {
			r.event(obj, corev1.EventTypeWarning, v1.InstallFailedReason, fmt.Sprintf("member %s (%s=%s): %s", st.Release, splitBy, m.value, err))
			return fail(v1.InstallFailedReason, err)
		}
		forgetLeases(ctx)
		r.event(obj, corev1.EventTypeNormal, v1.InstallSucceededReason, fmt.Sprintf("installed member release %s revision %d (%s) for the %d node(s) with %s=%s", info.Name, info.Revision, info.Chart, st.Nodes, splitBy, m.value))
		return 0, nil
	}
	switch action {
	case actionInstall:
		if again, err := install(); err != nil {
			return again, err
		}
	case actionReinstall:
		if err := r.Engine.Uninstall(ctx, req.Namespace, req.Name); err != nil {
			return fail(v1.InstallFailedReason, err)
		}
		if again, err := install(); err != nil {
			return again, err
		}
	case actionUpgrade:
		up, err := r.Engine.Upgrade(ctx, req)
		if err != nil {
			r.event(obj, corev1.EventTypeWarning, v1.UpgradeFailedReason, fmt.Sprintf("member %s (%s=%s): %s", st.Release, splitBy, m.value, err))
			var chartErr *release.ChartError
			if !errors.As(err, &chartErr) && !errors.As(err, new(*release.RefusedError)) {
				if runs, why := r.previousCCMRuns(ctx, obj); runs {
					r.event(obj, corev1.EventTypeWarning, v1.WaitingForPreviousCCMReason, rollbackHeld(req.Name, why))
				} else if rb, rerr := r.Engine.Rollback(ctx, req.Namespace, req.Name); rerr != nil {
					err = errors.Join(err, rerr)
				} else {
					st.Revision = rb.Revision
				}
			}
			return fail(v1.UpgradeFailedReason, err)
		}
		info = up
		forgetLeases(ctx)
		r.event(obj, corev1.EventTypeNormal, v1.UpgradeSucceededReason, fmt.Sprintf("upgraded member release %s to revision %d (%s)", info.Name, info.Revision, info.Chart))
	}
	st.Revision = info.Revision

	// Health: its CCM leads.
	h, err := r.observeHealth(ctx, req.Lifecycle, r.now())
	if err != nil {
		return fail(v1.InstallFailedReason, err)
	}
	st.Reason = h.reason
	if h.healthy() {
		st.Ready = true
		st.Message = fmt.Sprintf("revision %d deployed for %d node(s); %s", info.Revision, st.Nodes, h.message)
		return max(h.expires.Sub(r.now()), 0) + h.leaseDuration/2, nil
	}
	st.Ready, st.Message = false, h.message
	return max(h.leaseDuration/2, time.Second), nil
}

// summarizeMembers writes the NativeCCM's conditions from its members:
// Installed and Ready True when every member is deployed and leads, else
// False naming the first member that is not; NodesOwned False when some of
// its nodes have no member.
func (r *NativeCCMReconciler) summarizeMembers(obj *v1.NativeCCM, splitBy string, unserved []string) {
	members := obj.Status.Members
	obj.Status.Leader = nil
	conditions.Delete(obj, v1.HealthyCondition)
	if len(unserved) > 0 {
		msg := fmt.Sprintf("NativeCCM %s is split by %s, and %s", obj.Name, splitBy, strings.Join(unserved, "; "))
		r.nodesOwnedFalse(obj, v1.InvalidDomainReason, msg)
	}
	if len(members) == 0 {
		reason, msg := v1.NoNodesReason, fmt.Sprintf("no node of NativeCCM %s has a value of %s", obj.Name, splitBy)
		if obj.InstallPolicy() == v1.InstallNever {
			reason, msg = v1.InstallDisabledReason, "install policy is Never"
		}
		conditions.Delete(obj, v1.GatedCondition)
		conditions.MarkFalse(obj, v1.InstalledCondition, reason, "%s", msg)
		conditions.MarkTrue(obj, meta.ReadyCondition, reason, "not installed: %s", msg)
		return
	}
	var names, failing []string
	var firstFailing *v1.MemberStatus
	for i := range members {
		m := &members[i]
		names = append(names, fmt.Sprintf("%s (%s, %d node(s))", m.Release, m.Value, m.Nodes))
		if !m.Ready {
			failing = append(failing, m.Value)
			if firstFailing == nil {
				firstFailing = m
			}
		}
	}
	installedAll := !slices.ContainsFunc(members, func(m v1.MemberStatus) bool { return m.Revision == 0 })
	if installedAll {
		conditions.MarkTrue(obj, v1.InstalledCondition, v1.UpToDateReason, "%d member release(s): %s", len(members), strings.Join(names, ", "))
	} else {
		conditions.MarkFalse(obj, v1.InstalledCondition, firstFailing.Reason, "member %s (%s=%s) is not installed: %s", firstFailing.Release, splitBy, firstFailing.Value, firstFailing.Message)
	}
	if firstFailing == nil {
		conditions.MarkTrue(obj, v1.HealthyCondition, v1.LeaseRenewedReason, "every member leads: %s", strings.Join(names, ", "))
		conditions.MarkTrue(obj, meta.ReadyCondition, v1.UpToDateReason, "%d member release(s) deployed and leading: %s", len(members), strings.Join(names, ", "))
		return
	}
	msg := fmt.Sprintf("%d of %d member(s) not ready (%s): member %s (%s=%s): %s", len(failing), len(members), strings.Join(failing, ", "), firstFailing.Release, splitBy, firstFailing.Value, firstFailing.Message)
	conditions.MarkFalse(obj, v1.HealthyCondition, firstFailing.Reason, "%s", msg)
	conditions.MarkFalse(obj, meta.ReadyCondition, firstFailing.Reason, "%s", msg)
}

// removeMember uninstalls one member's release and removes its Lease.
func (r *NativeCCMReconciler) removeMember(ctx context.Context, obj *v1.NativeCCM, value, why string) error {
	if err := r.holdForLoadBalancers(ctx, obj); err != nil {
		return err
	}
	name := obj.MemberReleaseName(value)
	if err := r.Engine.Uninstall(ctx, r.Namespace, name); err != nil {
		r.event(obj, corev1.EventTypeWarning, v1.UninstallFailedReason, fmt.Sprintf("member release %s/%s: %s", r.Namespace, name, err))
		return err
	}
	r.event(obj, corev1.EventTypeNormal, v1.UninstallSucceededReason, fmt.Sprintf("member release %s/%s uninstalled: %s", r.Namespace, name, why))
	r.gateChecks.forget(memberGateID(obj, value))
	return r.deleteLease(ctx, name)
}

// removeMembers uninstalls every member (the NativeCCM is deleted, refused,
// no longer split or not wanted).
func (r *NativeCCMReconciler) removeMembers(ctx context.Context, obj *v1.NativeCCM, why string) error {
	installed, err := r.memberReleases(ctx, obj)
	if err != nil {
		return err
	}
	for _, v := range slices.Sorted(maps.Keys(installed)) {
		if err := r.removeMember(ctx, obj, v, why); err != nil {
			return err
		}
	}
	if err := r.forgetUninstalledMembers(ctx, obj, installed, nil); err != nil {
		return err
	}
	obj.Status.Members = nil
	return nil
}

// forgetUninstalledMembers removes the Leases (and forgets the gate checks)
// of the members status.members lists that have no release and are not
// wanted: a member removed by hand that waited for the previous CCM
// (spec.takeOver) has no release left to uninstall, but the Lease the
// coordinator created for it is still there.
func (r *NativeCCMReconciler) forgetUninstalledMembers(ctx context.Context, obj *v1.NativeCCM, installed map[string]bool, wanted []string) error {
	for _, m := range obj.Status.Members {
		if installed[m.Value] || slices.Contains(wanted, m.Value) || m.Value == "" {
			continue
		}
		r.gateChecks.forget(memberGateID(obj, m.Value))
		if err := r.deleteLease(ctx, obj.MemberReleaseName(m.Value)); err != nil {
			return err
		}
	}
	return nil
}

// memberReleases are the values whose member release exists: those Helm's
// release storage (the cached labels of its Secrets) names
// native-ccm-<name>--<value>, and those status.members records (a release
// whose record the cache does not have yet).
func (r *NativeCCMReconciler) memberReleases(ctx context.Context, obj *v1.NativeCCM) (map[string]bool, error) {
	out := map[string]bool{}
	for _, m := range obj.Status.Members {
		if m.Revision > 0 {
			out[m.Value] = true
		}
	}
	var secrets corev1.SecretList
	if err := r.List(ctx, &secrets, client.InNamespace(r.Namespace), client.MatchingLabels{release.StorageOwnerLabel: release.StorageOwner}); err != nil {
		return nil, fmt.Errorf("list the release records of NativeCCM %s's members: %w", obj.Name, err)
	}
	prefix := obj.ReleaseName() + domain.SplitSeparator
	for i := range secrets.Items {
		s := &secrets.Items[i]
		if v, ok := strings.CutPrefix(s.Labels[release.StorageNameLabel], prefix); ok && s.Type == release.HelmStorageType && v != "" {
			out[v] = true
		}
	}
	return out, nil
}

// cloudConfigBase reads the credentials Secret's cloud-config file, which
// every member gets with its own value set.
func (r *NativeCCMReconciler) cloudConfigBase(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile) (string, error) {
	if p.CCM.CloudConfig == nil {
		return "", nil
	}
	name := r.secretName(obj, p)
	var s corev1.Secret
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, &s)
	if apierrors.IsNotFound(err) {
		return "", r.waitFor(obj, v1.CredentialsNotFoundReason, fmt.Errorf("waiting for credentials: missing Secret %s/%s", r.Namespace, name))
	}
	if err != nil {
		return "", err
	}
	data, ok := s.Data[p.CCM.CloudConfig.Key]
	if !ok {
		return "", r.waitFor(obj, v1.CredentialsNotFoundReason, fmt.Errorf("waiting for credentials: missing key %s of Secret %s/%s", p.CCM.CloudConfig.Key, r.Namespace, name))
	}
	return string(data), nil
}

// firstNode names a node of the NativeCCM's domain with value of label.
func (r *NativeCCMReconciler) firstNode(obj *v1.NativeCCM, dom domain.Domain, label, value string) string {
	_, first := r.nodes.nodesWhere(obj.Spec.Platform, func(l map[string]string) bool {
		return dom.Contains(names.PlatformLabel, l) && l[label] == value
	}, 1)
	return strings.Join(first, "")
}

// memberGateID keys a member's gate check (gateChecks).
func memberGateID(obj *v1.NativeCCM, value string) types.UID {
	return types.UID(string(obj.UID) + "/" + value)
}

// Package doctor inspects a cluster running Hybrid CCM and reports what a person
// needs to fix: nodes talos-ccm has not initialized (or initialized without the
// routing label or providerID), nodes whose Talos API talos-ccm cannot reach
// (its current TalosAPIUnavailable events), cloud-controller-managers that would fight
// (foreign cloud-node controllers, shared leader-election leases), NativeCCMs
// that are not Ready or whose installed CCM is not running, NativeCCMs that
// wait for the CCM they take over from (or run beside it again), kubelet-serving
// CSRs nobody decides, pod CIDR overlaps, a fence the API server does not
// enforce (absent, not denying, or an older one with a paramKind that refuses
// every node write after each API server start), NativeCCMs whose upstream
// CCM is outside Kubernetes' version skew policy or leaves foreign nodes
// alone by a label some of them lack, NativeCCMs whose CCM the
// fence refuses everything (no grant), orphaned native CCM identities and
// grants, grants of the native CCMs' node rights that the fence does not
// confine, and in the coordinator's namespace: workloads with host access,
// privileges or a root user, Services that publish something, and a Pod
// Security level below restricted.
//
// It only reads. Every finding names the object and says how to fix it.
// Options.Component scopes it to what one chart installed (the charts' helm
// test runs it so), reading no more than that chart's test ServiceAccount
// may.
package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Checks (the Check field of a Finding).
const (
	CheckUninitialized   = "NodeUninitialized"
	CheckNoPlatformLabel = "NodeWithoutPlatformLabel"
	CheckNoProviderID    = "NodeWithoutProviderID"
	CheckForeignCCM      = "ForeignCloudNodeController"
	CheckSharedLease     = "SharedLeaderLease"
	CheckNativeCCM       = "NativeCCMNotReady"
	CheckCCMNotRunning   = "NativeCCMNotRunning"
	CheckPendingCSR      = "KubeletServingCSRPending"
	CheckPodCIDROverlap  = "PodCIDROverlap"
	CheckUnfenced        = "UnfencedNodeLifecycleGrant"
	CheckLBConflict      = "LoadBalancerClassConflict"
	CheckFence           = "FenceNotEnforced"
	CheckFenceGrant      = "FenceGrantMissing"
	CheckOrphanIdentity  = "OrphanedNativeCCMIdentity"
	CheckOrphanGrant     = "OrphanedFenceGrant"
	CheckUnsafeWorkload  = "UnsafeWorkloadInCoordinatorNamespace"
	CheckPublishedSvc    = "PublishingServiceInCoordinatorNamespace"
	CheckPodSecurity     = "CoordinatorNamespacePodSecurity"
	CheckUnowned         = "NodesInNoDomain"
	// CheckNodesNotOwned: a NativeCCM says (NodesOwned=False) that nodes of
	// its domain have no CCM of theirs: a split value it does not serve, or
	// nodes spanning what one CCM of its cloud can see.
	CheckNodesNotOwned = "NativeCCMNodesNotOwned"
	// CheckWaitingForPreviousCCM: a NativeCCM that takes over from a CCM the
	// cluster runs (spec.takeOver.lease) is not installed while that CCM
	// renews its Lease, or while the coordinator cannot read the Lease.
	CheckWaitingForPreviousCCM = "NativeCCMWaitingForPreviousCCM"
	// CheckPreviousCCMRunning: the CCM a NativeCCM took over from renews its
	// Lease again while the NativeCCM's release is installed: both run.
	CheckPreviousCCMRunning = "PreviousCCMRunning"
	// CheckReleaseRecord: a Helm release record in the coordinator's
	// namespace holds what a native CCM release never does (a hook, a kind
	// the native-ccm chart never renders, an object elsewhere): the
	// coordinator wrote it, and whoever runs Helm on it runs that.
	CheckReleaseRecord = "SuspiciousReleaseRecord"
)

// Finding is one problem.
type Finding struct {
	Check   string `json:"check"`
	Object  string `json:"object"`
	Message string `json:"message"`
	Fix     string `json:"fix"`
}

// Options tune the checks.
type Options struct {
	// UninitializedAfter: an uninitialized node older than this is a finding.
	UninitializedAfter time.Duration
	// CSRPendingAfter: an undecided kubelet-serving CSR older than this is a finding.
	CSRPendingAfter time.Duration
	// Now is the reference time (tests); zero means time.Now().
	Now time.Time
	// Component scopes the checks to what one chart installed
	// (ComponentTalosCCM, ComponentCoordinator) with its controller in
	// Namespace, as the charts' helm test does; empty: every check.
	Component string
	// Namespace of the Component's controller (its Deployment and Lease).
	Namespace string
}

// Report is the result of Run.
type Report struct {
	Findings []Finding `json:"findings"`
	// Notes are facts that are not problems (e.g. the NativeCCM API is absent).
	Notes []string `json:"notes,omitempty"`
	// Inspected counts what was inspected.
	Inspected Counts `json:"inspected"`

	coordinator *controllerRef // the coordinator's Deployment, once found
	now         time.Time      // Options.Now
}

// memberInstallGrace is how long a split member's identity may exist before
// its NativeCCM lists the member (status.members): the coordinator creates the
// ServiceAccount with the release and writes the status after it.
const memberInstallGrace = 15 * time.Minute

// Counts of what a Report inspected.
type Counts struct {
	Nodes      int `json:"nodes"`
	NativeCCMs int `json:"nativeCCMs"`
	CSRs       int `json:"kubeletServingCSRs"`
	Workloads  int `json:"ccmWorkloads"`
}

// Scheme knows the types doctor reads.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1.AddToScheme(s)
	return s
}

// NewClient returns a read client for cfg.
func NewClient(cfg *rest.Config) (client.Client, error) {
	return client.New(cfg, client.Options{Scheme: Scheme()})
}

// Run performs every check.
func Run(ctx context.Context, c client.Client, o Options) (*Report, error) {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	r := &Report{now: o.Now}
	if o.Component != "" {
		if err := r.runComponent(ctx, c, o); err != nil {
			return nil, err
		}
		r.sort()
		return r, nil
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	r.Inspected.Nodes = len(nodes.Items)
	r.checkNodes(nodes.Items, o)
	r.checkPodCIDRs(nodes.Items)
	if err := r.checkTalosAPI(ctx, c, nodes.Items, o); err != nil {
		return nil, err
	}
	// Deployments: the CCMs among them (checkWorkloads), talos-ccm and the
	// coordinator (checkControllers); read once.
	var deps appsv1.DeploymentList
	if err := c.List(ctx, &deps); err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	if err := r.checkWorkloads(ctx, c, deps.Items); err != nil {
		return nil, err
	}
	if err := r.checkControllers(ctx, c, o, deps.Items, controllerChecks{talosCCM: true, coordinator: true}); err != nil {
		return nil, err
	}
	if err := r.checkNativeCCMs(ctx, c, nodes.Items, true); err != nil {
		return nil, err
	}
	if err := r.checkCSRs(ctx, c, o); err != nil {
		return nil, err
	}
	r.sort()
	return r, nil
}

// sort orders the findings by check, then object.
func (r *Report) sort() {
	sort.SliceStable(r.Findings, func(i, j int) bool {
		if r.Findings[i].Check != r.Findings[j].Check {
			return r.Findings[i].Check < r.Findings[j].Check
		}
		return r.Findings[i].Object < r.Findings[j].Object
	})
}

func (r *Report) add(check, object, fix, format string, a ...any) {
	r.Findings = append(r.Findings, Finding{Check: check, Object: object, Message: fmt.Sprintf(format, a...), Fix: fix})
}

func uninitialized(n *corev1.Node) bool { return names.Uninitialized(n.Spec.Taints) }

func (r *Report) checkNodes(nodes []corev1.Node, o Options) {
	for i := range nodes {
		n := &nodes[i]
		obj := "node/" + n.Name
		age := o.Now.Sub(n.CreationTimestamp.Time).Truncate(time.Second)
		if uninitialized(n) {
			if age >= o.UninitializedAfter {
				r.add(CheckUninitialized, obj,
					"check talos-ccm is running and its events on the node: kubectl describe node "+n.Name,
					"still has the %s taint after %s", cloudproviderapi.TaintExternalCloudProvider, age)
			}
			continue
		}
		if n.Labels[names.PlatformLabel] == "" {
			r.add(CheckNoPlatformLabel, obj,
				"no native CCM sees this node; let talos-ccm initialize it (or label it by hand if it is not a Talos node)",
				"is initialized but has no %s label", names.PlatformLabel)
		}
		if n.Spec.ProviderID == "" {
			r.add(CheckNoProviderID, obj,
				"a native CCM may treat it as unknown; check the node's Talos PlatformMetadata and talos-ccm events",
				"is initialized but has an empty spec.providerID")
		}
	}
}

func (r *Report) checkPodCIDRs(nodes []corev1.Node) {
	type owned struct {
		p    netip.Prefix
		node string
	}
	var all []owned
	for i := range nodes {
		cidrs := nodes[i].Spec.PodCIDRs
		if len(cidrs) == 0 && nodes[i].Spec.PodCIDR != "" {
			cidrs = []string{nodes[i].Spec.PodCIDR}
		}
		for _, s := range cidrs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				r.add(CheckPodCIDROverlap, "node/"+nodes[i].Name, "fix spec.podCIDRs (recreate the node object)", "has an unparsable pod CIDR %q", s)
				continue
			}
			all = append(all, owned{p.Masked(), nodes[i].Name})
		}
	}
	// sorted by start address, a prefix can only overlap the ones after it while
	// they start inside it
	sort.Slice(all, func(i, j int) bool {
		if c := all[i].p.Addr().Compare(all[j].p.Addr()); c != 0 {
			return c < 0
		}
		return all[i].p.Bits() < all[j].p.Bits()
	})
	for i := range all {
		for j := i + 1; j < len(all) && all[i].p.Contains(all[j].p.Addr()); j++ {
			if all[i].node == all[j].node {
				continue
			}
			r.add(CheckPodCIDROverlap, "node/"+all[j].node,
				"two nodes route the same pod addresses; delete and re-register one of them so node IPAM assigns a free range",
				"pod CIDR %s overlaps %s of node %s", all[j].p, all[i].p, all[i].node)
		}
	}
}

func (r *Report) checkWorkloads(ctx context.Context, c client.Client, deps []appsv1.Deployment) error {
	var ws []controller.CCMWorkload
	managed := map[string]bool{}
	add := func(kind string, o client.Object, spec corev1.PodSpec) {
		for _, ct := range spec.Containers {
			ref := kind + "/" + o.GetNamespace() + "/" + o.GetName()
			w, ok := controller.ParseCCMContainer(ref, ct)
			if !ok {
				continue
			}
			ws = append(ws, w)
			if o.GetLabels()[release.ManagedByLabel] == release.ManagedByValue || w.IsTalosCCM() {
				managed[ref] = true
			}
		}
	}
	for i := range deps {
		add("Deployment", &deps[i], deps[i].Spec.Template.Spec)
	}
	var dss appsv1.DaemonSetList
	if err := c.List(ctx, &dss); err != nil {
		return fmt.Errorf("list daemonsets: %w", err)
	}
	for i := range dss.Items {
		add("DaemonSet", &dss.Items[i], dss.Items[i].Spec.Template.Spec)
	}
	r.Inspected.Workloads = len(ws)
	leases := map[string][]string{}
	for _, w := range ws {
		if !managed[w.Ref] && w.RunsCloudNode() {
			r.add(CheckForeignCCM, w.Ref,
				"run it lifecycle-only (--controllers=cloud-node-lifecycle) or let ccm-coordinator install it; only talos-ccm may initialize nodes",
				"is a CCM not managed by Hybrid CCM and runs the cloud-node controller (--controllers=%s)", strings.Join(w.Controllers, ","))
		}
		if w.LeaderElect {
			k := w.LeaseNamespace + "/" + w.LeaseName
			leases[k] = append(leases[k], w.Ref)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(leases)) {
		if refs := leases[k]; len(refs) > 1 {
			sort.Strings(refs)
			r.add(CheckSharedLease, "lease/"+k,
				"give each CCM its own --leader-elect-resource-name: with a shared lease only one of them runs",
				"is the leader-election lease of %d CCMs: %s", len(refs), strings.Join(refs, ", "))
		}
	}
	return nil
}

// checkNativeCCMs checks the NativeCCMs and the fence; all, also the
// cluster-wide checks of grants, orphans and the coordinator's namespace,
// and of the nodes' opt-out labels.
func (r *Report) checkNativeCCMs(ctx context.Context, c client.Client, nodes []corev1.Node, all bool) error {
	var list v1.NativeCCMList
	if err := c.List(ctx, &list); err != nil {
		if apimeta.IsNoMatchError(err) || isNotFound(err) {
			r.Notes = append(r.Notes, "the NativeCCM API (hybridccm.io/v1alpha1) is not installed: ccm-coordinator checks skipped")
			return nil
		}
		return fmt.Errorf("list nativeccms: %w", err)
	}
	r.Inspected.NativeCCMs = len(list.Items)
	if all && len(list.Items) > 0 && r.coordinator == nil {
		r.add(CheckCoordinatorAbsent, "deployment/ccm-coordinator", r.coordinatorLogs(),
			"%d NativeCCM(s) but no ccm-coordinator Deployment: no native CCM is installed, upgraded or removed", len(list.Items))
	}
	ns, err := r.checkFence(ctx, c)
	if err != nil {
		return err
	}
	if all {
		if err := r.checkAll(ctx, c, ns, list.Items, nodes); err != nil {
			return err
		}
	}
	r.checkLoadBalancerClasses(list.Items)
	r.checkUnowned(list.Items, nodes)
	r.checkUpstreamSkew(list.Items)
	r.checkNativeCCMConditions(list.Items)
	return nil
}

// checkAll is the part of checkNativeCCMs that reads cluster-wide what no
// component's scope covers.
func (r *Report) checkAll(ctx context.Context, c client.Client, ns string, nccms []v1.NativeCCM, nodes []corev1.Node) error {
	list := v1.NativeCCMList{Items: nccms}
	if err := r.checkGrants(ctx, c, ns, list.Items); err != nil {
		return err
	}
	if err := r.checkOrphans(ctx, c, ns, list.Items); err != nil {
		return err
	}
	if err := r.checkLifecycleGrants(ctx, c, ns); err != nil {
		return err
	}
	if err := r.checkCoordinatorNamespace(ctx, c, ns); err != nil {
		return err
	}
	if err := r.checkReleaseRecords(ctx, c, ns); err != nil {
		return err
	}
	r.checkForeignNodeLabels(list.Items, nodes)
	return nil
}

// checkReleaseRecords reads every Helm release record of the coordinator's
// namespace ns (release.RecordProblems): records the coordinator writes are
// never trusted input for anyone else's Helm.
func (r *Report) checkReleaseRecords(ctx context.Context, c client.Client, ns string) error {
	if ns == "" {
		return nil
	}
	var secrets corev1.SecretList
	err := c.List(ctx, &secrets, client.InNamespace(ns), client.MatchingLabels{release.StorageOwnerLabel: release.StorageOwner})
	switch {
	case isForbidden(err):
		r.Notes = append(r.Notes, "cannot list Secrets of "+ns+": Helm release records not checked")
		return nil
	case err != nil:
		return fmt.Errorf("list release records: %w", err)
	}
	for i := range secrets.Items {
		s := &secrets.Items[i]
		if s.Type != release.HelmStorageType {
			continue
		}
		for _, p := range release.RecordProblems(s) {
			r.add(CheckReleaseRecord, "secret/"+ns+"/"+s.Name,
				fmt.Sprintf("run no Helm command on it; remove the release with hybridctl cleanup native-ccm %s -n %s and find out who wrote the record",
					strings.TrimPrefix(s.Labels[release.StorageNameLabel], v1.ReleasePrefix), ns),
				"%s", p)
		}
	}
	return nil
}

// checkNativeCCMConditions reports the NativeCCMs that are not Ready, or
// whose installed CCM is not running.
func (r *Report) checkNativeCCMConditions(nccms []v1.NativeCCM) {
	for i := range nccms {
		n := &nccms[i]
		if n.Spec.Suspend {
			continue
		}
		ready := apimeta.FindStatusCondition(n.Status.Conditions, "Ready")
		healthy := apimeta.FindStatusCondition(n.Status.Conditions, v1.HealthyCondition)
		if owned := apimeta.FindStatusCondition(n.Status.Conditions, v1.NodesOwnedCondition); owned != nil && owned.Status == metav1.ConditionFalse {
			r.add(CheckNodesNotOwned, "nativeccm/"+n.Name, "kubectl describe nativeccm "+n.Name+` (docs/coordinator.md, "Domains")`,
				"nodes of its domain have no CCM: %s: %s", owned.Reason, owned.Message)
		}
		if conflict := apimeta.FindStatusCondition(n.Status.Conditions, v1.ConflictCondition); conflict != nil &&
			conflict.Status == metav1.ConditionTrue && strings.Contains(conflict.Message, controller.PreviousCCMLiveMessage) {
			r.add(CheckPreviousCCMRunning, "nativeccm/"+n.Name, previousCCMFix(n, v1.PreviousCCMLiveReason),
				"its release is installed and the CCM it took over from runs again beside it: %s", conflict.Message)
		}
		switch {
		case ready != nil && ready.Status == metav1.ConditionFalse &&
			(ready.Reason == v1.WaitingForPreviousCCMReason || ready.Reason == v1.PreviousCCMLeaseUnreadableReason):
			r.add(CheckWaitingForPreviousCCM, "nativeccm/"+n.Name, previousCCMFix(n, ready.Reason),
				"is not installed while the CCM it takes over from may run: %s: %s", ready.Reason, ready.Message)
		case healthy != nil && healthy.Status == metav1.ConditionFalse:
			r.add(CheckCCMNotRunning, "nativeccm/"+n.Name, notRunningFix(n, healthy.Reason),
				"release installed, but its CCM is not running: %s: %s", healthy.Reason, healthy.Message)
		case ready == nil:
			r.add(CheckNativeCCM, "nativeccm/"+n.Name, r.coordinatorLogs(),
				"has no Ready condition yet (never reconciled)")
		case ready.Status != metav1.ConditionTrue:
			r.add(CheckNativeCCM, "nativeccm/"+n.Name, "kubectl describe nativeccm "+n.Name,
				"is not Ready: %s: %s", ready.Reason, ready.Message)
		}
	}
}

// previousCCMFix says what to do about the CCM NativeCCM n takes over from
// (spec.takeOver.lease), by the reason the coordinator gave.
func previousCCMFix(n *v1.NativeCCM, reason string) string {
	lease := "(spec.takeOver.lease)"
	if n.Spec.TakeOver != nil {
		lease = n.Spec.TakeOver.Lease
	}
	if reason == v1.PreviousCCMLeaseUnreadableReason {
		return "let the coordinator get Lease " + lease + ": the hybrid-ccm chart renders the Role from clouds." + n.Name +
			".takeOver.lease, the ccm-coordinator chart alone from takeOverLeases (docs/migrating-from-a-cloud-ccm.md)"
	}
	return "uninstall the CCM that holds Lease " + lease + " (kubectl -n " + strings.SplitN(lease, "/", 2)[0] + " get lease " + path.Base(lease) +
		" -o yaml names its pod); " + n.ReleaseName() + " is installed once that Lease runs out (docs/migrating-from-a-cloud-ccm.md)"
}

// checkLoadBalancerClasses finds NativeCCMs that ask to serve the same load
// balancer class, or all to be the default for Services without a class: the
// coordinator lets the oldest serve it and the others not.
func (r *Report) checkLoadBalancerClasses(nccms []v1.NativeCCM) {
	byClass := map[string][]string{}
	var defaults []string
	for i := range nccms {
		n := &nccms[i]
		if !n.LoadBalancersEnabled() || !n.DeletionTimestamp.IsZero() {
			continue
		}
		byClass[n.LoadBalancerClass()] = append(byClass[n.LoadBalancerClass()], n.Name)
		if n.Spec.LoadBalancers.Default {
			defaults = append(defaults, n.Name)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(byClass)) {
		if names := byClass[c]; len(names) > 1 {
			sort.Strings(names)
			r.add(CheckLBConflict, "loadbalancerclass/"+c, "give each NativeCCM its own spec.loadBalancers.class (kubectl edit nativeccm "+names[1]+")",
				"NativeCCMs %s all ask to serve load balancer class %s: only the oldest does", strings.Join(names, ", "), c)
		}
	}
	if len(defaults) > 1 {
		sort.Strings(defaults)
		r.add(CheckLBConflict, "loadbalancerclass/(none)", "set spec.loadBalancers.default on one NativeCCM only",
			"NativeCCMs %s are all the default for Services of type LoadBalancer without a class: only the oldest is", strings.Join(defaults, ", "))
	}
}

// checkFence reads the fence (the ccm-coordinator chart's admission policy)
// and reports it when the API server does not enforce it as this version
// does: absent, bound without Deny, failing open, with a paramKind (the
// fence before issue 22, which refuses every node write of everyone while its
// param kind is unknown: after each API server start), or confining no
// namespace. It returns the namespace whose native-ccm-* ServiceAccounts the
// fence confines, "" when none.
func (r *Report) checkFence(ctx context.Context, c client.Client) (string, error) {
	obj := "validatingadmissionpolicy/" + gate.DefaultFenceName
	const install = "install (or upgrade to) the ccm-coordinator chart of your coordinator's version: it ships the fence"
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, o := range []struct {
		kind string
		obj  client.Object
	}{{"validatingadmissionpolicy", &policy}, {"validatingadmissionpolicybinding", &binding}} {
		err := c.Get(ctx, client.ObjectKey{Name: gate.DefaultFenceName}, o.obj)
		switch {
		case isForbidden(err):
			r.Notes = append(r.Notes, "cannot read the fence ("+gate.DefaultFenceName+"): not checked")
			return "", nil
		case isNotFound(err):
			r.add(CheckFence, o.kind+"/"+gate.DefaultFenceName, install, "does not exist: the API server confines no native CCM")
			return "", nil
		case err != nil:
			return "", fmt.Errorf("get the fence: %w", err)
		}
	}
	if pk := policy.Spec.ParamKind; pk != nil {
		r.add(CheckFence, obj, install,
			"has paramKind %s %s: an older fence, which refuses every node write of every identity (kubelets too) while the API server does not know that kind: for about 30 s after each API server start, and while the CRD is missing or new",
			pk.APIVersion, pk.Kind)
	}
	if !slices.Contains(binding.Spec.ValidationActions, admissionregistrationv1.Deny) || binding.Spec.PolicyName != policy.Name {
		r.add(CheckFence, "validatingadmissionpolicybinding/"+gate.DefaultFenceName, install,
			"does not bind the fence with Deny (validationActions %v, policy %q): its denials are not enforced", binding.Spec.ValidationActions, binding.Spec.PolicyName)
	}
	if fp := policy.Spec.FailurePolicy; fp != nil && *fp != admissionregistrationv1.Fail {
		r.add(CheckFence, obj, install, "has failurePolicy %s: an evaluation error lets a native CCM's write through", *fp)
	}
	ns := gate.FenceNamespace(&policy)
	if ns == "" {
		if policy.Spec.ParamKind == nil {
			r.add(CheckFence, obj, install, "confines no namespace's native CCM ServiceAccounts (its match condition is not the fence's)")
		}
		return "", nil
	}
	if err := gate.CheckFence(ctx, c, gate.Fence{Namespace: ns}); err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("the fence is not the one this hybridctl knows (another version, or changed): %v", err))
	}
	return ns, nil
}

// checkGrants asks the API server, for every NativeCCM, whether its CCM's
// ServiceAccount holds the grant the fence confines it to: without it the
// fence refuses all its writes (and the coordinator installs nothing).
func (r *Report) checkGrants(ctx context.Context, c client.Client, ns string, nccms []v1.NativeCCM) error {
	if ns == "" {
		return nil
	}
	for i := range nccms {
		n := &nccms[i]
		if !n.DeletionTimestamp.IsZero() {
			continue
		}
		err := gate.CheckGrant(ctx, c, gate.GrantFor(n, ns))
		var ge *gate.GrantError
		switch {
		case err == nil:
		case errors.As(err, &ge):
			r.add(CheckFenceGrant, "nativeccm/"+n.Name, ge.Fix(), "%s", ge.Problem())
		case isForbidden(err):
			r.Notes = append(r.Notes, "cannot create SubjectAccessReviews: the NativeCCMs' fence grants not checked")
			return nil
		case errors.Is(err, gate.ErrConfig):
			// the NativeCCM itself is invalid; NativeCCMNotReady says why
		default:
			return err
		}
	}
	return nil
}

// checkOrphans finds native CCM identities without their NativeCCM:
// ServiceAccounts native-ccm-<name> of the fence's namespace (the fence
// refuses them every node and Service write; nothing should run as them),
// and fence grants whose NativeCCM is gone (a ServiceAccount of that name
// would be confined to the grant's platform rather than refused).
func (r *Report) checkOrphans(ctx context.Context, c client.Client, ns string, nccms []v1.NativeCCM) error {
	exists := map[string]bool{}
	// split: the NativeCCMs split by a label, whose members' identities are
	// native-ccm-<name>--<value> (v1alpha1.NativeCCM.MemberName).
	split := map[string]bool{}
	// members: the members the NativeCCMs list (status.members).
	members := map[string]bool{}
	for _, n := range nccms {
		exists[n.Name] = true
		if n.Spec.Domain != nil && n.Spec.Domain.SplitBy != "" {
			split[n.Name] = true
		}
		for _, m := range n.Status.Members {
			if name, ok := strings.CutPrefix(m.Release, v1.ReleasePrefix); ok {
				members[name] = true
			}
		}
	}
	if ns != "" {
		var sas corev1.ServiceAccountList
		err := c.List(ctx, &sas, client.InNamespace(ns))
		switch {
		case isForbidden(err):
			r.Notes = append(r.Notes, "cannot list ServiceAccounts of "+ns+": orphaned native CCM identities not checked")
		case err != nil:
			return fmt.Errorf("list serviceaccounts: %w", err)
		}
		for _, sa := range sas.Items {
			name, ok := strings.CutPrefix(sa.Name, v1.ReleasePrefix)
			// The fence reads native-ccm-<name>--<value> as NativeCCM
			// <name>'s member for <value>, split at the first "--"
			// (NativeCCM names hold none), whatever NativeCCMs exist.
			owner, value, member := strings.Cut(name, "--")
			if !ok || members[name] || !member && exists[name] {
				continue
			}
			if member && split[owner] {
				// A member being installed is not listed yet; one its
				// NativeCCM never lists is left behind (or made by hand).
				if r.now.Sub(sa.CreationTimestamp.Time) < memberInstallGrace {
					continue
				}
				r.add(CheckOrphanIdentity, "serviceaccount/"+ns+"/"+sa.Name,
					fmt.Sprintf("find what runs as it (kubectl -n %s get pods -o wide --field-selector spec.serviceAccountName=%s) and delete it; NativeCCM %s's members: kubectl get nativeccm %s -o jsonpath='{.status.members}'", ns, sa.Name, owner, owner),
					"is the identity of a member of NativeCCM %s for %q, which %s does not list (status.members) after %s: the fence lets it change only the nodes labelled with that value", owner, value, owner, memberInstallGrace)
				continue
			}
			if member && exists[owner] {
				r.add(CheckOrphanIdentity, "serviceaccount/"+ns+"/"+sa.Name,
					fmt.Sprintf("find what runs as it (kubectl -n %s get pods -o wide --field-selector spec.serviceAccountName=%s) and delete it", ns, sa.Name),
					"is the identity of NativeCCM %s's member for %q, but %s is not split (spec.domain.splitBy): the fence refuses it every node and Service write", owner, value, owner)
				continue
			}
			r.add(CheckOrphanIdentity, "serviceaccount/"+ns+"/"+sa.Name,
				fmt.Sprintf("find what runs as it (kubectl -n %s get pods -o wide --field-selector spec.serviceAccountName=%s) and delete it, or recreate NativeCCM %s", ns, sa.Name, name),
				"is the identity of NativeCCM %s, which does not exist: the fence refuses it every node and Service write", name)
		}
	}
	var roles rbacv1.ClusterRoleList
	err := c.List(ctx, &roles, client.HasLabels{gate.GrantLabel})
	switch {
	case isForbidden(err):
		r.Notes = append(r.Notes, "cannot list ClusterRoles: orphaned fence grants not checked")
		return nil
	case err != nil:
		return fmt.Errorf("list clusterroles: %w", err)
	}
	for _, role := range roles.Items {
		name := role.Labels[gate.GrantLabel]
		if exists[name] {
			continue
		}
		r.add(CheckOrphanGrant, "clusterrole/"+role.Name,
			fmt.Sprintf("delete ClusterRole and ClusterRoleBinding %s, or recreate NativeCCM %s", role.Name, name),
			"is the fence grant of NativeCCM %s, which does not exist: a ServiceAccount %s%s is confined to what it grants instead of refused everything", name, v1.ReleasePrefix, name)
	}
	return nil
}

// checkLifecycleGrants finds bindings of the native CCMs' node rights
// (ClusterRole hybrid-ccm:native-ccm-lifecycle) to anyone the fence does not
// confine: it confines the ServiceAccounts native-ccm-* of its namespace ns
// (refusing those without a grant everything), and nothing else at all.
func (r *Report) checkLifecycleGrants(ctx context.Context, c client.Client, ns string) error {
	var bindings rbacv1.ClusterRoleBindingList
	if err := c.List(ctx, &bindings); err != nil {
		if isForbidden(err) {
			r.Notes = append(r.Notes, "cannot list ClusterRoleBindings: grants of the native CCMs' node rights not checked")
			return nil
		}
		return fmt.Errorf("list clusterrolebindings: %w", err)
	}
	for _, b := range bindings.Items {
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != release.LifecycleClusterRole {
			continue
		}
		for _, s := range b.Subjects {
			native := s.Kind == rbacv1.ServiceAccountKind && strings.HasPrefix(s.Name, v1.ReleasePrefix)
			switch {
			case native && (ns == "" || s.Namespace == ns):
				// confined by the fence (or no fence at all: FenceNotEnforced says so)
				continue
			case native:
				r.add(CheckUnfenced, "clusterrolebinding/"+b.Name,
					fmt.Sprintf("delete the binding (kubectl delete clusterrolebinding %s): native CCMs run in the coordinator's namespace %s", b.Name, ns),
					"grants %s to ServiceAccount %s/%s, but the fence confines only the native CCMs of namespace %s: it may change and delete any node",
					release.LifecycleClusterRole, s.Namespace, s.Name, ns)
			default:
				r.add(CheckUnfenced, "clusterrolebinding/"+b.Name, "delete the binding: only native CCM ServiceAccounts (native-ccm-<NativeCCM>) should hold this role",
					"grants %s to %s %s, which no fence confines: it may change and delete any node", release.LifecycleClusterRole, s.Kind, subjectName(s))
			}
		}
	}
	return nil
}

// checkCoordinatorNamespace looks at the coordinator's namespace ns (the
// fence's): what the coordinator's admission policy refuses it to write,
// whoever wrote it: Deployments, DaemonSets, StatefulSets and bare pods with
// host access, privileges or a root user (release.PodSecurityProblems; the
// host network only for the platforms the policy lets have it), Services
// with external IPs, a node port or a load balancer (the coordinator writes
// none), and a namespace whose Pod Security enforcement is below restricted
// although no profile needs the host network.
func (r *Report) checkCoordinatorNamespace(ctx context.Context, c client.Client, ns string) error {
	if ns == "" {
		return nil
	}
	hostNetwork, found, err := coordinatorHostNetworkPlatforms(ctx, c)
	switch {
	case isForbidden(err):
		r.Notes = append(r.Notes, "cannot read the coordinator's admission policy: host network taken as declared by no profile")
	case err != nil:
		return err
	case !found:
		r.Notes = append(r.Notes, "no admission policy of a ccm-coordinator chart found: the API server does not refuse the coordinator unsafe workloads (install the chart of your coordinator's version)")
	}
	fix := func(kind, name string) string {
		return fmt.Sprintf("find who wrote it (kubectl -n %s get %s %s --show-managed-fields) and delete it; the coordinator of this version renders native CCMs without host access as a non-root user, and its admission policy refuses it anything else", ns, strings.ToLower(kind), name)
	}
	report := func(kind string, o client.Object, tplLabels map[string]string, spec *corev1.PodSpec) {
		problems := release.PodSecurityProblems(spec, slices.Contains(hostNetwork, tplLabels[release.PlatformLabel]))
		if len(problems) == 0 {
			return
		}
		msgs := make([]string, len(problems))
		for i, p := range problems {
			msgs[i] = p.Field + ": " + p.Reason
		}
		r.add(CheckUnsafeWorkload, strings.ToLower(kind)+"/"+ns+"/"+o.GetName(), fix(kind, o.GetName()),
			"runs pods with host access, privileges or a root user in the coordinator's namespace: %s", strings.Join(msgs, "; "))
	}
	lists := []struct {
		kind string
		list client.ObjectList
		each func(client.ObjectList)
	}{
		{"Deployment", &appsv1.DeploymentList{}, func(l client.ObjectList) {
			for i := range l.(*appsv1.DeploymentList).Items {
				o := &l.(*appsv1.DeploymentList).Items[i]
				report("Deployment", o, o.Spec.Template.Labels, &o.Spec.Template.Spec)
			}
		}},
		{"DaemonSet", &appsv1.DaemonSetList{}, func(l client.ObjectList) {
			for i := range l.(*appsv1.DaemonSetList).Items {
				o := &l.(*appsv1.DaemonSetList).Items[i]
				report("DaemonSet", o, o.Spec.Template.Labels, &o.Spec.Template.Spec)
			}
		}},
		{"StatefulSet", &appsv1.StatefulSetList{}, func(l client.ObjectList) {
			for i := range l.(*appsv1.StatefulSetList).Items {
				o := &l.(*appsv1.StatefulSetList).Items[i]
				report("StatefulSet", o, o.Spec.Template.Labels, &o.Spec.Template.Spec)
			}
		}},
		{"Pod", &corev1.PodList{}, func(l client.ObjectList) {
			for i := range l.(*corev1.PodList).Items {
				o := &l.(*corev1.PodList).Items[i]
				if len(o.OwnerReferences) == 0 { // a workload's pods are its findings
					report("Pod", o, o.Labels, &o.Spec)
				}
			}
		}},
		{"Service", &corev1.ServiceList{}, func(l client.ObjectList) {
			for _, s := range l.(*corev1.ServiceList).Items {
				var what string
				switch {
				case len(s.Spec.ExternalIPs) > 0:
					what = "has spec.externalIPs " + strings.Join(s.Spec.ExternalIPs, ", ") + ": it captures traffic to those addresses in the cluster (CVE-2020-8554)"
				case s.Spec.Type == corev1.ServiceTypeNodePort:
					what = "is of type NodePort: it is published on every node"
				case s.Spec.Type == corev1.ServiceTypeLoadBalancer:
					what = "is of type LoadBalancer"
					if s.Spec.LoadBalancerClass != nil {
						what += " (class " + *s.Spec.LoadBalancerClass + ")"
					}
					what += ": a cloud load balancer publishes it"
				default:
					continue
				}
				r.add(CheckPublishedSvc, "service/"+ns+"/"+s.Name, fix("Service", s.Name),
					"%s; the coordinator writes no Services and no native CCM needs one", what)
			}
		}},
	}
	for _, l := range lists {
		err := c.List(ctx, l.list, client.InNamespace(ns))
		switch {
		case isForbidden(err):
			r.Notes = append(r.Notes, fmt.Sprintf("cannot list %ss of %s: not checked for host access or publishing", l.kind, ns))
			continue
		case err != nil:
			return fmt.Errorf("list %ss of %s: %w", strings.ToLower(l.kind), ns, err)
		}
		l.each(l.list)
	}

	var namespace corev1.Namespace
	err = c.Get(ctx, client.ObjectKey{Name: ns}, &namespace)
	switch {
	case isForbidden(err):
		r.Notes = append(r.Notes, "cannot read namespace "+ns+": its Pod Security level not checked")
		return nil
	case isNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get namespace %s: %w", ns, err)
	}
	const enforce = "pod-security.kubernetes.io/enforce"
	if level := namespace.Labels[enforce]; len(hostNetwork) == 0 && level != "restricted" {
		if level == "" {
			level = "none (label " + enforce + " not set: the cluster's default, usually privileged)"
		}
		r.add(CheckPodSecurity, "namespace/"+ns, fmt.Sprintf("kubectl label namespace %s %s=restricted --overwrite (the ccm-coordinator chart does, when it creates the namespace)", ns, enforce),
			"enforces Pod Security level %s: every pod there, the native CCMs' too, meets restricted, and no profile needs the host network", level)
	}
	return nil
}

// coordinatorHostNetworkPlatforms reads the platforms the coordinator's
// admission policies (of the ccm-coordinator chart) let run on the host
// network: their variable hostNetworkPlatforms, a JSON list. found says
// whether there is such a policy.
func coordinatorHostNetworkPlatforms(ctx context.Context, c client.Client) (platforms []string, found bool, err error) {
	var policies admissionregistrationv1.ValidatingAdmissionPolicyList
	if err := c.List(ctx, &policies, client.MatchingLabels{"app.kubernetes.io/name": "ccm-coordinator"}); err != nil {
		return nil, false, err
	}
	for _, p := range policies.Items {
		for _, v := range p.Spec.Variables {
			if v.Name != "hostNetworkPlatforms" {
				continue
			}
			found = true
			var list []string
			if err := json.Unmarshal([]byte(v.Expression), &list); err == nil {
				platforms = append(platforms, list...)
			}
		}
	}
	return platforms, found, nil
}

func subjectName(s rbacv1.Subject) string {
	if s.Namespace != "" {
		return s.Namespace + "/" + s.Name
	}
	return s.Name
}

func isForbidden(err error) bool {
	var se interface{ Status() metav1.Status }
	return errors.As(err, &se) && se.Status().Code == 403
}

// notRunningFix says where to look when a NativeCCM's CCM is not running.
func notRunningFix(n *v1.NativeCCM, reason string) string {
	ns := "hybrid-ccm-system" // the coordinator's default namespace
	if n.Status.Release != nil && n.Status.Release.Namespace != "" {
		ns = n.Status.Release.Namespace
	}
	if reason == v1.LeaseHeldByForeignIdentityReason && n.Status.Leader != nil {
		lns, name, _ := strings.Cut(n.Status.Leader.Lease, "/")
		return fmt.Sprintf("find the process that holds the lease (kubectl -n %s get lease %s -o yaml) and give it a lease name of its own", lns, name)
	}
	return fmt.Sprintf("kubectl -n %s get pods -l %s=%s; kubectl -n %s logs -l %s=%s --all-containers --previous",
		ns, release.NativeCCMLabel, n.ReleaseName(), ns, release.NativeCCMLabel, n.ReleaseName())
}

func isNotFound(err error) bool {
	var se interface{ Status() metav1.Status }
	return errors.As(err, &se) && se.Status().Code == 404
}

func (r *Report) checkCSRs(ctx context.Context, c client.Client, o Options) error {
	var list certificatesv1.CertificateSigningRequestList
	if err := c.List(ctx, &list); err != nil {
		return fmt.Errorf("list certificatesigningrequests: %w", err)
	}
	for i := range list.Items {
		csr := &list.Items[i]
		if csr.Spec.SignerName != certificatesv1.KubeletServingSignerName {
			continue
		}
		r.Inspected.CSRs++
		decided := slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
			return c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed
		})
		age := o.Now.Sub(csr.CreationTimestamp.Time).Truncate(time.Second)
		if !decided && age >= o.CSRPendingAfter {
			r.add(CheckPendingCSR, "csr/"+csr.Name,
				"is node-csr-approval enabled in talos-ccm (--controllers)? an uninitialized node's CSR waits for its initialization",
				"kubelet-serving request of %s undecided for %s", csr.Spec.Username, age)
		}
	}
	return nil
}

// checkUnowned reports the nodes of a platform some NativeCCM serves that no
// NativeCCM's domain (spec.platform and spec.domain.selector) covers: no
// native CCM manages their lifecycle.
func (r *Report) checkUnowned(nccms []v1.NativeCCM, nodes []corev1.Node) {
	domains := map[string][]domain.Domain{}
	for i := range nccms {
		n := &nccms[i]
		if !n.DeletionTimestamp.IsZero() {
			continue
		}
		var sel *metav1.LabelSelector
		if n.Spec.Domain != nil {
			sel = n.Spec.Domain.Selector
		}
		d, err := domain.FromSelector(n.Spec.Platform, names.PlatformLabel, sel)
		if err != nil {
			continue // the NativeCCM is stalled: NativeCCMNotReady says why
		}
		domains[n.Spec.Platform] = append(domains[n.Spec.Platform], d)
	}
	unowned := map[string][]string{}
	for i := range nodes {
		n := &nodes[i]
		p := n.Labels[names.PlatformLabel]
		ds, served := domains[p]
		if !served || slices.ContainsFunc(ds, func(d domain.Domain) bool { return d.Contains(names.PlatformLabel, n.Labels) }) {
			continue
		}
		unowned[p] = append(unowned[p], n.Name)
	}
	for _, p := range slices.Sorted(maps.Keys(unowned)) {
		list := unowned[p]
		sort.Strings(list)
		shown := list
		if len(shown) > 5 {
			shown = append(slices.Clone(shown[:5]), "...")
		}
		r.add(CheckUnowned, "platform/"+p, "give them a NativeCCM whose spec.domain.selector covers them, or widen a domain (docs/coordinator.md, \"Domains\"): kubectl get nodes -L topology.kubernetes.io/region,"+v1.DomainLabel+" -l "+names.PlatformLabel+"="+p,
			"%d node(s) of platform %s are in no NativeCCM's domain, so no native CCM manages their lifecycle: %s", len(list), p, strings.Join(shown, ", "))
	}
}

package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Domains: a NativeCCM owns the nodes of its platform that its domain
// (spec.domain.selector) selects — what one CCM of the cloud sees with its
// credentials and cloud config. The reconciler refuses domains it cannot
// enforce, a younger NativeCCM whose domain overlaps an older one's of the
// same platform, and a domain whose nodes span the profile's boundary label
// (an aws CCM sees one region and deletes every other region's node as "not
// found"); and it reports the platform's nodes that no domain covers.

// shownNodes is how many node names a domain message gives.
const shownNodes = 3

// resolveDomain reads spec.domain: the domain, the profile's boundary
// label ("" when the profile knows none) and the split label
// (spec.domain.splitBy, "" when not split). A domain the fence or the node
// store cannot check stalls.
func (r *NativeCCMReconciler) resolveDomain(obj *v1.NativeCCM, p *profile.Profile) (domain.Domain, string, string, error) {
	stall := func(err error) (domain.Domain, string, string, error) {
		return domain.Domain{}, "", "", r.stallProfile(obj, v1.InvalidDomainReason, err)
	}
	if strings.Contains(obj.Name, domain.SplitSeparator) {
		return stall(fmt.Errorf("metadata.name %q contains %q, which names the members of a split NativeCCM: the fence would take its ServiceAccount for one; rename it", obj.Name, domain.SplitSeparator))
	}
	d, splitBy, err := domain.Of(obj, p)
	if err != nil {
		return stall(err)
	}
	if missing := r.nodes.missingKeys(domain.Keys(d, splitBy)); len(missing) > 0 {
		field := "spec.domain.selector"
		if slices.Contains(missing, splitBy) {
			field = "spec.domain.splitBy"
		}
		return stall(fmt.Errorf("%s: the coordinator knows the domain labels %v, not %v: add them to the ccm-coordinator chart's fence.domainLabels, which sets the fence and --domain-labels", field, r.nodes.keys, missing))
	}
	boundary := ""
	if p.Domain != nil {
		boundary = p.Domain.BoundaryLabel
	}
	if boundary != "" && !slices.Contains(r.nodes.keys, boundary) {
		boundary = "" // the store keeps no values of it: no spanning check
	}
	return d, boundary, splitBy, nil
}

// checkDomain returns why the NativeCCM may not run a CCM for its domain:
// an older NativeCCM of the platform owns some of the same nodes; or the
// domain's nodes carry several values of the boundary label and nothing is
// installed yet. When a CCM is installed and its nodes come to span several
// values, it is not taken away (node labels must not uninstall a
// platform's CCM: a kubelet may set its own region), but kept to the value
// it served (status.boundaryValue): the narrowed domain is returned.
// others are the platform's NativeCCMs (platformNativeCCMs).
func (r *NativeCCMReconciler) checkDomain(obj *v1.NativeCCM, others []v1.NativeCCM, d domain.Domain, boundary string, nodes domainView) (*stallError, *domain.Domain) {
	for i := range others {
		o := &others[i]
		if o.Name == obj.Name || !o.DeletionTimestamp.IsZero() || !older(o, obj) {
			continue
		}
		od, err := domain.FromSelector(o.Spec.Platform, names.PlatformLabel, selectorOf(o))
		if err != nil {
			continue // that one is stalled itself and installs nothing
		}
		example, overlap := domain.Overlap(d, od)
		if !overlap {
			continue
		}
		_, first := r.nodes.nodesWhere(obj.Spec.Platform, func(l map[string]string) bool {
			return d.Contains(names.PlatformLabel, l) && od.Contains(names.PlatformLabel, l)
		}, 1)
		where := "no such node yet"
		if len(first) > 0 {
			where = "e.g. node " + first[0]
		}
		return &stallError{reason: v1.DomainOverlapReason, err: fmt.Errorf(
			"NativeCCM %s (older) already owns some of its nodes: both own %s nodes with %s (%s); no node is owned twice, so %s installs nothing until one of the two domains (spec.domain.selector) is narrowed",
			o.Name, obj.Spec.Platform, labelList(example), where, obj.Name)}, nil
	}
	if boundary == "" {
		return nil, nil
	}
	values := slices.Sorted(maps.Keys(nodes.Values))
	values = slices.DeleteFunc(values, func(v string) bool { return v == "" })
	if len(values) == 1 && obj.Status.Release != nil {
		obj.Status.BoundaryValue = values[0]
	}
	if len(values) < 2 {
		return nil, nil
	}
	parts := make([]string, 0, len(values))
	for _, v := range values {
		_, first := r.nodes.nodesWhere(obj.Spec.Platform, func(l map[string]string) bool {
			return d.Contains(names.PlatformLabel, l) && l[boundary] == v
		}, 1)
		parts = append(parts, fmt.Sprintf("%s (%d node(s), e.g. %s)", v, nodes.Values[v], strings.Join(first, "")))
	}
	spans := fmt.Sprintf("its nodes are in %d values of %s: %s; one %s CCM sees one %s and deletes every other one's nodes as not found",
		len(values), boundary, strings.Join(parts, ", "), obj.Spec.Platform, boundaryNoun(boundary))
	fix := fmt.Sprintf("give each value a NativeCCM of its own with spec.domain.selector (%s in (...)), with the credentials and cloud config for it", boundary)
	if obj.Status.Release == nil {
		return &stallError{reason: v1.DomainSpansBoundaryReason, err: fmt.Errorf("%s, so nothing is installed: %s", spans, fix)}, nil
	}
	// Installed: never taken away by node labels.
	var msg string
	var narrowed *domain.Domain
	if kept := obj.Status.BoundaryValue; kept != "" {
		if n, ok := d.With(boundary, kept); ok {
			narrowed = &n
		}
		msg = fmt.Sprintf("%s: the installed CCM is kept to %s=%s, the value its nodes had, and sees no other; the others' nodes are no native CCM's: %s", spans, boundary, kept, fix)
	} else {
		msg = fmt.Sprintf("%s: the installed CCM is left as it is, since the coordinator never saw which value it serves; %s", spans, fix)
	}
	r.nodesOwnedFalse(obj, v1.DomainSpansBoundaryReason, msg)
	return nil, narrowed
}

// refuse takes the release away (a CCM that would delete nodes it does not
// own must not run) and stalls with the reason.
func (r *NativeCCMReconciler) refuse(ctx context.Context, obj *v1.NativeCCM, s *stallError) error {
	if !conditions.HasAnyReason(obj, meta.StalledCondition, s.reason) || conditions.GetMessage(obj, meta.StalledCondition) != s.err.Error() {
		r.event(obj, corev1.EventTypeWarning, s.reason, s.err.Error())
	}
	if obj.Status.Release != nil {
		if err := r.uninstall(ctx, obj, s.reason+": "+s.err.Error()); err != nil {
			return err
		}
	}
	if err := r.removeMembers(ctx, obj, s.reason+": "+s.err.Error()); err != nil {
		return err
	}
	if err := r.deleteLease(ctx, obj.ReleaseName()); err != nil {
		return err
	}
	r.gateChecks.forget(obj.UID)
	obj.Status.Release, obj.Status.Leader, obj.Status.Failures = nil, nil, 0
	conditions.Delete(obj, v1.HealthyCondition)
	conditions.Delete(obj, v1.GatedCondition)
	conditions.MarkFalse(obj, v1.InstalledCondition, s.reason, "%s", s.err)
	conditions.MarkFalse(obj, meta.ReadyCondition, s.reason, "%s", s.err)
	return s
}

// reportUnowned counts the platform's nodes that no NativeCCM's domain
// covers (status.unownedNodes, the NodesOwned condition, a Warning event
// when the set changes).
func (r *NativeCCMReconciler) reportUnowned(obj *v1.NativeCCM, all []v1.NativeCCM) {
	var domains []domain.Domain
	for i := range all {
		o := &all[i]
		if !o.DeletionTimestamp.IsZero() {
			continue
		}
		if d, err := domain.FromSelector(o.Spec.Platform, names.PlatformLabel, selectorOf(o)); err == nil {
			domains = append(domains, d)
		}
	}
	count, first := r.nodes.nodesWhere(obj.Spec.Platform, func(l map[string]string) bool {
		return !slices.ContainsFunc(domains, func(d domain.Domain) bool { return d.Contains(names.PlatformLabel, l) })
	}, shownNodes)
	obj.Status.UnownedNodes = int32(count)
	if count == 0 {
		conditions.MarkTrue(obj, v1.NodesOwnedCondition, v1.AllNodesOwnedReason, "every node of platform %s is in the domain of a NativeCCM", obj.Spec.Platform)
		return
	}
	msg := fmt.Sprintf("%d node(s) of platform %s are in no NativeCCM's domain, so no native CCM manages their lifecycle: %s", count, obj.Spec.Platform, strings.Join(first, ", "))
	if count > len(first) {
		msg += ", ..."
	}
	r.nodesOwnedFalse(obj, v1.UnownedNodesReason, msg)
}

// nodesOwnedFalse marks NodesOwned False and warns with an event when the
// message is not the one last warned of for obj. The condition itself is no
// memory of that: several steps of one reconcile write it (the unowned nodes
// first, then the boundary or the split), so comparing with it warned again
// on every reconcile.
func (r *NativeCCMReconciler) nodesOwnedFalse(obj *v1.NativeCCM, reason, msg string) {
	key := string(obj.UID) + "/" + reason
	if last, ok := r.nodesOwnedWarned.Load(key); !ok || last.(string) != msg {
		r.event(obj, corev1.EventTypeWarning, reason, msg)
		r.nodesOwnedWarned.Store(key, msg)
	}
	conditions.MarkFalse(obj, v1.NodesOwnedCondition, reason, "%s", msg)
}

// platformNativeCCMs are the NativeCCMs of a platform (the manager's cache).
func (r *NativeCCMReconciler) platformNativeCCMs(ctx context.Context, platform string) ([]v1.NativeCCM, error) {
	var list v1.NativeCCMList
	if err := r.List(ctx, &list, client.MatchingFields{platformIndex: platform}); err != nil {
		return nil, err
	}
	return list.Items, nil
}

func selectorOf(o *v1.NativeCCM) *metav1.LabelSelector {
	if o.Spec.Domain == nil {
		return nil
	}
	return o.Spec.Domain.Selector
}

// labelList writes labels as k=v, sorted by key.
func labelList(l map[string]string) string {
	if len(l) == 0 {
		return "any labels"
	}
	parts := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ", ")
}

// boundaryNoun names what a boundary label's values are.
func boundaryNoun(label string) string {
	if i := strings.LastIndexByte(label, '/'); i >= 0 {
		return label[i+1:]
	}
	return label
}

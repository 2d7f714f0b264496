package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Reasons of the Gated condition.
const (
	// GateEnforcedReason: the fence is in place and the release carries the view.
	GateEnforcedReason = "GateEnforced"
	// GateFailedReason: the fence could not be written; nothing is installed
	// until it is.
	GateFailedReason = "GateFailed"
)

// Coordinator wires the gate into every release of the NativeCCM reconciler.
// Its Mutators method is a coordinator/controller.MutatorsFunc:
//
//	r.Mutators = gate.Coordinator{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Image: gateImage}.Mutators
type Coordinator struct {
	// Client writes the NativeCCM's status.gate and asks the API server
	// (SubjectAccessReviews) whether the release's ServiceAccount holds its
	// grant.
	Client client.Client
	// Reader reads the fence's policy and binding by name (uncached: the
	// coordinator may get those two objects and nothing else of
	// admissionregistration.k8s.io).
	Reader client.Reader
	// FenceName names the fence policy and binding; default DefaultFenceName.
	FenceName string
	// Image of ccm-gate.
	Image string
	// ImagePullPolicy of ccm-gate; empty: Kubernetes' default.
	ImagePullPolicy corev1.PullPolicy
	// NetworkPolicy, when set, gives every release a NetworkPolicy for its
	// pods (NetworkPolicy); nil: none.
	NetworkPolicy *NetworkPolicyConfig
}

// Mutators checks that the fence is installed and current, that it knows
// the providerID prefixes of the NativeCCM's profile for its platform, and
// that the release's ServiceAccount holds the NativeCCM's grant (what the
// fence confines it to); it records status.gate (what the fence enforces for
// it) and returns the sidecar mutator that adds the view (and, with
// NetworkPolicy set, the mutator that adds the release's NetworkPolicy). It records the
// Gated condition. Errors that wrap ErrConfig need a change of the NativeCCM
// or profile; others (a missing fence or grant, the API server) are worth a
// retry.
func (g Coordinator) Mutators(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile, l release.Lifecycle) ([]release.Mutator, error) {
	fail := func(err error) ([]release.Mutator, error) {
		conditions.MarkFalse(obj, v1.GatedCondition, GateFailedReason, "%s", err)
		return nil, err
	}
	f := Fence{Name: g.FenceName, Namespace: l.Namespace}
	dom, splitBy, err := domain.Of(obj, p)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrConfig, err))
	}
	member := splitBy != "" && strings.HasPrefix(l.Username(), f.Username(obj.Name)+domain.SplitSeparator)
	if l.Username() != f.Username(obj.Name) && !member {
		return fail(fmt.Errorf("%w: the release runs as %s, but the fence confines %s", ErrConfig, l.Username(), f.Username(obj.Name)))
	}
	if err := ValidatePrefixes(p.ProviderIDPrefixes); err != nil {
		return fail(fmt.Errorf("profile %s: %w", p.Name, err))
	}
	reader := g.Reader
	if reader == nil {
		reader = g.Client
	}
	installed, err := ReadFence(ctx, reader, f)
	if err != nil {
		return fail(err)
	}
	if missing := domain.Unenforceable(dom, splitBy, installed.DomainKeys); len(missing) > 0 {
		return fail(fmt.Errorf("%w: spec.domain: the fence checks the domain labels %v, not %v: add them to the ccm-coordinator chart's fence.domainLabels (docs/gate.md, \"Domains\")",
			ErrConfig, installed.DomainKeys, missing))
	}
	// The fence takes the prefixes of the node's platform from its own table,
	// which the chart renders from the same profiles the coordinator loads.
	enforced := installed.Prefixes[l.Platform]
	if missing := slices.DeleteFunc(slices.Clone(p.ProviderIDPrefixes), func(x string) bool { return slices.Contains(enforced, x) }); len(missing) > 0 {
		return fail(fmt.Errorf("%w: the fence knows providerID prefixes %v of platform %s, not %v of profile %s: install the ccm-coordinator chart with the profile overrides the coordinator runs with",
			ErrFenceNotInstalled, enforced, l.Platform, missing, p.Name))
	}
	grant := Grant{NativeCCM: obj.Name, Namespace: l.Namespace, Platform: l.Platform,
		Domain: DomainGrant{Require: dom.Require, SplitBy: splitBy}}
	if lb := l.LoadBalancers; lb != nil {
		grant.LoadBalancers = &v1.GateLoadBalancers{Class: lb.Class, Default: lb.Default}
	}
	if err := CheckGrant(ctx, g.Client, grant); err != nil {
		return fail(err)
	}
	sa, user := l.Namespace+"/"+l.ServiceAccountName(), l.Username()
	if member {
		// one status for every member
		sa, user = l.Namespace+"/"+v1.ReleasePrefix+obj.Name+domain.SplitSeparator+"<value>", f.Username(obj.Name)+domain.SplitSeparator+"<value>"
	}
	want := &v1.GateStatus{
		Policy:             f.name(),
		ServiceAccount:     sa,
		ProviderIDPrefixes: append([]string(nil), p.ProviderIDPrefixes...),
		LoadBalancers:      grant.LoadBalancers,
	}
	if !reflect.DeepEqual(obj.Status.Gate, want) {
		if err := g.writeGateStatus(ctx, obj, want); err != nil {
			return fail(err)
		}
		ctrl.LoggerFrom(ctx).Info("fence status written", "policy", want.Policy, "serviceAccount", want.ServiceAccount, "providerIDPrefixes", want.ProviderIDPrefixes)
	}
	s := SidecarFor(l, g.Image)
	s.ImagePullPolicy = g.ImagePullPolicy

	if err := s.validate(); err != nil {
		return fail(fmt.Errorf("gate sidecar: %w", err))
	}
	services := "no Services"
	if lb := want.LoadBalancers; lb != nil {
		services = "only the status of Services of type LoadBalancer of class " + lb.Class
		if lb.Default {
			services += " or without a class"
		}
	}
	nodes := fmt.Sprintf("nodes labelled %s=%s", names.PlatformLabel, l.Platform)
	if !dom.Whole() {
		nodes += " and " + strings.ReplaceAll(dom.Selector(), "),", ") and ")
	}
	if splitBy != "" {
		nodes += ", each split member those of its own " + splitBy
	}
	conditions.MarkTrue(obj, v1.GatedCondition, GateEnforcedReason,
		"admission policy %s lets %s change only %s with providerID %v (grant %s), and %s; ccm-gate shows it only those",
		want.Policy, user, nodes, want.ProviderIDPrefixes, GrantName(obj.Name), services)
	mutators := []release.Mutator{s}
	if g.NetworkPolicy != nil {
		mutators = append(mutators, NetworkPolicy{Release: l.Release, Namespace: l.Namespace, Platform: l.Platform, NetworkPolicyConfig: *g.NetworkPolicy})
	}
	return mutators, nil
}

// writeGateStatus patches status.gate alone: what the fence enforces for the
// release, for people and tools to read (the fence itself reads no
// NativeCCM). A NativeCCM not yet stored (no UID) only gets the field in
// memory.
func (g Coordinator) writeGateStatus(ctx context.Context, obj *v1.NativeCCM, want *v1.GateStatus) error {
	obj.Status.Gate = want
	if obj.UID == "" {
		return nil
	}
	// Every field spelled out, null when absent: a merge patch keeps what it
	// does not mention, and a load balancer grant withdrawn must go.
	var lb any
	if want.LoadBalancers != nil {
		lb = map[string]any{"class": want.LoadBalancers.Class, "default": want.LoadBalancers.Default}
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"gate": map[string]any{
		"policy": want.Policy, "serviceAccount": want.ServiceAccount,
		"providerIDPrefixes": want.ProviderIDPrefixes, "loadBalancers": lb,
	}}})
	if err != nil {
		return err
	}
	patched := obj.DeepCopy()
	if err := g.Client.Status().Patch(ctx, patched, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("gate: writing status.gate of NativeCCM %s: %w", obj.Name, err)
	}
	return nil
}

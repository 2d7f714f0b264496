package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// resolveProfile finds the profile and builds the release request from it
// and spec.overrides: what the release would be if it is wanted; and the
// instance it was made from (a split NativeCCM's members are made from it
// too). Errors that only a change of the spec or the profiles can fix stall.
func (r *NativeCCMReconciler) resolveProfile(ctx context.Context, obj *v1.NativeCCM) (*profile.Profile, release.Request, release.Instance, error) {
	stall := func(reason string, err error) (*profile.Profile, release.Request, release.Instance, error) {
		return nil, release.Request{}, release.Instance{}, r.stallProfile(obj, reason, err)
	}
	p, ok := r.Profiles.Get(obj.ProfileName())
	if !ok {
		return stall(v1.ProfileNotFoundReason, fmt.Errorf("profile %q not found", obj.ProfileName()))
	}
	if !p.Routes(obj.Spec.Platform) {
		return stall(v1.PlatformNotRoutedReason, fmt.Errorf("profile %q routes platforms %v, not %q", p.Name, p.Platforms, obj.Spec.Platform))
	}
	gitVersion, minor, err := r.ServerVersion.ServerVersion(ctx)
	if err != nil {
		return nil, release.Request{}, release.Instance{}, err
	}
	in := release.Instance{
		KubernetesMinor: minor,
		ReleaseName:     obj.ReleaseName(),
		Namespace:       r.Namespace,
		Platform:        obj.Spec.Platform,
	}
	if c := obj.Spec.Credentials; c != nil {
		in.SecretName = c.SecretRef.Name
	}
	in.ImagePullSecrets = r.imagePullSecrets(obj)
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
		return nil, release.Request{}, release.Instance{}, err
	}
	in.LoadBalancers = lb
	req, err := release.FromProfile(p, in)
	var skew *profile.SkewError
	switch {
	case errors.As(err, &skew):
		r.recheckUpstream(obj, gitVersion, minor)
		stall := r.stallProfile(obj, v1.NoUpstreamForKubernetesVersionReason, err)
		stall.after = r.Interval
		return nil, release.Request{}, release.Instance{}, stall
	case errors.Is(err, release.ErrLoadBalancersUnsupported):
		return stall(v1.LoadBalancersUnsupportedReason, err)
	case err != nil:
		return stall(v1.InvalidOverridesReason, err)
	}
	r.recordUpstream(obj, req.Upstream, gitVersion)
	conditions.MarkTrue(obj, v1.ProfileResolvedCondition, v1.ProfileResolvedReason, "profile %s, chart source %s; %s", p.Name, p.Chart.Source, upstreamMessage(req.Upstream, gitVersion))
	return p, req, in, nil
}

// stallProfile records a configuration error of the profile, the overrides
// or what the gate needs of them (ProfileResolved and Ready False with the
// reason, a Warning event) and returns it as a stall: no retry until the
// spec or the profiles change.
func (r *NativeCCMReconciler) stallProfile(obj *v1.NativeCCM, reason string, err error) *stallError {
	conditions.MarkFalse(obj, v1.ProfileResolvedCondition, reason, "%s", err)
	conditions.MarkFalse(obj, meta.ReadyCondition, reason, "%s", err)
	r.event(obj, corev1.EventTypeWarning, reason, err.Error())
	return &stallError{reason: reason, err: err}
}

// observeNodes counts the domain's nodes (by the boundary label's values
// too, when the profile has one) and tracks when the last one went.
func (r *NativeCCMReconciler) observeNodes(obj *v1.NativeCCM, d domain.Domain, boundary string) domainView {
	nodes := r.nodes.domain(d, boundary)
	obj.Status.Nodes = int32(nodes.Nodes)
	obj.Status.NodesWithoutProviderID = int32(nodes.WithoutProviderID)
	switch {
	case nodes.Nodes > 0:
		obj.Status.NoNodesSince = nil
	case obj.Status.NoNodesSince == nil:
		now := metav1.NewTime(r.now())
		obj.Status.NoNodesSince = &now
	}
	return nodes
}

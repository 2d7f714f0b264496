package controller

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// recordUpstream writes the chosen upstream CCM into status.upstream, and
// an UpstreamChosen event when its image changed (a Warning when it is
// outside Kubernetes' skew policy, which only an override can be).
func (r *NativeCCMReconciler) recordUpstream(obj *v1.NativeCCM, u profile.Upstream, gitVersion string) {
	st := &v1.UpstreamStatus{
		Image:            u.Reference(),
		Source:           string(u.Source),
		APIServerVersion: gitVersion,
	}
	if u.Minor != 0 {
		st.KubernetesMinor = profile.MinorString(u.Minor)
	}
	if skew, ok := u.Skew(); ok {
		st.Skew = ptr.To(int32(skew))
	}
	if len(u.NodeFilterArgs) > 0 || len(u.ForeignNodeLabels) > 0 {
		st.NodeFilter = &v1.NodeFilterStatus{Args: slices.Clone(u.NodeFilterArgs)}
		for _, k := range slices.Sorted(maps.Keys(u.ForeignNodeLabels)) {
			st.NodeFilter.ForeignNodeLabels = append(st.NodeFilter.ForeignNodeLabels, k+"="+u.ForeignNodeLabels[k])
		}
	}
	prev := obj.Status.Upstream
	obj.Status.Upstream = st
	if prev != nil && prev.Image == st.Image {
		return
	}
	kind := corev1.EventTypeNormal
	if skew, ok := u.Skew(); ok && (skew < 0 || skew > profile.MaxSkew) {
		kind = corev1.EventTypeWarning
	}
	r.event(obj, kind, v1.UpstreamChosenReason, upstreamMessage(u, gitVersion))
}

// recheckUpstream updates status.upstream for an API server the profile has
// no release for: the release that runs stays, and its skew is now that
// against this API server.
func (r *NativeCCMReconciler) recheckUpstream(obj *v1.NativeCCM, gitVersion string, serverMinor int) {
	st := obj.Status.Upstream
	if st == nil {
		return
	}
	st.APIServerVersion = gitVersion
	st.Skew = nil
	if m, err := profile.ParseMinor(st.KubernetesMinor); err == nil {
		st.Skew = ptr.To(int32(serverMinor - m))
	}
}

// upstreamMessage says which upstream CCM runs, for which API server, and why.
func upstreamMessage(u profile.Upstream, gitVersion string) string {
	msg := fmt.Sprintf("upstream CCM %s", u.Reference())
	skew, known := u.Skew()
	switch {
	case u.Source == profile.FromOverride && known:
		msg += fmt.Sprintf(" (spec.overrides.image; the profile's release for Kubernetes %s)", profile.MinorString(u.Minor))
	case u.Source == profile.FromOverride:
		msg += " (spec.overrides.image; its Kubernetes minor is unknown)"
	case u.Source == profile.FromDefaultTag:
		msg += " (the profile's release for every Kubernetes minor)"
	case skew == 0:
		msg += fmt.Sprintf(" (the profile's release for Kubernetes %s)", profile.MinorString(u.Minor))
	default:
		msg += fmt.Sprintf(" (the profile has none for Kubernetes %s: its release for %s)", profile.MinorString(u.ServerMinor), profile.MinorString(u.Minor))
	}
	msg += " for API server " + gitVersion
	switch {
	case known && skew < 0:
		msg += fmt.Sprintf(", %d minor(s) newer than the API server: outside Kubernetes' skew policy", -skew)
	case known && skew > profile.MaxSkew:
		msg += fmt.Sprintf(", %d minors older than the API server: outside Kubernetes' skew policy (at most %d)", skew, profile.MaxSkew)
	}
	if len(u.NodeFilterArgs) > 0 {
		msg += fmt.Sprintf("; its own node filter: %v", u.NodeFilterArgs)
	}
	return msg
}

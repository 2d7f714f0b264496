package doctor

import (
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// CheckUpstreamSkew: the upstream CCM a NativeCCM runs is outside
// Kubernetes' version skew policy (more than one minor older than the API
// server, or newer).
const CheckUpstreamSkew = "UpstreamCCMVersionSkew"

// checkUpstreamSkew reports the NativeCCMs whose upstream CCM
// (status.upstream, as the coordinator last chose or checked it against the
// API server) is more than one minor older than the API server, or newer.
func (r *Report) checkUpstreamSkew(nccms []v1.NativeCCM) {
	for i := range nccms {
		n := &nccms[i]
		u := n.Status.Upstream
		if u == nil || u.Skew == nil {
			continue
		}
		skew := int(*u.Skew)
		if skew >= 0 && skew <= profile.MaxSkew {
			continue
		}
		fix := "give the profile a release for the API server's minor (a profile override of ccm.image.tags, docs/profiles.md) or upgrade hybrid-ccm"
		if u.Source == string(profile.FromOverride) {
			fix = "change or remove spec.overrides.image of the NativeCCM: kubectl edit nativeccm " + n.Name
		}
		older := "older than"
		if skew < 0 {
			older, skew = "newer than", -skew
		}
		r.add(CheckUpstreamSkew, "nativeccm/"+n.Name, fix,
			"runs upstream CCM %s (for Kubernetes %s), %d minor(s) %s the API server %s: Kubernetes' skew policy allows a CCM at most %d minor older and never newer",
			u.Image, u.KubernetesMinor, skew, older, u.APIServerVersion, profile.MaxSkew)
	}
}

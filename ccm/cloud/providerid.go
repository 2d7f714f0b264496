package cloud

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// nativePlatforms are Talos platforms whose cloud has its own CCM. A node of such
// a platform must carry that CCM's providerID format: talos-ccm never writes a
// placeholder for it (providerID is write-once; the native CCM would reject it).
var nativePlatforms = map[string]func(md *Metadata) string{
	"aws":           func(md *Metadata) string { return join("aws:///", md.Zone, "/", md.InstanceID) },
	"azure":         nil, // needs subscription and resource group: only from metadata
	"gcp":           nil, // needs the project: only from metadata
	"hcloud":        func(md *Metadata) string { return join("hcloud://", md.InstanceID) },
	"openstack":     func(md *Metadata) string { return join("openstack:///", md.InstanceID) },
	"oracle":        func(md *Metadata) string { return join("oci://", md.InstanceID) },
	"digital-ocean": func(md *Metadata) string { return join("digitalocean://", md.InstanceID) },
	"scaleway":      func(md *Metadata) string { return join("scaleway://instance/", md.Zone, "/", md.InstanceID) },
	"upcloud":       func(md *Metadata) string { return join("upcloud:////", md.InstanceID) },
	"vultr":         func(md *Metadata) string { return join("vultr://", md.InstanceID) },
	"exoscale":      func(md *Metadata) string { return join("exoscale://", md.InstanceID) },
	"akamai":        func(md *Metadata) string { return join("linode://", md.InstanceID) },
	"equinixMetal":  func(md *Metadata) string { return join("equinixmetal://", md.InstanceID) },
	"cloudstack":    nil,
	// Talos has no cloudscale platform: a rule moves nodes here with
	// platformMetadata.platform (docs/profiles.md).
	"cloudscale": cloudscaleProviderID,
}

// nativeFormats describes, for the error of a platform whose instance ID
// cannot give its providerID, what the native CCM needs.
var nativeFormats = map[string]string{
	"cloudscale": "cloudscale://<server UUID>: the instance ID must be the server's UUID",
}

// uuidPattern is a UUID in its canonical text form, any case.
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// cloudscaleProviderID is cloudscale://<server UUID>, the UUID lower-cased as
// the cloudscale API spells it. The cloudscale CCM parses what follows the
// scheme as a UUID and looks the server up by it, so an instance ID that is
// not one gives no providerID (talos-ccm retries instead of writing an ID the
// CCM would never recognise).
func cloudscaleProviderID(md *Metadata) string {
	id := strings.TrimSpace(md.InstanceID)
	if !uuidPattern.MatchString(id) {
		return ""
	}
	return "cloudscale://" + strings.ToLower(id)
}

// join concatenates parts, or returns "" when any variable part is empty.
func join(parts ...string) string {
	for i := 1; i < len(parts); i += 2 {
		if parts[i] == "" {
			return ""
		}
	}
	return strings.Join(parts, "")
}

// HasNativeCCM reports whether the Talos platform has its own upstream CCM.
func HasNativeCCM(platform string) bool {
	_, ok := nativePlatforms[platform]
	return ok
}

// ProviderID decides the providerID talos-ccm writes for a node whose
// (transformed) metadata is md and whose Talos API answered on nodeIP (used only
// by the talos://<platform>/<ip> fallback of platforms without a native CCM).
// An empty result with a nil error never happens: either a value or an error
// wrapping facts.ErrMetadataIncomplete (the node is left uninitialized and retried).
func ProviderID(md *Metadata, nodeIP string) (string, error) {
	if id := strings.TrimSpace(md.ProviderID); id != "" {
		return normalizeProviderID(id), nil
	}
	if build, native := nativePlatforms[md.Platform]; native {
		if build != nil {
			if id := build(md); id != "" {
				return id, nil
			}
		}
		if format, ok := nativeFormats[md.Platform]; ok && md.InstanceID != "" {
			return "", fmt.Errorf("%w: platform %q needs %s, got instance ID %q",
				facts.ErrMetadataIncomplete, md.Platform, format, clip(md.InstanceID))
		}
		return "", fmt.Errorf("%w: platform %q has a native providerID format but metadata has no providerID/instanceID yet",
			facts.ErrMetadataIncomplete, md.Platform)
	}
	if md.Platform == "" {
		return "", fmt.Errorf("%w: metadata has no platform", facts.ErrMetadataIncomplete)
	}
	return fmt.Sprintf("talos://%s/%s", md.Platform, nodeIP), nil
}

// normalizeProviderID lower-cases the Azure resource group, as the Azure CCM
// compares it case-insensitively but writes it lower-case.
func normalizeProviderID(id string) string {
	if !strings.HasPrefix(id, "azure://") {
		return id
	}
	const marker = "/resourcegroups/"
	i := strings.Index(strings.ToLower(id), marker)
	if i < 0 {
		return id
	}
	start := i + len(marker)
	end := strings.IndexByte(id[start:], '/')
	if end < 0 {
		end = len(id) - start
	}
	return id[:start] + strings.ToLower(id[start:start+end]) + id[start+end:]
}

// NodeLabels returns every label talos-ccm writes on a node whose transformed
// metadata is md: the rule labels, then the labels it derives itself — instance
// type, topology region and zone (stable and beta keys), the routing label
// node.cloudprovider.kubernetes.io/platform, .../clustername (global.clusterName)
// and .../lifecycle=spot. Empty values are not written.
func NodeLabels(md *Metadata, ruleLabels map[string]string, clusterName string) map[string]string {
	out := make(map[string]string, len(ruleLabels)+9)
	for k, v := range ruleLabels {
		out[k] = v
	}
	set := func(v string, keys ...string) {
		if v == "" {
			return
		}
		for _, k := range keys {
			out[k] = v
		}
	}
	set(md.InstanceType, corev1.LabelInstanceTypeStable, corev1.LabelInstanceType)
	set(md.Zone, corev1.LabelTopologyZone, corev1.LabelFailureDomainBetaZone)
	set(md.Region, corev1.LabelTopologyRegion, corev1.LabelFailureDomainBetaRegion)
	set(md.Platform, names.PlatformLabel)
	set(clusterName, LabelClusterName)
	if md.Spot {
		out[LabelLifecycle] = "spot"
	}
	return out
}

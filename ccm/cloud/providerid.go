package cloud

import (
	"fmt"
	"strings"
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

// providerID decides the node's providerID from (transformed) metadata.
// An empty result with a nil error never happens: either a value or an error
// wrapping ErrMetadataIncomplete (retry later).
func providerID(md *Metadata, nodeIP string) (string, error) {
	if id := strings.TrimSpace(md.ProviderID); id != "" {
		return normalizeProviderID(id), nil
	}
	if build, native := nativePlatforms[md.Platform]; native {
		if build != nil {
			if id := build(md); id != "" {
				return id, nil
			}
		}
		return "", fmt.Errorf("%w: platform %q has a native providerID format but metadata has no providerID/instanceID yet",
			ErrMetadataIncomplete, md.Platform)
	}
	if md.Platform == "" {
		return "", fmt.Errorf("%w: metadata has no platform", ErrMetadataIncomplete)
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

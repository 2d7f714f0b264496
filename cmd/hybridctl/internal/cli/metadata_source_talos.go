package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
)

// TalosMetadataSource reads a live node's PlatformMetadata and
// SystemInformation through its Talos API.
type TalosMetadataSource struct {
	// Node is the node's address (what WithNode addresses).
	Node string
	// Options select the talosconfig.
	Options talos.Options
	// ClusterName is set by Metadata: the cluster the talosconfig context
	// names, which talos-ccm uses when the rules set no global.clusterName.
	ClusterName string
}

// String implements MetadataSource.
func (s *TalosMetadataSource) String() string { return "Talos API of node " + s.Node }

// Metadata implements MetadataSource.
func (s *TalosMetadataSource) Metadata(ctx context.Context) (transform.Metadata, []string, error) {
	c, err := talos.New(ctx, s.Options)
	if err != nil {
		return transform.Metadata{}, nil, fmt.Errorf("--node %s: %w", s.Node, err)
	}
	defer func() { _ = c.Close() }()
	s.ClusterName = c.ClusterName()
	pm, err := c.PlatformMetadata(ctx, s.Node)
	if err != nil {
		return transform.Metadata{}, nil, fmt.Errorf("--node %s: %w", s.Node, err)
	}
	md := transform.Metadata{
		Platform: pm.Platform, Hostname: pm.Hostname, Region: pm.Region, Zone: pm.Zone,
		InstanceType: pm.InstanceType, InstanceID: pm.InstanceID, ProviderID: pm.ProviderID,
		Spot: pm.Spot, InternalDNS: pm.InternalDNS, ExternalDNS: pm.ExternalDNS, Tags: pm.Tags,
	}
	var warnings []string
	if md.Hostname == "" {
		// talos-ccm's rules see the node name then (k8s/Nodename)
		name, err := c.Nodename(ctx, s.Node)
		if err != nil {
			return transform.Metadata{}, nil, fmt.Errorf("--node %s: %w", s.Node, err)
		}
		md.Hostname = name
		warnings = append(warnings, fmt.Sprintf("the metadata has no hostname: using the node name %q (k8s/Nodename), as talos-ccm does", name))
	}
	si, err := c.SystemInformation(ctx, s.Node)
	switch {
	case errors.Is(err, talos.ErrNotFound):
		warnings = append(warnings, "node has no SystemInformation resource: hardware keys are empty")
	case err != nil:
		return transform.Metadata{}, nil, fmt.Errorf("--node %s: %w", s.Node, err)
	default:
		md.Manufacturer, md.ProductName, md.Version = si.Manufacturer, si.ProductName, si.Version
		md.SerialNumber, md.UUID, md.SKUNumber = si.SerialNumber, si.UUID, si.SKUNumber
	}
	return md, warnings, nil
}

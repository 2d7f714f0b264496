// Package cloud is talos-ccm's cloud provider "talos": it decides what a
// node's Talos API reports (platform metadata, addresses, hardware
// information) means for Kubernetes under the user's transformation rules —
// providerID, topology labels, addresses, the routing label and rule output
// (Interpreter, used by the facts source) — and answers k8s.io/cloud-provider's
// Interface with InstancesV2 from the established facts (Provider).
//
// It neither reads the Talos API nor remembers facts (ccm/facts does both),
// and never writes to the API server (the cloud-node controller does).
package cloud

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	cloudprovider "k8s.io/cloud-provider"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Labels talos-ccm owns.
const (
	LabelClusterName = "node.cloudprovider.kubernetes.io/clustername"
	LabelLifecycle   = "node.cloudprovider.kubernetes.io/lifecycle"
)

// Metadata is the platform metadata rules match on.
type Metadata = transform.Metadata

// Interpreter turns a reading of a node's Talos API into the node's facts
// with the transformation rules: it implements facts.Interpreter.
type Interpreter struct {
	rules *transform.Config
}

var _ facts.Interpreter = (*Interpreter)(nil)

// NewInterpreter returns the interpreter applying rules (may be nil: none).
func NewInterpreter(rules *transform.Config) *Interpreter {
	if rules == nil {
		rules = &transform.Config{}
	}
	return &Interpreter{rules: rules}
}

// PreferIPv6 implements facts.Interpreter (global.preferIPv6).
func (in *Interpreter) PreferIPv6() bool { return in.rules.Global.PreferIPv6 }

// NeedsSystemInformation implements facts.Interpreter: only rules that match
// on hardware need hardware/SystemInformation.
func (in *Interpreter) NeedsSystemInformation() bool { return in.rules.NeedsSystemInformation() }

// Interpret implements facts.Interpreter: it applies the rules to the
// platform metadata (and hardware information), then decides providerID,
// addresses and labels from the result.
func (in *Interpreter) Interpret(node *corev1.Node, r *facts.Reading) (*facts.Facts, error) {
	tmd := r.Metadata
	if tmd == nil {
		return nil, fmt.Errorf("%w: no PlatformMetadata in the reading", facts.ErrMetadataIncomplete)
	}
	md := Metadata{
		Platform: tmd.Platform, Hostname: tmd.Hostname, Region: tmd.Region, Zone: tmd.Zone,
		InstanceType: tmd.InstanceType, InstanceID: tmd.InstanceID, ProviderID: tmd.ProviderID,
		Spot: tmd.Spot, InternalDNS: tmd.InternalDNS, ExternalDNS: tmd.ExternalDNS, Tags: tmd.Tags,
	}
	if md.Hostname == "" {
		// as the upstream Talos CCM: rules see the node name (which the Talos
		// API has just confirmed, k8s/Nodename) when the platform gives none
		md.Hostname = node.Name
	}
	if sys := r.System; sys != nil {
		md.Manufacturer, md.ProductName, md.Version = sys.Manufacturer, sys.ProductName, sys.Version
		md.SerialNumber, md.UUID, md.SKUNumber = sys.SerialNumber, sys.UUID, sys.SKUNumber
	}
	res, err := in.rules.Apply(md)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", facts.ErrRules, err)
	}
	md = res.Metadata

	id, err := ProviderID(&md, r.Answered.String())
	if err != nil {
		return nil, err
	}
	f := &facts.Facts{
		Platform:     md.Platform,
		ProviderID:   id,
		InstanceType: md.InstanceType,
		Region:       md.Region,
		Zone:         md.Zone,
		Addresses:    nodeAddresses(node.Name, r.NodeIPs, r.Addresses, r.Links, &md, res.Features.PublicIPDiscovery, in.rules.Global.PreferIPv6),
		Labels:       NodeLabels(&md, res.Labels, in.rules.Global.ClusterName),
		Annotations:  res.Annotations,
		Taints:       res.Taints,
		Rules:        res.Matched,
	}
	f.Result, f.PlatformHeld = enforced(node, res, f, in.rules.Global.ClusterName)
	return f, nil
}

// FactSource establishes node facts (ccm/facts.Source).
type FactSource interface {
	Facts(ctx context.Context, node *corev1.Node) (*facts.Facts, error)
}

// Provider implements cloudprovider.Interface for Talos nodes.
type Provider struct {
	facts FactSource
}

var (
	_ cloudprovider.Interface   = (*Provider)(nil)
	_ cloudprovider.InstancesV2 = (*Provider)(nil)
)

// New returns the provider answering from src.
func New(src FactSource) *Provider { return &Provider{facts: src} }

// Initialize implements cloudprovider.Interface.
func (p *Provider) Initialize(cloudprovider.ControllerClientBuilder, <-chan struct{}) {}

// LoadBalancer is not supported: native CCMs own load balancers.
func (p *Provider) LoadBalancer() (cloudprovider.LoadBalancer, bool) { return nil, false }

// Instances is not supported (InstancesV2 is).
func (p *Provider) Instances() (cloudprovider.Instances, bool) { return nil, false }

// InstancesV2 implements cloudprovider.Interface.
func (p *Provider) InstancesV2() (cloudprovider.InstancesV2, bool) { return p, true }

// Zones is not supported (InstancesV2 returns zones).
func (p *Provider) Zones() (cloudprovider.Zones, bool) { return nil, false }

// Clusters is not supported.
func (p *Provider) Clusters() (cloudprovider.Clusters, bool) { return nil, false }

// Routes is not supported.
func (p *Provider) Routes() (cloudprovider.Routes, bool) { return nil, false }

// names.ProviderName implements cloudprovider.Interface.
func (p *Provider) ProviderName() string { return names.ProviderName }

// HasClusterID implements cloudprovider.Interface.
func (p *Provider) HasClusterID() bool { return true }

// InstanceExists always reports true: talos-ccm has no cloud API and must never
// be the reason a node is deleted. Native CCMs (gated) decide that.
func (p *Provider) InstanceExists(context.Context, *corev1.Node) (bool, error) { return true, nil }

// InstanceShutdown always reports false for the same reason.
func (p *Provider) InstanceShutdown(context.Context, *corev1.Node) (bool, error) { return false, nil }

// InstanceMetadata implements InstancesV2 on top of the node's facts. A node
// whose providerID disagrees with its Talos API gets an error
// (facts.ErrProviderIDMismatch): k8s.io/cloud-provider's node controller then
// keeps the uninitialized taint and retries, as talos-ccm's cloud-node
// controller does.
func (p *Provider) InstanceMetadata(ctx context.Context, node *corev1.Node) (*cloudprovider.InstanceMetadata, error) {
	f, err := p.facts.Facts(ctx, node)
	if err != nil {
		return nil, err
	}
	return &cloudprovider.InstanceMetadata{
		ProviderID:       f.ProviderID,
		InstanceType:     f.InstanceType,
		NodeAddresses:    f.Addresses,
		Zone:             f.Zone,
		Region:           f.Region,
		AdditionalLabels: f.Labels,
	}, nil
}

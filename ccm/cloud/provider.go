// Package cloud is talos-ccm's cloud provider "talos": it turns what a node's
// Talos API reports (platform metadata, addresses, hardware information) and the
// user's transformation rules into the facts Kubernetes records on the Node
// (providerID, topology labels, addresses, routing label, rule output).
//
// It implements k8s.io/cloud-provider's Interface with InstancesV2 and remembers
// the facts it established per node, which the CSR approver trusts (the kubelet's
// own provided-node-ip annotation proves nothing). It never writes to the API
// server; the cloud-node controller does.
package cloud

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	cloudprovider "k8s.io/cloud-provider"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
)

// ProviderName is the --cloud-provider value of talos-ccm.
const ProviderName = "talos"

// Labels talos-ccm owns.
const (
	LabelPlatform    = "node.cloudprovider.kubernetes.io/platform"
	LabelClusterName = "node.cloudprovider.kubernetes.io/clustername"
	LabelLifecycle   = "node.cloudprovider.kubernetes.io/lifecycle"
)

// Metadata is the platform metadata rules match on.
type Metadata = transform.Metadata

var (
	// ErrMetadataIncomplete: the node answered but its metadata cannot produce a
	// correct providerID yet; retry later (never write a placeholder).
	ErrMetadataIncomplete = errors.New("platform metadata incomplete")
	// ErrNoNodeIP: the node has neither a provided-node-ip annotation nor an
	// InternalIP, so its Talos API cannot be addressed.
	ErrNoNodeIP = errors.New("node has no address to reach its Talos API")
	// ErrTalosAPI: no address of the node answered the Talos API.
	ErrTalosAPI = errors.New("talos API unavailable for node")
	// ErrRules: the transformation rules failed for this node.
	ErrRules = errors.New("transformation rules failed")
	// ErrIdentity: the machine answering on the node's address is another node
	// (its Talos k8s/Nodename differs). Nothing is established from it.
	ErrIdentity = errors.New("talos machine identity does not match the node")
	// ErrProvidedNodeIP: the kubelet-written addresses to reach the node by
	// (provided-node-ip, else InternalIPs) are unparsable or name more than one
	// address per family, which the kubelet itself never does. Nothing is dialled.
	ErrProvidedNodeIP = errors.New("invalid node IPs")
	// ErrProviderIDMismatch: an uninitialized Node already carries a providerID
	// that differs from the one its Talos API establishes (a kubelet can register
	// with any providerID). Nothing is established for the node until an admin
	// resolves it or the Talos metadata changes.
	ErrProviderIDMismatch = errors.New("providerID does not match the Talos API")
)

// ProviderIDMismatchError is ErrProviderIDMismatch with both values.
type ProviderIDMismatchError struct {
	// Registered is the providerID the Node carries; Established the one its
	// Talos API gives.
	Registered, Established string
}

func (e *ProviderIDMismatchError) Error() string {
	return fmt.Sprintf("%v: the Node has providerID %q, its Talos API establishes %q", ErrProviderIDMismatch, e.Registered, e.Established)
}

func (e *ProviderIDMismatchError) Unwrap() error { return ErrProviderIDMismatch }

// Options tune the provider.
type Options struct {
	// LookupTimeout bounds one lookup of a node's facts as a whole (every
	// address tried, every request). Zero means 20s.
	LookupTimeout time.Duration
}

// DefaultLookupTimeout bounds a lookup when Options.LookupTimeout is zero.
const DefaultLookupTimeout = 20 * time.Second

// TalosReader is what the provider needs from the Talos API (ccm/talos.Client).
type TalosReader interface {
	PlatformMetadata(ctx context.Context, node string) (*talos.PlatformMetadata, error)
	Addresses(ctx context.Context, node string) ([]talos.Address, error)
	SystemInformation(ctx context.Context, node string) (*talos.SystemInformation, error)
	Nodename(ctx context.Context, node string) (string, error)
}

// Facts is everything talos-ccm established for a node from its Talos API.
type Facts struct {
	Platform     string
	ProviderID   string
	InstanceType string
	Region       string
	Zone         string
	Addresses    []corev1.NodeAddress
	// Labels are every label talos-ccm writes (NodeLabels): rule labels, instance
	// type, topology, routing, cluster name and lifecycle.
	Labels      map[string]string
	Annotations map[string]string
	Taints      []corev1.Taint
	// Rules are the names of the transformation rules that matched.
	Rules []string
	// Result is what enforce mode keeps reconciled on an initialized node: the
	// rule output and the labels derived from the metadata after overrides
	// (see enforced).
	Result *transform.Result
	// PlatformHeld, when set, says why enforce mode keeps the node's current
	// platform label instead of the one the rules now give (see enforced).
	PlatformHeld string
	// ReadAt is when the Talos API was read.
	ReadAt time.Time
}

// Provider implements cloudprovider.Interface for Talos nodes.
type Provider struct {
	talos  TalosReader
	rules  *transform.Config
	lookup time.Duration

	mu       sync.RWMutex
	facts    map[string]*Facts  // by node name
	inflight map[string]*flight // by node name: the one lookup of each node in progress
}

// flight is one lookup of a node's facts in progress. Every caller asking for
// the same node meanwhile (cloud-node, node-csr-approval) waits for it instead
// of dialling the node again: a node whose Talos API hangs costs one lookup.
type flight struct {
	done chan struct{}
	f    *Facts
	err  error
}

var (
	_ cloudprovider.Interface   = (*Provider)(nil)
	_ cloudprovider.InstancesV2 = (*Provider)(nil)
	_ csr.AddressSource         = (*Provider)(nil)
)

// New returns a provider reading through r and applying rules (may be nil).
func New(r TalosReader, rules *transform.Config, opts Options) *Provider {
	if rules == nil {
		rules = &transform.Config{}
	}
	if opts.LookupTimeout <= 0 {
		opts.LookupTimeout = DefaultLookupTimeout
	}
	return &Provider{talos: r, rules: rules, lookup: opts.LookupTimeout, facts: map[string]*Facts{}, inflight: map[string]*flight{}}
}

// Rules returns the transformation configuration in use.
func (p *Provider) Rules() *transform.Config { return p.rules }

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

// ProviderName implements cloudprovider.Interface.
func (p *Provider) ProviderName() string { return ProviderName }

// HasClusterID implements cloudprovider.Interface.
func (p *Provider) HasClusterID() bool { return true }

// InstanceExists always reports true: talos-ccm has no cloud API and must never
// be the reason a node is deleted. Native CCMs (gated) decide that.
func (p *Provider) InstanceExists(context.Context, *corev1.Node) (bool, error) { return true, nil }

// InstanceShutdown always reports false for the same reason.
func (p *Provider) InstanceShutdown(context.Context, *corev1.Node) (bool, error) { return false, nil }

// InstanceMetadata implements InstancesV2 on top of Facts. A node whose
// providerID disagrees with its Talos API gets an error (ErrProviderIDMismatch):
// k8s.io/cloud-provider's node controller then keeps the uninitialized taint and
// retries, as talos-ccm's cloud-node controller does.
func (p *Provider) InstanceMetadata(ctx context.Context, node *corev1.Node) (*cloudprovider.InstanceMetadata, error) {
	f, err := p.Facts(ctx, node)
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

// EstablishedAddresses returns the addresses talos-ccm established for the node
// from its Talos API (the remembered facts, or a fresh read). It is what the
// CSR approver accepts as proof.
func (p *Provider) EstablishedAddresses(ctx context.Context, node *corev1.Node) ([]corev1.NodeAddress, error) {
	p.mu.RLock()
	f := p.facts[node.Name]
	p.mu.RUnlock()
	if f == nil {
		var err error
		switch f, err = p.Facts(ctx, node); {
		case errors.Is(err, ErrIdentity):
			// another machine answered: tell the approver to deny, not retry
			return nil, fmt.Errorf("%w: %w", csr.ErrNotThisNode, err)
		case errors.Is(err, ErrProvidedNodeIP):
			// nothing was dialled: the kubelet's addresses are refused
			return nil, fmt.Errorf("%w: %w", csr.ErrProvidedNodeIPInvalid, err)
		case err != nil:
			return nil, err
		}
	}
	return append([]corev1.NodeAddress(nil), f.Addresses...), nil
}

// Forget drops remembered facts of a deleted node.
func (p *Provider) Forget(nodeName string) {
	p.mu.Lock()
	delete(p.facts, nodeName)
	p.mu.Unlock()
}

// talosTargets lists the addresses to dial: the provided node IPs (preferred
// family first), else the node's InternalIPs. Both are written by the kubelet,
// which allows one address per family (--node-ip): more, or an unparsable one,
// is refused (ErrProvidedNodeIP) before anything is dialled, so a node cannot
// make a lookup try many addresses one after another.
func talosTargets(node *corev1.Node, preferIPv6 bool) ([]netip.Addr, error) {
	if ann, ok := node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]; ok {
		ips, err := nodeIPs(ann)
		if err == nil {
			err = onePerFamily(ips)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: annotation %s=%q: %v", ErrProvidedNodeIP, cloudproviderapi.AnnotationAlphaProvidedIPAddr, clip(ann), err)
		}
		if len(ips) > 0 {
			return orderByFamily(ips, preferIPv6), nil
		}
	}
	var ips []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			return nil, fmt.Errorf("%w: InternalIP %q: %v", ErrProvidedNodeIP, clip(a.Address), err)
		}
		ips = append(ips, ip.Unmap())
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("%w: no %s annotation and no InternalIP in status", ErrNoNodeIP, cloudproviderapi.AnnotationAlphaProvidedIPAddr)
	}
	if err := onePerFamily(ips); err != nil {
		return nil, fmt.Errorf("%w: status InternalIPs: %v", ErrProvidedNodeIP, err)
	}
	return orderByFamily(ips, preferIPv6), nil
}

// Facts establishes the node's facts from its Talos API and applies the rules.
// Concurrent callers for the same node share one lookup (see flight), which
// runs under its own deadline (Options.LookupTimeout) whatever the callers'
// contexts; a caller whose context ends stops waiting, the lookup goes on for
// the others. An uninitialized node whose providerID is set and differs from
// the established one gets ErrProviderIDMismatch (a *ProviderIDMismatchError
// naming both); nothing is remembered for it.
func (p *Provider) Facts(ctx context.Context, node *corev1.Node) (*Facts, error) {
	const op = "cloud/Provider.Facts"
	targets, err := talosTargets(node, p.rules.Global.PreferIPv6)
	if err != nil {
		return nil, fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	p.mu.Lock()
	fl := p.inflight[node.Name]
	if fl == nil {
		fl = &flight{done: make(chan struct{})}
		p.inflight[node.Name] = fl
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.lookup)
		go func() {
			defer cancel()
			fl.f, fl.err = p.read(lctx, node, targets)
			p.mu.Lock()
			delete(p.inflight, node.Name)
			switch {
			case fl.err != nil:
			case providerIDMismatch(node, fl.f) != nil:
				// nothing is established for a node registered with another providerID
				delete(p.facts, node.Name)
			default:
				p.facts[node.Name] = fl.f
			}
			p.mu.Unlock()
			close(fl.done)
		}()
	} else {
		klog.V(4).InfoS("Joining the node's lookup in flight", "node", klog.KObj(node))
	}
	p.mu.Unlock()
	select {
	case <-fl.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: node %s: %w", op, node.Name, ctx.Err())
	}
	if fl.err != nil {
		return nil, fl.err
	}
	if err := providerIDMismatch(node, fl.f); err != nil {
		return nil, fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	return fl.f, nil
}

// providerIDMismatch refuses an uninitialized node registered with a providerID
// that differs from the established one: a kubelet can register with any
// providerID, so it proves nothing. An initialized node's providerID was
// accepted when it was initialized and is write-once; it is not compared again
// (on metal it names the address that answered, which may change).
func providerIDMismatch(node *corev1.Node, f *Facts) error {
	if node.Spec.ProviderID == "" || node.Spec.ProviderID == f.ProviderID || !uninitialized(node) {
		return nil
	}
	return &ProviderIDMismatchError{Registered: node.Spec.ProviderID, Established: f.ProviderID}
}

func uninitialized(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cloudproviderapi.TaintExternalCloudProvider })
}

// read reads the node's Talos API at targets (in order, until one answers)
// and applies the rules. It neither remembers nor compares the result.
func (p *Provider) read(ctx context.Context, node *corev1.Node, targets []netip.Addr) (*Facts, error) {
	const op = "cloud/Provider.Facts"
	preferIPv6 := p.rules.Global.PreferIPv6

	// Metadata and addresses are independent reads: run them concurrently so a
	// node costs one Talos round trip of latency.
	var (
		tmd      *talos.PlatformMetadata
		addrs    []talos.Address
		sys      *talos.SystemInformation
		target   netip.Addr
		errs     []error
		needSys  = p.rules.NeedsSystemInformation()
		readTime = time.Now()
	)
	for _, ip := range targets {
		var wg sync.WaitGroup
		var mdErr, addrErr, sysErr, nameErr error
		var nodename string
		wg.Add(3)
		go func() { defer wg.Done(); tmd, mdErr = p.talos.PlatformMetadata(ctx, ip.String()) }()
		go func() { defer wg.Done(); addrs, addrErr = p.talos.Addresses(ctx, ip.String()) }()
		go func() { defer wg.Done(); nodename, nameErr = p.talos.Nodename(ctx, ip.String()) }()
		if needSys {
			wg.Add(1)
			go func() { defer wg.Done(); sys, sysErr = p.talos.SystemInformation(ctx, ip.String()) }()
		}
		wg.Wait()
		// The kubelet writes provided-node-ip itself: whoever answers there must
		// prove to be this node before anything it says is believed.
		if nameErr == nil && nodename != node.Name {
			// What was proven before no longer holds: the approver must not go on
			// accepting the remembered addresses.
			p.Forget(node.Name)
			return nil, fmt.Errorf("%s: node %s: %w: the Talos API at %s belongs to node %q", op, node.Name, ErrIdentity, ip, nodename)
		}
		if nameErr == nil && mdErr == nil && addrErr == nil && (sysErr == nil || errors.Is(sysErr, talos.ErrNotFound)) {
			target = ip
			break
		}
		if errors.Is(mdErr, talos.ErrNotFound) {
			return nil, fmt.Errorf("%s: node %s: %w: the node has no PlatformMetadata resource yet", op, node.Name, ErrMetadataIncomplete)
		}
		errs = append(errs, errors.Join(mdErr, addrErr, sysErr, nameErr))
		if ctx.Err() != nil {
			break
		}
	}
	if !target.IsValid() {
		return nil, fmt.Errorf("%s: node %s: %w: %w", op, node.Name, ErrTalosAPI, errors.Join(errs...))
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
	if sys != nil {
		md.Manufacturer, md.ProductName, md.Version = sys.Manufacturer, sys.ProductName, sys.Version
		md.SerialNumber, md.UUID, md.SKUNumber = sys.SerialNumber, sys.UUID, sys.SKUNumber
	}
	res, err := p.rules.Apply(md)
	if err != nil {
		return nil, fmt.Errorf("%s: node %s: %w: %w", op, node.Name, ErrRules, err)
	}
	md = res.Metadata

	id, err := ProviderID(&md, target.String())
	if err != nil {
		return nil, fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	f := &Facts{
		Platform:     md.Platform,
		ProviderID:   id,
		InstanceType: md.InstanceType,
		Region:       md.Region,
		Zone:         md.Zone,
		Addresses:    nodeAddresses(node.Name, targets, addrs, &md, res.Features.PublicIPDiscovery, preferIPv6),
		Labels:       NodeLabels(&md, res.Labels, p.rules.Global.ClusterName),
		Annotations:  res.Annotations,
		Taints:       res.Taints,
		Rules:        res.Matched,
		ReadAt:       readTime,
	}
	f.Result, f.PlatformHeld = enforced(node, res, f, p.rules.Global.ClusterName)
	klog.V(4).InfoS("Established node facts", "node", klog.KObj(node), "platform", f.Platform, "providerID", f.ProviderID, "rules", f.Rules, "talosAddress", target)
	return f, nil
}

package ipam

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/spf13/pflag"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
)

// AllocatorType selects how pod CIDRs are chosen (--cidr-allocator-type).
type AllocatorType string

const (
	// RangeAllocator gives every node one subnet per family of the cluster CIDRs.
	RangeAllocator AllocatorType = "RangeAllocator"
	// CloudAllocator gives every node an IPv6 subnet of its own global IPv6
	// prefix (read from its Talos addresses) and falls back to the range
	// allocator for IPv4 and for nodes without a usable global prefix.
	CloudAllocator AllocatorType = "CloudAllocator"
)

// Default mask sizes of per-node pod CIDRs.
const (
	DefaultNodeCIDRMaskSizeIPv4 = 24
	DefaultNodeCIDRMaskSizeIPv6 = 64
)

// Options are the controller's own flags. The cloud-provider framework owns
// --allocate-node-cidrs, --cluster-cidr and --cidr-allocator-type; Config
// combines both.
type Options struct {
	// NodeCIDRMaskSize is the mask size in a single-stack cluster (0: the
	// family's default).
	NodeCIDRMaskSize int
	// NodeCIDRMaskSizeIPv4 and NodeCIDRMaskSizeIPv6 are per-family mask sizes
	// (0: NodeCIDRMaskSize in a single-stack cluster, else the default).
	NodeCIDRMaskSizeIPv4, NodeCIDRMaskSizeIPv6 int
	// ServiceClusterIPRange is one or two comma-separated CIDRs never handed
	// to nodes.
	ServiceClusterIPRange string
	// Workers is the number of nodes handled in parallel.
	Workers int
}

// NewOptions returns the defaults.
func NewOptions() *Options { return &Options{Workers: 16} }

// AddFlags binds the options.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.NodeCIDRMaskSize, "node-cidr-mask-size", o.NodeCIDRMaskSize,
		"node-ipam-controller: mask size of node pod CIDRs in a single-stack cluster (default 24 for IPv4, 64 for IPv6).")
	fs.IntVar(&o.NodeCIDRMaskSizeIPv4, "node-cidr-mask-size-ipv4", o.NodeCIDRMaskSizeIPv4,
		"node-ipam-controller: mask size of IPv4 node pod CIDRs (default 24).")
	fs.IntVar(&o.NodeCIDRMaskSizeIPv6, "node-cidr-mask-size-ipv6", o.NodeCIDRMaskSizeIPv6,
		"node-ipam-controller: mask size of IPv6 node pod CIDRs (default 64). With CloudAllocator: the size carved from a node's own prefix when smaller than it, see docs/ipam.md.")
	fs.StringVar(&o.ServiceClusterIPRange, "service-cluster-ip-range", o.ServiceClusterIPRange,
		"node-ipam-controller: service CIDRs (one or two, comma-separated) never handed to nodes. Default: read from the Talos control plane together with the pod CIDRs when --cluster-cidr is not set.")
	fs.IntVar(&o.Workers, "node-ipam-workers", o.Workers,
		"node-ipam-controller: number of nodes handled in parallel.")
}

// Config is everything the controller needs, resolved from Options and the
// framework's flags.
type Config struct {
	// AllocatorType is RangeAllocator (default) or CloudAllocator.
	AllocatorType AllocatorType
	// ClusterCIDRs are the pod CIDRs (one, or two of different families). Empty:
	// read from the Talos control plane (k8s/ControllerManagerConfig).
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are never handed to nodes. Empty with empty ClusterCIDRs:
	// read from Talos too.
	ServiceCIDRs []netip.Prefix
	// NodeCIDRMaskSize, NodeCIDRMaskSizeIPv4, NodeCIDRMaskSizeIPv6 as in Options.
	NodeCIDRMaskSize, NodeCIDRMaskSizeIPv4, NodeCIDRMaskSizeIPv6 int
	// Workers is the number of nodes handled in parallel (default 16).
	Workers int
}

// Config combines the options with the framework's --cidr-allocator-type and
// --cluster-cidr values and validates the result.
func (o *Options) Config(allocatorType, clusterCIDR string) (Config, error) {
	c := Config{
		AllocatorType:        AllocatorType(allocatorType),
		NodeCIDRMaskSize:     o.NodeCIDRMaskSize,
		NodeCIDRMaskSizeIPv4: o.NodeCIDRMaskSizeIPv4,
		NodeCIDRMaskSizeIPv6: o.NodeCIDRMaskSizeIPv6,
		Workers:              o.Workers,
	}
	if c.AllocatorType == "" {
		c.AllocatorType = RangeAllocator
	}
	var errs []error
	var err error
	if c.ClusterCIDRs, err = iplist.Prefixes(clusterCIDR); err != nil {
		errs = append(errs, fmt.Errorf("--cluster-cidr=%s: %w", clusterCIDR, err))
	}
	if c.ServiceCIDRs, err = iplist.Prefixes(o.ServiceClusterIPRange); err != nil {
		errs = append(errs, fmt.Errorf("--service-cluster-ip-range=%s: %w", o.ServiceClusterIPRange, err))
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	return c, c.Validate()
}

// dualStack reports whether cidrs has one CIDR of each family.
func dualStack(cidrs []netip.Prefix) bool {
	return len(cidrs) == 2 && cidrs[0].Addr().Is4() != cidrs[1].Addr().Is4()
}

// MaskSize is the node pod CIDR mask size for the family of cidr in a cluster
// with clusterCIDRs.
func (c Config) MaskSize(cidr netip.Prefix, clusterCIDRs []netip.Prefix) int {
	perFamily, def := c.NodeCIDRMaskSizeIPv4, DefaultNodeCIDRMaskSizeIPv4
	if cidr.Addr().Is6() {
		perFamily, def = c.NodeCIDRMaskSizeIPv6, DefaultNodeCIDRMaskSizeIPv6
	}
	switch {
	case perFamily != 0:
		return perFamily
	case c.NodeCIDRMaskSize != 0 && !dualStack(clusterCIDRs):
		return c.NodeCIDRMaskSize
	}
	return def
}

// Validate reports every invalid setting, naming its flag. Cluster CIDRs that
// come from Talos are checked again with ValidateCIDRs when they are known.
func (c Config) Validate() error {
	var errs []error
	switch c.AllocatorType {
	case RangeAllocator, CloudAllocator:
	default:
		errs = append(errs, fmt.Errorf("--cidr-allocator-type=%s: must be %s or %s", c.AllocatorType, RangeAllocator, CloudAllocator))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("--node-ipam-workers=%d: must be at least 1", c.Workers))
	}
	for _, m := range []struct {
		flag     string
		v, limit int
	}{
		{"--node-cidr-mask-size", c.NodeCIDRMaskSize, 128},
		{"--node-cidr-mask-size-ipv4", c.NodeCIDRMaskSizeIPv4, 32},
		{"--node-cidr-mask-size-ipv6", c.NodeCIDRMaskSizeIPv6, 128},
	} {
		if m.v < 0 || m.v > m.limit {
			errs = append(errs, fmt.Errorf("%s=%d: must be 0 (default) or between 1 and %d", m.flag, m.v, m.limit))
		}
	}
	if err := checkFamilies("--service-cluster-ip-range", c.ServiceCIDRs); err != nil {
		errs = append(errs, err)
	}
	if len(c.ClusterCIDRs) > 0 {
		if err := c.ValidateCIDRs(c.ClusterCIDRs, "--cluster-cidr"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ValidateCIDRs checks cluster CIDRs against the mask sizes; source names
// where they came from (a flag, or the Talos resource).
func (c Config) ValidateCIDRs(cidrs []netip.Prefix, source string) error {
	if err := checkFamilies(source, cidrs); err != nil {
		return err
	}
	var errs []error
	if c.NodeCIDRMaskSize != 0 && dualStack(cidrs) && (c.NodeCIDRMaskSizeIPv4 == 0 || c.NodeCIDRMaskSizeIPv6 == 0) {
		errs = append(errs, fmt.Errorf("--node-cidr-mask-size=%d: ambiguous in a dual-stack cluster (%s): use --node-cidr-mask-size-ipv4/-ipv6",
			c.NodeCIDRMaskSize, iplist.Join(cidrs)))
	}
	for _, p := range cidrs {
		m := c.MaskSize(p, cidrs)
		maxMask := 30
		if p.Addr().Is6() {
			maxMask = maxCloudMaskSize
		}
		switch {
		case m < p.Bits():
			errs = append(errs, fmt.Errorf("%s=%s: node mask size /%d is larger than the cluster CIDR", source, p, m))
		case m > maxMask:
			errs = append(errs, fmt.Errorf("%s=%s: node mask size /%d leaves too few pod addresses (at most /%d)", source, p, m, maxMask))
		case m-p.Bits() > maxSubnetBits:
			errs = append(errs, fmt.Errorf("%s=%s: node mask size /%d splits it into more than 2^%d subnets", source, p, m, maxSubnetBits))
		}
	}
	return errors.Join(errs...)
}

func checkFamilies(source string, cidrs []netip.Prefix) error {
	var errs []error
	for _, p := range cidrs {
		if p != p.Masked() {
			errs = append(errs, fmt.Errorf("%s=%s: host bits set (did you mean %s?)", source, p, p.Masked()))
		}
		if p.Addr().Is4In6() {
			errs = append(errs, fmt.Errorf("%s=%s: IPv4-mapped IPv6 CIDRs are not supported", source, p))
		}
	}
	switch {
	case len(cidrs) > 2:
		errs = append(errs, fmt.Errorf("%s=%s: at most two CIDRs (one per family)", source, iplist.Join(cidrs)))
	case len(cidrs) == 2 && !dualStack(cidrs):
		errs = append(errs, fmt.Errorf("%s=%s: two CIDRs must be of different families", source, iplist.Join(cidrs)))
	}
	return errors.Join(errs...)
}

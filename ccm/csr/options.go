package csr

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
)

// Options tune the policy and the controller. The zero value is not usable: start
// from NewOptions.
type Options struct {
	// MinExpiration and MaxExpiration bound spec.expirationSeconds when it is set.
	MinExpiration, MaxExpiration time.Duration
	// WaitForInitialization makes requests of nodes that still carry the
	// uninitialized taint wait (Retry) instead of being judged right away.
	WaitForInitialization bool
	// AllowedIPRanges accept IP SANs inside them even if talos-ccm did not establish
	// them for the node (exotic setups; weakens the policy; empty by default).
	AllowedIPRanges []netip.Prefix
	// AllowedDNSSuffixes accept DNS SANs below them (label boundary: suffix
	// "nodes.example.com" accepts "a.nodes.example.com", not "nodes.example.com" or
	// "xnodes.example.com"); weakens the policy; empty by default.
	AllowedDNSSuffixes []string
	// Workers is the number of requests decided in parallel.
	Workers int
	// ClusterDomain is the cluster's DNS domain: no name in it is ever a
	// node's (default cluster.local).
	ClusterDomain string
	// ReservedIPRanges are never a node's (the cluster's Service and pod
	// CIDRs as configured; the API server's own ServiceCIDR objects are read
	// besides).
	ReservedIPRanges []netip.Prefix
	// APIServer is the URL talos-ccm reaches the API server at (set by the
	// wiring, not a flag): its host is never a node's.
	APIServer string
}

// NewOptions returns the defaults: 1h–367d, wait for initialization, no allow-lists,
// 4 workers.
func NewOptions() *Options {
	return &Options{
		MinExpiration:         time.Hour,
		MaxExpiration:         367 * 24 * time.Hour,
		WaitForInitialization: true,
		Workers:               4,
		ClusterDomain:         "cluster.local",
	}
}

// AddFlags binds the options to --csr-* flags.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.MinExpiration, "csr-min-expiration", o.MinExpiration,
		"node-csr-approval: smallest spec.expirationSeconds a kubelet serving CSR may request.")
	fs.DurationVar(&o.MaxExpiration, "csr-max-expiration", o.MaxExpiration,
		"node-csr-approval: largest spec.expirationSeconds a kubelet serving CSR may request.")
	fs.BoolVar(&o.WaitForInitialization, "csr-wait-for-initialization", o.WaitForInitialization,
		"node-csr-approval: keep CSRs of nodes that still have the uninitialized taint pending until talos-ccm has initialized them.")
	fs.Var((*iplist.PrefixesValue)(&o.AllowedIPRanges), "csr-allowed-ip-ranges",
		"node-csr-approval: comma-separated CIDRs whose addresses are accepted as IP SANs for any node, in addition to the addresses talos-ccm established (weakens the check; empty by default).")
	fs.StringSliceVar(&o.AllowedDNSSuffixes, "csr-allowed-dns-suffixes", o.AllowedDNSSuffixes,
		"node-csr-approval: comma-separated DNS suffixes; names below them are accepted as DNS SANs for any node (weakens the check; empty by default).")
	fs.StringVar(&o.ClusterDomain, "csr-cluster-domain", o.ClusterDomain,
		"node-csr-approval: the cluster's DNS domain; no name in it is approved as a DNS SAN.")
	fs.Var((*iplist.PrefixesValue)(&o.ReservedIPRanges), "csr-reserved-ip-ranges",
		"node-csr-approval: comma-separated CIDRs never approved as IP SANs, besides the ServiceCIDRs the API server reports (e.g. the Service and pod CIDRs; --cluster-cidr is added).")
	fs.IntVar(&o.Workers, "csr-workers", o.Workers,
		"node-csr-approval: number of CSRs decided in parallel.")
}

// Validate reports every invalid option, naming its flag.
func (o *Options) Validate() error {
	var errs []error
	if o.MinExpiration <= 0 {
		errs = append(errs, fmt.Errorf("--csr-min-expiration=%s: must be positive", o.MinExpiration))
	}
	if o.MaxExpiration < o.MinExpiration {
		errs = append(errs, fmt.Errorf("--csr-max-expiration=%s: must not be below --csr-min-expiration=%s", o.MaxExpiration, o.MinExpiration))
	}
	if o.Workers < 1 {
		errs = append(errs, fmt.Errorf("--csr-workers=%d: must be at least 1", o.Workers))
	}
	for _, p := range o.AllowedIPRanges {
		switch {
		case !p.IsValid():
			errs = append(errs, errors.New("--csr-allowed-ip-ranges: invalid prefix"))
		case p.Bits() == 0:
			errs = append(errs, fmt.Errorf("--csr-allowed-ip-ranges=%s: a /0 range would switch the IP check off", p))
		case p != p.Masked():
			errs = append(errs, fmt.Errorf("--csr-allowed-ip-ranges=%s: host bits set (did you mean %s?)", p, p.Masked()))
		}
	}
	for _, p := range o.ReservedIPRanges {
		if !p.IsValid() {
			errs = append(errs, errors.New("--csr-reserved-ip-ranges: invalid prefix"))
		}
	}
	for _, s := range o.AllowedDNSSuffixes {
		if err := validateDNSSuffix(s); err != nil {
			errs = append(errs, fmt.Errorf("--csr-allowed-dns-suffixes=%q: %w", s, err))
		}
	}
	return errors.Join(errs...)
}

func validateDNSSuffix(s string) error {
	if strings.ContainsRune(s, '*') {
		return errors.New("wildcards are not allowed (a suffix already covers every name below it)")
	}
	if isReservedDNSName(s) {
		return errors.New("kubernetes names are reserved for the API server")
	}
	if !strings.Contains(s, ".") {
		return errors.New("must have at least two labels (a top-level domain alone is too broad)")
	}
	if msgs := validation.IsDNS1123Subdomain(s); len(msgs) > 0 {
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

// Package talos owns every conversation with the Talos API. It reads the facts
// talos-ccm needs about a node (runtime/PlatformMetadata, network/AddressStatus,
// network/LinkStatus, hardware/SystemInformation, k8s/ControllerManagerConfig)
// through the real
// machinery client, addressing each request to the node with WithNode, and
// returns them as plain values. It never touches Kubernetes objects and makes no
// decisions about them.
package talos

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	talosclient "github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// ErrNotFound means the node answered but does not have the resource (yet).
var ErrNotFound = errors.New("resource not found on node")

// PlatformMetadata mirrors Talos runtime/PlatformMetadata.
type PlatformMetadata struct {
	Platform     string
	Hostname     string
	Region       string
	Zone         string
	InstanceType string
	InstanceID   string
	ProviderID   string
	Spot         bool
	InternalDNS  string
	ExternalDNS  string
	Tags         map[string]string
}

// Address is one network/AddressStatus: an address with its prefix on a link.
type Address struct {
	Link   string
	Prefix netip.Prefix
}

// Link is one network/LinkStatus: what the kernel says a link is. Talos puts a
// cloud's public (1:1 NAT) addresses on the pseudo-link "external", which has
// no LinkStatus: a LinkStatus of that name is a kernel link someone created.
type Link struct {
	Name string
	// Kind is the kernel's link kind ("" for a plain device; "bond", "vlan",
	// "dummy", "veth", "wireguard", ...).
	Kind string
	// Physical is Talos' own judgement (LinkStatusSpec.Physical): an ethernet
	// device that is no virtual kind.
	Physical bool
}

// SystemInformation mirrors Talos hardware/SystemInformation.
type SystemInformation struct {
	Manufacturer, ProductName, Version, SerialNumber, UUID, SKUNumber string
}

// ClusterNetwork is the pod and service CIDRs from the control plane's
// k8s/ControllerManagerConfig.
type ClusterNetwork struct {
	PodCIDRs     []netip.Prefix
	ServiceCIDRs []netip.Prefix
}

// Options configure the client.
type Options struct {
	// ConfigPath is a talosconfig file; empty means $TALOSCONFIG, ~/.talos/config,
	// then /var/run/secrets/talos.dev/config (the Talos ServiceAccount mount).
	ConfigPath string
	// Context selects a talosconfig context; empty means the current one.
	Context string
	// Endpoints override the talosconfig endpoints.
	Endpoints []string
	// Timeout bounds each request (default 10s).
	Timeout time.Duration
	// Kube, when set, resolves the Talos Service's names (talos.default, the
	// endpoint of the talosconfig Talos writes) from the Service's
	// EndpointSlices through the API server instead of DNS.
	Kube kubernetes.Interface
	// ReloadInterval is how often the talosconfig file is checked for changes
	// (default 30s; negative disables). Talos renews the certificate of a Talos
	// ServiceAccount in its mounted Secret: a changed file is loaded and
	// used for the following requests.
	ReloadInterval time.Duration
}

// Client reads node facts from the Talos API over one shared connection.
type Client struct {
	opts    Options
	path    string
	timeout time.Duration

	mu      sync.RWMutex
	c       *talosclient.Client
	stamp   fileStamp
	checked time.Time
}

// fileStamp identifies a version of the talosconfig file.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}
}

// LoadConfig reads a talosconfig without ever creating one (a missing file is an
// error that names the paths tried).
func LoadConfig(path string) (*clientconfig.Config, string, error) {
	candidates := []string{path}
	if path == "" {
		candidates = nil
		paths, err := clientconfig.GetDefaultPaths()
		if err != nil {
			return nil, "", fmt.Errorf("talosconfig: %w", err)
		}
		for _, p := range paths {
			candidates = append(candidates, p.Path)
		}
	}
	for _, p := range candidates {
		b, err := os.ReadFile(p)
		if err != nil {
			if path == "" && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, p, fmt.Errorf("talosconfig %s: %w", p, err)
		}
		cfg, err := clientconfig.FromBytes(b)
		if err != nil {
			return nil, p, fmt.Errorf("talosconfig %s: %w", p, err)
		}
		return cfg, p, nil
	}
	return nil, "", fmt.Errorf("talosconfig: none found (tried %s)", strings.Join(candidates, ", "))
}

// New creates a client. It does not dial yet.
func New(ctx context.Context, o Options) (*Client, error) {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.ReloadInterval == 0 {
		o.ReloadInterval = 30 * time.Second
	}
	c := &Client{opts: o, timeout: o.Timeout}
	tc, path, err := c.build(ctx)
	if err != nil {
		return nil, err
	}
	c.c, c.path, c.stamp, c.checked = tc, path, stampOf(path), time.Now()
	return c, nil
}

// build loads the talosconfig and creates a machinery client from it.
func (c *Client) build(ctx context.Context) (*talosclient.Client, string, error) {
	cfg, path, err := LoadConfig(c.opts.ConfigPath)
	if err != nil {
		return nil, path, err
	}
	opts := []talosclient.OptionFunc{talosclient.WithConfig(cfg), talosclient.WithGRPCDialOptions(peerInterceptors()...)}
	if c.opts.Context != "" {
		if _, ok := cfg.Contexts[c.opts.Context]; !ok {
			return nil, path, fmt.Errorf("talosconfig %s: context %q not found", path, c.opts.Context)
		}
		opts = append(opts, talosclient.WithContextName(c.opts.Context))
	}
	if len(c.opts.Endpoints) > 0 {
		opts = append(opts, talosclient.WithEndpoints(c.opts.Endpoints...))
	}
	if c.opts.Kube != nil {
		opts = append(opts, talosclient.WithGRPCDialOptions(grpc.WithResolvers(newServiceResolver(c.opts.Kube))))
	}
	tc, err := talosclient.New(ctx, opts...)
	if err != nil {
		return nil, path, fmt.Errorf("talos client from %s: %w", path, err)
	}
	return tc, path, nil
}

// current returns the machinery client, first reloading the talosconfig if the
// file changed since it was loaded (checked at most every ReloadInterval). A
// file that no longer loads keeps the previous client and is logged.
func (c *Client) current(ctx context.Context) *talosclient.Client {
	c.mu.RLock()
	tc, due := c.c, c.opts.ReloadInterval > 0 && time.Since(c.checked) >= c.opts.ReloadInterval
	c.mu.RUnlock()
	if !due {
		return tc
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) < c.opts.ReloadInterval {
		return c.c
	}
	c.checked = time.Now()
	st := stampOf(c.path)
	if st == c.stamp || st == (fileStamp{}) {
		return c.c
	}
	fresh, _, err := c.build(ctx)
	if err != nil {
		klog.ErrorS(err, "Cannot reload the changed talosconfig; keeping the loaded one", "path", c.path)
		c.stamp = st // report once per change
		return c.c
	}
	old := c.c
	c.c, c.stamp = fresh, st
	klog.InfoS("Reloaded the changed talosconfig", "path", c.path)
	// requests in flight keep the old connection until they finish
	time.AfterFunc(2*c.timeout, func() { _ = old.Close() })
	return c.c
}

// ClusterName is the cluster the talosconfig context in use names (its
// `cluster` field; Options.Context, else the config's current context), or ""
// when it names none. The upstream Talos CCM labels nodes with it when its
// configuration sets no cluster name; talos-ccm does the same. A talosconfig
// Talos issues for a Talos ServiceAccount names no cluster.
func (c *Client) ClusterName() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.c.GetClusterName()
}

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c.Close()
}

// call runs fn against node with the request timeout, counting and timing it.
func (c *Client) call(ctx context.Context, op, node string, fn func(ctx context.Context, st state.State) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	ctx, via := withPeerRecord(ctx)
	err := fn(talosclient.WithNode(ctx, node), c.current(ctx).COSI)
	code := status.Code(err)
	if state.IsNotFoundError(err) {
		code = codes.NotFound // the COSI client returns its own error, not a status
	}
	observe(op, start, code)
	if err != nil {
		if code == codes.NotFound {
			err = ErrNotFound
		}
		klog.V(4).InfoS("Talos API call failed", "op", op, "node", node, "endpoint", via.get(), "err", err)
		return &CallError{Op: op, Node: node, Endpoint: via.get(), Err: err}
	}
	klog.V(5).InfoS("Talos API call", "op", op, "node", node, "duration", time.Since(start))
	return nil
}

// PlatformMetadata reads runtime/PlatformMetadata of the node at address node.
func (c *Client) PlatformMetadata(ctx context.Context, node string) (*PlatformMetadata, error) {
	const op = "talos/Client.PlatformMetadata"
	var out *PlatformMetadata
	err := c.call(ctx, op, node, func(ctx context.Context, st state.State) error {
		r, err := safe.StateGet[*runtime.PlatformMetadata](ctx, st,
			resource.NewMetadata(runtime.NamespaceName, runtime.PlatformMetadataType, runtime.PlatformMetadataID, resource.VersionUndefined))
		if err != nil {
			return err
		}
		s := r.TypedSpec()
		out = &PlatformMetadata{
			Platform: s.Platform, Hostname: s.Hostname, Region: s.Region, Zone: s.Zone,
			InstanceType: s.InstanceType, InstanceID: s.InstanceID, ProviderID: s.ProviderID,
			Spot: s.Spot, InternalDNS: s.InternalDNS, ExternalDNS: s.ExternalDNS, Tags: s.Tags,
		}
		return nil
	})
	return out, err
}

// Addresses lists network/AddressStatus of the node.
func (c *Client) Addresses(ctx context.Context, node string) ([]Address, error) {
	const op = "talos/Client.Addresses"
	var out []Address
	err := c.call(ctx, op, node, func(ctx context.Context, st state.State) error {
		list, err := safe.StateListAll[*network.AddressStatus](ctx, st)
		if err != nil {
			return err
		}
		for r := range list.All() {
			s := r.TypedSpec()
			out = append(out, Address{Link: s.LinkName, Prefix: s.Address})
		}
		return nil
	})
	return out, err
}

// Links lists network/LinkStatus of the node.
func (c *Client) Links(ctx context.Context, node string) ([]Link, error) {
	const op = "talos/Client.Links"
	var out []Link
	err := c.call(ctx, op, node, func(ctx context.Context, st state.State) error {
		list, err := safe.StateListAll[*network.LinkStatus](ctx, st)
		if err != nil {
			return err
		}
		for r := range list.All() {
			s := r.TypedSpec()
			out = append(out, Link{Name: r.Metadata().ID(), Kind: s.Kind, Physical: s.Physical()})
		}
		return nil
	})
	return out, err
}

// SystemInformation reads hardware/SystemInformation of the node.
func (c *Client) SystemInformation(ctx context.Context, node string) (*SystemInformation, error) {
	const op = "talos/Client.SystemInformation"
	var out *SystemInformation
	err := c.call(ctx, op, node, func(ctx context.Context, st state.State) error {
		r, err := safe.StateGet[*hardware.SystemInformation](ctx, st,
			resource.NewMetadata(hardware.NamespaceName, hardware.SystemInformationType, hardware.SystemInformationID, resource.VersionUndefined))
		if err != nil {
			return err
		}
		s := r.TypedSpec()
		out = &SystemInformation{Manufacturer: s.Manufacturer, ProductName: s.ProductName, Version: s.Version,
			SerialNumber: s.SerialNumber, UUID: s.UUID, SKUNumber: s.SKUNumber}
		return nil
	})
	return out, err
}

// Nodename reads k8s/Nodename: the name the node's kubelet registers under.
// It proves which machine answered on an address.
func (c *Client) Nodename(ctx context.Context, node string) (string, error) {
	const op = "talos/Client.Nodename"
	var out string
	err := c.call(ctx, op, node, func(ctx context.Context, st state.State) error {
		r, err := safe.StateGet[*k8s.Nodename](ctx, st,
			resource.NewMetadata(k8s.NamespaceName, k8s.NodenameType, k8s.NodenameID, resource.VersionUndefined))
		if err != nil {
			return err
		}
		out = r.TypedSpec().Nodename
		return nil
	})
	return out, err
}

// ClusterNetwork reads the pod/service CIDRs from the control-plane node's
// k8s/ControllerManagerConfig.
func (c *Client) ClusterNetwork(ctx context.Context, node string) (*ClusterNetwork, error) {
	const op = "talos/Client.ClusterNetwork"
	var out *ClusterNetwork
	err := c.call(ctx, op, node, func(ctx context.Context, st state.State) error {
		r, err := safe.StateGet[*k8s.ControllerManagerConfig](ctx, st,
			resource.NewMetadata(k8s.ControlPlaneNamespaceName, k8s.ControllerManagerConfigType, k8s.ControllerManagerConfigID, resource.VersionUndefined))
		if err != nil {
			return err
		}
		s := r.TypedSpec()
		out = &ClusterNetwork{}
		for i, p := range s.PodCIDRs {
			pp, err := netip.ParsePrefix(p)
			if err != nil {
				return fmt.Errorf("podCIDRs[%d] %q: %w", i, p, err)
			}
			out.PodCIDRs = append(out.PodCIDRs, pp)
		}
		for i, p := range s.ServiceCIDRs {
			pp, err := netip.ParsePrefix(p)
			if err != nil {
				return fmt.Errorf("serviceCIDRs[%d] %q: %w", i, p, err)
			}
			out.ServiceCIDRs = append(out.ServiceCIDRs, pp)
		}
		return nil
	})
	return out, err
}

package talosnode

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/nethelpers"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// Spec is what a simulated node reports through its Talos API.
type Spec struct {
	// Metadata becomes runtime/PlatformMetadata; nil means the resource is absent
	// (as on a node whose platform has not produced metadata yet).
	Metadata *runtime.PlatformMetadataSpec
	// Addresses become network/AddressStatus resources. Each link they name
	// but "external" gets a network/LinkStatus (a physical ethernet device, or
	// loopback for "lo") unless Links declares it; addresses on "external" are
	// the platform's pseudo-link, which has no LinkStatus, as on a real node.
	Addresses []Address
	// Links are kernel links besides (or instead of) the defaults above: e.g.
	// {Name: "external", Kind: "dummy"}, the link a node's root can create with
	// `ip link add external type dummy`.
	Links []Link
	// System becomes hardware/SystemInformation; nil means absent.
	System *hardware.SystemInformationSpec
	// Nodename becomes k8s/Nodename (the kubelet's node name); empty means the
	// name given to AddNode.
	Nodename string
}

// Address is one AddressStatus: a prefix on a link. Talos puts the public
// address of clouds with 1:1 NAT on the link named "external".
type Address struct {
	Link   string
	Prefix string // e.g. "10.0.0.5/24", "2001:db8::5/64"
}

// Link is one network/LinkStatus.
type Link struct {
	Name string
	// Kind is the kernel link kind: "" for a device, "dummy", "bond", "vlan",
	// "veth", "wireguard", ...
	Kind string
}

// create stores r in the node's state already marshaled, as the COSI state
// server sends it (protobuf and YAML spec): the server then answers every
// request with those bytes instead of encoding the resource again. The
// answers are byte for byte what it would send for r; what it saves is the
// work a real Talos node does on its own CPU (machined encoding its
// resources), which in a test would land on the cores the API server and
// talos-ccm share.
func create(ctx context.Context, st state.State, r resource.Resource) error {
	m, err := encoded(r)
	if err != nil {
		return err
	}
	return st.Create(ctx, m)
}

// encoded is r as the state server sends it (see create).
func encoded(r resource.Resource) (resource.Resource, error) {
	m, err := protobuf.FromResource(r)
	if err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", r.Metadata().Type(), r.Metadata().ID(), err)
	}
	return m, nil
}

func (s Spec) apply(ctx context.Context, st state.State, name string) error {
	nn := k8s.NewNodename(k8s.NamespaceName, k8s.NodenameID)
	nn.TypedSpec().Nodename = name
	if s.Nodename != "" {
		nn.TypedSpec().Nodename = s.Nodename
	}
	if err := create(ctx, st, nn); err != nil {
		return fmt.Errorf("create Nodename: %w", err)
	}
	if s.Metadata != nil {
		r := runtime.NewPlatformMetadataSpec(runtime.NamespaceName, runtime.PlatformMetadataID)
		*r.TypedSpec() = *s.Metadata
		if err := create(ctx, st, r); err != nil {
			return fmt.Errorf("create PlatformMetadata: %w", err)
		}
	}
	if err := s.createLinks(ctx, st); err != nil {
		return err
	}
	for i, a := range s.Addresses {
		r, err := addressStatus(i+1, a)
		if err != nil {
			return fmt.Errorf("addresses[%d]: %w", i, err)
		}
		if err := create(ctx, st, r); err != nil {
			return fmt.Errorf("create AddressStatus %s: %w", a.Prefix, err)
		}
	}
	if s.System != nil {
		r := hardware.NewSystemInformation(hardware.SystemInformationID)
		*r.TypedSpec() = *s.System
		if err := create(ctx, st, r); err != nil {
			return fmt.Errorf("create SystemInformation: %w", err)
		}
	}
	return nil
}

// createLinks creates the LinkStatus of every link the spec names (Spec.Addresses).
func (s Spec) createLinks(ctx context.Context, st state.State) error {
	links := map[string]Link{}
	var order []string
	add := func(l Link) {
		if _, ok := links[l.Name]; !ok {
			order = append(order, l.Name)
		}
		links[l.Name] = l
	}
	for _, a := range s.Addresses {
		if a.Link != "external" {
			add(Link{Name: a.Link})
		}
	}
	for _, l := range s.Links {
		add(l)
	}
	for i, name := range order {
		if err := create(ctx, st, linkStatus(i+1, links[name])); err != nil {
			return fmt.Errorf("create LinkStatus %s: %w", name, err)
		}
	}
	return nil
}

// linkStatus is l as the network/LinkStatus Talos reports.
func linkStatus(index int, l Link) *network.LinkStatus {
	r := network.NewLinkStatus(network.NamespaceName, l.Name)
	spec := r.TypedSpec()
	spec.Index = uint32(index)
	spec.Type = nethelpers.LinkEther
	spec.Kind = l.Kind
	spec.LinkState = true
	spec.OperationalState = nethelpers.OperStateUp
	if l.Name == "lo" {
		spec.Type = nethelpers.LinkLoopbck
	}
	return r
}

// addressStatus is a as the network/AddressStatus Talos reports, on the link
// of the given index (none for the platform's pseudo-link "external").
func addressStatus(linkIndex int, a Address) (*network.AddressStatus, error) {
	p, err := netip.ParsePrefix(a.Prefix)
	if err != nil {
		return nil, err
	}
	r := network.NewAddressStatus(network.NamespaceName, network.AddressID(a.Link, p))
	spec := r.TypedSpec()
	spec.Address = p
	spec.Local = p.Addr()
	spec.LinkName = a.Link
	if a.Link != "external" {
		spec.LinkIndex = uint32(linkIndex)
	}
	spec.Scope = nethelpers.ScopeGlobal
	spec.Flags = nethelpers.AddressFlags(nethelpers.AddressPermanent)
	spec.Family = nethelpers.FamilyInet4
	if p.Addr().Is6() {
		spec.Family = nethelpers.FamilyInet6
	}
	if p.Addr().IsLoopback() {
		spec.Scope = nethelpers.ScopeHost
	} else if p.Addr().IsLinkLocalUnicast() {
		spec.Scope = nethelpers.ScopeLink
	}
	return r, nil
}

// AddAddress adds an address to the running node (a new network/AddressStatus),
// as when an interface gets one more address.
func (n *Node) AddAddress(ctx context.Context, a Address) error {
	r, err := addressStatus(100, a)
	if err != nil {
		return fmt.Errorf("address %q: %w", a.Prefix, err)
	}
	if err := create(ctx, n.state, r); err != nil {
		return fmt.Errorf("create AddressStatus %s: %w", a.Prefix, err)
	}
	return nil
}

// AddLink adds a kernel link to the running node (a new network/LinkStatus),
// as `ip link add` does.
func (n *Node) AddLink(ctx context.Context, l Link) error {
	if err := create(ctx, n.state, linkStatus(200, l)); err != nil {
		return fmt.Errorf("create LinkStatus %s: %w", l.Name, err)
	}
	return nil
}

// SetMetadata replaces (or creates) the node's PlatformMetadata.
func (n *Node) SetMetadata(ctx context.Context, md runtime.PlatformMetadataSpec) error {
	r := runtime.NewPlatformMetadataSpec(runtime.NamespaceName, runtime.PlatformMetadataID)
	cur, err := n.state.Get(ctx, r.Metadata())
	*r.TypedSpec() = md
	if state.IsNotFoundError(err) {
		err = create(ctx, n.state, r)
	} else if err == nil {
		r.Metadata().SetVersion(cur.Metadata().Version())
		var m resource.Resource
		if m, err = encoded(r); err == nil {
			err = n.state.Update(ctx, m)
		}
	}
	if err != nil {
		return fmt.Errorf("talosnode: node %s: set PlatformMetadata: %w", n.Name, err)
	}
	return nil
}

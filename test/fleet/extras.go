package fleet

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/siderolabs/talos/pkg/machinery/nethelpers"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
)

// TalosExtras is more of what a machine's Talos API reports than Machine
// says: the spot lifecycle, the hardware, a public address. Talos learns
// these from the platform too; set them before talos-ccm reads the machine
// (SetTalosExtras).
type TalosExtras struct {
	// Spot marks the instance as spot (PlatformMetadata.Spot): talos-ccm
	// labels its node node.cloudprovider.kubernetes.io/lifecycle=spot.
	Spot bool
	// Manufacturer and ProductName become hardware/SystemInformation (what
	// transformation rules may select on).
	Manufacturer, ProductName string
	// ExternalIP is the public address of a cloud with 1:1 NAT: an
	// AddressStatus on the link Talos names "external" (talos-ccm makes it
	// the node's ExternalIP).
	ExternalIP string
}

// SetTalosExtras adds x to what the machine's Talos API reports.
func (f *Fleet) SetTalosExtras(ctx context.Context, name string, x TalosExtras) error {
	tn := f.Talos.Node(name)
	var m *Machine
	for i := range f.Machines {
		if f.Machines[i].Name == name {
			m = &f.Machines[i]
		}
	}
	if tn == nil || m == nil {
		return fmt.Errorf("fleet: no machine %s", name)
	}
	if x.Spot {
		md := m.metadata()
		md.Spot = true
		if err := tn.SetMetadata(ctx, md); err != nil {
			return fmt.Errorf("fleet: machine %s: %w", name, err)
		}
	}
	if x.Manufacturer != "" || x.ProductName != "" {
		r := hardware.NewSystemInformation(hardware.SystemInformationID)
		r.TypedSpec().Manufacturer, r.TypedSpec().ProductName = x.Manufacturer, x.ProductName
		if err := tn.State().Create(ctx, r); err != nil {
			return fmt.Errorf("fleet: machine %s: SystemInformation: %w", name, err)
		}
	}
	if x.ExternalIP != "" {
		ip, err := netip.ParseAddr(x.ExternalIP)
		if err != nil {
			return fmt.Errorf("fleet: machine %s: external IP: %w", name, err)
		}
		p := netip.PrefixFrom(ip, ip.BitLen())
		r := network.NewAddressStatus(network.NamespaceName, network.AddressID("external", p))
		spec := r.TypedSpec()
		spec.Address, spec.Local, spec.LinkName, spec.LinkIndex = p, ip, "external", 99
		spec.Scope, spec.Flags = nethelpers.ScopeGlobal, nethelpers.AddressFlags(nethelpers.AddressPermanent)
		spec.Family = nethelpers.FamilyInet4
		if ip.Is6() {
			spec.Family = nethelpers.FamilyInet6
		}
		if err := tn.State().Create(ctx, r); err != nil {
			return fmt.Errorf("fleet: machine %s: external address: %w", name, err)
		}
	}
	return nil
}

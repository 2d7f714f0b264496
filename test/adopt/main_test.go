// Package adopt hands a cluster bootstrapped with the static manifests
// (docs/deploy, as Talos applies cluster.externalCloudProvider.manifests)
// over to Helm on a real cluster (test/cluster, test/fleet), the path
// docs/install.md gives a new Talos cluster: talos-ccm first, because every
// node waits for it, then `helm install` of the umbrella chart — what the
// Flux layout's HelmRelease does too — while machines keep joining. Only its
// tests hold code.
package adopt

import (
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
)

var f *fleet.Fleet

// machines the cluster is bootstrapped with: two bare-metal control planes
// (talos-ccm's leader and, once Helm runs it with a standby, the standby's
// machine: it runs in the host's network, one per machine), an aws instance
// and an hcloud server.
var machines = []fleet.Machine{
	{Name: "metal-cp", Platform: "metal", ControlPlane: true},
	{Name: "metal-cp2", Platform: "metal", ControlPlane: true},
	{Name: "aws-1", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0000000000000c001", Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "m5.large"},
	{Name: "hcloud-1", Platform: "hcloud", ProviderID: "hcloud://3001", Region: "nbg1", Zone: "nbg1-dc3", InstanceType: "cx22"},
}

// joining are the machines that join while Helm takes over.
var joining = []fleet.Machine{
	{Name: "aws-2", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0000000000000c002", Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "m5.large"},
	{Name: "hcloud-2", Platform: "hcloud", ProviderID: "hcloud://3002", Region: "nbg1", Zone: "nbg1-dc3", InstanceType: "cx22"},
	{Name: "metal-3", Platform: "metal"},
}

func TestMain(m *testing.M) {
	// kube-controller-manager allocates pod CIDRs, as Talos runs it by
	// default: the static manifests' talos-ccm does not. Cluster DNS
	// (CoreDNS as Talos deploys it) is created by the test, together with
	// the static manifests, as Talos applies both at bootstrap.
	fleetcheck.Main(m, fleetcheck.Package{
		Name:      "adopt",
		Options:   fleet.Options{Machines: machines, AllocateNodeCIDRs: true, DeferClusterDNS: true},
		Platforms: []string{"aws", "hcloud"},
	}, func(fl *fleet.Fleet) { f = fl })
}

// Package takeover hands a cluster that runs one cloud's CCM on its own over
// to Hybrid CCM on a real cluster (test/cluster, test/fleet), the path
// docs/migrating-from-a-cloud-ccm.md gives: the unmodified upstream AWS CCM
// installed by its own Helm chart (charts/aws-cloud-controller-manager of
// k8s.io/cloud-provider-aws, from the Go module cache), initializing the aws
// nodes and serving a LoadBalancer Service without a class with a Classic
// ELB in the fake EC2 (test/fakeec2); then `helm install` of the umbrella
// chart from the fleet's registry with an aws NativeCCM that serves the
// Services without a class and takes over from that CCM's Lease, while the
// AWS CCM still runs; then the AWS CCM uninstalled. Only its tests hold code.
package takeover

import (
	"context"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var (
	f *fleet.Fleet
	// version is the release the test makes and installs.
	version string
	// awsCCM is the upstream AWS CCM binary the registry serves as its image
	// (hack/aws-ccm.sh); its module's source holds the chart.
	awsCCM string
)

// The aws machines are named as EC2 names instances with resource-based
// hostnames (their instance IDs), as the AWS CCM finds an instance for a node
// without a providerID: by its name. They differ within the first 13
// characters (the node's veth takes them).
var (
	awsMachine = func(id string) fleet.Machine {
		return fleet.Machine{Name: id, Platform: "aws", ProviderID: "aws:///" + zone + "/" + id, Region: region, Zone: zone, InstanceType: "m5.large"}
	}
	// machines the cluster starts with: a bare-metal control plane (where
	// the AWS CCM's DaemonSet and Hybrid CCM's controllers run; no CCM knows
	// it before talos-ccm) and two aws instances.
	machines = []fleet.Machine{
		{Name: "metal-cp", Platform: "metal", ControlPlane: true},
		awsMachine("i-01a0000000000e001"),
		awsMachine("i-02a0000000000e002"),
	}
	// joining joins after the take-over.
	joining = awsMachine("i-03a0000000000e003")
)

const (
	region = "eu-west-1"
	zone   = "eu-west-1a"
)

func TestMain(m *testing.M) {
	// kube-controller-manager allocates pod CIDRs, as on a cluster whose
	// only CCM was the cloud's (talos-ccm's node IPAM stays off).
	fleetcheck.Main(m, fleetcheck.Package{
		Name:      "takeover",
		Options:   fleet.Options{Machines: machines, AllocateNodeCIDRs: true},
		Platforms: []string{"aws"},
		Images: func(_ context.Context, _ string, _ map[string]string, bin string) error {
			awsCCM = bin
			return nil
		},
		Setup: func(ctx context.Context, fl *fleet.Fleet) (err error) {
			if version, err = ship.DefaultVersion(testenv.RepoRoot()); err != nil {
				return err
			}
			return fl.Release(ctx, version)
		},
	}, func(fl *fleet.Fleet) { f = fl })
}

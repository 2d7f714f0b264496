// Package oncluster installs the product the user's way on a real cluster
// (test/cluster, test/fleet): real kubelets and containerd on machines of
// several platforms, each answering the Talos API on its own address, in
// fake clouds (test/fleet's: EC2 and ELB for the real AWS CCM, test/testccm's
// instance and load-balancer API for the other clouds); `make release` into
// a private registry the test runs; `helm install` of the umbrella chart from
// that OCI registry, as docs/install.md says, with a multi-cloud values file
// and an image pull Secret for the product's images. It
// asserts what the cluster does with it (nodes initialized, serving
// certificates approved, native CCMs running gated with their security
// contexts enforced, the real AWS CCM among them — one per aws region, each
// owning its region's node (a domain) with a cloud.conf of that region —,
// holding no API credential, renewing their leases without a restart; no pod
// of the product with an admin credential; no cloud asked about another
// cloud's node, no aws region's endpoint about another region's; LoadBalancer
// Services served by the cloud of their class, targeting only its domain's
// nodes),
// and then a cluster's daily operations: the API server restarted and
// stopped, instances gone in their clouds and machines powered off (each aws
// region's CCM keeping its NotReady node while the instance runs, and only
// the second region's deleting its node once that instance is gone), a node
// rebooted, the talos-ccm leader lost, a native CCM's leader pod lost; last,
// what the gate prevents: the same AWS CCM of one region run ungated deletes
// the other region's NotReady node (upstream cloud-provider-aws#939). Only
// its tests hold code.
package oncluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
	"github.com/hybrid-ccm/hybrid-ccm/test/registry"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// releaseCredentials are those of the registry's release repositories.
var releaseCredentials = registry.Credentials{Username: "platform-team", Password: "release-pull-token"}

var (
	f *fleet.Fleet
	// version is the release the test makes and installs.
	version string
)

// machines of the fleet: two control-plane machines (bare metal, where the
// product's pods run: talos-ccm's leader and its standby use the host's
// network, one per machine), two aws instances in two regions, each owned by
// its region's NativeCCM (TestOperations terminates the second), an hcloud
// server (TestOperations deletes it), a gcp instance and a second metal
// machine.
var machines = []fleet.Machine{
	{Name: "metal-cp", Platform: "metal", ControlPlane: true},
	{Name: "metal-cp2", Platform: "metal", ControlPlane: true},
	{Name: "aws-1", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0000000000000a001", Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "m5.large"},
	{Name: "aws-2", Platform: "aws", ProviderID: "aws:///us-east-1a/i-0000000000000a002", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "m5.large"},
	{Name: "hcloud-1", Platform: "hcloud", ProviderID: "hcloud://1001", Region: "fsn1", Zone: "fsn1-dc14", InstanceType: "cx22"},
	{Name: "gcp-1", Platform: "gcp", ProviderID: "gce://prod/europe-west3-a/gcp-1", Region: "europe-west3", Zone: "europe-west3-a", InstanceType: "e2-small"},
	{Name: "metal-2", Platform: "metal"},
}

func TestMain(m *testing.M) {
	fleetcheck.Main(m, fleetcheck.Package{
		Name: "oncluster",
		// The release goes to a private registry: its repositories need
		// credentials (TestPrivateRegistry). No cluster DNS, as on a Talos
		// cluster with cluster.coreDNS.disabled: talos-ccm must initialize
		// every node through the Talos Service (talos.default) with nothing
		// answering DNS (TestInstallAsDocumented); test/adopt runs CoreDNS.
		Options: fleet.Options{Machines: machines, ReleaseCredentials: &releaseCredentials, NoClusterDNS: true},
		// Every built-in profile's CCM image: the real AWS CCM for aws,
		// test/testccm for the others.
		Setup: func(ctx context.Context, fl *fleet.Fleet) (err error) {
			if version, err = ship.DefaultVersion(testenv.RepoRoot()); err != nil {
				return err
			}
			return fl.Release(ctx, version)
		},
		After: func() {
			if clouds != nil {
				if err := clouds.Close(); err != nil {
					fmt.Fprintln(os.Stderr, "clouds:", err)
				}
			}
		},
	}, func(fl *fleet.Fleet) { f = fl })
}

// goBuild builds a static binary of a package of the repository.
func goBuild(ctx context.Context, out, pkg string) error {
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

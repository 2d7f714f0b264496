// Package adopt hands a cluster bootstrapped with the static manifests
// (docs/deploy, as Talos applies cluster.externalCloudProvider.manifests)
// over to Helm on a real cluster (test/cluster, test/fleet), the path
// docs/install.md gives a new Talos cluster: talos-ccm first, because every
// node waits for it, then `helm install` of the umbrella chart — what the
// Flux layout's HelmRelease does too — while machines keep joining. Only its
// tests hold code.
package adopt

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
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
	// The cluster's bridge, routes and every daemon's port live in a network
	// namespace of the package's own; nothing it runs can reach beyond it.
	os.Exit(netns.Main(func() int { return run(m) }))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "test/adopt runs a cluster and needs root")
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	root := testenv.RepoRoot()
	awsCCM, err := fleet.AWSCCM(ctx, root)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "hybrid-ccm-adopt-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	images, err := fleet.UpstreamImages(ctx, root, dir, awsCCM, "aws", "hcloud")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// kube-controller-manager allocates pod CIDRs, as Talos runs it by
	// default: the static manifests' talos-ccm does not.
	f, err = fleet.Up(ctx, fleet.Options{Machines: machines, Images: images, Log: logWriter{}, AllocateNodeCIDRs: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := f.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "down:", err)
		}
	}()
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "cluster logs (tails):\n%s\n", f.Logs(3000))
	}
	return code
}

// logWriter writes the fleet's steps to standard error with the time.
type logWriter struct{}

func (logWriter) Write(p []byte) (int, error) {
	fmt.Fprintf(os.Stderr, "%s %s", time.Now().Format("15:04:05.000"), p)
	return len(p), nil
}

// Package upgrade upgrades the product on a real cluster (test/cluster,
// test/fleet) the way a platform team does: the previous release — charts
// and images built by `make release` from an earlier commit of this
// repository — installed with `helm install` from a registry, then `helm
// upgrade` to the release of this tree while Talos machines join. It asserts
// what must hold through it: no node left uninitialized, each CCM with at
// most one leader at any time, no foreign node touched, no CSR denied. Only
// its tests hold code.
package upgrade

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
)

var f *fleet.Fleet

// machines the previous release is installed on: two control-plane machines
// (bare metal: talos-ccm's leader and its standby, one per machine, in the
// host's network), an aws instance and an hcloud server.
var machines = []fleet.Machine{
	{Name: "metal-cp", Platform: "metal", ControlPlane: true},
	{Name: "metal-cp2", Platform: "metal", ControlPlane: true},
	{Name: "aws-1", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0000000000000b001", Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "m5.large"},
	{Name: "hcloud-1", Platform: "hcloud", ProviderID: "hcloud://2001", Region: "fsn1", Zone: "fsn1-dc14", InstanceType: "cx22"},
}

// joining are the machines that join while the upgrade runs.
var joining = []fleet.Machine{
	{Name: "aws-2", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0000000000000b002", Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "m5.large"},
	{Name: "hcloud-2", Platform: "hcloud", ProviderID: "hcloud://2002", Region: "fsn1", Zone: "fsn1-dc14", InstanceType: "cx22"},
	{Name: "metal-3", Platform: "metal"},
}

func TestMain(m *testing.M) {
	fleetcheck.Main(m, fleetcheck.Package{
		Name:      "upgrade",
		Options:   fleet.Options{Machines: machines, TalosAPIByAddress: true},
		Platforms: []string{"aws", "hcloud"},
		Images:    previousImages,
		OnHost:    previousModules,
	}, func(fl *fleet.Fleet) { f = fl })
}

// previousModules downloads the modules of the previous release's go.mod
// (go mod download in a copy of its tree) into the module cache, while the
// Go module proxy is in reach: the test's `make release` of that tree runs in
// the package's namespace, where it is not. On a machine that has them
// (every run after the first) nothing is fetched.
func previousModules(ctx context.Context, root string) error {
	dir, err := os.MkdirTemp("", "hybrid-ccm-upgrade-previous-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, file := range []string{"go.mod", "go.sum"} {
		data, err := exec.CommandContext(ctx, "git", "-C", root, "show", previous+":"+file).Output()
		if err != nil {
			return fmt.Errorf("git show %.12s:%s: %w (a shallow clone lacks the commit: git fetch --unshallow)", previous, file, err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o644); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, "go", "mod", "download")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the previous release's modules (go mod download of %.12s's go.mod): %w\n%s", previous, err, out)
	}
	return nil
}

// previousImages adds the upstream CCM images the previous release's
// profiles name for this control plane and this tree's do not (the previous
// release named one aws tag for every minor, v1.34.0) to images: under
// those names the registry serves the same binaries as under this tree's
// (for aws, the AWS CCM hack/aws-ccm.sh built for this tree; the Go module
// proxy is out of reach in here, and the test is about the product's
// hand-over, which moves the aws release to this tree's tag).
func previousImages(ctx context.Context, root string, images map[string]string, awsCCM string) error {
	minor, err := fleet.ControlPlaneMinor()
	if err != nil {
		return err
	}
	byRepo := map[string]string{}
	for ref, bin := range images {
		repo, _, _ := strings.Cut(ref, ":")
		byRepo[repo] = bin
	}
	byRepo["registry.k8s.io/provider-aws/cloud-controller-manager"] = awsCCM
	for _, name := range []string{"aws", "hcloud"} {
		file := "profiles/" + name + ".yaml"
		data, err := exec.CommandContext(ctx, "git", "-C", root, "show", previous+":"+file).Output()
		if err != nil {
			return fmt.Errorf("git show %s:%s: %w (a shallow clone lacks the commit: git fetch --unshallow)", previous, file, err)
		}
		// only its image: a profile of then need not validate now
		p := &profile.Profile{}
		if err := yaml.Unmarshal(data, p); err != nil {
			return fmt.Errorf("%s@%.12s: %w", file, previous, err)
		}
		tag, _, err := p.TagFor(minor)
		if err != nil {
			return err
		}
		bin, ok := byRepo[p.CCM.Image.Repository]
		if !ok {
			return fmt.Errorf("the previous release's %s profile names %s, which this tree's does not", name, p.CCM.Image.Repository)
		}
		if _, ok := images[p.CCM.Image.Repository+":"+tag]; !ok {
			images[p.CCM.Image.Repository+":"+tag] = bin
		}
	}
	return nil
}

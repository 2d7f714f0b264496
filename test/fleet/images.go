package fleet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// UpstreamImages maps the image of each built-in profile named in platforms
// (all profiles when empty) to the static binary the fleet's registry serves
// under that name (Options.Images): the real AWS CCM (awsCCM, which
// hack/aws-ccm.sh builds) for aws, test/testccm — a CCM on
// k8s.io/cloud-provider/app that asks the fleet's Clouds — for the clouds
// whose CCM cannot be built from the Go module proxy. test/testccm is built
// from the repository at root into dir.
func UpstreamImages(ctx context.Context, root, dir, awsCCM string, profiles ...string) (map[string]string, error) {
	testCCM := filepath.Join(dir, "testccm")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", testCCM, "./test/testccm")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // an image without libc
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("fleet: build test/testccm: %w\n%s", err, out)
	}
	set, err := profile.Builtin()
	if err != nil {
		return nil, err
	}
	if len(profiles) == 0 {
		profiles = set.Names()
	}
	images := map[string]string{}
	for _, name := range profiles {
		p, ok := set.Get(name)
		if !ok {
			return nil, fmt.Errorf("fleet: no built-in profile %q", name)
		}
		bin := testCCM
		if name == "aws" {
			bin = awsCCM
		}
		images[p.CCM.Image.Reference()] = bin
	}
	return images, nil
}

// AWSCCM builds (or finds in its cache) the upstream AWS CCM at the version
// profiles/aws.yaml names with hack/aws-ccm.sh of the repository at root, and
// returns the binary's path. The script may need the Go module proxy: call
// it where that is reachable (a test's network namespace keeps it reachable
// only through the build cache, which `make test` fills first).
func AWSCCM(ctx context.Context, root string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "aws-ccm.sh"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("fleet: hack/aws-ccm.sh: %w\n%s", err, stderr.String())
	}
	bin := strings.TrimSpace(string(out))
	if bin == "" {
		return "", fmt.Errorf("fleet: hack/aws-ccm.sh printed no binary path\n%s", stderr.String())
	}
	return bin, nil
}

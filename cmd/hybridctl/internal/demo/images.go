package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
)

// upstreamImages maps the image of each demo cloud's profile to the static
// binary the fleet's registry serves under that name (fleet.UpstreamImages).
func upstreamImages(ctx context.Context, root, dir, awsCCM string) (map[string]string, error) {
	var platforms []string
	for _, d := range demoClouds {
		if !slices.Contains(platforms, d.platform) {
			platforms = append(platforms, d.platform)
		}
	}
	return fleet.UpstreamImages(ctx, root, dir, awsCCM, platforms...)
}

// awsCCMBinary is the upstream AWS CCM that hack/aws-ccm.sh built (`make
// demo` runs it first) for the release the aws profile names for the
// control plane's minor (the one the coordinator installs), found where the
// script caches it: ${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-~/.cache}/hybrid-ccm}/aws-ccm-<tag>.
// The demo does not build it: it runs in a network namespace without the Go
// module proxy.
func awsCCMBinary() (string, error) {
	set, err := profile.Builtin()
	if err != nil {
		return "", err
	}
	p, ok := set.Get("aws")
	if !ok {
		return "", errors.New("no built-in aws profile")
	}
	root := os.Getenv("HYBRID_CCM_CACHE")
	if root == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		root = filepath.Join(cache, "hybrid-ccm")
	}
	minor, err := fleet.ControlPlaneMinor()
	if err != nil {
		return "", err
	}
	tag, _, err := p.TagFor(minor)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, "aws-ccm-"+tag, "aws-cloud-controller-manager")
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("the demo runs the upstream AWS CCM %s, built by hack/aws-ccm.sh, and %s is not there: run `make demo` (it builds it) or hack/aws-ccm.sh first", tag, bin)
	}
	return bin, nil
}

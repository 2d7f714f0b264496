package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// UpstreamImages maps the images of each built-in profile named in platforms
// (all profiles when empty; every release it names, whichever the
// coordinator chooses for the cluster's minor) to the static binary the
// fleet's registry serves under that name (Options.Images): the real AWS CCM
// (awsCCM, which hack/aws-ccm.sh builds for the control plane's minor, in a
// directory aws-ccm-<tag>) under the aws image of that tag, test/testccm — a
// CCM on k8s.io/cloud-provider/app that asks the fleet's Clouds — for the
// clouds whose CCM cannot be built from the Go module proxy. test/testccm is
// built from the repository at root into dir.
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
		if name == "aws" {
			tag, err := AWSCCMTag(awsCCM)
			if err != nil {
				return nil, err
			}
			images[p.CCM.Image.Repository+":"+tag] = awsCCM
			continue
		}
		for _, tag := range releases(p.CCM.Image) {
			images[p.CCM.Image.Repository+":"+tag] = testCCM
		}
	}
	return images, nil
}

// releases are the tags an image names: one per minor, and the default.
func releases(img profile.Image) []string {
	var tags []string
	for _, t := range img.Tags {
		tags = append(tags, t)
	}
	if img.Tag != "" {
		tags = append(tags, img.Tag)
	}
	return tags
}

// ControlPlaneMinor is the Kubernetes minor (N of 1.N) of the control
// plane the fleet runs: what $KUBEBUILDER_ASSETS/kube-apiserver --version
// says (the binary test/cluster starts).
func ControlPlaneMinor() (int, error) {
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kube-apiserver")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("fleet: %s --version (KUBEBUILDER_ASSETS: hack/control-plane.sh): %w", bin, err)
	}
	// "Kubernetes v1.36.3"
	fields := strings.Fields(string(out))
	if len(fields) != 2 || fields[0] != "Kubernetes" {
		return 0, fmt.Errorf("fleet: %s --version said %q, not \"Kubernetes v1.N.P\"", bin, out)
	}
	return profile.ServerMinor(fields[1])
}

// AWSCCM builds (or finds in its cache) the upstream AWS CCM at the release
// profiles/aws.yaml names for the control plane's minor with hack/aws-ccm.sh of the repository at root, and
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

// AWSCCMTag is the release (the module version, and the tag of its image)
// of the AWS CCM binary hack/aws-ccm.sh built: awsCCM's directory is
// aws-ccm-<tag>.
func AWSCCMTag(awsCCM string) (string, error) {
	tag, ok := strings.CutPrefix(filepath.Base(filepath.Dir(awsCCM)), "aws-ccm-")
	if !ok || tag == "" {
		return "", fmt.Errorf("fleet: %s is not in a directory aws-ccm-<tag> (hack/aws-ccm.sh)", awsCCM)
	}
	return tag, nil
}

// AWSCCMChart is the directory of the AWS CCM's own Helm chart
// (charts/aws-cloud-controller-manager of k8s.io/cloud-provider-aws) at the
// release of the binary awsCCM, as that module's source holds it in the Go
// module cache, where hack/aws-ccm.sh keeps it. The module proxy is not
// asked (a test's network namespace cannot reach it).
func AWSCCMChart(ctx context.Context, awsCCM string) (string, error) {
	tag, err := AWSCCMTag(awsCCM)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "hybrid-ccm-aws-chart-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	mod := "k8s.io/cloud-provider-aws@" + tag
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", mod)
	cmd.Dir = dir // outside any module: nothing to add to a go.sum
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=")
	out, err := cmd.Output()
	var dl struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &dl); err != nil || jerr != nil || dl.Dir == "" {
		return "", fmt.Errorf("fleet: %s is not in the Go module cache (hack/aws-ccm.sh keeps it there): %v %s", mod, err, dl.Error)
	}
	chart := filepath.Join(dl.Dir, "charts", "aws-cloud-controller-manager")
	if _, err := os.Stat(filepath.Join(chart, "Chart.yaml")); err != nil {
		return "", fmt.Errorf("fleet: %s has no chart charts/aws-cloud-controller-manager: %w", mod, err)
	}
	return chart, nil
}
